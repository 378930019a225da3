"""Philox uniforms shared with the eager reference (specdec_ext/_philox.py documents the stream)."""

import triton
import triton.language as tl


@triton.jit
def open_uniform(seed, c0, c1, c2, c3):
    """Word 0 of Philox4x32-10 at counter (c0, c1, c2, c3), as a float32 uniform in (0, 1).

    ``((x >> 9) + 0.5) * 2**-23`` is exact in float32 and never 0: a token with p = 0 can never be
    accepted and ``-log(u)`` stays finite.
    """
    # Give every counter word the same shape: Philox rounds swap words, and a scalar word meeting a
    # block word would otherwise change shape between rounds.
    zero = c0 * 0 + c1 * 0 + c2 * 0 + c3 * 0
    x, _, _, _ = tl.philox(seed, c0 + zero, c1 + zero, c2 + zero, c3 + zero)
    return ((x >> 9).to(tl.float32) + 0.5) * 1.1920928955078125e-07
