"""Compile every Triton tree / block kernel, in every constexpr variant the launchers use, for a
Hopper GPU (sm_90) down to a cubin, without a GPU (ptxas ships with Triton's NVIDIA backend).

Run with TRITON_INTERPRET unset or 0: ``python tests/tree_triton_compile_check.py`` prints one line
per variant and ``ok N`` last. Exit status 0: all compiled; 1: a kernel failed; 3: this Triton
cannot compile for sm_90 here. tests/test_tree_triton_compile.py runs it in a subprocess.
"""

from __future__ import annotations

import inspect
import itertools
import os
import sys
from pathlib import Path

LOGITS = {"fp32": "*fp32", "bf16": "*bf16"}
INT64_POINTERS = {
    "tokens_ptr", "children_ptr", "num_nodes_ptr", "num_draft_ptr", "keys_ptr", "offsets_ptr", "top_k_ptr", "raw_arg_ptr", "arg_ptr", "t_arg_ptr",
    "state_line_ptr", "state_depth_ptr", "state_removed_ptr", "path_ptr", "state_draft_ptr", "state_hot_ptr", "race_idx_ptr", "bonus_idx_ptr",
    "out_tokens_ptr", "out_accepted_ptr",
}
INT32_POINTERS = {"pre_bad_ptr", "greedy_ptr", "bad_ptr", "line_bad_ptr", "t_bad_ptr", "d_bad_ptr", "state_bad_ptr"}


def _pointer(name: str, logits: str) -> str:
    if name in ("logits_ptr", "target_ptr", "draft_ptr"):
        return logits
    if name in INT64_POINTERS:
        return "*i64"
    if name in INT32_POINTERS:
        return "*i32"
    return "*fp32"


def variants(k):
    for dtype in LOGITS:
        yield f"chunk_stats {dtype}", k.chunk_stats_kernel, {"BLOCK": 1024}, LOGITS[dtype]
        for filtered in (False, True):
            yield f"line_stats {dtype} filtered={filtered}", k.line_stats_kernel, {"CHUNKS_POW2": 128, "FILTERED": filtered, "BLOCK": 1024, "SECTIONS": 16}, LOGITS[dtype]
        for has_draft, wor, check in itertools.product((False, True), (False, True), (False, True)):
            if wor and not has_draft:
                continue
            constexprs = {"HAS_DRAFT": has_draft, "WITHOUT_REPLACEMENT": wor, "CHECK": check, "W_POW2": 8, "BLOCK": 1024}
            yield f"tree_walk {dtype} draft={has_draft} wor={wor} check={check}", k.tree_walk_kernel, constexprs, LOGITS[dtype]
        for has_draft, check in itertools.product((False, True), (False, True)):
            constexprs = {"HAS_DRAFT": has_draft, "CHECK": check, "K1_POW2": 8, "BLOCK": 1024}
            yield f"block_walk {dtype} draft={has_draft} check={check}", k.block_walk_kernel, constexprs, LOGITS[dtype]
        for has_draft in (False, True):
            yield f"race {dtype} draft={has_draft}", k.race_kernel, {"HAS_DRAFT": has_draft, "W_POW2": 8, "BLOCK": 1024}, LOGITS[dtype]
        for logprobs in (0, 1, 2):
            yield f"block_finalize {dtype} logprobs={logprobs}", k.block_finalize_kernel, {"CHUNKS_POW2": 128, "K1_POW2": 8, "LOGPROBS": logprobs}, LOGITS[dtype]
    yield "tree_finalize", k.tree_finalize_kernel, {"CHUNKS_POW2": 128, "D1_POW2": 8}, "*fp32"


def main() -> int:
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        print("unset TRITON_INTERPRET: the interpreter replaces the compiler", file=sys.stderr)
        return 2
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    import triton

    try:
        from triton.backends.compiler import GPUTarget
        from triton.compiler import ASTSource
    except ImportError as error:
        print(f"no ahead-of-time compiler in this Triton: {error}")
        return 3
    from specdec_ext._triton_tree import kernels

    target = GPUTarget("cuda", 90, 32)
    count = 0
    for label, kernel, constexprs, logits in variants(kernels()):
        signature = {}
        for name in inspect.signature(kernel.fn).parameters:
            if name in constexprs:
                signature[name] = "constexpr"
            elif name.endswith("_ptr"):
                signature[name] = _pointer(name, logits)
            else:
                signature[name] = "i32"
        try:
            compiled = triton.compile(ASTSource(kernel, signature, constexprs=constexprs), target=target)
        except Exception as error:
            text = str(error)
            if count == 0 and ("ptxas" in text or "backend" in text.lower()):
                print(f"cannot compile for sm_90 here: {type(error).__name__}: {text[:300]}")
                return 3
            print(f"FAILED {label}: {type(error).__name__}: {text[:3000]}")
            return 1
        if not compiled.asm.get("cubin"):
            print(f"FAILED {label}: no cubin")
            return 1
        count += 1
        print(f"compiled {label}")
    print(f"ok {count}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
