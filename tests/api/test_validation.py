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


def _lazy_backends() -> list[str]:
    return [b for b in ("eager", "cpp", "triton") if b in specdec_ext.available_backends("cpu")]


def _spoil_cases() -> list:
    # The interpreter is slow: the default run spoils three lines with Triton, make test-slow the rest.
    cases = []
    for backend in _lazy_backends():
        if backend == "triton":
            cases += [pytest.param("triton", "few", id="triton"), pytest.param("triton", "more", id="triton-more", marks=pytest.mark.slow)]
        else:
            cases.append(pytest.param(backend, "all", id=backend))
    return cases


@pytest.mark.parametrize(("backend", "spoil_set"), _spoil_cases())
def test_check_false_reads_lines_up_to_the_first_rejection(backend, spoil_set):
    """check=False blanks a row only for a bad line its verification reads; further lines cannot
    change its tokens. The oracle is the clean call: a spoiled line past a row's stopping point j
    leaves the row exactly as it was, a spoiled line at or before j blanks it. check=True raises
    for every spoiled line up to n_b."""
    batch, k, vocab = 6, 4, 300
    g = torch.Generator().manual_seed(11)
    target = torch.randn(batch, k + 1, vocab, generator=g) * 2
    draft = target[:, :k] + 0.7 * torch.randn(batch, k, vocab, generator=g)
    tokens = torch.multinomial(draft.softmax(-1).reshape(-1, vocab), 1, generator=g).reshape(batch, k)
    temperature = torch.tensor([1.0, 1.0, 0.8, 1.0, 0.0, 0.0])  # rows 4-5 greedy
    tokens[4] = target[4, :k].argmax(-1)  # a greedy row that accepts everything
    tokens[5, 1:] = target[5, 1:k].argmax(-1)  # and one that stops at position 0 (most likely)

    def run(t, d, check):
        return specdec_ext.verify(t, d, tokens, temperature=temperature, generator=torch.Generator().manual_seed(5), backend=backend, check=check)

    clean = run(target, draft, False)
    stops = clean.num_accepted.tolist()
    assert len(set(stops)) > 1 and 0 < max(stops[:4])  # rows stop at different positions
    values = (float("nan"),) if backend == "triton" else (float("nan"), float("inf"), "empty")
    spoils = [(line, position, value) for position in range(k + 1) for line in ("target", "draft") for value in values]
    if spoil_set == "more":  # every target position with NaN, draft lines at both ends, each kind once
        spoils = [s for s in spoils if s[0] == "target" or s[1] in (0, k - 1)]
        spoils += [("target", 0, "empty"), ("draft", k - 1, "empty")]
    elif spoil_set == "few":  # a line every row reads, one only some rows reach, an empty draft line
        spoils = [("target", 1, float("nan")), ("target", k, float("inf")), ("draft", k - 1, "empty")]
    for line, position, value in spoils:
        if line == "draft" and position == k:
            continue
        t, d = target.clone(), draft.clone()
        spoiled = t if line == "target" else d
        if value == "empty":
            spoiled[:, position] = float("-inf")
        else:
            spoiled[:, position, 7] = value
        out = run(t, d, False)
        for row in range(batch):
            greedy = float(temperature[row]) == 0
            read = position <= stops[row] and not (line == "draft" and greedy)
            if read:
                assert (out.tokens[row] == -1).all() and int(out.num_accepted[row]) == 0, (line, position, value, row)
            else:
                assert torch.equal(out.tokens[row], clean.tokens[row]) and int(out.num_accepted[row]) == stops[row], (line, position, value, row)
        with pytest.raises(ValueError, match=f"^{line}_logits: row 0 "):
            run(t, d, True)


def test_scalar_parameters_take_the_cached_path_with_the_same_results():
    """Scalar parameters reuse cached per-row tensors: bad values still raise on every call, and the
    results equal those of explicit per-row tensors."""
    target, draft, tokens = _inputs()
    for _ in range(2):
        with pytest.raises(ValueError, match="temperature must be a finite number"):
            specdec_ext.verify(target, draft, tokens, temperature=-1.0)
        with pytest.raises(ValueError, match="top_p must lie in"):
            specdec_ext.verify(target, draft, tokens, top_p=1.5)
    for backend in specdec_ext.available_backends("cpu"):
        for params in ({}, {"temperature": 0.7, "top_k": 3}, {"temperature": 0, "top_p": 0.9}, {"top_k": 0, "top_p": None}):
            per_row = {name: torch.tensor([value] * B) for name, value in params.items() if value is not None}
            for _ in range(1 if backend == "triton" else 2):  # the second call finds the cached tensors (the cache is the same for every backend)
                a = specdec_ext.verify(target, draft, tokens, generator=torch.Generator().manual_seed(1), backend=backend, **params)
                b = specdec_ext.verify(target, draft, tokens, generator=torch.Generator().manual_seed(1), backend=backend, **per_row)
                assert torch.equal(a.tokens, b.tokens) and torch.equal(a.num_accepted, b.num_accepted), (backend, params)
    args = specdec_ext._params.validate_verify(target, draft, tokens, temperature=0.7, top_k=3, top_p=None, num_draft_tokens=None, generator=None, check=True)
    assert args.temperature.tolist() == pytest.approx([0.7] * B) and args.top_k.tolist() == [3] * B
    assert args.top_p.tolist() == [1.0] * B and args.num_draft_tokens.tolist() == [K] * B and args.filtered
