"""specdec_ext.Verifier / Sampler: the same tokens as the default calls for the same keys on every
backend, calls checked against what they were built for, torch.compile(fullgraph=True), and a
Triton call that allocates only its outputs and reads nothing back (what CUDA-graph capture needs)."""

from __future__ import annotations

import contextlib

import pytest
import torch
from conftest import all_cpu_backends
from torch.utils._python_dispatch import TorchDispatchMode

import specdec_ext
from specdec_ext import _cpp_backend, _philox, _triton_backend

B, K, V = 3, 3, 40
FILTERED = {"temperature": 0.7, "top_k": 9, "top_p": 0.9}
PER_ROW = {"temperature": torch.tensor([0.0, 1.0, 0.5]), "top_k": torch.tensor([0, 4, 0]), "top_p": torch.tensor([1.0, 1.0, 0.8])}


def _inputs(seed=0, batch=B, k=K, vocab=V, draft_vocab=V):
    g = torch.Generator().manual_seed(seed)
    target = torch.randn(batch, k + 1, vocab, generator=g) * 2
    draft = target[:, :k, :draft_vocab] + torch.randn(batch, k, draft_vocab, generator=g)
    drafts = torch.multinomial(draft.softmax(-1).reshape(-1, draft_vocab), 1, generator=g).reshape(batch, k)
    seeds = torch.randint(0, 2**62, (batch,), generator=g)
    offsets = torch.randint(0, 2**40, (batch,), generator=g)
    return target, draft, drafts, seeds, offsets


@pytest.fixture(params=["cpp", "python"])
def host_outputs(request, monkeypatch) -> str:
    """Where a prepared Triton call checks its tensors and allocates its outputs: in one trip to the
    C++ extension (``_C.LaunchOutputs``), or in Python (as without the extension). Returns the name
    of the aten op that allocates an output on that path."""
    if request.param == "python":
        monkeypatch.setattr(_cpp_backend, "launch_outputs", lambda *args: None)
        return "empty_like"
    if not hasattr(_cpp_backend._C, "LaunchOutputs"):
        pytest.skip("the C++ extension is not built")
    return "empty"


def _same(a, b) -> None:
    assert torch.equal(a.tokens, b.tokens) and torch.equal(a.num_accepted, b.num_accepted)
    for x, y in ((a.logprobs, b.logprobs), (a.accept_probs, b.accept_probs)):
        assert (x is None) == (y is None)
        if x is not None:
            torch.testing.assert_close(x, y, rtol=0, atol=0, equal_nan=True)


@pytest.mark.parametrize("backend", all_cpu_backends())
@pytest.mark.parametrize("params", [{}, FILTERED, PER_ROW], ids=["plain", "filtered", "per-row"])
def test_verifier_gives_the_default_calls_tokens(backend, params):
    """Same keys, same tokens, logprobs and accept_probs as verify(): seeds and offsets, a generator
    with ragged lengths; and (plain parameters: the interpreter is slow) torch's default generator,
    one-hot drafts, a smaller draft vocabulary, block verification."""
    target, draft, drafts, seeds, offsets = _inputs()
    ragged = torch.tensor([3, 0, 2])
    outputs = {"return_logprobs": "processed", "return_accept_probs": True}
    verifier = specdec_ext.Verifier(B, K, V, backend=backend, **params, **outputs)
    assert verifier.backend == backend
    expected = specdec_ext.verify(target, draft, drafts, seeds=seeds, offsets=offsets, backend=backend, **params, **outputs)
    _same(verifier(target, draft, drafts, seeds=seeds, offsets=offsets), expected)
    expected = specdec_ext.verify(target, draft, drafts, num_draft_tokens=ragged, generator=torch.Generator().manual_seed(4), backend=backend,
                                  **params, **outputs)
    _same(verifier(target, draft, drafts, num_draft_tokens=ragged, generator=torch.Generator().manual_seed(4)), expected)
    if params and backend == "triton":
        return
    torch.manual_seed(8)  # no generator: torch's default one, as for verify()
    got = verifier(target, draft, drafts)
    torch.manual_seed(8)
    _same(got, specdec_ext.verify(target, draft, drafts, backend=backend, **params, **outputs))

    one_hot = specdec_ext.Verifier(B, K, V, one_hot_drafts=True, backend=backend, **params)
    _same(one_hot(target, None, drafts, seeds=seeds), specdec_ext.verify(target, None, drafts, seeds=seeds, backend=backend, **params))
    small = specdec_ext.Verifier(B, K, V, draft_vocab_size=30, backend=backend, **params)
    _, small_draft, small_drafts, _, _ = _inputs(draft_vocab=30)
    _same(small(target, small_draft, small_drafts, seeds=seeds), specdec_ext.verify(target, small_draft, small_drafts, seeds=seeds, backend=backend, **params))
    if backend in specdec_ext.available_backends("cpu", "verify_block"):
        block = specdec_ext.Verifier(B, K, V, method="block", return_logprobs="raw", backend=backend, **params)
        expected = specdec_ext.verify(target, draft, drafts, method="block", return_logprobs="raw", seeds=seeds, offsets=offsets, backend=backend, **params)
        _same(block(target, draft, drafts, seeds=seeds, offsets=offsets), expected)


