"""Compile every Triton kernel, in every constexpr variant the launchers use, for a Hopper GPU
(sm_90) down to a cubin, without a GPU: ptxas ships with Triton's NVIDIA backend.

Run as a script with TRITON_INTERPRET unset or 0 (the interpreter replaces the compiler):
``python tests/triton_compile_check.py`` prints one line per variant and ``ok N`` last. Exit status
0: all compiled; 1: a kernel failed to compile; 3: this Triton cannot compile for sm_90 here.
tests/test_triton_compile.py runs it in a subprocess.
"""

from __future__ import annotations

import inspect
import itertools
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

LOGIT_TYPES = {"fp32": "*fp32", "bf16": "*bf16", "fp16": "*fp16"}


def _pointer_type(name: str, logits: str, tokens: str) -> str:
    if name in ("logits_ptr", "target_ptr", "draft_ptr"):
        return logits
    if name == "tokens_ptr":
        return tokens
    if name in ("top_k_ptr", "num_draft_ptr", "seed_ptr", "num_accepted_ptr", "out_ptr"):
        return "*i64"
    if name.endswith(("_arg_ptr", "_idx_ptr", "_bad_ptr")) or name in ("invalid_ptr", "cand_count_ptr", "cand_floor_ptr"):
        return "*i32"
    return "*fp32"


def variants(k):
    """(label, kernel, constexprs, logits type, tokens type) for every launch the backend makes."""
    for dtype, shift in itertools.product(LOGIT_TYPES, (0, 1)):
        yield f"candidates {dtype} shift={shift}", k.candidates_kernel, {"USED_SHIFT": shift, "CHUNK": 4096, "CAND": 64}, LOGIT_TYPES[dtype], "*i64"
        yield f"threshold {dtype} shift={shift}", k.threshold_kernel, {"USED_SHIFT": shift, "CHUNKS_POW2": 64, "CAND": 64, "CANDS_POW2": 4096, "BLOCK": 1024}, LOGIT_TYPES[dtype], "*i64"
        for filtered in (False, True):
            yield f"line_stats {dtype} shift={shift} filtered={filtered}", k.line_stats_kernel, {"USED_SHIFT": shift, "FILTERED": filtered, "BLOCK": 1024}, LOGIT_TYPES[dtype], "*i64"
    for dtype, has_draft, check_all, filtered, tokens in itertools.product(("fp32", "bf16"), (False, True), (False, True), (False, True), ("*i64", "*i32")):
        if tokens == "*i32" and not (has_draft and filtered):
            continue  # one variant with int32 drafts is enough
        constexprs = {"HAS_DRAFT": has_draft, "CHECK_ALL_LINES": check_all, "FILTERED": filtered, "CHUNKS_POW2": 128, "BLOCK": 1024}
        yield f"race {dtype} draft={has_draft} check_all={check_all} filtered={filtered} tokens={tokens}", k.race_kernel, constexprs, LOGIT_TYPES[dtype], tokens
    yield "finalize", k.finalize_kernel, {"CHUNKS_POW2": 128, "K1_POW2": 16}, "*fp32", "*i64"


def resource_usage(cubin: bytes, cuobjdump: str) -> str:
    """'REG:n ... LOCAL:n' of a cubin (registers per thread; LOCAL > 0 means spills), or ''."""
    if not os.path.exists(cuobjdump):
        return ""
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        out = subprocess.run([cuobjdump, "-res-usage", f.name], capture_output=True, text=True).stdout
    found = re.search(r"REG:(\d+).*LOCAL:(\d+)", out)
    return f"{found.group(1)} registers, {found.group(2)} bytes spilled" if found else ""


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
    from specdec_ext._triton_backend import kernels

    target = GPUTarget("cuda", 90, 32)
    cuobjdump = str(Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump")
    count = 0
    for label, kernel, constexprs, logits, tokens in variants(kernels()):
        signature = {}
        for name in inspect.signature(kernel.fn).parameters:
            if name in constexprs:
                signature[name] = "constexpr"
            elif name.endswith("_ptr"):
                signature[name] = _pointer_type(name, logits, tokens)
            else:
                signature[name] = "i32"
        try:
            compiled = triton.compile(ASTSource(kernel, signature, constexprs=constexprs), target=target)
        except Exception as error:
            text = str(error)
            if count == 0 and ("ptxas" in text or "backend" in text.lower()):
                print(f"cannot compile for sm_90 here: {type(error).__name__}: {text[:300]}")
                return 3
            print(f"FAILED {label}: {type(error).__name__}: {text[:2000]}")
            return 1
        if not compiled.asm.get("cubin"):
            print(f"FAILED {label}: no cubin")
            return 1
        count += 1
        usage = resource_usage(compiled.asm["cubin"], cuobjdump)
        print(f"compiled {label}" + (f": {usage}" if usage else ""))
    print(f"ok {count}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
