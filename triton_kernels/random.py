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
    """uint32 words -> float32 uniforms ``((w >> 9) + 0.5) * 2**-23`` in the open interval (0, 1).

    Computed as the float with bits ``0x3F800000 | (w >> 9)`` (that is 1 + (w >> 9) * 2**-23) minus
    ``1 - 2**-24``: both steps are exact, so the value is the same, in three instructions."""
    one_to_two = ((words >> 9) | 0x3F800000).to(tl.float32, bitcast=True)
    return one_to_two - 0.99999994039535522


@triton.jit
def position_words(position):
    """(low, high) uint32 words of int64 absolute positions."""
    return (position & 0xFFFFFFFF).to(tl.uint32), (position >> 32).to(tl.uint32)


@triton.jit
def acceptance_coins(key, positions):
    """Coins of int64 absolute ``positions`` (any shape) under int64 ``key``: word 0 of (0, P_lo, P_hi, 0)."""
    return ranked_coins(key, positions, positions * 0)


@triton.jit
def ranked_coins(key, positions, ranks):
    """Coins of a tree's sibling ``ranks`` at int64 absolute ``positions`` (same shape): word 0 of
    (rank, P_lo, P_hi, 0). Rank 0 is the chain's acceptance coin."""
    p_lo, p_hi = position_words(positions)
    word, _, _, _ = tl.philox(key, ranks.to(tl.uint32), p_lo, p_hi, p_lo * 0)
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
def _fast_log2(x, INTERPRET: tl.constexpr):
    """log2 by the special-function unit (absolute error 2**-22 near 1, so only where |log2 x| is large)."""
    if INTERPRET:
        return tl.log2(x)
    else:
        return tl.inline_asm_elementwise("lg2.approx.ftz.f32 $0, $1;", "=f,f", [x], dtype=tl.float32, is_pure=True, pack=1)


@triton.jit
def fast_reciprocal(x, INTERPRET: tl.constexpr):
    """1 / x to 1 ulp by the special-function unit (the race keys only: p(x) divides exactly)."""
    if INTERPRET:
        return 1.0 / x
    else:
        return tl.inline_asm_elementwise("rcp.approx.ftz.f32 $0, $1;", "=f,f", [x], dtype=tl.float32, is_pure=True, pack=1)


@triton.jit
def log2_uniform(u, INTERPRET: tl.constexpr):
    """log2(u) < 0 for uniforms u in (0, 1), to within 4e-7 relative everywhere.

    The race draws argmax r / E with E = -ln(u) = -ln(2) log2(u); its likely winners have u close
    to 1 and E tiny, so E must be accurate relative to itself there. Below u = 3/4, log2 by the
    special-function unit (|log2 u| >= 0.41, so its 2**-22 absolute error stays relative); above,
    with w = 1 - u (exact), ln(1 - w) = -2 atanh(z), z = w / (2 - w) <= 1/7, summed to z**9
    (truncation below 3e-8) with explicit fused multiply-adds. About 12 instructions, against
    about 25 for a general-purpose log."""
    w = 1.0 - u
    z = w * fast_reciprocal(2.0 - w, INTERPRET)
    z2 = z * z
    # -2 log2(e) * (1 + z2/3 + z2**2/5 + z2**3/7 + z2**4/9), by Horner's rule
    poly = tl.fma(z2, -0.3205988979753252, -0.4121985831111324)
    poly = tl.fma(z2, poly, -0.5770780163555853)
    poly = tl.fma(z2, poly, -0.9617966939259756)
    poly = tl.fma(z2, poly, -2.8853900817779268)
    return tl.where(u > 0.75, z * poly, _fast_log2(u, INTERPRET))


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


@triton.jit
def order_key(s):
    """int32 key with the order of float32 ``s`` (-0.0 folded onto +0.0)."""
    bits = (s + 0.0).to(tl.int32, bitcast=True)
    return tl.where(bits >= 0, bits, bits ^ 0x7FFFFFFF)


@triton.jit
def key_to_float(key):
    bits = tl.where(key >= 0, key, key ^ 0x7FFFFFFF).to(tl.int32)
    return bits.to(tl.float32, bitcast=True)


@triton.jit
def raw_key(x, BF16: tl.constexpr, BITS: tl.constexpr = False):
    """int32 key with the order of 16-bit floats ``x`` (bf16 or fp16) in [-32768, 32767], from
    their bits (-0.0 just below +0.0: the two scale to one value, which the search allows for).
    A bf16's bits are the high half of its float32's, whose order key is at hand where the value
    is converted anyway (no 16-bit extraction); BITS (a loop that needs no value): from the 16
    bits, one shift and one exclusive or (the sign's copy flips the magnitude of a negative)."""
    if BF16 and not BITS:
        bits = x.to(tl.float32).to(tl.int32, bitcast=True)
        return tl.where(bits >= 0, bits, bits ^ 0x7FFFFFFF) >> 16
    else:
        bits = x.to(tl.int16, bitcast=True).to(tl.int32)
        return bits ^ ((bits >> 15) & 0x7FFF)


@triton.jit
def raw_bits_reaching(lo):
    """(first, span): the bits of 16-bit floats (zero-extended to int32) whose raw key is at least
    ``lo`` are those with ``(bits - first)`` at most ``span`` as unsigned 32-bit integers. The raw
    keys take the positive floats' bits in order, then the negative floats' backwards: from
    ``lo >= 0`` the bits lo .. 32767, from a negative lo the bits 0 up to lo's negative float's
    (and from lo above 32767 none: a first of 65536 puts every float's bits past any span of 0)."""
    first = tl.where(lo > 32767, 65536, tl.where(lo >= 0, lo, 0))
    span = tl.where(lo > 32767, 0, tl.where(lo >= 0, 32767 - lo, (lo ^ 0x7FFF) & 0xFFFF))
    return first, span.to(tl.uint32, bitcast=True)


@triton.jit
def bits_scaled(bits, inv_t, DTYPE: tl.constexpr):
    """The scaled value (as a tile computes it) of the 16-bit float of DTYPE with ``bits`` (zero-extended)."""
    return bits.to(tl.int16).to(DTYPE, bitcast=True).to(tl.float32) * inv_t


@triton.jit
def raw_scaled(key, inv_t, DTYPE: tl.constexpr):
    """The scaled value (as a tile computes it) of the 16-bit float of DTYPE with raw key ``key``."""
    bits = tl.where(key >= 0, key, key ^ 0x7FFF).to(tl.int16)
    return bits.to(DTYPE, bitcast=True).to(tl.float32) * inv_t
