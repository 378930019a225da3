"""The compiled Triton kernels on a CUDA GPU (skipped without one; ``bash bench/gpu_suite.sh`` runs
them): stream v2 outputs identical to the eager reference, CUDA-graph replay with fresh keys, and
no allocation besides the outputs once the workspace is warm."""

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


@pytest.mark.parametrize("params", [{"top_k": 3000}, {"top_p": 0.99}, {"top_k": 20000, "top_p": 0.97}])
def test_cuda_whole_line_search_matches_eager(params):
    """Flat logits put every cut beyond the candidates: the cut-offs launch's programs search whole
    lines, waiting on each other's passes (tickets, acquire / release), twice in a row and replayed
    from a CUDA graph, with the same tokens as the eager reference each time."""
    batch, k, vocab = 8, 4, 128256
    target, draft, tokens, seeds, offsets = _case(batch, k, vocab, torch.float32, seed=3)
    target, draft = 0.05 * target, 0.05 * draft

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


def test_cuda_graph_replays_with_fresh_keys_and_no_allocation():
    batch, k, vocab = 4, 4, 128256
    target, draft, tokens, _, _ = _case(batch, k, vocab, torch.float32, seed=1)
    target, draft, tokens = target.cuda(), draft.cuda(), tokens.cuda()

    def call():
        return specdec_ext.verify(target, draft, tokens, backend="triton", check=False)

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            call()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = call()
    seen = set()
    for _ in range(20):
        graph.replay()
        torch.cuda.synchronize()
        assert (out.tokens[:, 0] >= 0).all()
        seen.add(tuple(out.tokens.flatten().tolist()))
    assert len(seen) > 1  # a fresh key per replay: not the same draw twenty times

    # Eager calls: after warm-up only the outputs are allocated.
    call()
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    result = call()
    torch.cuda.synchronize()
    outputs = result.tokens.numel() * 8 + result.num_accepted.numel() * 8
    assert torch.cuda.max_memory_allocated() - before <= outputs + 2 * 512  # allocator rounding of two tensors
