"""The C++ extension as a part of a running program: it releases the GIL, checks where every tensor
argument lives, survives exceptions on any of its threads, normalises accurately, and is built
against (and only loads beside) the installed torch."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest
import torch

from specdec_ext import _cpp_backend

ROOT = Path(__file__).resolve().parents[2]
needs_cpp = pytest.mark.skipif(not _cpp_backend.is_available(), reason=f"C++ extension unavailable: {_cpp_backend.unavailable_reason()}")


def _arguments(batch=2, k=2, vocab=64):
    g = torch.Generator().manual_seed(0)
    return {
        "target_logits": torch.randn(batch, k + 1, vocab, generator=g),
        "draft_logits": torch.randn(batch, k, vocab, generator=g),
        "draft_tokens": torch.randint(0, vocab, (batch, k), generator=g),
        "temperature": torch.ones(batch),
        "top_k": torch.zeros(batch, dtype=torch.int64),
        "top_p": torch.ones(batch),
        "num_draft_tokens": torch.full((batch,), k),
        "seeds": torch.arange(batch),
        "offsets": torch.zeros(batch, dtype=torch.int64),
    }


# --------------------------------------------------------------------------------------------
# The GIL


def _entry_point_calls(batch=8, k=7, vocab=128256):
    """verify, block_verify and tree_verify on the same lines (a chain as a tree), with top-p 0.9 or
    none (filtered lines make a call longer)."""
    args = _arguments(batch=batch, k=k, vocab=vocab)
    parents = torch.arange(-1, k - 1).expand(batch, k)  # a chain: node i's parent is node i - 1
    tree_target = args["target_logits"]  # contexts 0 .. k
    tree_draft = torch.cat([args["draft_logits"], args["draft_logits"][:, -1:]], dim=1)  # a draft line per context

    def calls(top_p):
        row = dict(args, top_p=torch.full((batch,), top_p))
        params = (row["temperature"], row["top_k"], row["top_p"])
        return {
            "verify": lambda: _cpp_backend._C.verify(*row.values(), 1, 1, True, 2, True),  # base_key, stream, check, raw logprobs, accept_probs
            "block": lambda: _cpp_backend._C.block_verify(row["target_logits"], row["draft_logits"], row["draft_tokens"], *params, row["num_draft_tokens"],
                                                          row["seeds"], row["offsets"], 1, True, 2),
            "tree": lambda: _cpp_backend._C.tree_verify(tree_target, tree_draft, row["draft_tokens"], parents, *params, row["num_draft_tokens"], row["seeds"],
                                                        row["offsets"], 1, True, True),
        }

    return calls


@needs_cpp
@pytest.mark.parametrize("entry", ["verify", "block", "tree"])
def test_the_gil_is_released_during_a_call(entry):
    """Another Python thread keeps running while a call computes. With the GIL held it could run
    only in the switch interval after the call (set to 0.1 ms here), so its count would stay near
    zero whatever the call's length; released, it counts for the whole call. (32 rows: calls long
    enough that a busy machine's slower spinner still counts well past the threshold.)"""
    calls = _entry_point_calls(batch=32)
    count = [0]
    stop = threading.Event()

    def spin():
        while not stop.is_set():
            count[0] += 1

    threads, interval = torch.get_num_threads(), sys.getswitchinterval()
    torch.set_num_threads(1)  # the kernel on one core, the spinning thread free to take the other
    sys.setswitchinterval(1e-4)
    spinner = threading.Thread(target=spin, daemon=True)
    spinner.start()
    during = []
    try:
        for _ in range(3):
            for top_p in (0.9, 1.0):
                call = calls(top_p)[entry]
                before = count[0]
                call()
                during.append(count[0] - before)
    finally:
        stop.set()
        spinner.join()
        torch.set_num_threads(threads)
        sys.setswitchinterval(interval)
    assert max(during) > 100_000, during  # (held: at most ~20k here, from the switches around each call)


