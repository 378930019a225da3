"""The backend table and its one rule, the same for verify, block verification, sample and trees."""

from __future__ import annotations

import warnings

import pytest
import torch

import specdec_ext
from specdec_ext import _cpp_backend, _dispatch


@pytest.fixture
def fresh_resolutions():
    _dispatch.forget()
    yield
    _dispatch.forget()


def _chain(batch=3, k=2, vocab=30, seed=0):
    g = torch.Generator().manual_seed(seed)
    target = torch.randn(batch, k + 1, vocab, generator=g)
    draft = torch.randn(batch, k, vocab, generator=g)
    return target, draft, torch.randint(0, vocab, (batch, k), generator=g)


def test_the_table_points_at_every_backends_contract_entry_points():
    assert set(_dispatch.TABLE) == {"eager", "cpp", "triton"}
    for name, entries in _dispatch.TABLE.items():
        assert set(entries) == set(_dispatch.ENTRY_POINTS), name
        for entry, (module, function) in entries.items():
            assert callable(_dispatch._function(module, function)), (name, entry)
    assert _dispatch.TABLE["cpp"]["verify_tree"] == (_cpp_backend, "verify_tree")  # the C++ backend's own entry points


@pytest.mark.parametrize("entry", _dispatch.ENTRY_POINTS)
def test_auto_takes_the_fused_kernel_of_the_device(entry):
    found = specdec_ext.available_backends("cpu", entry)
    assert found[-1] == "eager" and found == sorted(found, key=["cpp", "triton", "eager"].index)  # fastest first
    assert "triton" not in specdec_ext.available_backends("cpu", entry, interpreted=False)
    expected = "cpp" if "cpp" in found else "eager"
    assert _dispatch.resolve("auto", torch.device("cpu"), entry)[0] == expected
    assert specdec_ext.available_backends("meta", entry) == ["eager"]


@pytest.mark.parametrize("entry", _dispatch.ENTRY_POINTS)
def test_a_named_backend_that_cannot_run_the_call_raises(entry):
    with pytest.raises(ValueError, match=r"backend='triton' cannot run .* on meta \(Triton needs CUDA tensors.*available: \['eager'\]"):
        _dispatch.resolve("triton", torch.device("meta"), entry)
    with pytest.raises(ValueError, match=r"backend='cpp' cannot run .* on meta \(the C\+\+ kernel takes CPU tensors\)"):
        _dispatch.resolve("cpp", torch.device("meta"), entry)
    with pytest.raises(ValueError, match="backend must be one of"):
        _dispatch.resolve("gpu", torch.device("cpu"), entry)
    with pytest.raises(ValueError, match="entry must be one of"):
        specdec_ext.available_backends("cpu", "sample")


@pytest.mark.skipif(not _cpp_backend.is_available(), reason="the C++ extension is not built")
def test_auto_falls_back_the_same_way_for_every_entry_point(monkeypatch, fresh_resolutions):
    """Without the C++ extension, auto runs chains, blocks and trees on the eager reference with one
    RuntimeWarning per entry point, at the caller's line, never silently; naming the C++ backend raises."""
    target, draft, tokens = _chain()
    parents = torch.tensor([[-1, 0]] * 3)
    tree_draft = torch.cat([draft, draft[:, :1]], 1)
    seeds = torch.arange(3)
    fused = (specdec_ext.verify(target, draft, tokens, seeds=seeds), specdec_ext.verify(target, draft, tokens, method="block", seeds=seeds),
             specdec_ext.verify_tree(target, tree_draft, tokens, parents, seeds=seeds))
    _dispatch.forget()
    monkeypatch.setattr(_cpp_backend, "_C", None)
    with pytest.warns(RuntimeWarning) as record:
        for _ in range(2):
            chain = specdec_ext.verify(target, draft, tokens, seeds=seeds)
            block = specdec_ext.verify(target, draft, tokens, method="block", seeds=seeds)
            tree = specdec_ext.verify_tree(target, tree_draft, tokens, parents, seeds=seeds)
    messages = [str(w.message) for w in record if issubclass(w.category, RuntimeWarning)]
    assert len(messages) == 3, messages  # once per entry point
    assert all(w.filename == __file__ for w in record), [w.filename for w in record]  # the caller's line
    assert any("block verification" in m for m in messages) and any("tree verification" in m for m in messages)
    # The eager reference gives the fused kernel's tokens.
    for got, want in zip((chain, block, tree), fused, strict=True):
        assert torch.equal(got.tokens, want.tokens)
    for call in (lambda: specdec_ext.verify(target, draft, tokens, backend="cpp"),
                 lambda: specdec_ext.verify(target, draft, tokens, method="block", backend="cpp"),
                 lambda: specdec_ext.verify_tree(target, tree_draft, tokens, parents, backend="cpp")):
        with pytest.raises(ValueError, match=r"backend='cpp' cannot run .*; available: \["):
            call()
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        specdec_ext.verify_tree(target, tree_draft, tokens, parents)  # warned once: not again


def test_every_entry_point_checks_the_backend_name_the_same_way():
    target, draft, tokens = _chain()
    for call in (lambda: specdec_ext.verify(target, draft, tokens, backend="cuda"),
                 lambda: specdec_ext.verify(target, draft, tokens, backend="cuda", method="block"),
                 lambda: specdec_ext.sample(target[:, 0], backend="cuda"),
                 lambda: specdec_ext.verify_tree(target, torch.cat([draft, draft[:, :1]], 1), tokens, torch.tensor([[-1, 0]] * 3), backend="cuda"),
                 lambda: specdec_ext.Verifier(3, 2, 30, backend="cuda"),
                 lambda: specdec_ext.Sampler(3, 30, backend="cuda")):
        with pytest.raises(ValueError, match=r"backend must be one of \('auto', 'triton', 'cpp', 'eager'\), got 'cuda'"):
            call()
