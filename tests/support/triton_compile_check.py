"""Compile every Triton launch the backend makes, exactly as it makes it, for a Hopper GPU (sm_90)
down to a cubin, without a GPU: ptxas ships with Triton's NVIDIA backend.

"Exactly": each call below (chains, blocks and trees) is planned by its launcher itself
(``_triton_backend.launches_for``, ``_triton_tree.launches_for``, through bench.gpu_model's
``launches``, on meta tensors of the call's shapes) and compiled with the JIT's own argument specialisation
(``_triton_backend.compile_launch``: 16-divisible pointers and integers, the real constexprs), so
the binaries are the ones a launch would run. The calls together take every constexpr branch.
Also checked: a call's specialisation is the same at every batch size (no recompilation, no new
CUDA-graph capture when B changes), every loop of every variant's SASS (each backward branch) is
one the GPU model knows and counts (``bench.gpu_model.unknown_loops``), the tiles that scatter
values through atomics convert no layout (``converted_scatters``), and the key windows are on
(``key_window_default``) exactly where this Triton lowers ``tl.histogram`` to shared-memory
atomics (``histogram_takes_shared_atomics``).

Run as a script with TRITON_INTERPRET unset or 0 (the interpreter replaces the compiler):
``python tests/support/triton_compile_check.py`` prints one line per compiled variant (registers, spills)
and ``ok N`` last (``--lowering``: only the windows' check). Exit status 0: all compiled; 1: a kernel failed to compile or a batch size
changed a specialisation, or the model misses a loop, or a scattering tile converts layouts, or the windows do not follow the lowering; 3: this Triton cannot compile for sm_90 here. Works with Triton 3.6 and
later. tests/triton/test_triton_compile.py runs it in a subprocess.
"""

from __future__ import annotations

import dataclasses
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def calls():
    from bench.gpu_model import Call

    v = 128256
    return [
        Call("fp32 draft logits, unfiltered", 1, 4, v, "fp32"),
        Call("bf16 logprobs raw, accept_probs, seeds, offsets", 64, 8, v, "bf16", logprobs=2, accept_probs=True, seeds=True, offsets=True),
        Call("fp16 one-hot drafts, filtered, check, logprobs processed", 4, 3, 50257, "fp16", draft="one-hot", top_k=50, top_p=0.9, check=True, logprobs=1),
        Call("fp32 sample stream, seeds", 8, 0, 32000, "fp32", draft="one-hot", stream=2, seeds=True),
        Call("fp32 target, bf16 draft of a smaller vocabulary, filtered", 2, 5, 152064, "fp32", draft_dtype="bf16", draft_vocab=151936, top_p=0.95),
        Call("fp32 draft logits, top-p (vLLM's lines: sampled starts)", 8, 4, v, "fp32", top_p=0.95),
        Call("bf16 filtered, check", 16, 4, 32000, "bf16", top_k=20, check=True),
        Call("block fp32 draft logits, logprobs raw, seeds, offsets", 64, 8, v, "fp32", method="block", logprobs=2, seeds=True, offsets=True),
        Call("block bf16 one-hot drafts, filtered, check, logprobs processed", 4, 3, 32000, "bf16", draft="one-hot", top_k=50, top_p=0.9, check=True,
             logprobs=1, method="block"),
        Call("block fp32 target, bf16 draft of a smaller vocabulary, top-p", 2, 5, 152064, "fp32", draft_dtype="bf16", draft_vocab=151936, top_p=0.95,
             method="block"),
        Call("tree fp32 iid siblings", 1, 8, v, "fp32", method="tree", tree_depth=4),
        Call("tree bf16 without replacement, filtered, check, seeds, offsets", 16, 16, 32000, "bf16", method="tree", siblings="without_replacement",
             top_k=20, top_p=0.9, check=True, seeds=True, offsets=True, tree_depth=5),
        Call("tree fp16 deterministic siblings, top-p, seeds", 4, 4, 50257, "fp16", draft="one-hot", method="tree", top_p=0.95, seeds=True),
    ]


# Tiles whose values go to atomics and to the slots those return (select.py's _tile_values,
# SCATTERED, and _gather) hold each value in the lane that loaded it: one value a lane, or a
# gather's lane column (Triton 3.8 on) or 16-byte vector (3.6, 3.7), whose run of slots one atomic
# takes. No layout conversion through shared memory, so no barrier but a tl.histogram's own (a
# mass histogram tile's, as many as the same kernel's count histogram tile takes).
SCATTERING_TILES = ("gather tile", "window gather tile", "raw window atomic tile", "mass histogram tile")


def converted_scatters(kernel: str, code) -> list:
    """The scattering tile loops of ``code`` with more barriers than those allow."""
    from bench.gpu_model import loop_kinds

    kinds = [kind.replace(" (masked)", "") if kind else None for kind in loop_kinds(kernel, code)]
    histogram = min((loop.has("BAR") for loop, kind in zip(code.loops, kinds, strict=True) if kind == "count histogram tile"), default=0)

    def allowed(kind: str) -> int:
        return histogram if kind == "mass histogram tile" else 0

    return [(loop, kind) for loop, kind in zip(code.loops, kinds, strict=True) if kind in SCATTERING_TILES and loop.has("BAR") > allowed(kind)]


