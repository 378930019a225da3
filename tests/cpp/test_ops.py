"""torch.ops.specdec.verify / sample: the registered operator (opcheck, fake kernels, a graph
without breaks under torch.compile, the CPU kernel behind it, and the CUDA route)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
import torch

import specdec_ext
from specdec_ext import _cpp_backend, _params, ops
from specdec_ext.reference import verify_eager


def _inputs(batch=3, k=4, vocab=300, seed=0, draft=True, device="cpu"):
    g = torch.Generator().manual_seed(seed)
    target = torch.randn(batch, k + 1, vocab, generator=g) * 2
    draft_logits = target[:, :k] + 0.5 * torch.randn(batch, k, vocab, generator=g) if draft else None
    tokens = torch.randint(0, vocab, (batch, k), generator=g)
    params = {
        "temperature": torch.tensor([0.8, 0.0, 1.0])[:batch],
        "top_k": torch.tensor([0, 5, 40])[:batch],
        "top_p": torch.tensor([1.0, 1.0, 0.9])[:batch],
        "num_draft_tokens": torch.tensor([k, 2, 0])[:batch],
    }
    seeds = torch.tensor([1234567, 5, 2**61], dtype=torch.int64)[:batch]
    offsets = torch.tensor([0, 17, 2**33], dtype=torch.int64)[:batch]
    move = lambda t: t.to(device) if t is not None else None  # noqa: E731
    return move(target), move(draft_logits), move(tokens), {n: move(v) for n, v in params.items()}, (move(seeds), move(offsets))


BASE_KEY = 987654321


def _op_args(target, draft, tokens, params, keys, base_key=BASE_KEY):
    seeds, offsets = keys
    return (target, draft, tokens, params["temperature"], params["top_k"], params["top_p"], params["num_draft_tokens"], seeds, offsets, base_key)


@pytest.mark.parametrize("draft", [True, False])
@pytest.mark.parametrize("seeded", [True, False])
def test_opcheck_verify(draft, seeded):
    target, draft_logits, tokens, params, keys = _inputs(draft=draft)
    args = _op_args(target, draft_logits, tokens, params, keys if seeded else (None, None))
    torch.library.opcheck(torch.ops.specdec.verify.default, args)
    # The optional outputs hold NaN where nothing is emitted, which opcheck's output comparison
    # cannot take: their values are compared with the reference in test_op_matches_eager_reference.
    schema_checks = ("test_schema", "test_autograd_registration", "test_faketensor")
    torch.library.opcheck(torch.ops.specdec.verify.default, args, {"stream": 2, "check": False, "logprobs": 1, "accept_probs": True}, test_utils=schema_checks)


def test_opcheck_sample():
    target, _, _, params, (seeds, offsets) = _inputs()
    torch.library.opcheck(torch.ops.specdec.sample.default, (target[:, 0], params["temperature"], params["top_k"], params["top_p"], seeds, offsets, BASE_KEY))


def test_op_matches_eager_reference():
    target, draft, tokens, params, (seeds, offsets) = _inputs(seed=3)
    for mode, accept in ((0, False), (2, True)):
        args = _params.validate_verify(
            target, draft, tokens, generator=None, check=False, seeds=seeds, offsets=offsets,
            return_logprobs=[False, "processed", "raw"][mode], return_accept_probs=accept, **params,
        )
        expected = verify_eager(args, BASE_KEY)
        got = torch.ops.specdec.verify(*_op_args(target, draft, tokens, params, (seeds, offsets)), logprobs=mode, accept_probs=accept, check=False)
        assert torch.equal(got[0], expected[0]) and torch.equal(got[1], expected[1])
        if mode:
            torch.testing.assert_close(got[2], expected[2], equal_nan=True, rtol=0, atol=1e-5)
            torch.testing.assert_close(got[3], expected[3], equal_nan=True, rtol=0, atol=1e-6)
        else:
            assert got[2].shape == (0,) and got[3].shape == (0,)
    sample = torch.ops.specdec.sample(target[:, 0], params["temperature"], params["top_k"], params["top_p"], None, offsets, BASE_KEY)
    no_drafts = torch.empty((3, 0), dtype=torch.int64)
    sample_args = _params.validate_verify(
        target[:, :1], None, no_drafts, generator=None, check=False, temperature=params["temperature"], top_k=params["top_k"], top_p=params["top_p"],
        num_draft_tokens=None, offsets=offsets, stream=2,
    )
    assert torch.equal(sample, verify_eager(sample_args, BASE_KEY)[0][:, 0])


def test_fake_kernels_give_shapes():
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode() as mode:
        target, draft, tokens, params, (seeds, offsets) = _inputs(batch=3, k=2)
        target, draft, tokens, seeds, offsets = (mode.from_tensor(t) for t in (target, draft, tokens, seeds, offsets))
        params = {n: mode.from_tensor(v) for n, v in params.items()}
        tokens_out, accepted, no_logprobs, no_accept = torch.ops.specdec.verify(*_op_args(target, draft, tokens, params, (seeds, offsets)))
        _, _, logprobs, accept = torch.ops.specdec.verify(*_op_args(target, draft, tokens, params, (None, None)), logprobs=2, accept_probs=True)
        sampled = torch.ops.specdec.sample(target[:, 0], params["temperature"], params["top_k"], params["top_p"], seeds, offsets, BASE_KEY)
    assert tokens_out.shape == (3, 3) and tokens_out.dtype == torch.int64
    assert accepted.shape == (3,) and accepted.dtype == torch.int64
    assert no_logprobs.shape == (0,) and no_accept.shape == (0,)
    assert logprobs.shape == (3, 3) and logprobs.dtype == torch.float32
    assert accept.shape == (3, 2) and accept.dtype == torch.float32
    assert sampled.shape == (3,) and sampled.dtype == torch.int64


def test_cpu_kernel_is_the_cpp_one_when_built():
    assert ops.CPU_KERNEL == ("cpp" if _cpp_backend.is_available() else "eager")


@pytest.mark.parametrize("backend", ["auto", "eager"])
def test_compile_fullgraph_has_no_graph_break(backend):
    target, draft, tokens, params, _ = _inputs(seed=5)

    def step(target, draft, tokens, temperature, top_k, top_p):
        out = specdec_ext.verify(target, draft, tokens, temperature=temperature, top_k=top_k, top_p=top_p, check=False, backend=backend)
        return out.tokens, out.num_accepted, specdec_ext.sample(target[:, -1], temperature=temperature, check=False, backend=backend)

    compiled = torch.compile(step, fullgraph=True, backend="aot_eager")
    inputs = (target, draft, tokens, params["temperature"], params["top_k"], params["top_p"])
    torch.manual_seed(11)
    got = compiled(*inputs)
    torch.manual_seed(11)
    expected = step(*inputs)  # the same default-generator seeds: the same tokens
    for a, b in zip(got, expected, strict=True):
        assert torch.equal(a, b)
    explanation = torch._dynamo.explain(step)(*inputs)
    assert explanation.graph_break_count == 0, explanation.break_reasons


def test_check_true_under_compile_fullgraph():
    """The default check=True inside torch.compile(fullgraph=True) on CPU: valid calls give the eager
    result; bad values raise (an assertion inside the graph) with a message that says how to get
    the row named or blanked."""
    target, draft, tokens, params, _ = _inputs(seed=6)

    def step(target, draft, tokens, temperature, top_k, top_p):
        return specdec_ext.verify(target, draft, tokens, temperature=temperature, top_k=top_k, top_p=top_p).tokens

    compiled = torch.compile(step, fullgraph=True, backend="aot_eager")
    inputs = (target, draft, tokens, params["temperature"], params["top_k"], params["top_p"])
    torch.manual_seed(3)
    got = compiled(*inputs)
    torch.manual_seed(3)
    assert torch.equal(got, step(*inputs))
    bad_logits = target.clone()
    bad_logits[0, 0, 7] = float("nan")
    with pytest.raises(RuntimeError, match="check=True found a row .*pass check=False"):
        compiled(bad_logits, *inputs[1:])
    with pytest.raises(RuntimeError, match="temperature must be finite and >= 0.*pass check=False"):
        compiled(*inputs[:3], torch.tensor([0.8, -1.0, 1.0]), *inputs[4:])
    with pytest.raises(ValueError, match="target_logits: row 0 contains NaN"):  # eager calls name the row
        step(bad_logits, *inputs[1:])


def test_fake_kernels_are_registered_by_import_specdec_ext():
    """After a plain `import specdec_ext` (ops.py not imported by hand), the op runs under FakeTensorMode."""
    script = textwrap.dedent(
        """
        import sys, torch, specdec_ext
        from torch._subclasses.fake_tensor import FakeTensorMode
        with FakeTensorMode() as mode:
            t = mode.from_tensor(torch.randn(2, 3, 50))
            x = mode.from_tensor(torch.zeros(2, 2, dtype=torch.int64))
            rows = [mode.from_tensor(v) for v in (torch.ones(2), torch.zeros(2, dtype=torch.int64), torch.ones(2), torch.full((2,), 2))]
            out = torch.ops.specdec.verify(t, None, x, *rows, None, None, 5, logprobs=1)
            sampled = torch.ops.specdec.sample(t[:, 0], *rows[:3], None, None, 5)
        assert out[0].shape == (2, 3) and out[2].shape == (2, 3) and sampled.shape == (2,)
        print("ok")
        """
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0 and result.stdout.strip().endswith("ok"), result.stderr[-3000:]


def test_op_registered_with_eager_kernel_without_extension():
    """With the extension hidden, ops.py defines the schemas itself and runs the eager reference."""
    script = textwrap.dedent(
        """
        import sys
        sys.modules["specdec_ext._C"] = None  # the import fails as if nothing was built
        import torch, specdec_ext
        from specdec_ext import _cpp_backend, ops
        from specdec_ext.reference import verify_eager
        from specdec_ext._params import validate_verify
        assert not _cpp_backend.is_available() and ops.CPU_KERNEL == "eager"
        g = torch.Generator().manual_seed(0)
        t, d = torch.randn(2, 3, 50, generator=g), torch.randn(2, 2, 50, generator=g)
        x = torch.randint(0, 50, (2, 2), generator=g)
        T, k, p, n, s = torch.ones(2), torch.tensor([0, 3]), torch.tensor([1.0, 0.9]), torch.tensor([2, 1]), torch.tensor([77, 78])
        torch.library.opcheck(torch.ops.specdec.verify.default, (t, d, x, T, k, p, n, s, None, 0))
        torch.library.opcheck(torch.ops.specdec.sample.default, (t[:, 0], T, k, p, s, None, 0))
        got = torch.ops.specdec.verify(t, d, x, T, k, p, n, s, None, 0)
        want = verify_eager(validate_verify(t, d, x, temperature=T, top_k=k, top_p=p, num_draft_tokens=n, generator=None, check=False, seeds=s), 0)
        assert all(torch.equal(a, b) for a, b in zip(got[:2], want[:2]))
        compiled = torch.compile(lambda t, d, x: specdec_ext.verify(t, d, x, check=False).tokens, fullgraph=True, backend="aot_eager")
        assert compiled(t, d, x).shape == (2, 3)
        print("ok")
        """
    )
    env = dict(os.environ, TRITON_INTERPRET=os.environ.get("TRITON_INTERPRET", "1"))
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=300)
    assert result.returncode == 0 and result.stdout.strip().endswith("ok"), result.stderr[-3000:]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_op_runs_the_triton_kernels():
    target, draft, tokens, params, (seeds, offsets) = _inputs(seed=9, device="cuda")
    got = torch.ops.specdec.verify(*_op_args(target, draft, tokens, params, (seeds, offsets)))
    args = _params.validate_verify(target, draft, tokens, generator=None, check=False, seeds=seeds, offsets=offsets, **params)
    expected = verify_eager(args, BASE_KEY)
    assert torch.equal(got[0], expected[0]) and torch.equal(got[1], expected[1])
    compiled = torch.compile(lambda t, d, x: specdec_ext.verify(t, d, x, check=False).tokens, fullgraph=True)
    assert compiled(target, draft, tokens).shape == target.shape[:2]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_check_false_replays_from_a_cuda_graph():
    """verify(check=False) captured in a CUDA graph: every replay draws a fresh key from the default
    generator, greedy rows give the reference's tokens, and every row keeps the output layout."""
    g = torch.Generator().manual_seed(3)
    batch, k, vocab = 4, 4, 32000
    target = 2 * torch.randn(batch, k + 1, vocab, generator=g)
    draft = target[:, :k] + 0.5 * torch.randn(batch, k, vocab, generator=g)
    tokens = torch.multinomial(draft.softmax(-1).reshape(-1, vocab), 1, generator=g).reshape(batch, k)
    temperature = torch.tensor([0.0, 1.0, 0.7, 0.0])
    greedy_rows = [0, 3]
    expected = specdec_ext.verify(target, draft, tokens, temperature=temperature, backend="eager")
    inputs = [x.cuda() for x in (target, draft, tokens, temperature)]

    from bench.harness.timing import capture_cuda_graph

    graph, out = capture_cuda_graph(lambda: specdec_ext.verify(inputs[0], inputs[1], inputs[2], temperature=inputs[3], check=False))
    sampled = set()
    for _ in range(20):
        graph.replay()
        tokens_out, accepted = out.tokens.cpu(), out.num_accepted.cpu()
        assert torch.equal(tokens_out[greedy_rows], expected.tokens[greedy_rows])
        for row in range(batch):
            n = int(accepted[row])
            assert (tokens_out[row, : n + 1] >= 0).all() and (tokens_out[row, : n + 1] < vocab).all() and (tokens_out[row, n + 1 :] == -1).all()
        sampled.add(tuple(tokens_out[1].tolist()))
    assert len(sampled) > 1  # a fresh Philox key per replay
