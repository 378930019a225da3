"""The compiled Triton kernels on a CUDA GPU (skipped without one; ``bash bench/gpu_suite.sh`` runs
them): stream v2 outputs identical to the eager reference, CUDA-graph replay with fresh keys, and
no allocation besides the outputs once the workspace is warm; for chains, blocks and trees."""

from __future__ import annotations

import os

import pytest
import torch

import specdec_ext

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
    pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") == "1", reason="TRITON_INTERPRET=1 would interpret, not compile: unset it"),
]


def _case(batch, k, vocab, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    target = (2 * torch.randn(batch, k + 1, vocab, generator=g)).to(dtype)
    draft = (target[:, :k].float() + 0.5 * torch.randn(batch, k, vocab, generator=g)).to(dtype)
    tokens = torch.multinomial(draft.float().softmax(-1).reshape(batch * k, vocab), 1, generator=g).reshape(batch, k)
    seeds = torch.randint(0, 2**62, (batch,), generator=g)
    offsets = torch.randint(0, 2**40, (batch,), generator=g)
    return target, draft, tokens, seeds, offsets


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("params", [{}, {"temperature": 0.7, "top_k": 50, "top_p": 0.9}, {"temperature": torch.tensor([0.0, 1.0, 0.6, 1.3] * 4)}])
def test_cuda_stream_v2_matches_eager(dtype, params):
    batch, k, vocab = 16, 4, 32000
    target, draft, tokens, seeds, offsets = _case(batch, k, vocab, dtype, seed=batch)
    outs = {}
    for device, backend in (("cuda", "triton"), ("cpu", "eager")):
        moved = {key: value.to(device) if isinstance(value, torch.Tensor) else value for key, value in params.items()}
        out = specdec_ext.verify(
            target.to(device), draft.to(device), tokens.to(device), seeds=seeds.to(device), offsets=offsets.to(device),
            return_logprobs="processed", return_accept_probs=True, backend=backend, **moved,
        )
        outs[backend] = [t.cpu() for t in out]
    fused, eager = outs["triton"], outs["eager"]
    differ = (fused[0] != eager[0]).any(dim=1).nonzero().flatten().tolist()
    # Backends agree to float rounding: an exp/log implementation's last bit can flip a decision
    # that sits on it (about once in 10**7); no such row is expected among these 16.
    assert not differ, f"rows {differ} differ:\ntriton {fused[0][differ].tolist()}\neager  {eager[0][differ].tolist()}"
    torch.testing.assert_close(fused[2], eager[2], rtol=0, atol=1e-5, equal_nan=True)
    torch.testing.assert_close(fused[3], eager[3], rtol=0, atol=1e-5, equal_nan=True)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("params", [{"top_k": 3000}, {"top_p": 0.99}, {"top_k": 20000, "top_p": 0.97}])
def test_cuda_whole_line_search_matches_eager(params, dtype):
    """Flat logits put every cut beyond the candidates: the cut-offs launch's programs search whole
    lines, waiting on each other's passes (tickets, acquire / release), twice in a row and replayed
    from a CUDA graph, with the same tokens as the eager reference each time. bf16: a top-k's
    search over raw keys, its first pass counted by the statistics launch (left zeroed for the
    next call and replay)."""
    batch, k, vocab = 8, 4, 128256
    target, draft, tokens, seeds, offsets = _case(batch, k, vocab, torch.float32, seed=3)
    target, draft = (0.05 * target).to(dtype), (0.05 * draft).to(dtype)

    def call(device, backend):
        return specdec_ext.verify(target.to(device), draft.to(device), tokens.to(device), seeds=seeds.to(device), offsets=offsets.to(device),
                                  temperature=0.9, backend=backend, **params)

    expected = call("cpu", "eager").tokens
    for _ in range(2):
        assert torch.equal(call("cuda", "triton").tokens.cpu(), expected)
    cuda_args = [x.cuda() for x in (target, draft, tokens, seeds, offsets)]
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = specdec_ext.verify(*cuda_args[:3], seeds=cuda_args[3], offsets=cuda_args[4], temperature=0.9, backend="triton", check=False, **params)
    for _ in range(3):
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out.tokens.cpu(), expected)