# --------------------------------------------------------------------------------------------
# Every tensor argument is checked (a meta tensor has no data; a CUDA one is no host pointer)


@needs_cpp
@pytest.mark.parametrize("name", list(_arguments()))
def test_every_tensor_argument_must_be_on_the_cpu(name):
    args = _arguments()
    args[name] = args[name].to("meta")
    with pytest.raises(ValueError, match=f"{name} must be a CPU tensor"):
        _cpp_backend._C.verify(*args.values(), 0)
    if name in ("target_logits", "temperature", "top_k", "top_p", "seeds", "offsets"):
        sample_args = {"logits": args["target_logits"][:, 0], **{n: args[n] for n in ("temperature", "top_k", "top_p", "seeds", "offsets")}}
        with pytest.raises(ValueError, match=f"{'logits' if name == 'target_logits' else name} must be a CPU tensor"):
            _cpp_backend._C.sample(*sample_args.values(), 0)
    if name != "draft_logits":  # (block and tree calls take the same row tensors; a tree's draft has N+1 lines)
        block_args = [args[n] for n in ("target_logits", "draft_logits", "draft_tokens", "temperature", "top_k", "top_p", "num_draft_tokens", "seeds", "offsets")]
        with pytest.raises(ValueError, match=f"{name} must be a CPU tensor"):
            _cpp_backend._C.block_verify(*block_args, 0)
        parents = torch.full((2, 2), -1)  # two children of the root
        tree_args = [args["target_logits"], None, args["draft_tokens"], parents, args["temperature"], args["top_k"], args["top_p"], args["num_draft_tokens"],
                     args["seeds"], args["offsets"]]
        with pytest.raises(ValueError, match=f"{name} must be a CPU tensor|num_nodes must be a CPU tensor"):
            _cpp_backend._C.tree_verify(*tree_args, 0)


class _Logits(torch.Tensor):
    """A tensor subclass: it may override what a call does, so the C++ trip leaves it to Python."""


@needs_cpp
def test_launch_outputs_take_the_first_calls_tensors_and_allocate_the_outputs():
    """_C.LaunchOutputs (the prepared Triton call's host work before its launches): a call with the
    first call's sizes, dtypes, device and layout gets fresh outputs of the right shapes, dtypes and
    inference mode; anything else gets None, having allocated nothing."""
    a = _arguments(batch=3, k=2, vocab=16)
    target, draft, drafts, seeds = a["target_logits"], a["draft_logits"], a["draft_tokens"], a["seeds"]
    host = _cpp_backend.launch_outputs(target, draft, drafts, sample=False, logprobs=True, accept_probs=False)
    tokens, num_accepted, logprobs, accept_probs = host(target, draft, drafts, seeds, None)
    assert (tokens.shape, tokens.dtype, num_accepted.shape, num_accepted.dtype) == ((3, 3), torch.int64, (3,), torch.int64)
    assert (logprobs.shape, logprobs.dtype, accept_probs) == ((3, 3), torch.float32, None)
    assert host(target, draft, drafts, None, None)[0] is not tokens  # (fresh outputs each call)
    with torch.inference_mode():
        assert host(target, draft, drafts, None, None)[0].is_inference()
    assert not host(target, draft, drafts, None, None)[0].is_inference()
    strided = torch.zeros(3, 3, 20)[:, :, :16]
    left = [(strided, draft, drafts, None, None), (target.double(), draft, drafts, None, None), (target[:2], draft, drafts, None, None),
            (target.as_subclass(_Logits), draft, drafts, None, None), (target, None, drafts, None, None), (target, draft, drafts.int(), None, None),
            ("logits", draft, drafts, None, None), (target, draft, drafts, seeds.int(), None), (target, draft, drafts, None, torch.arange(6)[::2]),
            (target, draft, drafts, seeds[:2], None), (target, draft, drafts, seeds.reshape(3, 1), None)]
    for call in left:
        assert host(*call) is None
    # Bound to a non-contiguous first call: that call's strides, not contiguity.
    wide = _cpp_backend.launch_outputs(strided, draft, drafts, sample=False, logprobs=False, accept_probs=True)
    assert wide(strided, draft, drafts, None, None)[3].shape == (3, 2) and wide(target, draft, drafts, None, None) is None
    one_hot = _cpp_backend.launch_outputs(target, None, drafts, sample=False, logprobs=False, accept_probs=False)
    assert one_hot(target, draft, drafts, None, None) is None and one_hot(target, None, drafts, None, None)[2:] == (None, None)
    sample = _cpp_backend.launch_outputs(target[:, 0].contiguous(), None, None, sample=True, logprobs=False, accept_probs=False)
    drawn = sample(target[:, 0].contiguous(), None, None, None, None)
    assert type(drawn) is torch.Tensor and (drawn.shape, drawn.dtype) == ((3,), torch.int64)
    assert sample(target[:, 0], None, None, None, None) is None  # (rows (K + 1) V apart: not the first call's layout)


