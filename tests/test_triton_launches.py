"""What one Triton call costs the device, counted on the interpreter: launches per call (two without
top-k / top-p, four with them), no tensor allocated or computed besides the outputs once the
workspace is warm, and the same launches the GPU model (bench/gpu_model.py) plans and compiles."""

from __future__ import annotations

import contextlib

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import specdec_ext
from specdec_ext import _params, _triton_backend

pytestmark = pytest.mark.skipif("triton" not in specdec_ext.available_backends("cpu"), reason="triton is not installed")

# aten ops that allocate or compute (views, metadata and the interpreter's own copies are left out).
_VIEW_OPS = {"view", "_unsafe_view", "slice", "select", "as_strided", "alias", "detach", "expand", "t", "transpose", "unsqueeze", "squeeze", "reshape",
             "permute", "_reshape_alias", "lift_fresh", "unbind", "split", "split_with_sizes"}


class _Recorder(TorchDispatchMode):
    """Every aten op run while active, except views; paused inside kernel launches."""

    def __init__(self):
        super().__init__()
        self.ops: list[str] = []
        self.paused = False

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if not self.paused:
            name = func.overloadpacket.__name__
            if name not in _VIEW_OPS:
                self.ops.append(name)
        return func(*args, **(kwargs or {}))


@contextlib.contextmanager
def _count_launches(recorder: _Recorder):
    """Patch every kernel's launcher to count launches (and pause the op recorder inside them:
    the interpreter copies arguments with aten ops of its own)."""
    launched: list[str] = []
    kernels = _triton_backend.kernels()
    originals = {}
    for name in ("cutoff_kernel", "line_stats_kernel", "race_kernel"):
        kernel = getattr(kernels, name)
        originals[name] = kernel.run

        def run(*args, _name=name, _run=kernel.run, **kwargs):
            launched.append(_name)
            recorder.paused = True
            try:
                return _run(*args, **kwargs)
            finally:
                recorder.paused = False

        kernel.run = run
    try:
        yield launched
    finally:
        for name, run in originals.items():
            getattr(kernels, name).run = run


def _inputs(filtered: bool, logprobs: bool):
    g = torch.Generator().manual_seed(0)
    target = torch.randn(2, 3, 700, generator=g)
    draft = target[:, :2] + torch.randn(2, 2, 700, generator=g)
    tokens = torch.randint(0, 700, (2, 2), generator=g)
    kw = {"temperature": 0.8, "top_k": 30 if filtered else None, "top_p": 0.9 if filtered else None, "num_draft_tokens": None, "generator": None,
          "check": False, "seeds": torch.tensor([3, 4]), "offsets": torch.tensor([10, 0])}
    if logprobs:
        kw |= {"return_logprobs": "raw", "return_accept_probs": True}
    return _params.validate_verify(target, draft, tokens, **kw)


@pytest.mark.parametrize("filtered,logprobs,expected", [(False, False, 2), (False, True, 2), (True, True, 4)])
def test_launches_and_allocations_per_call(filtered, logprobs, expected):
    args = _inputs(filtered, logprobs)
    _triton_backend.verify(args, 7)  # warm-up: the workspace and the launch plan are made once
    recorder = _Recorder()
    with _count_launches(recorder) as launched, recorder:
        out = _triton_backend.verify(args, 7)
    assert len(launched) == expected, launched
    outputs = 2 + (2 if logprobs else 0)
    # Only the outputs are allocated (torch.empty), and nothing else runs on the device.
    assert recorder.ops == ["empty"] * outputs, recorder.ops
    assert out[0].shape == (2, 3)
    # The GPU model plans the very same launches.
    planned = [launch.name.split(":")[0] for launch in _triton_backend.launches_for(args, 7)]
    assert [name.replace("_kernel", "") for name in launched] == planned


def test_the_workspace_counters_reset_themselves():
    """The race's arrival counters are back at zero after every call (a CUDA graph replays the
    launches with the counters it captured), whatever the number of chunks per row."""
    args = _inputs(False, False)
    for chunks in (1, 3, 5):
        _triton_backend.verify(args, 1, race_chunks=chunks, race_block=64)
        ws = _triton_backend.workspace(args.target_logits.device)
        assert int(ws.counters.abs().sum()) == 0
    # The whole-line search's counters too (top-k 600 of 700 values: every line searches).
    args = _params.validate_verify(*_inputs(False, False)[:3], temperature=0.8, top_k=600, top_p=None, num_draft_tokens=None, generator=None, check=False)
    _triton_backend.verify(args, 1, select_chunk=256, stats_tile=128, stats_parts=2)
    ws = _triton_backend.workspace(args.target_logits.device)
    assert int(ws.counters.abs().sum()) == 0


def test_batch_size_does_not_enter_the_compiled_signature():
    """Batch-dependent integers are not specialised by the JIT (a new batch size is no new compile
    or graph capture); the constexprs depend on dtype, flags, K and V only. (The compile check,
    tests/triton_compile_check.py, also compares the JIT's whole specialisation across batch sizes.)"""
    race = _triton_backend.kernels().race_kernel
    stats = _triton_backend.kernels().line_stats_kernel
    cutoffs = _triton_backend.kernels().cutoff_kernel
    for kernel, names in ((race, ("batch", "base_key", "t_parts", "d_parts", "tiles_per_chunk", "num_chunks")), (stats, ("batch", "tiles_per_part")),
                          (cutoffs, ("batch", "t_parts", "d_parts"))):
        declared = getattr(kernel, "do_not_specialize", None) or getattr(kernel, "kwargs", {}).get("do_not_specialize", ())
        dns = set(declared)
        assert set(names) <= dns, (kernel, dns)
    constexprs = []
    for batch in (1, 3, 64):
        g = torch.Generator().manual_seed(batch)
        target = torch.randn(batch, 3, 500, generator=g).to("meta")
        args = _params.VerifyArgs(
            target, torch.empty(batch, 2, 500, device="meta"), torch.empty(batch, 2, dtype=torch.int64, device="meta"),
            *(torch.empty(batch, dtype=dt, device="meta") for dt in (torch.float32, torch.int64, torch.float32, torch.int64)), None, False, False,
        )
        constexprs.append([launch.constexprs for launch in _triton_backend.launches_for(args, 0, sm_count=132)])
    assert constexprs[0] == constexprs[1] == constexprs[2]
