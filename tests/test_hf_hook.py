"""specdec_ext.hf: the assisted-generation hook and the custom_generate entry point."""

from __future__ import annotations

import inspect
import warnings

import pytest
import torch
import transformers.generation.utils as hf_utils
from scipy.stats import chi2
from tiny_models import left_pad, perturbed_copy, tiny_gpt2, tiny_llama
from transformers.utils import logging as hf_logging

import specdec_ext
import specdec_ext.hf as hf

PROMPT = torch.tensor([[5, 6, 7]])


@pytest.fixture(autouse=True)
def _clean_state(monkeypatch):
    # One intra-op thread: many times faster for tiny models on shared cores. Each test starts and
    # ends uninstalled, with the warn-once memory cleared.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    monkeypatch.setattr(hf, "_warned", set())
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*eager backend.*")
        yield
    hf.uninstall()
    hf_logging.set_verbosity(verbosity)
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def models():
    # Peaked laws and a draft that disagrees about half the time: a wrong sampler is visible.
    return tiny_llama(8, seed=0), tiny_gpt2(8, seed=3)


def _assisted(target, draft, seed, max_new_tokens=2, **kwargs):
    torch.manual_seed(seed)
    return target.generate(PROMPT, assistant_model=draft, max_new_tokens=max_new_tokens, **kwargs)


def test_install_is_used_and_removed(models):
    target, draft = models
    original = hf_utils._speculative_sampling
    assert hf.install() and hf.install()  # idempotent
    assert hf_utils._speculative_sampling is not original
    assert inspect.signature(hf_utils._speculative_sampling) == inspect.signature(original)
    before = hf.call_counts()["fused"]
    _assisted(target, draft, 0, max_new_tokens=8, do_sample=True)
    assert hf.call_counts()["fused"] > before

    hf.uninstall()
    assert hf_utils._speculative_sampling is original
    before = hf.call_counts()["fused"]
    _assisted(target, draft, 0, max_new_tokens=8, do_sample=True)
    assert hf.call_counts()["fused"] == before

    with pytest.raises(RuntimeError, match="inside"), hf.fused_verification():
        assert hf_utils._speculative_sampling is not original
        _assisted(target, draft, 0, max_new_tokens=8, do_sample=True)
        raise RuntimeError("inside")
    assert hf_utils._speculative_sampling is original
    assert hf.call_counts()["fused"] > before


def test_greedy_assisted_generation_is_left_alone(models):
    target, draft = models
    expected = _assisted(target, draft, 0, max_new_tokens=10, do_sample=False)
    with hf.fused_verification():
        before = hf.call_counts()
        got = _assisted(target, draft, 0, max_new_tokens=10, do_sample=False)
        assert hf.call_counts() == before
    assert got.tolist() == expected.tolist()


def test_unknown_signature_keeps_the_original(monkeypatch):
    def unfamiliar(candidate_input_ids, candidate_logits, new_logits):
        return None

    monkeypatch.setattr(hf_utils, "_speculative_sampling", unfamiliar)
    with pytest.warns(RuntimeWarning, match="unknown"):
        assert hf.install() is False
    assert hf_utils._speculative_sampling is unfamiliar
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert hf.install() is False  # said once only


def _block(gamma: int, vocab: int = 8, seed: int = 0):
    generator = torch.Generator().manual_seed(seed)
    new_logits = torch.randn(1, gamma + 1, vocab, generator=generator) * 2
    candidates = torch.cat([PROMPT, torch.randint(0, vocab, (1, gamma), generator=generator)], 1)
    return candidates, new_logits


@pytest.mark.skipif("assistant_ensemble_weight" not in inspect.signature(hf_utils._speculative_sampling).parameters,
                    reason="this transformers has no ensemble verification")
def test_ensemble_weight_falls_back_to_the_original():
    candidates, new_logits = _block(3)
    names = list(inspect.signature(hf_utils._speculative_sampling).parameters)
    extra = {"is_done_candidate": torch.tensor([False])} if "is_done_candidate" in names else {}
    hf.install()
    before = hf.call_counts()
    with pytest.warns(RuntimeWarning, match="assistant_ensemble_weight"):
        hf_utils._speculative_sampling(candidates, new_logits[:, :3], 3, new_logits, assistant_ensemble_weight=0.5, **extra)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        hf_utils._speculative_sampling(candidates, new_logits[:, :3], 3, new_logits, assistant_ensemble_weight=0.5, **extra)
    after = hf.call_counts()
    assert after["fallback"] == before["fallback"] + 2 and after["fused"] == before["fused"]


def test_without_a_fused_kernel_the_hook_keeps_transformers_code(monkeypatch):
    """With only the eager reference available the hook would slow users down: it falls back, once warned."""
    candidates, new_logits = _block(3)
    names = list(inspect.signature(hf_utils._speculative_sampling).parameters)
    extra = {"is_done_candidate": torch.tensor([False])} if "is_done_candidate" in names else {}
    monkeypatch.setattr(hf, "available_backends", lambda device: ["eager"])
    hf.install()
    before = hf.call_counts()
    with pytest.warns(RuntimeWarning, match="no fused kernel"):
        tokens, n = hf_utils._speculative_sampling(candidates, new_logits[:, :3], 3, new_logits, **extra)
    assert tokens.shape == (1, int(n) + 1)
    after = hf.call_counts()
    assert after["fallback"] == before["fallback"] + 1 and after["fused"] == before["fused"]