@pytest.mark.parametrize("backend", all_cpu_backends())
def test_sampler_gives_the_default_calls_tokens(backend):
    target, _, _, seeds, offsets = _inputs(seed=1)
    logits = target[:, 0]
    for params in ({}, FILTERED, PER_ROW) if backend != "triton" else ({}, FILTERED):
        sampler = specdec_ext.Sampler(B, V, backend=backend, **params)
        assert torch.equal(sampler(logits, seeds=seeds, offsets=offsets), specdec_ext.sample(logits, seeds=seeds, offsets=offsets, backend=backend, **params))
        g1, g2 = torch.Generator().manual_seed(2), torch.Generator().manual_seed(2)
        assert torch.equal(sampler(logits, generator=g1), specdec_ext.sample(logits, generator=g2, backend=backend, **params))
    bf16 = specdec_ext.Sampler(B, V, dtype=torch.bfloat16, temperature=0.0, backend=backend)
    assert torch.equal(bf16(logits.bfloat16()), logits.bfloat16().float().argmax(-1))


@pytest.mark.parametrize("backend", ["eager"] + (["cpp"] if "cpp" in specdec_ext.available_backends("cpu") else []))
def test_calls_are_checked_against_the_verifier(backend):
    """The same messages whichever backend runs (the C++ backend checks a call in C++ first and
    leaves every call it does not take to this validation)."""
    target, draft, drafts, seeds, _ = _inputs()
    verifier = specdec_ext.Verifier(B, K, V, backend=backend)
    with pytest.raises(ValueError, match=r"target_logits: this Verifier takes shape \(3, 4, 40\) torch.float32 on cpu, got shape \(3, 4, 41\)"):
        verifier(torch.randn(B, K + 1, V + 1), draft, drafts)
    with pytest.raises(ValueError, match="target_logits: this Verifier takes .* got shape .* torch.bfloat16"):
        verifier(target.bfloat16(), draft, drafts)
    with pytest.raises(ValueError, match="draft_logits: this Verifier takes draft logits"):
        verifier(target, None, drafts)
    with pytest.raises(ValueError, match="one_hot_drafts=True"):
        specdec_ext.Verifier(B, K, V, one_hot_drafts=True, backend=backend)(target, draft, drafts)
    # What no verification would take gets the validator's message.
    with pytest.raises(ValueError, match=r"draft_tokens must have shape \(batch, K\)"):
        verifier(target, draft, drafts[:, :2])
    with pytest.raises(ValueError, match="draft_tokens must be int32 or int64"):
        verifier(target, draft, drafts.float())
    with pytest.raises(ValueError, match="target_logits must be a tensor"):
        verifier(target.tolist(), draft, drafts)
    with pytest.raises(ValueError, match="draft_tokens is on meta"):
        verifier(target, draft, drafts.to("meta"))
    with pytest.raises(ValueError, match=r"seeds must have shape \(3,\)"):
        verifier(target, draft, drafts, seeds=seeds[:2])
    with pytest.raises(ValueError, match="offsets must be an int64 tensor"):
        verifier(target, draft, drafts, offsets=seeds.int())
    with pytest.raises(ValueError, match=r"num_draft_tokens must lie in \[0, K=3\]; row 1"):
        verifier(target, draft, drafts, num_draft_tokens=torch.tensor([0, 4, 1]))
    with pytest.raises(ValueError, match="generator must be a torch.Generator"):
        verifier(target, draft, drafts, generator=3)
    assert verifier(target, draft, drafts.int(), seeds=seeds).tokens.shape == (B, K + 1)  # int32 drafts are fine
    # Calls the C++ check leaves to the Python path give the same tokens: other strides, a tensor
    # subclass, a generator, ragged drafts.
    same = verifier(target, draft, drafts, seeds=seeds).tokens
    assert torch.equal(verifier(target.transpose(0, 1).contiguous().transpose(0, 1), draft, drafts, seeds=seeds).tokens, same)
    assert torch.equal(verifier(torch.nn.Parameter(target, requires_grad=False), draft, drafts, seeds=seeds).tokens, same)
    assert torch.equal(verifier(target, draft, drafts, seeds=seeds, num_draft_tokens=torch.full((B,), K)).tokens, same)
    g1, g2 = torch.Generator().manual_seed(4), torch.Generator().manual_seed(4)
    assert torch.equal(verifier(target, draft, drafts, generator=g1).tokens, specdec_ext.verify(target, draft, drafts, generator=g2, backend="eager").tokens)
    sampler = specdec_ext.Sampler(B, V, backend=backend)
    with pytest.raises(ValueError, match=r"logits: this Sampler takes shape \(3, 40\)"):
        sampler(target[:2, 0])
    with pytest.raises(ValueError, match="logits must be a 2-D"):
        sampler(target)


