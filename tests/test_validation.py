"""Every bad input raises ValueError naming the argument (and the first bad row for values)."""

from __future__ import annotations

import pytest
import torch

import specdec_ext

B, K, V = 3, 2, 10


def _inputs():
    g = torch.Generator().manual_seed(0)
    return torch.randn(B, K + 1, V, generator=g), torch.randn(B, K, V, generator=g), torch.randint(0, V, (B, K), generator=g)


def _expect(match, **overrides):
    target, draft, tokens = _inputs()
    kwargs = {"backend": "eager"}
    args = {"target_logits": target, "draft_logits": draft, "draft_tokens": tokens}
    for key, value in overrides.items():
        (args if key in args else kwargs)[key] = value
    with pytest.raises(ValueError, match=match):
        specdec_ext.verify(args["target_logits"], args["draft_logits"], args["draft_tokens"], **kwargs)


def test_shapes_dtypes_devices():
    target, draft, tokens = _inputs()
    _expect("target_logits must be 3-D", target_logits=target[:, 0])
    _expect("target_logits must be float32", target_logits=target.double())
    _expect("target_logits must be a tensor", target_logits=target.tolist())
    _expect("draft_tokens must be int32 or int64", draft_tokens=tokens.float())
    _expect(r"draft_tokens must have shape \(batch, K\)", draft_tokens=tokens[:, :1])
    _expect("draft_logits must be 3-D", draft_logits=draft[:, 0])
    _expect(r"draft_logits must have shape \(batch, K, draft_vocab\)", draft_logits=draft[:, :1])
    _expect("draft_logits vocabulary", draft_logits=torch.randn(B, K, V + 1))
    _expect("draft_logits is on meta", draft_logits=draft.to("meta"))
    _expect("draft_tokens is on meta", draft_tokens=tokens.to("meta"))
    _expect("backend must be one of", backend="cuda")
    _expect("generator must be a torch.Generator", generator=3)


def test_parameter_ranges():
    _expect("temperature must be a finite number >= 0", temperature=-0.5)
    _expect("temperature must be a finite number >= 0", temperature=float("nan"))
    _expect("top_k must be >= 0", top_k=-1)
    _expect(r"top_p must lie in \(0, 1\]", top_p=0.0)
    _expect(r"top_p must lie in \(0, 1\]", top_p=1.5)
    _expect("temperature must be finite and >= 0 .*row 1", temperature=torch.tensor([1.0, -1.0, 1.0]))
    _expect("top_k must be >= 0 .*row 2", top_k=torch.tensor([0, 1, -3]))
    _expect(r"top_p must lie in \(0, 1\]; row 0", top_p=torch.tensor([0.0, 0.5, 1.0]))
    _expect(r"temperature must be a scalar or a \(3,\) tensor", temperature=torch.ones(4))
    _expect("top_k must hold integers", top_k=torch.tensor([1.5, 1.0, 1.0]))
    _expect(r"num_draft_tokens must lie in \[0, K=2\]; row 1", num_draft_tokens=torch.tensor([0, 3, 1]))
    _expect("num_draft_tokens must be None or a", num_draft_tokens=torch.tensor([0.5, 1.0, 1.0]))


def test_values():
    target, draft, tokens = _inputs()
    bad = target.clone()
    bad[2, 1, 3] = float("nan")
    _expect("target_logits: row 2 contains NaN", target_logits=bad)
    bad = target.clone()
    bad[1, 0, 0] = float("inf")
    _expect("target_logits: row 1 contains NaN or \\+inf", target_logits=bad)
    bad = target.clone()
    bad[0, 2] = float("-inf")
    _expect("target_logits: row 0 has a position whose processed distribution is empty", target_logits=bad)
    bad = draft.clone()
    bad[1, 1] = float("nan")
    _expect("draft_logits: row 1 contains NaN", draft_logits=bad)
    bad_tokens = tokens.clone()
    bad_tokens[2, 0] = V
    _expect(r"draft_tokens: row 2 holds an id outside \[0, 10\)", draft_tokens=bad_tokens)
    bad_tokens[2, 0] = -1
    _expect(r"draft_tokens: row 2 holds an id outside", draft_tokens=bad_tokens)
    _expect("temperature: row 0 is so small", target_logits=target * 1e30, temperature=1e-10)


def test_unused_positions_are_not_checked():
    target, draft, tokens = _inputs()
    target[0, 2] = float("nan")
    tokens[0, 1] = -1
    out = specdec_ext.verify(target, draft, tokens, num_draft_tokens=torch.tensor([1, 2, 2]), backend="eager")
    assert out.tokens.shape == (B, K + 1)


def test_sample_validation():
    with pytest.raises(ValueError, match="logits must be a 2-D"):
        specdec_ext.sample(torch.randn(2, 3, 4))
    with pytest.raises(ValueError, match="^logits: row 1 contains NaN"):
        specdec_ext.sample(torch.tensor([[0.0, 1.0], [float("nan"), 0.0]]), backend="eager")


def test_check_false_never_raises_on_values_and_blanks_rows():
    target, draft, tokens = _inputs()
    target[1, 0, 0] = float("nan")
    out = specdec_ext.verify(target, draft, tokens, check=False, backend="eager")
    assert (out.tokens[1] == -1).all() and out.num_accepted[1] == 0
    assert (out.tokens[0] >= 0).sum() == out.num_accepted[0] + 1