def test_fused_sampling_contract():
    candidates, new_logits = _block(3)
    kept = new_logits.clone()
    # q = p at the draft positions: every draft is accepted, then a bonus token follows.
    tokens, n = hf._fused_sampling(candidates, new_logits[:, :3].clone(), 3, new_logits)
    assert n == 3 and tokens.shape == (1, 4) and tokens.dtype == torch.int64
    assert tokens[0, :3].tolist() == candidates[0, 3:].tolist()
    assert torch.equal(new_logits, kept)  # the caller reads new_logits again
    # transformers <= 5.17: candidates that end the sequence get no bonus token.
    tokens, n = hf._fused_sampling(candidates, new_logits[:, :3].clone(), 3, new_logits, torch.tensor([True]))
    assert n == 2 and tokens.tolist() == candidates[:, 3:].tolist()
    # A filtered target token (-inf) is never accepted.
    filtered = new_logits.clone()
    filtered[0, 0, candidates[0, 3]] = float("-inf")
    tokens, n = hf._fused_sampling(candidates, new_logits[:, :3].clone(), 3, filtered)
    assert n == 0 and tokens.shape == (1, 1) and tokens[0, 0] != candidates[0, 3]


def _redraw_after_rejection(candidate_input_ids, candidate_logits, candidate_length, new_logits, *args, **kwargs):
    """A wrong _speculative_sampling: after a rejection it samples the target's law instead of the residual."""
    p, q = new_logits.softmax(-1), candidate_logits.softmax(-1)
    drafts = candidate_input_ids[:, -candidate_length:]
    n = 0
    while n < candidate_length and torch.rand(()) < p[0, n, drafts[0, n]] / q[0, n, drafts[0, n]]:
        n += 1
    bonus = torch.multinomial(p[0, n], 1)
    return torch.cat([drafts[:, :n], bonus[None]], 1), n


def _first_token_statistic(target, draft, trials: int) -> tuple[float, float]:
    """Pearson statistic of the first new token of assisted sampling against the target's law, and its threshold."""
    with torch.no_grad():
        law = target(PROMPT).logits[0, -1].double().softmax(-1)
    counts = torch.zeros_like(law)
    for seed in range(trials):
        counts[_assisted(target, draft, seed, do_sample=True, top_k=0)[0, PROMPT.shape[1]]] += 1
    expected = trials * law
    big = expected >= 20  # pool cells too small for the chi-square approximation
    observed = torch.cat([counts[big], counts[~big].sum()[None]])
    expected = torch.cat([expected[big], expected[~big].sum()[None]])
    statistic = float(((observed - expected) ** 2 / expected.clamp(min=1e-300)).sum())
    return statistic, float(chi2.isf(1e-6, observed.numel() - 1))


def test_hooked_assisted_sampling_follows_the_target_law(models, monkeypatch):
    target, draft = models
    trials = 800
    with hf.fused_verification():
        before = hf.call_counts()["fused"]
        statistic, threshold = _first_token_statistic(target, draft, trials)
        assert hf.call_counts()["fused"] - before >= trials  # the fused path drew every first token
    assert statistic < threshold, (statistic, threshold)

    # The same check rejects a sampler that redraws from the target after a rejection.
    monkeypatch.setattr(hf_utils, "_speculative_sampling", _redraw_after_rejection)
    statistic, threshold = _first_token_statistic(target, draft, trials)
    assert statistic > threshold, (statistic, threshold)


def test_speculative_generate_as_custom_generate():
    target = tiny_llama(16, seed=7, eos_token_id=3, pad_token_id=0)
    draft = perturbed_copy(target, noise=0.02)
    input_ids, attention_mask = left_pad([[5, 6, 7, 8], [1, 2], [9]])
    expected = target.generate(input_ids, attention_mask=attention_mask, do_sample=False, max_new_tokens=12)
    got = target.generate(input_ids, attention_mask=attention_mask, custom_generate=hf.speculative_generate, draft_model=draft,
                          do_sample=False, max_new_tokens=12, num_draft_tokens=3)
    assert got[:, : expected.shape[1]].tolist() == expected.tolist()
    assert (got[:, expected.shape[1]:] == 0).all()  # rows are padded to max_new_tokens after EOS

    generator = torch.Generator().manual_seed(0)
    sampled = target.generate(input_ids, attention_mask=attention_mask, custom_generate=hf.speculative_generate, draft_model=draft,
                              do_sample=True, temperature=0.8, top_k=6, max_new_tokens=12, generator=generator, return_dict_in_generate=True)
    direct = specdec_ext.generate(target, draft, input_ids, attention_mask, max_new_tokens=12, temperature=0.8, top_k=6,
                                  top_p=1.0, generator=torch.Generator().manual_seed(0))
    assert sampled.sequences.tolist() == direct.sequences.tolist()  # same parameters, same random stream

    with pytest.raises(ValueError, match="draft_model"):
        target.generate(input_ids, attention_mask=attention_mask, custom_generate=hf.speculative_generate, max_new_tokens=4)
    with pytest.raises(ValueError, match="RepetitionPenalty"):
        target.generate(input_ids, attention_mask=attention_mask, custom_generate=hf.speculative_generate, draft_model=draft,
                        max_new_tokens=4, repetition_penalty=1.3)