def _captured(call):
    """A CUDA graph of ``call`` (warmed up on a side stream first) and the outputs it writes."""
    from bench.harness.timing import capture_cuda_graph

    return capture_cuda_graph(call, warmup=2)


def _distinct_draws(graph, out, replays: int) -> int:
    """How many different token tensors ``replays`` replays of ``graph`` write (every row emitting)."""
    seen = set()
    for _ in range(replays):
        graph.replay()
        torch.cuda.synchronize()
        assert (out.tokens[:, 0] >= 0).all()
        seen.add(tuple(out.tokens.flatten().tolist()))
    return len(seen)


def _allocated_beyond_outputs(call) -> int:
    """Bytes a warm eager ``call`` allocates beyond its outputs (with the allocator's rounding)."""
    call()
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    result = call()
    torch.cuda.synchronize()
    outputs = [t for t in result if isinstance(t, torch.Tensor)]
    return torch.cuda.max_memory_allocated() - before - sum(t.numel() * t.element_size() for t in outputs) - 512 * len(outputs)


def test_cuda_graph_replays_with_fresh_keys_and_no_allocation():
    batch, k, vocab = 4, 4, 128256
    target, draft, tokens, _, _ = _case(batch, k, vocab, torch.float32, seed=1)
    target, draft, tokens = target.cuda(), draft.cuda(), tokens.cuda()

    def call():
        return specdec_ext.verify(target, draft, tokens, backend="triton", check=False)

    graph, out = _captured(call)
    assert _distinct_draws(graph, out, 20) > 1  # a fresh key per replay: not the same draw twenty times
    assert _allocated_beyond_outputs(call) <= 0  # eager calls: after warm-up only the outputs are allocated


# --------------------------------------------------------------------------------------------------
# Blocks and trees

_PARENTS = [-1, -1, 0, 0, 2, 1, 4, -1]  # three children of the root, four deep


