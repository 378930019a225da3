"""``python -m bench.experiments.histogram_lowering``: what a histogram costs in this Triton's sm_90 code.

The whole-line search and the statistics' windows count values in bins. Triton 3.8 and later lower
``tl.histogram`` to shared-memory atomics; 3.6 and 3.7 to warp ballots and popcounts, whose cost
grows with the bits a bin index has. This compiles, for sm_90 with 8 warps, a kernel that counts
4096 int32 keys a step (16 a thread) in four ways and prints the SASS instructions of the whole
kernel a value a thread (prologue and store included, so an upper bound on its loop) and per bit of
bin index:

- ``tl.histogram`` at 16, 32, 64 and 256 bins;
- 16 bins as 8 int32 words of two 16-bit counters (one-hot shifted into a field, summed);
- 16 bins by comparing each key with every bin and summing;
- 256 bins as a tensor-core product of two 16-wide one-hot matrices (int8 and fp16; 1024 keys a
  step, as larger steps spill).

No GPU is needed (ptxas compiles; nothing runs). Triton 3.6 gave (2026-12-06): ballots 35.5, 36.5,
43.5, 58.5 instructions a value at 16 / 32 / 64 / 256 bins, 7.3 to 8.9 a bit; packed counters 56;
compare-and-sum 64.5; the tensor-core products 302 (int8) and 356 (fp16): none is cheaper a bit
than the ballots, so Triton 3.6 and 3.7 keep the whole-line search. Triton 3.9's shared-memory
atomics: 8.0 to 8.5 a value at any of these bin counts.
"""

from __future__ import annotations

import sys

import triton
import triton.language as tl

STEP = 4096
THREADS = 256  # 8 warps


@triton.jit
def triton_histogram(keys_ptr, counts_ptr, BINS: tl.constexpr, STEP: tl.constexpr):
    offsets = tl.arange(0, STEP)
    counts = tl.zeros((BINS,), tl.int32)
    for step in range(0, 4):
        counts += tl.histogram(tl.load(keys_ptr + step * STEP + offsets) & (BINS - 1), BINS)
    tl.store(counts_ptr + tl.arange(0, BINS), counts)


@triton.jit
def packed_counters(keys_ptr, counts_ptr, BINS: tl.constexpr, STEP: tl.constexpr):
    offsets = tl.arange(0, STEP)
    words = tl.zeros((BINS // 2,), tl.int32)  # two 16-bit counters a word
    for step in range(0, 4):
        key = tl.load(keys_ptr + step * STEP + offsets) & (BINS - 1)
        one = 1 << ((key & 1) * 16)
        words += tl.sum(tl.where((key >> 1)[:, None] == tl.arange(0, BINS // 2)[None, :], one[:, None], 0), axis=0)
    tl.store(counts_ptr + tl.arange(0, BINS // 2), words)


@triton.jit
def compare_and_sum(keys_ptr, counts_ptr, BINS: tl.constexpr, STEP: tl.constexpr):
    offsets = tl.arange(0, STEP)
    counts = tl.zeros((BINS,), tl.int32)
    for step in range(0, 4):
        key = tl.load(keys_ptr + step * STEP + offsets) & (BINS - 1)
        counts += tl.sum((key[:, None] == tl.arange(0, BINS)[None, :]).to(tl.int32), axis=0)
    tl.store(counts_ptr + tl.arange(0, BINS), counts)


@triton.jit
def one_hot_product(keys_ptr, counts_ptr, BINS: tl.constexpr, STEP: tl.constexpr, INT8: tl.constexpr):
    offsets = tl.arange(0, STEP)
    acc = tl.zeros((16, 16), tl.int32 if INT8 else tl.float32)
    for step in range(0, 4):
        key = tl.load(keys_ptr + step * STEP + offsets) & 255
        dtype = tl.int8 if INT8 else tl.float16
        high = (tl.arange(0, 16)[:, None] == (key >> 4)[None, :]).to(dtype)  # (16, STEP)
        low = ((key & 15)[:, None] == tl.arange(0, 16)[None, :]).to(dtype)  # (STEP, 16)
        if INT8:
            acc = tl.dot(high, low, acc, out_dtype=tl.int32)
        else:
            acc = tl.dot(high, low, acc)
    tl.store(counts_ptr + tl.arange(0, 16)[:, None] * 16 + tl.arange(0, 16)[None, :], acc.to(tl.int32))


def sass_of(fn, constexprs: dict) -> str:
    """The sm_90 SASS of one of these kernels (``fn(keys_ptr, counts_ptr, **constexprs)``, 8 warps)."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from bench.gpu_model import disassemble

    signature = {"keys_ptr": "*i32", "counts_ptr": "*i32", **{name: "constexpr" for name in constexprs}}
    compiled = triton.compile(ASTSource(fn=fn, signature=signature, constexprs=constexprs), target=GPUTarget("cuda", 90, 32),
                              options={"num_warps": THREADS // 32})
    return disassemble(compiled.asm["cubin"])[0]


def instructions(fn, constexprs: dict) -> int:
    return sum(1 for line in sass_of(fn, constexprs).splitlines() if "/*" in line and "*/" in line and ";" in line)


def main() -> int:
    print(f"triton {triton.__version__}, sm_90, {THREADS // 32} warps: SASS instructions of the kernel a value a thread (a bit of bin index)")
    rows = [(f"tl.histogram, {bins} bins", triton_histogram, {"BINS": bins, "STEP": STEP}, bins.bit_length() - 1) for bins in (16, 32, 64, 256)]
    rows += [("packed 16-bit counters, 16 bins", packed_counters, {"BINS": 16, "STEP": STEP}, 4),
             ("compare and sum, 16 bins", compare_and_sum, {"BINS": 16, "STEP": STEP}, 4),
             ("one-hot product int8, 256 bins", one_hot_product, {"BINS": 256, "STEP": 1024, "INT8": True}, 8),
             ("one-hot product fp16, 256 bins", one_hot_product, {"BINS": 256, "STEP": 1024, "INT8": False}, 8)]
    for name, fn, constexprs, bits in rows:
        try:
            per_value = instructions(fn, constexprs) / (constexprs["STEP"] / THREADS)
        except Exception as error:  # no ptxas for sm_90, or a lowering this Triton lacks
            print(f"{name}: not compiled ({type(error).__name__}: {str(error)[:120]})")
            continue
        print(f"{name:36s} {per_value:7.1f} a value  {per_value / bits:5.1f} a bit")
    return 0


if __name__ == "__main__":
    sys.exit(main())
