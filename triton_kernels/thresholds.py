"""Top-k / top-p cut-offs of one logits line by bisection on the float order, with no sort.

The kept set of top-k then top-p is always ``{s >= tau}``. We search ``tau`` over the 32-bit
order keys of float32 (an int32 whose order is the float order), so each search is exactly 32
counting (top-k) or summing (top-p) passes over the vocabulary and the result is a value present
in the line: top-k finds the k-th largest value (ties counted), top-p the smallest value whose
strictly-greater mass inside the top-k set is below ``top_p`` times that set's mass.
"""

import triton
import triton.language as tl

# The smallest order key, -2**31, written as a literal where used (a module-level constant is a plain
# int to the interpreter but must be a tl.constexpr object to the compiler).


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
def threshold_kernel(
    logits_ptr,  # (B, L, Vl) raw logits, any float dtype, last dim contiguous
    tau_ptr,  # (B * L,) float32 out: keep s >= tau (-inf = keep all)
    temperature_ptr,  # (B,) float32, 0 = greedy
    top_k_ptr,  # (B,) int64, 0 = off
    top_p_ptr,  # (B,) float32, 1 = off
    num_draft_ptr,  # (B,) int64: line l of row b is used iff l + USED_SHIFT <= n_b
    L,
    Vl,
    stride_b,
    stride_l,
    USED_SHIFT: tl.constexpr,  # 0 for target lines (positions 0..n_b), 1 for draft lines (0..n_b-1)
    BLOCK: tl.constexpr,
):
    line = tl.program_id(0)
    row = line // L
    pos = line % L
    temperature = tl.load(temperature_ptr + row)
    top_k = tl.load(top_k_ptr + row)
    top_p = tl.load(top_p_ptr + row)
    num_draft = tl.load(num_draft_ptr + row)
    use_k = (top_k > 0) & (top_k < Vl)
    use_p = top_p < 1.0
    base = logits_ptr + row.to(tl.int64) * stride_b + pos.to(tl.int64) * stride_l
    tau = float("-inf")
    if (temperature > 0) & (pos + USED_SHIFT <= num_draft) & (use_k | use_p):
        offsets = tl.arange(0, BLOCK)
        row_max = float("-inf")
        for start in range(0, Vl, BLOCK):
            idx = start + offsets
            s = tl.load(base + idx, mask=idx < Vl, other=float("-inf")).to(tl.float32) / temperature
            row_max = tl.maximum(row_max, tl.max(s, axis=0))
        max_key = order_key(row_max).to(tl.int64)

        # top-k: the largest key t with count(key >= t) >= k is the k-th largest value.
        k_key = tl.full((), -2147483648, tl.int64)
        if use_k:
            lo = tl.full((), -2147483648, tl.int64)
            hi = max_key
            for _ in range(32):
                mid = lo + (hi - lo + 1) // 2
                count = tl.zeros((), tl.int64)
                for start in range(0, Vl, BLOCK):
                    idx = start + offsets
                    s = tl.load(base + idx, mask=idx < Vl, other=float("-inf")).to(tl.float32) / temperature
                    count += tl.sum(((order_key(s) >= mid) & (idx < Vl)).to(tl.int64), axis=0)
                ok = count >= top_k
                lo = tl.where(ok, mid, lo)
                hi = tl.where(ok, hi, mid - 1)
            k_key = lo

        # top-p: the smallest key t whose strictly-greater mass (inside top-k) is below top_p * mass.
        tau_key = k_key
        if use_p:
            kept_mass = 0.0
            for start in range(0, Vl, BLOCK):
                idx = start + offsets
                s = tl.load(base + idx, mask=idx < Vl, other=float("-inf")).to(tl.float32) / temperature
                w = tl.where((order_key(s) >= k_key) & (s > float("-inf")), tl.exp(s - row_max), 0.0)
                kept_mass += tl.sum(w, axis=0)
            budget = top_p * kept_mass
            lo = k_key - 1  # mass above lo is the whole top-k mass: not below budget
            hi = max_key  # nothing lies above the maximum: below budget
            for _ in range(33):
                mid = lo + (hi - lo) // 2
                above = 0.0
                for start in range(0, Vl, BLOCK):
                    idx = start + offsets
                    s = tl.load(base + idx, mask=idx < Vl, other=float("-inf")).to(tl.float32) / temperature
                    key = order_key(s)
                    w = tl.where((key > mid) & (key >= k_key) & (s > float("-inf")), tl.exp(s - row_max), 0.0)
                    above += tl.sum(w, axis=0)
                searching = hi - lo > 1
                ok = above < budget
                hi = tl.where(searching & ok, mid, hi)
                lo = tl.where(searching & ~ok, mid, lo)
            tau_key = hi
        tau = tl.where(tau_key == -2147483648, float("-inf"), key_to_float(tau_key))
    tl.store(tau_ptr + line, tau)