def specialisation(launch) -> tuple:
    """What the JIT keys a compile on for this launch (types, divisibility, constexprs)."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import make_backend
    from triton.runtime.jit import create_function_from_signature

    backend = make_backend(GPUTarget("cuda", 90, 32))
    binder = create_function_from_signature(launch.kernel.signature, launch.kernel.params, backend)
    _, spec, _ = binder(*launch.args, **launch.constexprs)
    return tuple(spec)


def histogram_takes_shared_atomics() -> bool:
    """Whether this Triton lowers ``tl.histogram`` to one shared-memory atomic a value (3.8 and
    later), not to warp ballots and popcounts (3.6, 3.7): a 512-bin histogram of 16384 keys
    compiled for sm_90, its SASS read for ATOMS and VOTE. ``key_window_default`` turns the key
    windows on by Triton's version; this is the lowering that choice stands for."""
    from bench.experiments.histogram_lowering import sass_of, triton_histogram

    sass = sass_of(triton_histogram, {"BINS": 512, "STEP": 16384})
    return "ATOMS" in sass and "VOTE" not in sass


def check_lowering() -> int:
    """0 when the key windows are on exactly where tl.histogram takes shared-memory atomics, else 1."""
    import triton

    from specdec_ext import _triton_backend

    shared = histogram_takes_shared_atomics()
    windows = _triton_backend.key_window_default()
    lowering = "shared-memory atomics" if shared else "warp ballots and popcounts"
    if shared != windows:
        print(f"FAILED Triton {triton.__version__}: tl.histogram takes {lowering}, but key_window_default() is {windows}")
        return 1
    print(f"Triton {triton.__version__}: tl.histogram takes {lowering}; key windows {'on' if windows else 'off'}")
    return 0


def main(lowering_only: bool = False) -> int:
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        print("unset TRITON_INTERPRET: the interpreter replaces the compiler", file=sys.stderr)
        return 2
    sys.path.insert(0, str(ROOT))
    import triton

    try:
        from triton.backends.compiler import GPUTarget  # noqa: F401
        from triton.compiler import ASTSource  # noqa: F401
    except ImportError as error:
        print(f"no ahead-of-time compiler in this Triton: {error}")
        return 3
    from bench.gpu_model import analyse, disassemble, launches, unknown_loops
    from specdec_ext import _triton_backend

    print(f"triton {triton.__version__}")
    if lowering_only:
        try:
            return check_lowering()
        except Exception as error:  # no ptxas for sm_90 here
            print(f"cannot compile for sm_90 here: {type(error).__name__}: {str(error)[:300]}")
            return 3
    seen = {}
    count = 0
    for call in calls():
        # The same call at several batch sizes must specialise identically.
        keys = {batch: [(launch.name, specialisation(launch)) for launch in launches(dataclasses.replace(call, batch=batch), 132)] for batch in (1, 7, 64, 513)}
        if len({tuple(k) for k in keys.values()}) != 1:
            print(f"FAILED {call.name}: the specialisation depends on the batch size: {keys}")
            return 1
        for launch in launches(call, 132):
            key = (launch.name, specialisation(launch))
            if key in seen:
                continue
            try:
                compiled = _triton_backend.compile_launch(launch, arch=90)
            except Exception as error:
                text = str(error)
                if count == 0 and ("ptxas" in text or "backend" in text.lower()):
                    print(f"cannot compile for sm_90 here: {type(error).__name__}: {text[:300]}")
                    return 3
                print(f"FAILED {launch.name} of {call.name}: {type(error).__name__}: {text[:2000]}")
                return 1
            if not compiled.asm.get("cubin"):
                print(f"FAILED {launch.name} of {call.name}: no cubin")
                return 1
            code = analyse(*disassemble(compiled.asm["cubin"]))
            seen[key] = code
            count += 1
            print(f"compiled {launch.name:<14} ({call.name}): {code.registers} registers, {code.spill_bytes} bytes spilled, {len(code.loops)} loops")
            if code.spill_bytes:
                print(f"FAILED {launch.name} of {call.name}: registers spill to local memory")
                return 1
            kernel = launch.name.split(":")[0]
            converted = converted_scatters(kernel, code)
            if converted:
                print(f"FAILED {launch.name} of {call.name}: scattering tiles convert layouts through shared memory: "
                      + ", ".join(f"{kind} at {loop.start:#x} ({loop.has('BAR')} barriers)" for loop, kind in converted))
                return 1
            missing = unknown_loops(kernel, code)
            if missing:
                print(f"FAILED {launch.name} of {call.name}: loops the GPU model does not count: "
                      + ", ".join(f"{loop.start:#x}-{loop.end:#x} ({loop.instructions} instructions, {loop.by_opcode})" for loop in missing))
                return 1
    if check_lowering():
        return 1
    print(f"ok {count}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(lowering_only="--lowering" in sys.argv[1:]))