def test_construction_validates_once():
    with pytest.raises(ValueError, match="temperature must be a finite number >= 0"):
        specdec_ext.Verifier(B, K, V, temperature=-1.0)
    with pytest.raises(ValueError, match=r"top_p must lie in \(0, 1\]; row 2"):
        specdec_ext.Verifier(B, K, V, top_p=torch.tensor([1.0, 0.5, 0.0]))
    with pytest.raises(ValueError, match=r"temperature must be a scalar or a \(3,\) tensor"):
        specdec_ext.Sampler(B, V, temperature=torch.ones(2))
    with pytest.raises(ValueError, match="method must be one of"):
        specdec_ext.Verifier(B, K, V, method="tree")
    with pytest.raises(ValueError, match="return_accept_probs is defined for token-wise verification only"):
        specdec_ext.Verifier(B, K, V, method="block", return_accept_probs=True)
    with pytest.raises(ValueError, match="return_logprobs must be False"):
        specdec_ext.Verifier(B, K, V, return_logprobs="log")
    with pytest.raises(ValueError, match=r"backend='triton' cannot run verification on meta .*available: \['eager'\]"):
        specdec_ext.Verifier(B, K, V, device="meta", backend="triton")
    with pytest.raises(ValueError, match="backend must be one of"):
        specdec_ext.Sampler(B, V, backend="cuda")
    with pytest.raises(ValueError, match="draft_vocab_size .* must be at most vocab_size"):
        specdec_ext.Verifier(B, K, V, draft_vocab_size=V + 1)
    with pytest.raises(ValueError, match="dtype must be torch.float32"):
        specdec_ext.Verifier(B, K, V, dtype=torch.float64)
    with pytest.raises(ValueError, match="batch_size must be an integer >= 0"):
        specdec_ext.Sampler(-1, V)
    assert "backend='cpp'" in repr(specdec_ext.Verifier(B, K, V)) and "top_k=9" in repr(specdec_ext.Sampler(B, V, top_k=9))


