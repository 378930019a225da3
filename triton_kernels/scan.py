"""Running sums over the slots of a vector, as the kernels' histograms, candidates and gathers
take them (one formula each, so a sum read in two kernels is the same sum)."""

import triton
import triton.language as tl


@triton.jit
def from_here(values):
    """Each slot's value plus those of every later slot (a suffix sum)."""
    return tl.sum(values, axis=0) - tl.cumsum(values, axis=0) + values


@triton.jit
def before_here(values):
    """The sum of the values of every earlier slot (an exclusive prefix sum)."""
    return tl.cumsum(values, axis=0) - values
