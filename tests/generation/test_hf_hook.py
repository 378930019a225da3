"""specdec_ext.hf: the assisted-generation hook and the custom_generate entry point."""

from __future__ import annotations

import inspect
import warnings

import pytest
import torch
import transformers.generation.utils as hf_utils
from scipy.stats import chi2
from support.sequence_laws import RecordingStreamer, fits
from support.tiny_models import left_pad, perturbed_copy, tiny_gpt2, tiny_llama
from transformers.generation.logits_process import LogitsProcessorList, MinPLogitsWarper, RepetitionPenaltyLogitsProcessor
from transformers.generation.utils import GenerationMixin
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
    original, original_loop = hf_utils._speculative_sampling, GenerationMixin._assisted_decoding
    assert hf.install() and hf.install()  # idempotent
    assert hf_utils._speculative_sampling is not original and GenerationMixin._assisted_decoding is not original_loop
    assert inspect.signature(hf_utils._speculative_sampling) == inspect.signature(original)
    assert inspect.signature(GenerationMixin._assisted_decoding) == inspect.signature(original_loop)
    before = hf.call_counts().get("loop", 0)
    _assisted(target, draft, 0, max_new_tokens=8, do_sample=True)
    assert hf.call_counts()["loop"] == before + 1

    hf.uninstall()
    assert hf_utils._speculative_sampling is original and GenerationMixin._assisted_decoding is original_loop
    before = hf.call_counts()
    _assisted(target, draft, 0, max_new_tokens=8, do_sample=True)
    assert hf.call_counts() == before

    # Verification only: transformers' own loop, the fused function inside it.
    with pytest.raises(RuntimeError, match="inside"), hf.fused_verification(loop=False):
        assert hf_utils._speculative_sampling is not original and GenerationMixin._assisted_decoding is original_loop
        _assisted(target, draft, 0, max_new_tokens=8, do_sample=True)
        raise RuntimeError("inside")
    assert hf_utils._speculative_sampling is original and GenerationMixin._assisted_decoding is original_loop
    assert hf.call_counts()["fused"] > before["fused"]


def test_speculative_sampling_returns_the_originals_types():
    """transformers' own unit test calls n_matches.item(): the replacement returns exactly the original's types."""
    names = list(inspect.signature(hf_utils._speculative_sampling).parameters)
    original = hf_utils._speculative_sampling
    hf.install()
    hooked = hf_utils._speculative_sampling
    for gamma, done in ((3, False), (3, True), (1, False)):
        candidates, new_logits = _block(gamma, seed=gamma)
        candidate_logits = new_logits[:, :gamma].clone()  # q = p: every draft accepted
        extra = {"is_done_candidate": torch.tensor([done])} if "is_done_candidate" in names else {}
        if done and not extra:
            continue
        torch.manual_seed(0)
        want_tokens, want_n = original(candidates, candidate_logits, gamma, new_logits.clone(), **extra)
        got_tokens, got_n = hooked(candidates, candidate_logits, gamma, new_logits.clone(), **extra)
        assert type(got_n) is type(want_n) and isinstance(got_n, torch.Tensor) and got_n.dim() == 0
        assert got_n.dtype == want_n.dtype and got_n.device == want_n.device and got_n.item() == want_n.item()
        assert type(got_tokens) is type(want_tokens) and got_tokens.dtype == want_tokens.dtype and got_tokens.device == want_tokens.device
        assert got_tokens.shape == want_tokens.shape == (1, int(want_n) + 1 if not done else gamma)
        assert got_tokens[0, :gamma].tolist() == want_tokens[0, :gamma].tolist()


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
    with hf.fused_verification(loop=False):
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
    expected = target.generate(input_ids, attention_mask=attention_mask, do_sample=False, max_new_tokens=12, repetition_penalty=1.3)
    got = target.generate(input_ids, attention_mask=attention_mask, custom_generate=hf.speculative_generate, draft_model=draft,
                          do_sample=False, max_new_tokens=12, repetition_penalty=1.3)
    assert got[:, : expected.shape[1]].tolist() == expected.tolist()


# ------------------------------------------------------------- generate(assistant_model=...) through the loop

PROMPTS = [[5, 6, 7, 8, 9], [1, 2], [4, 11, 4, 12, 4, 13, 4]]