@pytest.mark.parametrize("backend", all_cpu_backends())
def test_check_raises_and_check_false_blanks(backend):
    target, draft, drafts, seeds, _ = _inputs(seed=3)
    bad = target.clone()
    bad[1, 0, 5] = float("nan")
    with pytest.raises(ValueError, match="^target_logits: row 1 contains NaN"):
        specdec_ext.Verifier(B, K, V, backend=backend)(bad, draft, drafts, seeds=seeds)
    out = specdec_ext.Verifier(B, K, V, backend=backend, check=False)(bad, draft, drafts, seeds=seeds)
    clean = specdec_ext.verify(target, draft, drafts, seeds=seeds, backend=backend)
    assert (out.tokens[1] == -1).all() and int(out.num_accepted[1]) == 0
    assert torch.equal(out.tokens[[0, 2]], clean.tokens[[0, 2]])
    negative = seeds.clone()
    negative[2] = -1
    with pytest.raises(ValueError, match="seeds: row 2 is negative"):
        specdec_ext.Verifier(B, K, V, backend=backend)(target, draft, drafts, seeds=negative)
    with pytest.raises(ValueError, match="^logits: row 1 contains NaN"):
        specdec_ext.Sampler(B, V, backend=backend)(bad[:, 0])
    assert int(specdec_ext.Sampler(B, V, backend=backend, check=False)(bad[:, 0])[1]) == -1


def test_an_empty_batch():
    out = specdec_ext.Verifier(0, K, V)(torch.randn(0, K + 1, V), torch.randn(0, K, V), torch.zeros(0, K, dtype=torch.int64))
    assert out.tokens.shape == (0, K + 1) and out.num_accepted.shape == (0,)
    assert specdec_ext.Sampler(0, V)(torch.randn(0, V)).shape == (0,)


def test_a_function_calling_them_compiles_without_a_graph_break():
    """torch.compile(fullgraph=True) of a step calling a Verifier and a Sampler (check=False and
    check=True): the registered operator inside the graph, the same tokens as eager calls."""
    target, draft, drafts, seeds, offsets = _inputs(seed=5)
    verifier = specdec_ext.Verifier(B, K, V, temperature=0.8, top_k=12, check=False)
    checked = specdec_ext.Verifier(B, K, V, temperature=0.8)
    sampler = specdec_ext.Sampler(B, V, temperature=0.8, top_k=12, check=False)

    def step(target, draft, drafts, seeds, offsets):
        out = verifier(target, draft, drafts, seeds=seeds, offsets=offsets)
        return out.tokens, out.num_accepted, checked(target, draft, drafts).tokens, sampler(target[:, -1], seeds=seeds, offsets=offsets + K + 1)

    inputs = (target, draft, drafts, seeds, offsets)
    compiled = torch.compile(step, fullgraph=True, backend="aot_eager")
    torch.manual_seed(11)
    got = compiled(*inputs)
    torch.manual_seed(11)
    expected = step(*inputs)
    for a, b in zip(got, expected, strict=True):
        assert torch.equal(a, b)
    explanation = torch._dynamo.explain(step)(*inputs)
    assert explanation.graph_break_count == 0, explanation.break_reasons


# aten ops that allocate or compute (views and metadata left out), as in test_triton_launches.
_VIEWS = {"view", "_unsafe_view", "slice", "select", "as_strided", "alias", "detach", "expand", "unsqueeze", "squeeze", "reshape", "lift_fresh"}


class _Ops(TorchDispatchMode):
    """Every aten op run while active (with whether its tensors are on the CPU), kernels excluded."""

    def __init__(self):
        super().__init__()
        self.ops: list[tuple[str, str]] = []
        self.paused = False

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if not self.paused and func.overloadpacket.__name__ not in _VIEWS:
            tensors = [a for a in args if isinstance(a, torch.Tensor)]
            self.ops.append((func.overloadpacket.__name__, tensors[0].device.type if tensors else "-"))
        return func(*args, **(kwargs or {}))


