"""The random stream (specdec_ext/_philox.py is its specification) and the float helpers every
kernel shares, so one formula means one thing in every kernel.

Stream v2: row b is keyed by its own 64-bit key; the acceptance coin of absolute position P is
word 0 of Philox4x32-10 at counter (0, P_lo, P_hi, 0); the race exponential of vocabulary id v is
word v & 3 of counter (v >> 2, P_lo, P_hi, S), S = 1 (verify) or 2 (sample). One Philox call
serves four consecutive ids.
"""

import triton
import triton.language as tl


@triton.jit
def open_uniform(words):
    """uint32 words -> float32 uniforms ``((w >> 9) + 0.5) * 2**-23`` in the open interval (0, 1)."""
    return ((words >> 9).to(tl.float32) + 0.5) * 1.1920928955078125e-07


@triton.jit
def position_words(position):
    """(low, high) uint32 words of int64 absolute positions."""
    return (position & 0xFFFFFFFF).to(tl.uint32), (position >> 32).to(tl.uint32)


@triton.jit
def acceptance_coins(key, positions):
    """Coins of int64 absolute ``positions`` (any shape) under int64 ``key``: word 0 of (0, P_lo, P_hi, 0)."""
    p_lo, p_hi = position_words(positions)
    zero = p_lo * 0
    word, _, _, _ = tl.philox(key, zero, p_lo, p_hi, zero)
    return open_uniform(word)


@triton.jit
def race_uniforms(key, start, p_lo, p_hi, STREAM: tl.constexpr, BLOCK: tl.constexpr):
    """Uniforms of the ids ``start + [0, BLOCK)`` (``start`` a multiple of 4) at one position: one
    Philox call per four ids, id 4g + w taking word w of counter (g, p_lo, p_hi, STREAM)."""
    groups = (start // 4 + tl.arange(0, BLOCK // 4)).to(tl.uint32)
    zero = groups * 0
    w0, w1, w2, w3 = tl.philox(key, groups, zero + p_lo, zero + p_hi, zero + STREAM)
    # join(join(w0, w2), join(w1, w3)) is (G, 2, 2) with [g, a, b] = word 2a + b: flat, id 4g + w.
    words = tl.reshape(tl.join(tl.join(w0, w2), tl.join(w1, w3)), (BLOCK,))
    return open_uniform(words)


@triton.jit
def exp(x):
    """e**x as ``exp2(x * log2(e))``: one multiply and one MUFU.EX2 on the GPU (results below
    2**-126 flush to 0). The interpreter evaluates the same formula, so both run one definition."""
    return tl.exp2(x * 1.4426950408889634)


@triton.jit
def negative_log(u, INTERPRET: tl.constexpr):
    """-ln(u) for u in (0, 1) as ``log2(u) * -ln(2)``: MUFU.LG2 on the GPU (Triton's own log is a
    precise polynomial of about 25 instructions), numpy's log2 in the interpreter."""
    if INTERPRET:
        log2 = tl.log2(u)
    else:
        log2 = tl.inline_asm_elementwise("lg2.approx.ftz.f32 $0, $1;", "=f,f", [u], dtype=tl.float32, is_pure=True, pack=1)
    return log2 * -0.6931471805599453


@triton.jit
def reciprocal(b):
    """RN(1 / b): IEEE round-to-nearest division, once per line."""
    return tl.math.div_rn(tl.full(b.shape, 1.0, tl.float32), b)


@triton.jit
def divide(a, b, b_reciprocal):
    """RN(a / b) for finite b > 0, given ``b_reciprocal = RN(1 / b)``: one multiply and two fused
    multiply-adds (Markstein: q = a*y, r = a - b*q exactly, q + r*y rounds correctly when y is the
    correctly rounded reciprocal), instead of a full division per element."""
    q = a * b_reciprocal
    r = tl.fma(-q, b, a)
    return tl.fma(r, b_reciprocal, q)