@pytest.fixture(scope="module")
def close_pair():
    target = tiny_llama(16, seed=7, eos_token_id=None, pad_token_id=0)
    return target, perturbed_copy(target, noise=0.04)


def _eos_for(target, input_ids, attention_mask, max_new_tokens):
    """An id greedy decoding emits early in some rows and never in others."""
    free = target.generate(input_ids, attention_mask=attention_mask, do_sample=False, max_new_tokens=max_new_tokens)[:, input_ids.shape[1]:]
    for token in range(target.config.vocab_size):
        if (free[:, : max_new_tokens // 2] == token).any(1).any() and not (free == token).any(1).all():
            return token
    raise AssertionError("no token ends some rows but not others")


@pytest.mark.parametrize("batch", [1, 3])
@pytest.mark.parametrize("processors", [{}, {"repetition_penalty": 1.4, "no_repeat_ngram_size": 3}])
@pytest.mark.parametrize("drafting", ["assistant", "prompt_lookup"])
def test_greedy_through_the_hook_equals_target_only(close_pair, batch, processors, drafting):
    """transformers' own behaviour (assisted greedy == greedy), now at any batch size, with EOS ending some rows."""
    target, draft = close_pair
    input_ids, attention_mask = left_pad(PROMPTS[:batch])
    eos = _eos_for(target, input_ids, attention_mask, 16) if batch > 1 else None
    common = {"attention_mask": attention_mask, "do_sample": False, "max_new_tokens": 16, "eos_token_id": eos, **processors}
    expected = target.generate(input_ids, **common)
    source = {"assistant_model": draft} if drafting == "assistant" else {"prompt_lookup_num_tokens": 3}
    with hf.fused_verification():
        before = hf.call_counts().get("loop", 0)
        got = target.generate(input_ids, **common, **source)
        assert hf.call_counts()["loop"] == before + 1
    assert got.tolist() == expected.tolist()


@pytest.mark.parametrize("processors", [{}, {"repetition_penalty": 1.3}])
def test_several_eos_ids_and_scores_through_the_hook(close_pair, processors):
    """The hook reports the lines transformers does, with its processors as the installed version
    applies them (a repetition penalty on left-padded rows: 5.17 counts the padding, later versions
    do not; the hook takes transformers' own processor either way)."""
    target, draft = close_pair
    input_ids, attention_mask = left_pad(PROMPTS)
    first = _eos_for(target, input_ids, attention_mask, 16)
    second = next(t for t in range(16) if t != first)
    common = {"attention_mask": attention_mask, "do_sample": False, "max_new_tokens": 16, "eos_token_id": [first, second],
              "return_dict_in_generate": True, "output_scores": True, "output_logits": True, **processors}
    expected = target.generate(input_ids, **common)
    with hf.fused_verification():
        got = target.generate(input_ids, assistant_model=draft, **common)
    assert type(got) is type(expected)
    assert got.sequences.tolist() == expected.sequences.tolist()
    assert len(got.scores) == len(expected.scores) == len(got.logits) == expected.sequences.shape[1] - input_ids.shape[1]
    new = expected.sequences[:, input_ids.shape[1]:]
    ended = torch.isin(new, torch.tensor([first, second])).long().cumsum(1)
    for t in range(len(expected.scores)):
        live = (ended[:, t] == 0) | ((ended[:, t] == 1) & torch.isin(new[:, t], torch.tensor([first, second])))
        # Up to each row's end, the same lines transformers reports (rows that ended differ by definition).
        torch.testing.assert_close(got.scores[t][live], expected.scores[t][live], atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(got.logits[t][live], expected.logits[t][live], atol=1e-4, rtol=1e-4)


def test_sampled_law_through_the_hook_at_batch_8000(monkeypatch):
    """Sampling with processors through generate(assistant_model=...): one batch of identical prompts,
    the joint law of three new tokens against transformers' processors by enumeration."""
    from specdec_ext.generation import draws

    target, draft = tiny_llama(8, seed=11, logit_scale=1.0), tiny_gpt2(8, seed=1, logit_scale=1.0)
    draft.generation_config.num_assistant_tokens = 2
    draft.generation_config.num_assistant_tokens_schedule = "constant"
    draft.generation_config.assistant_confidence_threshold = 0.0
    prompt = [1, 2, 3]
    reference = LogitsProcessorList([RepetitionPenaltyLogitsProcessor(2.5), MinPLogitsWarper(0.15)])

    def run():
        torch.manual_seed(5)
        with hf.fused_verification():
            out = target.generate(torch.tensor([prompt] * 8000), assistant_model=draft, do_sample=True, top_k=0, max_new_tokens=3,
                                  repetition_penalty=2.5, min_p=0.15)
        return fits(out[:, len(prompt):], target, prompt, reference)

    ok, statistic, threshold = run()
    assert ok, (statistic, threshold)

    def raw_draws(raw, processed, run, keys):  # drafts from the raw draft logits while verify() is told q is the processed line
        return specdec_ext.sample(draws.pad_vocab(raw, run.vocab), check=False)

    monkeypatch.setattr(draws, "draw_draft", raw_draws)
    ok, statistic, threshold = run()
    assert not ok, (statistic, threshold)


def test_streamer_receives_each_accepted_block(close_pair):
    target, draft = close_pair
    input_ids = torch.tensor([PROMPTS[2]])
    streamer = RecordingStreamer()
    with hf.fused_verification(num_draft_tokens=4):
        out = target.generate(input_ids, assistant_model=draft, do_sample=False, max_new_tokens=20, streamer=streamer)
    assert streamer.puts[0] == PROMPTS[2] and streamer.ended == 1  # transformers puts the prompt first
    blocks = streamer.puts[1:]
    assert sum(blocks, []) == out[0, input_ids.shape[1]:].tolist()
    assert max(len(block) for block in blocks) > 1  # tokens arrive as accepted, several per step
    assert len(blocks) < 20


def test_unsupported_argument_falls_back_with_one_warning(close_pair):
    target, draft = close_pair
    input_ids, attention_mask = left_pad(PROMPTS)
    common = {"attention_mask": attention_mask, "do_sample": False, "max_new_tokens": 8, "return_dict_in_generate": True, "output_attentions": True}
    expected = target.generate(input_ids, **common)
    with hf.fused_verification():
        with pytest.warns(RuntimeWarning, match="output_attentions.*target-only"):
            got = target.generate(input_ids, assistant_model=draft, **common)
        assert got.sequences.tolist() == expected.sequences.tolist() and got.attentions is not None
        with warnings.catch_warnings():
            warnings.simplefilter("error", RuntimeWarning)  # said once per argument
            target.generate(input_ids, assistant_model=draft, **common)
        hidden = {**common, "attention_mask": None, "output_attentions": False, "output_hidden_states": True}
        with pytest.warns(RuntimeWarning, match="output_hidden_states.*assisted generation"):
            single = target.generate(input_ids[2:], assistant_model=draft, **hidden)
    assert single.sequences[0].tolist() == expected.sequences[2].tolist() and single.hidden_states is not None


def test_max_time_stops_after_the_step_that_crossed_it(close_pair):
    target, draft = close_pair
    input_ids, attention_mask = left_pad(PROMPTS)
    with hf.fused_verification(num_draft_tokens=3):
        out = target.generate(input_ids, attention_mask=attention_mask, assistant_model=draft, do_sample=False, max_new_tokens=30, max_time=1e-9)
    assert 1 <= out.shape[1] - input_ids.shape[1] <= 4  # one step: at most K + 1 tokens


@pytest.fixture(scope="module")
def embedded():
    from specdec_ext.demo.assets import load_pair

    target, draft, tokenizer = load_pair()
    tokenizer.padding_side = "left"
    return target, draft, tokenizer


@pytest.mark.parametrize("batch", [1, 2])
def test_stop_strings_through_the_hook(embedded, batch):
    """transformers' stop strings with the hook: each row ends at the token completing the string, even inside an accepted block."""
    target, draft, tokenizer = embedded
    prompts = ["Market wrap: ", "Quarterly results: "][:batch]
    encoded = tokenizer(prompts, return_tensors="pt", padding=True)
    common = {"attention_mask": encoded["attention_mask"], "do_sample": False, "max_new_tokens": 40, "pad_token_id": tokenizer.pad_token_id}
    free = target.generate(encoded["input_ids"], **common)
    text = tokenizer.decode(free[0, encoded["input_ids"].shape[1]:], skip_special_tokens=True)
    stop = text[len(text) // 3: len(text) // 3 + 4]  # a string the first row produces mid-way
    expected = target.generate(encoded["input_ids"], stop_strings=stop, tokenizer=tokenizer, **common)
    with hf.fused_verification(num_draft_tokens=4):
        got = target.generate(encoded["input_ids"], assistant_model=draft, stop_strings=stop, tokenizer=tokenizer, **common)
    assert got.tolist() == expected.tolist()
    # The stop string did end the first row early (shorter output, or padding where free decoding went on).
    assert expected.shape[1] < free.shape[1] or expected[0].tolist() != free[0, : expected.shape[1]].tolist()


@pytest.mark.parametrize("batch", [1, 3])
def test_sampled_runs_through_the_hook_are_the_loops(close_pair, batch):
    """A sampled generate(assistant_model=...) is specdec_ext.generate with the same processors: same draws, same tokens."""
    target, draft = close_pair
    # Equal lengths: transformers < 5.24 lets the repetition penalty see prompt padding, generate() never does.
    input_ids, attention_mask = left_pad([[5, 6, 7], [1, 2, 3], [4, 11, 4]][:batch])
    torch.manual_seed(123)
    with hf.fused_verification(num_draft_tokens=3):
        got = target.generate(input_ids, attention_mask=attention_mask, assistant_model=draft, do_sample=True, temperature=0.8, top_k=8,
                              top_p=0.95, max_new_tokens=12, repetition_penalty=1.2)
    torch.manual_seed(123)
    direct = specdec_ext.generate(target, draft, input_ids, attention_mask, max_new_tokens=12, temperature=0.8, top_k=8, top_p=0.95,
                                  repetition_penalty=1.2, num_draft_tokens=3, eos_token_id=[])
    assert got.tolist() == direct.sequences.tolist()
    new = got[:, input_ids.shape[1]:]
    assert ((new >= 0) & (new < 16)).all() and hf.last_stats().target_forwards < 12  # several tokens per target forward


def test_sampled_scores_are_the_warped_logits(close_pair):
    """output_scores are what each token was drawn from: transformers' warpers applied to the raw logits (output_logits)."""
    from transformers.generation.logits_process import TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

    target, draft = close_pair
    input_ids, attention_mask = left_pad(PROMPTS)
    torch.manual_seed(0)
    with hf.fused_verification(num_draft_tokens=3):
        out = target.generate(input_ids, attention_mask=attention_mask, assistant_model=draft, do_sample=True, temperature=0.7, top_k=6,
                              top_p=0.9, max_new_tokens=10, return_dict_in_generate=True, output_scores=True, output_logits=True)
    warpers = LogitsProcessorList([TemperatureLogitsWarper(0.7), TopKLogitsWarper(6), TopPLogitsWarper(0.9)])
    new = out.sequences[:, input_ids.shape[1]:]
    assert len(out.scores) == len(out.logits) == new.shape[1]
    for t in range(new.shape[1]):
        torch.testing.assert_close(out.scores[t], warpers(None, out.logits[t].clone()))
        drawn = out.scores[t].gather(1, new[:, t: t + 1])
        assert torch.isfinite(drawn).all()  # every emitted token had probability > 0 under its scores


def test_benchmark_fixes_transformers_draft_length_on_the_assistant():
    # transformers reads K from the assistant's generation config; generate() keywords never reach it
    # (then every K below would run transformers' defaults and take the same number of forwards).
    from specdec_ext import measure

    target = tiny_llama(8, seed=0)
    draft = tiny_llama(8, seed=0)
    before = draft.generation_config.to_dict()
    common = {"max_new_tokens": 24, "sampling": {"temperature": 0.0}, "eos_ids": [], "pad_id": 0}
    forwards = []
    for k in (1, 3, 6):
        run = measure.assisted(target, draft, PROMPT, torch.ones_like(PROMPT), num_draft_tokens=k, mode="transformers", **common)
        assert run.new_tokens == 24
        forwards.append(run.details["target_forwards"])
    assert forwards[0] > forwards[1] > forwards[2] >= 24 // 7, forwards  # longer blocks, fewer target forwards
    assert draft.generation_config.to_dict() == before  # restored after each call