@contextlib.contextmanager
def _paused_in_launches(recorder: _Ops):
    """The interpreter copies kernel arguments with aten ops of its own: not counted."""
    kernels = _triton_backend.kernels()
    originals = {name: getattr(kernels, name).run for name in kernels.__all__}
    for name, run in originals.items():
        def paused(*args, _run=run, **kwargs):
            recorder.paused = True
            try:
                return _run(*args, **kwargs)
            finally:
                recorder.paused = False

        getattr(kernels, name).run = paused
    try:
        yield
    finally:
        for name, run in originals.items():
            getattr(kernels, name).run = run


@pytest.mark.skipif("triton" not in specdec_ext.available_backends("cpu"), reason="triton is not installed")
# (filtered: three launches under the slow interpreter, in CI's slow step)
@pytest.mark.parametrize("params", [{}, pytest.param(FILTERED, marks=pytest.mark.slow)], ids=["plain", "filtered"])
def test_a_triton_call_allocates_its_outputs_and_nothing_else(params, host_outputs):
    """With check=False a prepared Triton call runs no aten op but its outputs' allocation (seeded;
    in C++, or empty_like of prototypes the runner keeps), plus the key draw from a CPU generator (a
    CPU tensor op, no device read): nothing that a CUDA graph could not capture, no host sync. A
    sampler allocates only its (B,) tokens. (On CUDA, tests/triton/test_triton_cuda.py-style capture: below.)"""
    allocation = host_outputs
    target, draft, drafts, seeds, offsets = _inputs(seed=6)
    verifier = specdec_ext.Verifier(B, K, V, backend="triton", check=False, return_logprobs="processed", **params)
    sampler = specdec_ext.Sampler(B, V, backend="triton", check=False, **params)
    verifier(target, draft, drafts, seeds=seeds, offsets=offsets)  # warm-up: templates and workspace
    verifier(target, draft, drafts)
    sampler(target[:, 0], seeds=seeds)
    recorder = _Ops()
    with _paused_in_launches(recorder), recorder:
        verifier(target, draft, drafts, seeds=seeds, offsets=offsets)
    assert [op for op, _ in recorder.ops] == [allocation] * 3, recorder.ops  # tokens, num_accepted, logprobs
    recorder = _Ops()
    with _paused_in_launches(recorder), recorder:
        verifier(target, draft, drafts)
    # The key: drawn by the C++ extension (no aten op), else into a CPU buffer and read.
    key_ops = [] if _philox.FAST_DRAW is not None else ["_local_scalar_dense", "random_"]
    assert sorted(op for op, _ in recorder.ops if op != allocation) == key_ops, recorder.ops
    assert all(device == "cpu" for op, device in recorder.ops if op != allocation)  # the key buffer
    recorder = _Ops()
    with _paused_in_launches(recorder), recorder:
        sampler(target[:, 0], seeds=seeds)
    assert [op for op, _ in recorder.ops] == [allocation], recorder.ops


@pytest.mark.skipif(not torch.cuda.is_available() or "triton" not in specdec_ext.available_backends("cuda"), reason="needs CUDA and triton")
def test_cuda_graph_capture_of_a_verifier_call():
    """check=False on CUDA: captured once, replayed with the same tokens as the eager reference for
    seeded rows, and fresh keys per replay from the default generator."""
    target, draft, drafts, seeds, offsets = _inputs(seed=7, vocab=4096, draft_vocab=4096)
    expected = specdec_ext.verify(target, draft, drafts, seeds=seeds, offsets=offsets, backend="eager", **FILTERED).tokens
    cuda = [x.cuda() for x in (target, draft, drafts, seeds, offsets)]
    verifier = specdec_ext.Verifier(B, K, 4096, device="cuda", check=False, **FILTERED)
    sampler = specdec_ext.Sampler(B, 4096, device="cuda", check=False)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            verifier(*cuda[:3], seeds=cuda[3], offsets=cuda[4])
            sampler(cuda[0][:, 0])
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        seeded = verifier(*cuda[:3], seeds=cuda[3], offsets=cuda[4])
        drawn = sampler(cuda[0][:, 0])
    seen = set()
    for _ in range(10):
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(seeded.tokens.cpu(), expected)
        seen.add(tuple(drawn.tolist()))
    assert len(seen) > 1  # a fresh key per replay


