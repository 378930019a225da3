"""pytest-benchmark suite: ``pytest bench/`` (the default test run, ``pytest``, collects tests/ only).

Latency of every available backend and of the transformers / ``torch.multinomial`` baselines on a
small grid, each call on one of several rotated copies of its inputs (see bench/micro.py). The floor
bytes and achieved GB/s go into each benchmark's ``extra_info``; compare runs with
``pytest bench/ --benchmark-autosave`` and ``pytest-benchmark compare``.

Environment: SPECDEC_BENCH_DEVICE=cpu|cuda (default: cuda when available), SPECDEC_BENCH_GRID=small
(default) or a grid of bench/micro.py (quick, cpu-default, full).

``test_cuda_matches_eager`` is the correctness check of the compiled kernels: on CUDA, with
TRITON_INTERPRET unset, the fused Triton backend must emit the eager reference's tokens for the
same seed. It is skipped where there is no CUDA device.
"""

from __future__ import annotations

import itertools
import os

import pytest
import torch

import specdec_ext
from bench import micro
from bench.harness.env import device_name

DEVICE = os.environ.get("SPECDEC_BENCH_DEVICE") or ("cuda" if torch.cuda.is_available() else "cpu")
GRID = os.environ.get("SPECDEC_BENCH_GRID", "small")
SMALL = {"batch": (1, 16), "k": (4,), "vocab": (32000,)}


def _cases() -> list[micro.Case]:
    axes = SMALL if GRID == "small" else micro.GRIDS[GRID]
    cases = []
    for batch, vocab, dtype, filters in itertools.product(axes["batch"], axes["vocab"], micro.DTYPES, (False, True)):
        cases += [micro.Case("verify", batch, k, vocab, dtype, filters) for k in axes["k"]]
        cases.append(micro.Case("sample", batch, 0, vocab, dtype, filters))
    return cases


def _sync() -> None:
    if DEVICE == "cuda":
        torch.cuda.synchronize()


@pytest.mark.parametrize("backend", ["triton", "cpp", "eager", "baseline"])
@pytest.mark.parametrize("case", _cases(), ids=lambda c: c.label().replace(" ", "-").replace("=", ""))
def test_latency(benchmark, case, backend):
    name = micro.BASELINE[case.op] if backend == "baseline" else backend
    if name not in micro.backends_for(case.op, DEVICE):
        pytest.skip(f"{name} is not available on {DEVICE}")
    calls = itertools.cycle([micro.make_call(case, name, inputs) for inputs in micro.rotated_inputs(case, DEVICE)])

    def step():
        next(calls)()
        _sync()  # the device time belongs to the call

    step()  # compile and warm up outside the statistics
    benchmark.group = case.label()
    benchmark.extra_info.update(device=device_name(DEVICE), backend=name, floor_bytes=case.floor_bytes)
    benchmark(step)
    stats = getattr(benchmark, "stats", None)
    if stats is not None:  # None under --benchmark-disable
        benchmark.extra_info["achieved_gbs"] = case.floor_bytes / stats.stats.median / 1e9


CUDA_CASES = [
    # (batch, K, V, dtype, parameters): chunk counts, tile tails, dtypes, filters, greedy and ragged rows.
    (1, 4, 128256, torch.float32, {}),
    (1, 4, 128256, torch.bfloat16, {}),
    (3, 3, 1000, torch.float32, {}),
    (8, 8, 32000, torch.float16, {}),
    (64, 8, 128256, torch.bfloat16, {}),
    (256, 1, 151936, torch.float32, {}),
    (4, 4, 50257, torch.float32, {"temperature": 0.7, "top_k": 40, "top_p": 0.8}),
    (16, 4, 32000, torch.bfloat16, dict(micro.FILTERS)),
    (4, 4, 3000, torch.float32, {"temperature": torch.tensor([0.0, 1.0, 0.0, 0.6])}),
    (4, 4, 2000, torch.float32, {"num_draft_tokens": torch.tensor([0, 1, 4, 2]), "top_p": 0.9}),
]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") == "1", reason="TRITON_INTERPRET=1 would interpret, not compile: unset it")
@pytest.mark.parametrize("draft_kind", ["logits", "one-hot"])
@pytest.mark.parametrize("batch,k,vocab,dtype,params", CUDA_CASES, ids=lambda v: str(v).replace(" ", "") if not isinstance(v, dict) else "-".join(v) or "plain")
def test_cuda_matches_eager(batch, k, vocab, dtype, params, draft_kind):
    """Compiled Triton on CUDA emits exactly the eager reference's tokens (reference run on CPU)."""
    if "triton" not in specdec_ext.available_backends("cuda"):
        pytest.skip("triton is not usable on CUDA here")
    g = torch.Generator().manual_seed(batch * 1000 + k)
    target = (2 * torch.randn(batch, k + 1, vocab, generator=g)).to(dtype)
    draft = (target[:, :k].float() + 0.5 * torch.randn(batch, k, vocab, generator=g)).to(dtype)
    tokens = torch.multinomial(draft.float().softmax(-1).reshape(batch * k, vocab), 1, generator=g).reshape(batch, k)
    draft = draft if draft_kind == "logits" else None
    outs = {}
    for device, backend in (("cuda", "triton"), ("cpu", "eager")):
        moved = {key: value.to(device) if isinstance(value, torch.Tensor) else value for key, value in params.items()}
        # One CPU generator for both: the Philox key is drawn on the host, then moved to the device.
        out = specdec_ext.verify(
            target.to(device), None if draft is None else draft.to(device), tokens.to(device),
            generator=torch.Generator().manual_seed(7), backend=backend, **moved,
        )
        outs[backend] = (out.tokens.cpu(), out.num_accepted.cpu())
    fused, eager = outs["triton"], outs["eager"]
    differ = (fused[0] != eager[0]).any(dim=1).nonzero().flatten().tolist()
    assert not differ, f"rows {differ[:8]} differ:\ntriton {fused[0][differ[:4]].tolist()}\neager  {eager[0][differ[:4]].tolist()}"
    assert torch.equal(fused[1], eager[1])
