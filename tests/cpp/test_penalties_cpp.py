"""The C++ block repetition penalty (CPU float32) equals the torch stage bit for bit, at every block
position, with ragged committed lengths, a per-row or fixed prompt_ignore_length start, and ids the
torch stage clamps (negative: id 0; >= V: none)."""

import pytest
import torch

from specdec_ext import _cpp_backend
from specdec_ext.processors import Context, _RepetitionPenalty

pytestmark = pytest.mark.skipif(not (_cpp_backend.is_available() and hasattr(_cpp_backend._C, "repetition_penalty")),
                                reason="C++ extension not built")


class _Penalty:
    def __init__(self, penalty, ignore=None):
        self.penalty = penalty
        self.prompt_ignore_length = ignore


def _context(g, rows, width, vocab, committed, k):
    sequences = torch.randint(-1, vocab + 3, (rows + 2, width), generator=g)  # -1 and >= V: the clamped ids
    index = torch.randperm(rows + 2, generator=g)[:rows]
    context = Context(sequences, index, committed)
    context.drafts = torch.randint(-1, vocab + 2, (rows, k), generator=g)
    return context


def _torch_stage(stage, scores, context, first):
    """The stage with the C++ path switched off."""
    original = Context.cpu_repetition_penalty
    Context.cpu_repetition_penalty = lambda *args, **kwargs: None
    try:
        return stage(scores, context, first)
    finally:
        Context.cpu_repetition_penalty = original


@pytest.mark.parametrize("ignore", [None, 2, "per-row"])
@pytest.mark.parametrize("penalty", [1.1, 2.5, 0.7])
def test_cpp_block_penalty_equals_the_torch_stage(penalty, ignore):
    g = torch.Generator().manual_seed(7)
    vocab, width, k, rows = 37, 12, 4, 3
    committed = [12, 5, 9]
    if ignore == "per-row":
        ignore = torch.tensor([0, 3, 1, 4, 2])  # indexed by the context's index, like prompt_ignore_length tensors
    stage = _RepetitionPenalty(_Penalty(penalty, ignore))
    for first, positions in [(0, k + 1), (0, 1), (1, 1), (3, 1), (4, 1), (2, 3)]:
        context = _context(g, rows, width, vocab, committed, k)
        scores = torch.randn(rows, positions, vocab, generator=g) * 4
        fused = stage(scores, context, first)
        assert context.cpu_repetition_penalty(scores, 0, first, penalty) is not None  # the C++ path really ran
        context_again = Context(context.sequences, context.index, committed)
        context_again.drafts = context.drafts
        reference = _torch_stage(stage, scores, context_again, first)
        assert torch.equal(fused, reference), (first, positions, (fused != reference).nonzero()[:5])
        assert not torch.equal(fused, scores)  # something was penalised


def test_cpp_block_penalty_without_drafts_and_bad_arguments():
    kernel = _cpp_backend._C.repetition_penalty
    sequences = torch.tensor([[1, 2, 2, 5]])
    index, start, end = torch.tensor([0]), torch.tensor([0]), torch.tensor([3])
    scores = torch.tensor([[[1.0, -1.0, 2.0, -2.0, 4.0, 8.0]]])
    out = kernel(scores, sequences, index, start, end, None, 0, 2.0)
    assert out.tolist() == [[[1.0, -2.0, 1.0, -2.0, 4.0, 8.0]]]  # ids 1 and 2 seen once each; id 5 is past end
    with pytest.raises(ValueError, match="float32"):
        kernel(scores.double(), sequences, index, start, end, None, 0, 2.0)
    with pytest.raises(ValueError, match="index"):
        kernel(scores, sequences, torch.tensor([3]), start, end, None, 0, 2.0)
    with pytest.raises(ValueError, match="end"):
        kernel(scores, sequences, index, start, torch.tensor([9]), None, 0, 2.0)
    with pytest.raises(ValueError, match="drafts"):
        kernel(scores, sequences, index, start, end, torch.tensor([[1, 2]]), 3, 2.0)
    with pytest.raises(ValueError, match="penalty"):
        kernel(scores, sequences, index, start, end, None, 0, 0.0)
    with pytest.raises(ValueError, match="without drafts"):
        kernel(scores, sequences, index, start, end, None, 1, 2.0)
