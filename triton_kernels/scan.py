"""Running sums over the slots of a vector, as the kernels' histograms, candidates and gathers
take them (one formula each, so a sum read in two kernels is the same sum), and the selection
built on them."""

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


@triton.jit
def largest_reaching(keys, rank, DIGITS: tl.constexpr):
    """The largest x with at least ``rank`` of ``keys`` at or above it: their rank-th largest,
    counted with multiplicity (slot rank - 1 of a copy sorted in descending order), found a byte
    at a time from the top by 256-bin histograms and their suffix sums, with no sort. ``keys``: a
    vector of signed integers of DIGITS bytes, in [-2**(8 * DIGITS - 1), 2**(8 * DIGITS - 1))
    (int32: a step's shifts and tests take half the instructions of int64 ones); a slot that
    holds none takes the lowest, which is also the result when fewer than ``rank`` are present.

    The first step bins every key by its top byte, offset by 128 (the signed order). Each later
    step bins the keys whose higher bytes are the ones found so far by their next byte, those
    above them in the top bin, the rest in bin 0. Each bin's suffix sum from bin 1 up counts the
    keys at or above that bin's first value, so the next byte is the highest bin whose sum
    reaches ``rank``, or 0 where none does (bin 0's sum counts every slot: it is never read).
    Every slot lies in some bin, so a bin's suffix sum is the slots' number less the bins below
    it: one scan a step, no sum over the bins (a block reduction less, and its barriers)."""
    N: tl.constexpr = keys.shape[0]
    bins = tl.arange(0, 256)
    found = tl.full((), 0, keys.dtype)
    for step in tl.static_range(DIGITS):
        shift = 8 * (DIGITS - 1 - step)
        if step == 0:
            byte = ((keys >> shift) + 128).to(tl.int32)
        else:
            higher = keys >> (shift + 8)
            byte = tl.where(higher == found, (keys >> shift) & 255, tl.where(higher > found, 255, 0)).to(tl.int32)
        reach = before_here(tl.histogram(byte, 256)) <= N - rank  # (from_here(counts) >= rank)
        chosen = tl.max(tl.where(reach & (bins > 0), bins, 0), axis=0).to(keys.dtype)
        if step == 0:
            found = chosen - 128
        else:
            found = found * 256 + chosen
    return found