@needs_cpp
def test_key_tensors_must_be_int64_rows():
    args = _arguments()
    for name, bad in (("seeds", torch.arange(2, dtype=torch.int32)), ("offsets", torch.zeros(3, dtype=torch.int64)), ("seeds", torch.zeros(2, 1, dtype=torch.int64))):
        call = dict(args, **{name: bad})
        with pytest.raises(ValueError, match=name):
            _cpp_backend._C.verify(*call.values(), 0)
    with pytest.raises(ValueError, match="stream must be 1"):
        _cpp_backend._C.verify(*args.values(), 0, 3)
    with pytest.raises(ValueError, match="logprobs must be 0"):
        _cpp_backend._C.verify(*args.values(), 0, 1, True, 5)


# --------------------------------------------------------------------------------------------
# Exceptions on the kernel's threads


@needs_cpp
@pytest.mark.parametrize("scheduler", ["pool", "openmp"])
@pytest.mark.parametrize("throw_on", ["caller", "helper"])
def test_a_throwing_item_stops_the_pass_and_propagates(scheduler, throw_on):
    """An item that throws on the calling thread or on a helper: the call raises the error once every
    item already started has finished; nothing runs after it returned (helpers would otherwise work
    on the caller's freed stack) and a helper's failure never leaves the caller waiting forever.
    In a subprocess with a timeout, so a hang is a failure, not a stuck suite."""
    if scheduler == "openmp" and not _cpp_backend._C.openmp_linked():
        pytest.skip("built without torch's OpenMP runtime")
    script = textwrap.dedent(
        f"""
        import time, torch
        from specdec_ext import _cpp_backend
        torch.set_num_threads(2)
        C = _cpp_backend._C
        try:
            C.scheduler_selftest("{scheduler}", 64, 300, "{throw_on}")
        except RuntimeError as error:
            assert "injected failure" in str(error), error
        else:
            raise SystemExit("no error propagated")
        started = C.scheduler_selftest_started()
        time.sleep(0.2)
        assert C.scheduler_selftest_started() == started, "an item started after the call returned"
        assert C.scheduler_selftest("{scheduler}", 16, 50, "none") == 0  # the scheduler still works
        print("ok")
        """
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0 and result.stdout.strip().endswith("ok"), result.stdout[-2000:] + result.stderr[-3000:]


# --------------------------------------------------------------------------------------------
# The normaliser


@needs_cpp
@pytest.mark.parametrize("temperature", [1.0, 0.6])
def test_normaliser_is_accurate_against_float64(temperature):
    """z = sum exp(s - m) over a 128k line: relative error within float32 rounding of the result.
    (Float32 lane sums, 512 values per lane and chunk, lose 2.6e-7 on a 3 * randn line.)"""
    g = torch.Generator().manual_seed(5)
    lines = torch.cat([torch.randn(4, 128256, generator=g) * 3, torch.zeros(1, 128256), torch.rand(2, 128256, generator=g) - 30.0])
    m, z = _cpp_backend._C.line_stats(lines, temperature)
    scaled = lines * torch.tensor(1.0 / temperature, dtype=torch.float32) if temperature != 1.0 else lines
    assert torch.equal(m, scaled.amax(dim=1))
    exact = torch.exp(scaled.double() - scaled.double().amax(dim=1, keepdim=True)).sum(dim=1)
    relative = ((z - exact).abs() / exact).max().item()
    assert relative < 1.2e-7, relative


# --------------------------------------------------------------------------------------------
# Building against the installed torch


def test_build_requirements_do_not_pull_torch():
    section = (ROOT / "pyproject.toml").read_text().split("[build-system]", 1)[1].split("\n[", 1)[0]
    requires = re.findall(r'"([^"]+)"', re.search(r"requires\s*=\s*\[([^\]]*)\]", section).group(1))
    assert requires and not [r for r in requires if re.match(r"\s*torch\b", r, re.IGNORECASE)], requires


def _setup_module():
    spec = importlib.util.spec_from_file_location("specdec_setup", ROOT / "setup.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # (setup() itself runs only as __main__)
    return module


def test_isolated_build_finds_the_installed_torch(tmp_path):
    """pip's isolated build hides the environment's site-packages (PYTHONNOUSERSITE, PYTHONPATH and a
    sitecustomize that drops them from sys.path); setup.py still finds the installed torch."""
    (tmp_path / "sitecustomize.py").write_text(
        "import sys\nsys.path[:] = [p for p in sys.path if 'site-packages' not in p and 'dist-packages' not in p]\n"
    )
    isolated = dict(os.environ, PYTHONNOUSERSITE="1", PYTHONPATH=str(tmp_path))
    hidden = subprocess.run([sys.executable, "-c", "import torch"], env=isolated, capture_output=True, text=True, timeout=120)
    assert hidden.returncode != 0  # the simulation hides torch, as pip's build environment does
    site = _setup_module().installed_torch_site(isolated)
    assert site is not None and Path(site, "torch", "__init__.py").exists()
    assert Path(site).resolve() == Path(torch.__file__).resolve().parent.parent


def test_a_build_for_another_torch_is_refused_with_a_rebuild_message():
    assert _cpp_backend.build_mismatch(torch.__version__, torch.__version__) is None
    message = _cpp_backend.build_mismatch("2.11.0+cpu", "2.13.0+cpu")
    assert "built against torch 2.11.0+cpu" in message and "2.13.0+cpu is installed" in message
    assert "pip install --no-build-isolation" in message
    if _cpp_backend.is_available():
        assert _cpp_backend._C.torch_version_at_build() == torch.__version__


@pytest.mark.slow  # compiles the kernel again; CI runs it (make test-slow)
@pytest.mark.skipif(not Path("/usr/bin/objdump").exists(), reason="needs objdump")
def test_portable_fallback_is_compiled_for_the_baseline(tmp_path):
    """csrc/kernel_base.cpp gets -march=x86-64 / armv8-a whatever the environment's flags say: built
    with a -march=haswell compiler command it still holds no AVX instruction."""
    setup = _setup_module()
    if not setup.baseline_flags() or "x86" not in setup.baseline_flags()[0]:
        pytest.skip("the AVX check applies to x86-64")
    compiler = os.environ.get("CXX", "c++")
    # (-O1 keeps the compile short; the explicit vector code still compiles to vector instructions.)
    obj = setup.compile_baseline_object(tmp_path / "kernel_base.o", cxx=[compiler, "-march=haswell"], extra_flags=("-O1",))
    listing = subprocess.run(["objdump", "-d", "--no-show-raw-insn", str(obj)], capture_output=True, text=True, check=True).stdout
    vex = [line for line in listing.splitlines() if re.match(r"\s*[0-9a-f]+:\s+v[a-z0-9]+\s", line)]
    assert not vex, vex[:5]  # no AVX (VEX-encoded) instruction at all
    assert "xmm" in listing  # (SSE2 vectors)
