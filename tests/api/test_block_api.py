"""``verify(..., method="block")``: layout, validation and what a row reads."""

from __future__ import annotations

import pytest
import torch

import specdec_ext
from specdec_ext import available_backends, verify_tree

B, K, V = 6, 4, 50


def _inputs(seed=0):
    g = torch.Generator().manual_seed(seed)
    target = torch.randn(B, K + 1, V, generator=g) * 2
    draft = target[:, :K] + 0.7 * torch.randn(B, K, V, generator=g)
    tokens = torch.multinomial(draft.softmax(-1).reshape(-1, V), 1, generator=g).reshape(B, K)
    return target, draft, tokens


def test_layout_matches_token_verification():
    target, draft, tokens = _inputs()
    for backend in available_backends("cpu", "verify_block", interpreted=False):
        out = specdec_ext.verify(target, draft, tokens, method="block", generator=torch.Generator().manual_seed(1), backend=backend)
        assert out.tokens.shape == (B, K + 1) and out.num_accepted.shape == (B,)
        for row in range(B):
            n = int(out.num_accepted[row])
            assert torch.equal(out.tokens[row, :n], tokens[row, :n])
            assert 0 <= int(out.tokens[row, n]) < V and (out.tokens[row, n + 1 :] == -1).all()


def test_one_draft_and_no_draft_agree_with_the_tree_walk():
    """With K = 1 block and token-wise verification are the same test (u < min(1, p/q) vs u q < p), and
    with K = 0 both are the plain draw: the same keys give the same tokens."""
    target, draft, tokens = _inputs()
    rows = 2000
    g = torch.Generator().manual_seed(2)
    big_target = torch.randn(rows, 2, V, generator=g)
    big_draft = big_target[:, :1] + torch.randn(rows, 1, V, generator=g)
    drafts = torch.multinomial(big_draft[:, 0].softmax(-1), 1, generator=g)
    block = specdec_ext.verify(big_target, big_draft, drafts, method="block", generator=torch.Generator().manual_seed(3), backend="eager")
    tree = verify_tree(big_target, torch.cat([big_draft, big_draft], 1), drafts, torch.full((rows, 1), -1),
                       generator=torch.Generator().manual_seed(3), backend="eager")
    assert torch.equal(block.tokens, tree.tokens)
    plain = specdec_ext.verify(target[:, :1], None, tokens[:, :0], method="block", generator=torch.Generator().manual_seed(4), backend="eager")
    root_only = verify_tree(target[:, :1], None, tokens[:, :0], tokens[:, :0], generator=torch.Generator().manual_seed(4), backend="eager")
    assert torch.equal(plain.tokens, root_only.tokens)


def test_method_is_validated():
    target, draft, tokens = _inputs()
    with pytest.raises(ValueError, match="method must be one of"):
        specdec_ext.verify(target, draft, tokens, method="joint")


@pytest.mark.parametrize("backend", available_backends("cpu", "verify_block", interpreted=False))
def test_check_false_reads_every_line_up_to_n_b(backend):
    """Block verification decides from every line up to n_b (the last stop wins), so with check=False a
    bad line anywhere up to n_b blanks a sampled row; a greedy row verifies token by token and reads
    lines up to its first mismatch only. Lines past n_b are never read."""
    target, draft, tokens = _inputs(5)
    temperature = torch.tensor([1.0, 1.0, 0.8, 1.0, 0.0, 0.0])
    num_draft = torch.tensor([4, 2, 4, 0, 4, 4])
    tokens[4] = target[4, :K].argmax(-1)  # a greedy row that accepts everything
    tokens[5, 0] = (target[5, 0].argmax() + 1) % V  # and one that stops at 0

    def run(t, d, check=False):
        return specdec_ext.verify(t, d, tokens, temperature=temperature, num_draft_tokens=num_draft, method="block",
                                  generator=torch.Generator().manual_seed(6), backend=backend, check=check)

    clean = run(target, draft)
    for line in ("target", "draft"):
        for position in range(K + 1 if line == "target" else K):
            t, d = target.clone(), draft.clone()
            (t if line == "target" else d)[:, position, 3] = float("nan")
            out = run(t, d)
            for row in range(B):
                greedy = float(temperature[row]) == 0
                limit = int(clean.num_accepted[row]) if greedy else int(num_draft[row])
                read = position <= limit and not (line == "draft" and (greedy or position >= num_draft[row]))
                if read:
                    assert (out.tokens[row] == -1).all(), (line, position, row)
                else:
                    assert torch.equal(out.tokens[row], clean.tokens[row]), (line, position, row)
            with pytest.raises(ValueError, match=f"^{line}_logits: row 0 "):
                run(t, d, check=True)


def test_logprobs_of_the_emitted_tokens_and_no_accept_probs():
    target, draft, tokens = _inputs()
    for mode, scale in (("processed", 1 / 0.8), ("raw", 1.0)):
        out = specdec_ext.verify(target, draft, tokens, temperature=0.8, method="block", return_logprobs=mode, seeds=torch.arange(B), backend="eager")
        expected = torch.log_softmax(target * scale, -1).gather(2, out.tokens.clamp(min=0)[..., None])[..., 0]
        emitted = out.tokens >= 0
        torch.testing.assert_close(out.logprobs[emitted], expected[emitted], atol=1e-5, rtol=0)
        assert torch.isnan(out.logprobs[~emitted]).all()
    with pytest.raises(ValueError, match="return_accept_probs is defined for token-wise verification only"):
        specdec_ext.verify(target, draft, tokens, method="block", return_accept_probs=True)