@pytest.mark.skipif("triton" not in specdec_ext.available_backends("cpu"), reason="triton is not installed")
def test_a_triton_verifier_takes_logits_of_other_strides():
    """The launches are bound to the first call's strides; a call with other strides (a slice of a
    wider tensor) takes the general path, with the same tokens."""
    target, draft, drafts, seeds, _ = _inputs(seed=9)
    wide = torch.zeros(B, K + 1, V + 8)
    wide[:, :, :V] = target
    verifier = specdec_ext.Verifier(B, K, V, backend="triton")
    first = verifier(target, draft, drafts, seeds=seeds)
    sliced = verifier(wide[:, :, :V], draft, drafts, seeds=seeds)
    assert wide[:, :, :V].stride() != target.stride()
    assert torch.equal(first.tokens, sliced.tokens)
    assert torch.equal(first.tokens, specdec_ext.verify(target, draft, drafts, seeds=seeds, backend="eager").tokens)


@pytest.mark.skipif("triton" not in specdec_ext.available_backends("cpu"), reason="triton is not installed")
@pytest.mark.parametrize("params", [{}, pytest.param(FILTERED, marks=pytest.mark.slow)], ids=["plain", "filtered"])  # (filtered: CI's slow step)
def test_triton_calls_without_check_run_the_launches_bound_to_the_first(params, host_outputs):
    """check=False: a Triton Verifier / Sampler runs a call through the launches bound to its first
    call's layout (_triton_backend.plan_runner), with what the general launcher gives (the same
    verifier with num_draft_tokens, which the bound launches leave to it) and the eager reference's
    tokens, for every way of keying, call after call; one-hot drafts, a smaller draft vocabulary, a
    sampler on sliced logits. What it does not take it leaves to the general path: other strides,
    arguments with something wrong (the validator's messages). (Filtered, where the interpreter is
    slow: the three launches of one way of keying with seeds and one without, and the sampler.)"""
    target, draft, drafts, seeds, offsets = _inputs(seed=10)
    outputs = {"return_logprobs": "processed", "return_accept_probs": True}
    verifier = specdec_ext.Verifier(B, K, V, backend="triton", check=False, **params, **outputs)
    sampler = specdec_ext.Sampler(B, V, backend="triton", check=False, **params)
    logits = target[:, 1]  # rows (K + 1) * V apart
    everything = torch.full((B,), K)
    ways = ({"seeds": seeds, "offsets": offsets}, {}) if params else ({"seeds": seeds, "offsets": offsets}, {"seeds": seeds}, {"offsets": offsets}, {})
    for keys in ways:
        for _ in range(2):
            torch.manual_seed(8)
            got = verifier(target, draft, drafts, **keys)
            torch.manual_seed(8)
            _same(got, verifier(target, draft, drafts, num_draft_tokens=everything, **keys))
            torch.manual_seed(8)
            assert torch.equal(got.tokens, specdec_ext.verify(target, draft, drafts, backend="eager", **params, **keys).tokens)
        torch.manual_seed(3)
        got = sampler(logits, **keys)
        torch.manual_seed(3)
        assert torch.equal(got, specdec_ext.sample(logits, backend="eager", **params, **keys)) and got.shape == (B,)
    if params:
        return
    g1, g2 = torch.Generator().manual_seed(4), torch.Generator().manual_seed(4)
    _same(verifier(target, draft, drafts, generator=g1), verifier(target, draft, drafts, generator=g2, num_draft_tokens=everything))
    assert torch.equal(g1.get_state(), g2.get_state())
    # The runner's own answer: a call it takes, and None for one it leaves (having drawn no key).
    bound = verifier._plan.fast
    assert bound(target, draft, drafts, seeds, None, None) is not None
    wide = torch.zeros(B, K + 1, V + 8)
    wide[:, :, :V] = target
    state = torch.get_rng_state()
    assert bound(wide[:, :, :V], draft, drafts, None, None, None) is None and bound(target, draft, drafts.T.contiguous().T, None, None, None) is None
    left = [(target.bfloat16(), draft, drafts, None, None), (target, draft, drafts.int(), None, None), (target, None, drafts, None, None),
            ("logits", draft, drafts, None, None), (target[:2], draft[:2], drafts[:2], None, None), (target, draft, drafts, seeds.int(), None),
            (target, draft, drafts, None, torch.arange(2 * B)[::2]), (target, draft, drafts, seeds[:2], None)]
    assert all(bound(*call, None) is None for call in left)
    assert torch.equal(torch.get_rng_state(), state)
    _same(verifier(wide[:, :, :V], draft, drafts, seeds=seeds), verifier(target, draft, drafts, seeds=seeds))
    with pytest.raises(ValueError, match=r"target_logits: this Verifier takes shape \(3, 4, 40\) torch.float32 on cpu, got .* torch.bfloat16"):
        verifier(target.bfloat16(), draft, drafts)
    with pytest.raises(ValueError, match="draft_tokens must be int32 or int64"):
        verifier(target, draft, drafts.float())
    with pytest.raises(ValueError, match=r"seeds must have shape \(3,\)"):
        verifier(target, draft, drafts, seeds=seeds[:2])
    with pytest.raises(ValueError, match="generator must be a torch.Generator"):
        verifier(target, draft, drafts, generator=3)

    one_hot = specdec_ext.Verifier(B, K, V, one_hot_drafts=True, backend="triton", check=False, **params)
    small = specdec_ext.Verifier(B, K, V, draft_vocab_size=30, backend="triton", check=False, **params)
    _, small_draft, small_drafts, _, _ = _inputs(seed=10, draft_vocab=30)
    for _ in range(2):
        assert torch.equal(one_hot(target, None, drafts, seeds=seeds).tokens,
                           specdec_ext.verify(target, None, drafts, seeds=seeds, backend="eager", **params).tokens)
        assert torch.equal(small(target, small_draft, small_drafts, offsets=offsets, seeds=seeds).tokens,
                           specdec_ext.verify(target, small_draft, small_drafts, seeds=seeds, offsets=offsets, backend="eager", **params).tokens)
    with pytest.raises(ValueError, match="one_hot_drafts=True"):
        one_hot(target, draft, drafts)

    with pytest.raises(ValueError, match=r"logits: this Sampler takes shape \(3, 40\)"):
        sampler(target[:2, 0])
    empty = specdec_ext.Verifier(0, K, V, backend="triton", check=False)(torch.randn(0, K + 1, V), torch.randn(0, K, V), torch.zeros(0, K, dtype=torch.int64))
    assert empty.tokens.shape == (0, K + 1) and empty.num_accepted.shape == (0,)


@pytest.mark.parametrize("backend", [b for b in ("cpp", "eager") if b in specdec_ext.available_backends("cpu")])
def test_a_sampler_with_a_generator_draws_what_sample_draws(backend):
    """The generation loop draws its drafts with a Sampler and its generator: from the same generator
    state a Sampler draws what sample() draws, call after call (each call takes one key from it)."""
    logits = torch.randn(5, 300, generator=torch.Generator().manual_seed(3)) * 3
    for params in ({"temperature": 0.8, "top_k": 20, "top_p": None}, {"temperature": 1.0, "top_k": None, "top_p": 0.9}):
        default, prepared = torch.Generator().manual_seed(9), torch.Generator().manual_seed(9)
        sampler = specdec_ext.Sampler(5, 300, check=False, backend=backend, **params)
        for _ in range(3):
            want = specdec_ext.sample(logits, generator=default, check=False, backend=backend, **params)
            assert torch.equal(sampler(logits, generator=prepared), want)
        assert torch.equal(default.get_state(), prepared.get_state())