def _tree_case(batch, vocab, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    nodes = len(_PARENTS)
    target = (2 * torch.randn(batch, nodes + 1, vocab, generator=g)).to(dtype)
    draft = (target.float() + 0.5 * torch.randn(batch, nodes + 1, vocab, generator=g)).to(dtype)
    parents = torch.tensor([_PARENTS] * batch)
    lines = torch.gather(draft.float(), 1, (parents + 1)[:, :, None].expand(batch, nodes, vocab))
    tokens = torch.multinomial(lines.softmax(-1).reshape(batch * nodes, vocab), 1, generator=g).reshape(batch, nodes)
    seeds = torch.randint(0, 2**62, (batch,), generator=g)
    offsets = torch.randint(0, 2**40, (batch,), generator=g)
    return target, draft, tokens, parents, seeds, offsets


def _tree_call(case, device, backend, **params):
    target, draft, tokens, parents, seeds, offsets = (x.to(device) for x in case)
    params = dict(params)
    if params.pop("deterministic", False):
        draft = None
    return specdec_ext.verify_tree(target, draft, tokens, parents, seeds=seeds, offsets=offsets, backend=backend, **params)


_TREE_PARAMS = [{}, {"siblings": "without_replacement"}, {"deterministic": True},
                {"temperature": 0.7, "top_k": 50, "top_p": 0.9, "siblings": "without_replacement"},
                {"temperature": torch.tensor([0.0, 1.0, 0.6, 1.3] * 4), "num_nodes": torch.tensor([8, 0, 3, 5] * 4)}]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("params", _TREE_PARAMS)
def test_cuda_trees_match_eager(dtype, params):
    case = _tree_case(16, 32000, dtype, seed=5)
    moved = {key: value.cuda() if isinstance(value, torch.Tensor) else value for key, value in params.items()}
    fused = _tree_call(case, "cuda", "triton", **moved)
    eager = _tree_call(case, "cpu", "eager", **params)
    for got, want in zip(fused, eager, strict=True):
        assert torch.equal(got.cpu(), want)


@pytest.mark.parametrize("params", [{}, {"temperature": 0.7, "top_k": 50, "top_p": 0.9}, {"temperature": torch.tensor([0.0, 1.0, 0.6, 1.3] * 4)}])
@pytest.mark.parametrize("one_hot", [False, True])
def test_cuda_blocks_match_eager(params, one_hot):
    target, draft, tokens, seeds, offsets = _case(16, 4, 32000, torch.bfloat16, seed=7)
    outs = {}
    for device, backend in (("cuda", "triton"), ("cpu", "eager")):
        moved = {key: value.to(device) if isinstance(value, torch.Tensor) else value for key, value in params.items()}
        out = specdec_ext.verify(target.to(device), None if one_hot else draft.to(device), tokens.to(device), seeds=seeds.to(device),
                                 offsets=offsets.to(device), method="block", return_logprobs="processed", backend=backend, **moved)
        outs[backend] = [t.cpu() for t in out if t is not None]
    assert torch.equal(outs["triton"][0], outs["eager"][0]) and torch.equal(outs["triton"][1], outs["eager"][1])
    torch.testing.assert_close(outs["triton"][2], outs["eager"][2], rtol=0, atol=1e-5, equal_nan=True)


@pytest.mark.parametrize("params", [{"siblings": "without_replacement"}, {"deterministic": True, "temperature": 0.7, "top_k": 50}])
def test_cuda_graph_replays_trees(params):
    """A tree call captured in a CUDA graph replays with the eager reference's tokens every time
    (the outputs are N + 1 wide inside capture as outside), and draws fresh keys per replay without
    seeds. After warm-up an eager call allocates only its outputs."""
    case = _tree_case(4, 128256, torch.float32, seed=2)
    expected = _tree_call(case, "cpu", "eager", **params)
    # On the device before capture: a copy from host memory cannot be captured.
    on_device = tuple(x.cuda() for x in case)
    graph, out = _captured(lambda: _tree_call(on_device, "cuda", "triton", check=False, **params))
    nodes = len(_PARENTS)
    for _ in range(3):
        graph.replay()
        torch.cuda.synchronize()
        assert out.tokens.shape == (4, nodes + 1) and torch.equal(out.tokens.cpu(), expected.tokens)
        assert torch.equal(out.num_accepted.cpu(), expected.num_accepted) and torch.equal(out.accepted_nodes.cpu(), expected.accepted_nodes)

    target, draft, tokens, parents = on_device[:4]
    graph, out = _captured(lambda: specdec_ext.verify_tree(target, draft, tokens, parents, backend="triton", check=False))
    assert _distinct_draws(graph, out, 10) > 1
    assert _allocated_beyond_outputs(lambda: _tree_call(on_device, "cuda", "triton", check=False, **params)) <= 0


@pytest.mark.parametrize("params", [{}, {"temperature": 0.7, "top_k": 50, "top_p": 0.9}])
def test_cuda_graph_replays_blocks(params):
    """A block call captured in a CUDA graph replays with the eager reference's tokens every time."""
    target, draft, tokens, seeds, offsets = _case(4, 4, 128256, torch.float32, seed=4)
    expected = specdec_ext.verify(target, draft, tokens, seeds=seeds, offsets=offsets, method="block", backend="eager", **params)
    cuda = [x.cuda() for x in (target, draft, tokens, seeds, offsets)]
    graph, out = _captured(lambda: specdec_ext.verify(*cuda[:3], seeds=cuda[3], offsets=cuda[4], method="block", backend="triton", check=False,
                                                      **params))
    for _ in range(3):
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out.tokens.cpu(), expected.tokens) and torch.equal(out.num_accepted.cpu(), expected.num_accepted)
