"""specdec_ext.generate: exactness (greedy equality, exact sampling laws), cache hygiene, vocabularies."""

from __future__ import annotations

import importlib
import itertools
import warnings

import pytest
import torch
from scipy.stats import chi2
from sequence_laws import fits
from tiny_models import left_pad, perturbed_copy, tiny_gpt2, tiny_llama
from transformers.generation.logits_process import LogitsProcessorList, TypicalLogitsWarper

import specdec_ext
from specdec_ext.processors import LogitsPipeline
from specdec_ext.reference import process_lines

gen = importlib.import_module("specdec_ext.generate")  # the module (specdec_ext.generate is the function)


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    # The tests share two cores with other work; one intra-op thread is many times faster on tiny models.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*eager backend.*")
        yield
    torch.set_num_threads(threads)


# ---------------------------------------------------------------------------------------------- greedy


PROMPTS = [[5, 6, 7, 8, 9], [1, 2], [4, 11, 4, 12, 4, 13, 4], [7], [3, 9, 10]]


def _pair(name: str, vocab: int = 16):
    if name == "llama-gpt2":  # unrelated draft: mostly rejections
        return tiny_llama(vocab), tiny_gpt2(vocab, seed=3)
    if name == "gpt2-close":  # close draft: long accepted runs
        target = tiny_gpt2(vocab, seed=5, layers=2)
        return target, perturbed_copy(target, noise=0.04)
    if name == "llama-close":
        target = tiny_llama(vocab, seed=7)
        return target, perturbed_copy(target, noise=0.02)
    raise KeyError(name)


def _target_only(target, input_ids, attention_mask, max_new_tokens, eos, pad):
    out = target.generate(input_ids, attention_mask=attention_mask, do_sample=False, max_new_tokens=max_new_tokens,
                          eos_token_id=eos, pad_token_id=pad)
    return torch.nn.functional.pad(out, (0, input_ids.shape[1] + max_new_tokens - out.shape[1]), value=pad)


def _eos_ending_some_rows(target, input_ids, attention_mask, max_new_tokens) -> int:
    """An id that greedy decoding emits early in some rows and never in others (so EOS handling is exercised)."""
    free = _target_only(target, input_ids, attention_mask, max_new_tokens, None, 0)[:, input_ids.shape[1]:]
    for token in range(target.config.vocab_size):
        hits = (free == token).any(1)
        early = (free[:, : max_new_tokens // 2] == token).any(1)
        if early.any() and not hits.all():
            return token
    raise AssertionError("no token ends some rows but not all; change the model seeds")


@pytest.mark.parametrize(("pair", "num_draft_tokens"), [("llama-gpt2", 3), ("gpt2-close", 4), ("llama-close", "auto"), ("llama-close", 1)])
def test_greedy_equals_target_only_generate(pair, num_draft_tokens):
    target, draft = _pair(pair)
    input_ids, attention_mask = left_pad(PROMPTS)
    max_new = 24
    eos = _eos_ending_some_rows(target, input_ids, attention_mask, max_new)
    expected = _target_only(target, input_ids, attention_mask, max_new, eos, 0)
    out = specdec_ext.generate(target, draft, input_ids, attention_mask, max_new_tokens=max_new, do_sample=False,
                               num_draft_tokens=num_draft_tokens, eos_token_id=eos, pad_token_id=0)
    assert out.sequences.shape == expected.shape
    for row in range(len(PROMPTS)):
        assert out.sequences[row].tolist() == expected[row].tolist(), f"row {row}"
    stats = out.stats
    assert stats.target_forwards == len(stats.draft_lengths) + 1
    assert stats.draft_forwards == sum(stats.draft_lengths) + 1
    assert 0 <= stats.mean_acceptance <= 1 and stats.tokens_per_target_forward >= 1
    if pair != "llama-gpt2":  # the test only means something if long accepted runs and rejections both happen
        assert 0.3 < stats.mean_acceptance < 0.98, stats
        assert 0 < stats.tokens_per_target_forward_stderr < 1, stats  # steps emitted different numbers of tokens


@pytest.mark.parametrize("attention", ["eager", "2-d mask"])
def test_greedy_on_the_other_attention_paths(attention, monkeypatch):
    # sdpa (above) and eager get a 4-D mask built here; other implementations get the 2-D live-slot mask.
    if attention == "2-d mask":
        monkeypatch.setattr(gen._Cache, "_attention_mask", lambda self, width: self.slots)
    implementation = "eager" if attention == "eager" else "sdpa"
    target = tiny_llama(16, seed=7, attn_implementation=implementation)
    draft = tiny_gpt2(16, seed=3, attn_implementation=implementation)
    input_ids, attention_mask = left_pad(PROMPTS)
    expected = _target_only(target, input_ids, attention_mask, 20, None, 0)
    out = specdec_ext.generate(target, draft, input_ids, attention_mask, max_new_tokens=20, do_sample=False, num_draft_tokens=3)
    assert out.sequences.tolist() == expected.tolist()


def test_greedy_with_holes_squeezed_every_step(monkeypatch):
    monkeypatch.setattr(gen, "COMPACT_MIN_HOLES", 0)
    monkeypatch.setattr(gen, "COMPACT_HOLE_RATIO", 0.0)
    squeezes = []
    original = gen._Cache.squeeze_holes

    def counting(self, max_live):
        before = self.slots.shape[1]
        original(self, max_live)
        squeezes.append(before - self.slots.shape[1])

    monkeypatch.setattr(gen._Cache, "squeeze_holes", counting)
    target, draft = _pair("llama-close")
    input_ids, attention_mask = left_pad(PROMPTS)
    expected = _target_only(target, input_ids, attention_mask, 20, None, 0)
    out = specdec_ext.generate(target, draft, input_ids, attention_mask, max_new_tokens=20, do_sample=False, num_draft_tokens=3, eos_token_id=[])
    assert out.sequences.tolist() == expected.tolist()
    assert sum(squeezes) > 0


def test_finished_rows_leave_the_batch(monkeypatch):
    sizes = []
    original = gen._verify_and_write

    def recording(run, rows, target_logits, *args):
        sizes.append(target_logits.shape[0])
        return original(run, rows, target_logits, *args)

    monkeypatch.setattr(gen, "_verify_and_write", recording)
    target, draft = _pair("llama-close")
    input_ids, attention_mask = left_pad(PROMPTS)
    eos = _eos_ending_some_rows(target, input_ids, attention_mask, 24)
    out = specdec_ext.generate(target, draft, input_ids, attention_mask, max_new_tokens=24, do_sample=False, eos_token_id=eos, pad_token_id=0)
    assert sizes == sorted(sizes, reverse=True) and sizes[0] == len(PROMPTS) and sizes[-1] < len(PROMPTS)
    finished = (out.sequences[:, input_ids.shape[1]:] == eos).any(1)
    assert finished.any() and not finished.all()


# ------------------------------------------------------------------------------------- fresh scores


def _record_scores(monkeypatch):
    """Record, for every verification, the rows, their progress and the logits and drafts it was given."""
    records = []
    original = gen._verify_and_write

    def recording(run, rows, target_logits, draft_logits, drafts, budget):
        result = original(run, rows, target_logits, draft_logits, drafts, budget)
        kept_draft = None if draft_logits is None else draft_logits.clone()  # None when K = 0
        records.append((rows.index.clone(), rows.generated.clone(), target_logits.clone(), kept_draft, drafts.clone(), result[1].clone()))
        return result

    monkeypatch.setattr(gen, "_verify_and_write", recording)
    return records


def _stalest_scores(target, draft, records, sequences, attention_mask) -> tuple[float, float]:
    """Largest gaps between the logits a step used and fresh, cache-free forwards of their contexts.

    Target: positions j <= num_accepted (contexts made of committed tokens only). Draft: every position
    (its context is the committed tokens and the drafts before it).
    """
    width = attention_mask.shape[1]
    worst_target = worst_draft = 0.0
    with torch.no_grad():
        for index, generated, target_logits, draft_logits, drafts, accepted in records:
            k = drafts.shape[1]
            for b in range(index.shape[0]):
                row, done, a = int(index[b]), int(generated[b]), int(accepted[b])
                committed = torch.cat([sequences[row, :width][attention_mask[row].bool()], sequences[row, width: width + done]])
                fresh = target(torch.cat([committed, drafts[b, :a]])[None]).logits[0, -(a + 1):]
                worst_target = max(worst_target, float((fresh - target_logits[b, : a + 1]).abs().max()))
                if k:
                    fresh = draft(torch.cat([committed, drafts[b, : k - 1]])[None]).logits[0, -k:]
                    worst_draft = max(worst_draft, float((fresh - draft_logits[b]).abs().max()))
    return worst_target, worst_draft


def _fresh_run(monkeypatch, pair: str):
    target, draft = _pair(pair)
    input_ids, attention_mask = left_pad(PROMPTS)
    records = _record_scores(monkeypatch)
    out = specdec_ext.generate(target, draft, input_ids, attention_mask, max_new_tokens=16, num_draft_tokens=3,
                               generator=torch.Generator().manual_seed(0), eos_token_id=[])
    return _stalest_scores(target, draft, records, out.sequences, attention_mask), out.stats


@pytest.mark.parametrize("pair", ["llama-gpt2", "llama-close"])
def test_every_step_scores_fresh_logits(pair, monkeypatch):
    (target_gap, draft_gap), stats = _fresh_run(monkeypatch, pair)
    assert target_gap < 1e-4 and draft_gap < 1e-4
    if pair == "llama-gpt2":
        assert stats.mean_acceptance < 0.7  # many rejections: holes in both caches
    else:
        assert stats.acceptance_per_position[-1] > 0.25  # blocks fully accepted: the draft catches up


def test_fresh_score_check_catches_stale_entries(monkeypatch):
    # A cache that keeps rejected drafts live ...
    monkeypatch.setattr(gen._Cache, "settle", lambda self, live_tail, all_live=False: None)
    assert _fresh_run(monkeypatch, "llama-gpt2")[0][0] > 1e-2
    monkeypatch.undo()

    # ... target scores carried over from the previous step's forward ...
    previous = {}
    original_forward = gen._Cache.forward

    def reusing(self, tokens, positions, live, logits_to_keep=None, all_live=True):
        logits = original_forward(self, tokens, positions, live, logits_to_keep, all_live)
        old = previous.get(id(self))
        previous[id(self)] = logits
        if old is not None and old.shape == logits.shape and tokens.shape[1] > 1:
            logits = torch.cat([logits[:, :1], old[:, 1:]], 1)
        return logits

    monkeypatch.setattr(gen._Cache, "forward", reusing)
    assert _fresh_run(monkeypatch, "llama-gpt2")[0][0] > 1e-2
    monkeypatch.undo()

    # ... and a draft that never sees the last draft of a fully accepted block.
    original_draft = gen._draft

    def forgetful(draft, rows, *args):
        rows.any_behind = False
        return original_draft(draft, rows, *args)

    monkeypatch.setattr(gen, "_draft", forgetful)
    assert _fresh_run(monkeypatch, "llama-close")[0][1] > 1e-2


# ----------------------------------------------------------------------------------- exact sampling laws


def _exact_law(target, prompt, num_tokens, temperature, top_k, top_p) -> torch.Tensor:
    """P(x_1..x_n | prompt) under the processed target, flattened (x_1 most significant), by enumeration."""
    vocab = target.config.vocab_size
    heads = torch.tensor(list(itertools.product(range(vocab), repeat=num_tokens - 1)), dtype=torch.long).reshape(-1, num_tokens - 1)
    ids = torch.cat([torch.tensor(prompt).expand(heads.shape[0], -1), heads], 1)
    with torch.no_grad():
        logits = target(ids).logits[:, len(prompt) - 1:]  # (V^(n-1), n, V)
    lines = logits.reshape(-1, vocab)
    count = lines.shape[0]
    probs = process_lines(lines, torch.full((count,), float(temperature)), torch.full((count,), top_k or 0),
                          torch.full((count,), float(top_p or 1.0))).probs().reshape(heads.shape[0], num_tokens, vocab)
    law = torch.ones(heads.shape[0], dtype=torch.float64)
    for i in range(num_tokens - 1):
        law = law * probs[torch.arange(heads.shape[0]), i, heads[:, i]].double()
    return (law[:, None] * probs[:, -1].double()).reshape(-1)


def _chi_square(counts: torch.Tensor, law: torch.Tensor, alpha: float) -> tuple[float, float]:
    """(statistic, threshold) of Pearson's test with cells of expected count < 20 pooled; inf if a p = 0 cell is hit."""
    if counts[law == 0].sum() > 0:
        return float("inf"), 0.0
    expected = counts.sum() * law
    big = expected >= 20
    observed = torch.cat([counts[big].double(), counts[~big].sum()[None].double()])
    expected = torch.cat([expected[big], expected[~big].sum()[None]])
    keep = expected > 0
    statistic = float(((observed[keep] - expected[keep]) ** 2 / expected[keep]).sum())
    return statistic, float(chi2.isf(alpha, int(keep.sum()) - 1))


def _redraw_from_target_after_rejection(target_logits, draft_logits, draft_tokens, *, num_draft_tokens, generator, check, **options):
    """A wrong verifier: after a rejection it samples the target's law instead of the residual max(p - q, 0)."""
    result = specdec_ext.verify(target_logits, draft_logits, draft_tokens, num_draft_tokens=num_draft_tokens, generator=generator, check=check, **options)
    sampling = {name: value for name, value in options.items() if name in ("temperature", "top_k", "top_p")}
    rows = torch.arange(target_logits.shape[0])
    redrawn = specdec_ext.sample(target_logits[rows, result.num_accepted], generator=generator, **sampling)
    tokens = result.tokens.clone()
    rejected = result.num_accepted < num_draft_tokens
    tokens[rows, result.num_accepted] = torch.where(rejected, redrawn, tokens[rows, result.num_accepted])
    return specdec_ext.VerifyResult(tokens, result.num_accepted)


LAW_CASES = {
    # name: (target vocab, draft vocab, new tokens, K, temperature, top_k, top_p, rows per prompt)
    "plain": (8, 8, 3, 2, 1.0, None, None, 8000),
    "filtered": (8, 8, 3, 3, 0.8, 5, 0.9, 8000),
    "padded-target": (10, 8, 2, "auto", 1.3, None, 0.95, 6000),
}
LAW_PROMPTS = [[1, 2, 3], [4]]


def _sample_counts(case, generator_seed):
    target_vocab, draft_vocab, new, k, temperature, top_k, top_p, rows = LAW_CASES[case]
    # Mildly peaked laws: many cells carry mass, and the draft disagrees often (acceptance 0.3-0.5).
    target, draft = tiny_llama(target_vocab, seed=11, logit_scale=1.0), tiny_gpt2(draft_vocab, seed=1, logit_scale=1.0)
    input_ids, attention_mask = left_pad([p for p in LAW_PROMPTS for _ in range(rows)])
    out = specdec_ext.generate(target, draft, input_ids, attention_mask, max_new_tokens=new, temperature=temperature, top_k=top_k, top_p=top_p,
                               num_draft_tokens=k, generator=torch.Generator().manual_seed(generator_seed), eos_token_id=[])
    drawn = out.sequences[:, input_ids.shape[1]:]
    cells = (drawn * target_vocab ** torch.arange(new - 1, -1, -1)).sum(1)
    results = []
    for i, prompt in enumerate(LAW_PROMPTS):
        law = _exact_law(target, prompt, new, temperature, top_k, top_p)
        counts = torch.bincount(cells[i * rows: (i + 1) * rows], minlength=law.numel())
        results.append(_chi_square(counts, law, alpha=1e-6 / len(LAW_PROMPTS)))
    return results, out.stats


@pytest.mark.parametrize("case", list(LAW_CASES))
def test_joint_law_of_new_tokens_is_the_targets(case, monkeypatch):
    results, stats = _sample_counts(case, generator_seed=1)
    for statistic, threshold in results:
        assert statistic < threshold, (statistic, threshold)
    assert 0.1 < stats.mean_acceptance < 0.9, stats  # both branches of the verifier were exercised

    # The same check rejects a verifier that redraws from the target after a rejection.
    monkeypatch.setattr(gen, "verify", _redraw_from_target_after_rejection)
    wrong, _ = _sample_counts(case, generator_seed=1)
    assert any(statistic > threshold for statistic, threshold in wrong), wrong


def test_joint_law_check_rejects_stale_cache_entries(monkeypatch):
    # Rejected drafts left live in the caches: the law check must see it.
    monkeypatch.setattr(gen._Cache, "settle", lambda self, live_tail, all_live=False: None)
    wrong, _ = _sample_counts("plain", generator_seed=1)
    assert any(statistic > threshold for statistic, threshold in wrong), wrong


# ----------------------------------------------------------------------------------------- vocabularies


def test_padded_target_vocabulary_works():
    target, draft = tiny_llama(20, seed=7), tiny_gpt2(16, seed=2)
    input_ids, attention_mask = left_pad(PROMPTS)
    expected = _target_only(target, input_ids, attention_mask, 12, None, 0)
    out = specdec_ext.generate(target, draft, input_ids, attention_mask, max_new_tokens=12, do_sample=False, eos_token_id=[])
    assert out.sequences.tolist() == expected.tolist()
    sampled = specdec_ext.generate(target, draft, input_ids, attention_mask, max_new_tokens=12, generator=torch.Generator().manual_seed(0))
    new = sampled.sequences[:, input_ids.shape[1]:]
    assert ((new >= 0) & (new < 20)).all()


def test_unrelated_vocabularies_are_refused():
    input_ids, attention_mask = left_pad(PROMPTS)
    with pytest.raises(ValueError, match="vocabulary"):
        specdec_ext.generate(tiny_llama(16), tiny_gpt2(24), input_ids, attention_mask, max_new_tokens=4)


# --------------------------------------------------------------------------------------- misc behaviour


def test_auto_k_picks_long_drafts_only_when_they_pay():
    def chosen(acceptance, draft_seconds):
        lengths = gen._DraftLength("auto")
        assert lengths.choose() == gen.AUTO_FIRST_DRAFT_TOKENS
        for _ in range(20):
            lengths.update(int(100 * acceptance), 100, 4, draft_seconds=4 * draft_seconds, target_seconds=1.0)
        return lengths.choose()

    assert chosen(0.9, 0.02) == gen.AUTO_MAX_DRAFT_TOKENS  # cheap, accurate draft: the longest blocks
    assert chosen(0.3, 0.3) == 1  # poor, costly draft: the shortest block
    assert 2 <= chosen(0.7, 0.1) <= 5


def test_auto_k_follows_the_expected_speedup():
    for a, c in [(0.9, 0.05), (0.5, 0.2), (0.2, 0.5), (0.99, 0.01)]:
        best = gen.best_num_draft_tokens(a, c)
        assert gen.expected_speedup(a, c, best) == max(gen.expected_speedup(a, c, k) for k in range(1, gen.AUTO_MAX_DRAFT_TOKENS + 1))
    assert gen.best_num_draft_tokens(0.9, 0.05) > gen.best_num_draft_tokens(0.3, 0.5)
    assert gen.expected_speedup(0.0, 0.1, 1) == pytest.approx(1 / 1.1)


def test_bad_arguments_raise():
    target, draft = _pair("llama-close")
    input_ids, attention_mask = left_pad(PROMPTS)
    with pytest.raises(ValueError, match="left-padded"):
        specdec_ext.generate(target, draft, input_ids, attention_mask.flip(1), max_new_tokens=4)
    with pytest.raises(ValueError, match="num_draft_tokens"):
        specdec_ext.generate(target, draft, input_ids, attention_mask, max_new_tokens=4, num_draft_tokens=0)
    with pytest.raises(ValueError, match="top_p"):
        specdec_ext.generate(target, draft, input_ids, attention_mask, max_new_tokens=4, top_p=1.5)
    empty = specdec_ext.generate(target, draft, input_ids, attention_mask, max_new_tokens=0)
    assert empty.sequences.tolist() == input_ids.tolist()


# ------------------------------------------------------------------------------- logits processors


class BanSuccessor:
    """A user processor that depends on the prefix: the id after the last token's id is banned."""

    def __call__(self, input_ids, scores):
        banned = (input_ids[:, -1] + 1) % scores.shape[-1]
        return scores.scatter(1, banned[:, None], float("-inf"))


def _reference_processors(case: str):
    from transformers.generation import logits_process as lp

    from specdec_ext.processors import PresencePenaltyLogitsProcessor

    return {
        "repetition+min_p": lambda: [lp.RepetitionPenaltyLogitsProcessor(2.5), lp.MinPLogitsWarper(0.15)],
        "presence": lambda: [PresencePenaltyLogitsProcessor(2.0, 0.5, prompt_length=3)],
        "no_repeat_ngram+bias": lambda: [lp.SequenceBiasLogitsProcessor([[[2], 2.0]]), lp.NoRepeatNGramLogitsProcessor(2)],
        "bad_words+suppress": lambda: [lp.NoBadWordsLogitsProcessor([[1, 4], [6]]), lp.SuppressTokensLogitsProcessor([5])],
        "custom": lambda: [BanSuccessor()],
        "min_new_tokens": lambda: [lp.MinNewTokensLengthLogitsProcessor(3, 1, 4)],
        "temperature+top_k+min_p": lambda: [lp.TemperatureLogitsWarper(1.3), lp.TopKLogitsWarper(6), lp.MinPLogitsWarper(0.1)],
        "top_p+min_p": lambda: [lp.TopPLogitsWarper(0.9), lp.MinPLogitsWarper(0.1)],
        "typical+temperature": lambda: [lp.TypicalLogitsWarper(0.8), lp.TemperatureLogitsWarper(1.2)],
        "lookup+frequency": lambda: [PresencePenaltyLogitsProcessor(0.0, 2.0, prompt_length=4)],
    }[case]()


PROCESSOR_CASES = {
    # name: (generate() keywords, the deliberately wrong variant the same check must reject)
    "repetition+min_p": ({"repetition_penalty": 2.5, "min_p": 0.15}, "stale prefix"),
    "presence": ({"presence_penalty": 2.0, "frequency_penalty": 0.5}, "stale prefix"),
    "no_repeat_ngram+bias": ({"no_repeat_ngram_size": 2, "sequence_bias": [[[2], 2.0]]}, "stale prefix"),
    "bad_words+suppress": ({"bad_words_ids": [[1, 4], [6]], "suppress_tokens": [5]}, "stale prefix"),
    "custom": ({"logits_processor": [BanSuccessor()]}, "stale prefix"),
    # Id 4 carries most of the mass: as EOS it ends rows often, and suppressing it where it should not be shows.
    "min_new_tokens": ({"min_new_tokens": 1, "eos_token_id": 4, "pad_token_id": 4}, "stale prefix"),
    "temperature+top_k+min_p": ({"temperature": 1.3, "top_k": 6, "min_p": 0.1}, "q mismatch"),
    "top_p+min_p": ({"top_p": 0.9, "min_p": 0.1}, "q mismatch"),
    # Warpers the kernels do not implement: every warper in torch, in the list's order (typical before temperature here).
    "typical+temperature": ({"logits_processor": [TypicalLogitsWarper(0.8)], "temperature": 1.2}, "q mismatch"),
    # Prompt lookup proposes tokens already in the context: a count-based penalty sees each accepted draft.
    "lookup+frequency": ({"frequency_penalty": 2.0, "draft": "prompt_lookup", "ngram": 1}, "stale prefix"),
}
# Laws with mass on many cells (after 1, 2, 1, 2, 1 the target is uncertain); prompt lookup proposes
# 4, 4 after 3, 4, 4, 3, which the target often accepts.
PROCESSOR_PROMPTS = {"lookup+frequency": [3, 4, 4, 3], "temperature+top_k+min_p": [1, 2, 1, 2, 1], "top_p+min_p": [1, 2, 1, 2, 1],
                     "typical+temperature": [1, 2, 1, 2, 1]}


def _stale_prefix(original):
    """Wrong: every position of a block processed with the committed prefix only (drafts before it ignored)."""

    def apply(self, scores, context, first=0):
        return torch.cat([original(self, scores[:, j: j + 1], context, 0) for j in range(scores.shape[1])], 1)

    return apply


def _raw_draws(raw, processed, run):
    """Wrong: drafts drawn from the raw draft logits (processing applied to p only) while verify() is told q
    is the processed line. (Drafts from raw q verified against raw q would be exact: any q the drafts
    really come from keeps the law; processing q like p only raises acceptance.)"""
    return specdec_ext.sample(gen._pad_vocab(raw, run.vocab), generator=run.generator, check=False)


def _processor_samples(case: str, rows: int = 8000):
    keywords, _ = PROCESSOR_CASES[case]
    target, draft = tiny_llama(8, seed=11, logit_scale=1.0), tiny_gpt2(8, seed=1, logit_scale=1.0)
    keywords = dict(keywords)
    if keywords.get("draft") == "prompt_lookup":
        draft = None
    keywords.setdefault("eos_token_id", [])
    prompt = PROCESSOR_PROMPTS.get(case, [1, 2, 3])
    input_ids = torch.tensor([prompt] * rows)
    out = specdec_ext.generate(target, draft, input_ids, max_new_tokens=3, num_draft_tokens=2, generator=torch.Generator().manual_seed(3),
                               **keywords)
    eos = keywords["eos_token_id"] if isinstance(keywords["eos_token_id"], int) else None
    return fits(out.sequences[:, len(prompt):], target, prompt, LogitsProcessorList(_reference_processors(case)), eos), out.stats


@pytest.mark.parametrize("case", list(PROCESSOR_CASES))
def test_law_with_processors_is_target_only_sampling_with_them(case, monkeypatch):
    (ok, statistic, threshold), stats = _processor_samples(case)
    assert ok, (statistic, threshold)
    assert 0.05 < stats.mean_acceptance < 0.95, stats  # acceptances and rejections both happened

    wrong = PROCESSOR_CASES[case][1]
    if wrong == "stale prefix":
        monkeypatch.setattr(LogitsPipeline, "apply", _stale_prefix(LogitsPipeline.apply))
    else:
        monkeypatch.setattr(gen, "_draw_draft", _raw_draws)
    (ok, statistic, threshold), _ = _processor_samples(case)
    assert not ok, (wrong, statistic, threshold)


GREEDY_PROCESSORS = {
    "repetition": {"repetition_penalty": 1.6},
    "presence": {"presence_penalty": 1.5, "frequency_penalty": 0.3},
    "no_repeat_ngram": {"no_repeat_ngram_size": 2},
    "bad_words": {"bad_words_ids": [[3], [5, 6], [9, 9]]},
    "sequence_bias": {"sequence_bias": [[[3], 2.0], [[7, 8], -3.0], [[4], -1.5]]},
    "suppress": {"suppress_tokens": [4, 10]},
    "min_new_tokens": {"min_new_tokens": 6},
    "custom": {"logits_processor": [BanSuccessor()]},
}


@pytest.mark.parametrize("draft_kind", ["model", "prompt_lookup"])
@pytest.mark.parametrize("case", list(GREEDY_PROCESSORS))
def test_greedy_with_processors_equals_target_only(case, draft_kind):
    from transformers.generation.logits_process import LogitsProcessorList

    from specdec_ext.processors import PresencePenaltyLogitsProcessor

    target, draft = _pair("llama-close")
    input_ids, attention_mask = left_pad(PROMPTS)
    keywords = dict(GREEDY_PROCESSORS[case])
    reference = dict(keywords)
    if "presence_penalty" in reference:
        reference = {"logits_processor": LogitsProcessorList([PresencePenaltyLogitsProcessor(1.5, 0.3, prompt_length=input_ids.shape[1])])}
    eos = _eos_ending_some_rows(target, input_ids, attention_mask, 20)
    expected = target.generate(input_ids, attention_mask=attention_mask, do_sample=False, max_new_tokens=20, eos_token_id=eos, pad_token_id=0,
                               **reference)
    expected = torch.nn.functional.pad(expected, (0, input_ids.shape[1] + 20 - expected.shape[1]), value=0)
    out = specdec_ext.generate(target, None if draft_kind == "prompt_lookup" else draft, input_ids, attention_mask, max_new_tokens=20,
                               do_sample=False, num_draft_tokens=3, draft=draft_kind, ngram=2, eos_token_id=eos, pad_token_id=0, **keywords)
    assert out.sequences.tolist() == expected.tolist()


# -------------------------------------------------------------------------------- per-request keys

needs_request_keys = pytest.mark.skipif(not gen.REQUEST_KEYS, reason="verify()/sample() without per-request keys (stream v2)")


@needs_request_keys
@pytest.mark.parametrize("processors", [{}, {"repetition_penalty": 1.3, "min_p": 0.05}])
def test_a_seeded_row_is_the_same_in_any_batch(processors):
    """Row b of a batch equals the same prompt generated alone under its seed, token for token, whatever
    the batch and the row order (every draw is keyed by the row's seed and absolute position). With a
    fixed draft length: K decides which positions get a bonus draw instead of a draft and its check."""
    target, draft = _pair("llama-gpt2")
    prompts = torch.tensor([[5, 6, 7, 8], [1, 2, 3, 4], [4, 11, 4, 12], [7, 7, 1, 9]])
    seeds = torch.tensor([11, 12, 2**40 + 3, 14])
    common = {"max_new_tokens": 16, "temperature": 0.9, "eos_token_id": [], "num_draft_tokens": 3, **processors}
    whole = specdec_ext.generate(target, draft, prompts, seeds=seeds, **common).sequences
    for b in range(4):
        alone = specdec_ext.generate(target, draft, prompts[b: b + 1], seeds=seeds[b: b + 1], **common).sequences
        assert alone[0].tolist() == whole[b].tolist(), b
    order = torch.tensor([2, 0, 3, 1])
    permuted = specdec_ext.generate(target, draft, prompts[order], seeds=seeds[order], **common).sequences
    assert permuted.tolist() == whole[order].tolist()
    other = specdec_ext.generate(target, draft, prompts, seeds=seeds + 1, **common).sequences
    assert other.tolist() != whole.tolist()  # the seed decides


@needs_request_keys
def test_seeded_rows_follow_the_target_law(monkeypatch):
    """One seed per row: the joint law is exact; reusing a row's random numbers at every step (offsets
    not advanced) is caught by the same check."""
    target, draft = tiny_llama(8, seed=11, logit_scale=1.0), tiny_gpt2(8, seed=1, logit_scale=1.0)
    prompt = [1, 2, 3]

    def run():
        out = specdec_ext.generate(target, draft, torch.tensor([prompt] * 6000), max_new_tokens=3, num_draft_tokens=2, eos_token_id=[],
                                   seeds=torch.arange(6000) * 7919)
        return fits(out.sequences[:, len(prompt):], target, prompt, None)

    ok, statistic, threshold = run()
    assert ok, (statistic, threshold)

    def frozen(fn):
        def call(*args, **kwargs):
            if kwargs.get("offsets") is not None:
                kwargs["offsets"] = torch.zeros_like(kwargs["offsets"])
            return fn(*args, **kwargs)
        return call

    monkeypatch.setattr(gen, "verify", frozen(gen.verify))
    monkeypatch.setattr(gen, "sample", frozen(gen.sample))
    ok, statistic, threshold = run()
    assert not ok, (statistic, threshold)


@needs_request_keys
def test_adaptive_k_reads_accept_probs(monkeypatch):
    calls = []
    original = gen.verify

    def spy(*args, **kwargs):
        calls.append(kwargs.get("return_accept_probs", False))
        return original(*args, **kwargs)

    monkeypatch.setattr(gen, "verify", spy)
    target, draft = _pair("llama-close")
    input_ids, attention_mask = left_pad(PROMPTS)
    seen = []
    original_update = gen._DraftLength.update

    def update(self, accepted, judged, *args):
        seen.append((accepted, judged))
        return original_update(self, accepted, judged, *args)

    monkeypatch.setattr(gen._DraftLength, "update", update)
    specdec_ext.generate(target, draft, input_ids, attention_mask, max_new_tokens=12, num_draft_tokens="auto", eos_token_id=[],
                         generator=torch.Generator().manual_seed(0))
    assert calls and all(calls)
    assert any(accepted != int(accepted) for accepted, _ in seen)  # sums of min(1, p/q), not counts
    assert all(0 <= accepted <= judged for accepted, judged in seen)


def test_seeds_are_checked():
    target, draft = _pair("llama-close")
    input_ids, attention_mask = left_pad(PROMPTS)
    for bad in ([1, 2], [-1, 2, 3, 4, 5], "seed", [0.5] * 5):
        with pytest.raises(ValueError, match="seeds"):
            specdec_ext.generate(target, draft, input_ids, attention_mask, max_new_tokens=4, seeds=bad)


def test_the_draft_block_moves_to_the_verify_device_once_per_step(monkeypatch):
    """Draft and target are separate modules (here both on the CPU): the draft's proposals and logits reach
    the device of the target's logits in one transfer each per step, whatever K, never one per token."""
    moves = []
    original = gen._to_verify_device

    def counting(tensor, run):
        moves.append((tuple(tensor.shape), run.verify_device))
        return original(tensor, run)

    monkeypatch.setattr(gen, "_to_verify_device", counting)
    target, draft = _pair("llama-gpt2")
    input_ids, attention_mask = left_pad(PROMPTS)
    out = specdec_ext.generate(target, draft, input_ids, attention_mask, max_new_tokens=12, num_draft_tokens=3, eos_token_id=[],
                               generator=torch.Generator().manual_seed(0), repetition_penalty=1.2)
    steps = sum(1 for k in out.stats.draft_lengths if k)  # a step with K = 0 (the last token) drafts nothing
    assert len(moves) == 2 * steps
    assert all(device == target.device for _, device in moves)
    assert {len(shape) for shape, _ in moves[0::2]} == {2} and {len(shape) for shape, _ in moves[1::2]} == {3}  # (b, K) ids, (b, K, V) logits


class _StopAfter:
    """A user stopping criterion: a row ends right after it emits ``token`` (transformers' interface)."""

    def __init__(self, token: int):
        self.token = token

    def __call__(self, input_ids, scores, **kwargs):
        return input_ids[:, -1] == self.token


def test_rows_stop_at_their_own_token_inside_accepted_blocks(monkeypatch):
    """A criterion firing mid-block ends each row exactly where target-only decoding ends it; nothing after is emitted."""
    from transformers.generation.stopping_criteria import StoppingCriteriaList

    blocks = []
    original = gen._apply_stops

    def recording(run, rows, emitted_host, finished_host):
        before = list(emitted_host)
        original(run, rows, emitted_host, finished_host)
        blocks.extend((b, e) for b, e in zip(before, emitted_host, strict=True) if e < b)

    monkeypatch.setattr(gen, "_apply_stops", recording)
    target, draft = _pair("llama-close")
    input_ids, attention_mask = left_pad(PROMPTS)
    stop = _eos_ending_some_rows(target, input_ids, attention_mask, 24)
    expected = target.generate(input_ids, attention_mask=attention_mask, do_sample=False, max_new_tokens=24, pad_token_id=0,
                               stopping_criteria=StoppingCriteriaList([_StopAfter(stop)]))
    expected = torch.nn.functional.pad(expected, (0, input_ids.shape[1] + 24 - expected.shape[1]), value=0)
    out = specdec_ext.generate(target, draft, input_ids, attention_mask, max_new_tokens=24, do_sample=False, num_draft_tokens=4,
                               stopping_criteria=[_StopAfter(stop)], eos_token_id=[], pad_token_id=0)
    new, reference = out.sequences[:, input_ids.shape[1]:], expected[:, input_ids.shape[1]:]
    for row, count in enumerate(out.new_tokens):
        # Up to the stop, target-only decoding's tokens (transformers pads finished rows only when an EOS is set).
        assert new[row, :count].tolist() == reference[row, :count].tolist(), row
    assert blocks  # some row's block was cut after its stop token: tokens already accepted behind it were dropped
    for row, count in enumerate(out.new_tokens):
        assert (new[row, count:] == 0).all() and (count == 24 or new[row, count - 1] == stop)


@pytest.mark.parametrize("keywords", [{}, {"temperature": 0.7, "top_k": 5, "top_p": 0.9}, {"do_sample": False}, {"repetition_penalty": 1.3, "min_p": 0.05}])
def test_direct_draft_draws_equal_sample(keywords, monkeypatch):
    """The loop's direct C++ draft draw gives the tokens sample() gives (same keys, same stream)."""
    target, draft = _pair("llama-close")
    input_ids, attention_mask = left_pad(PROMPTS)
    used = []
    original = gen._direct_draw

    def direct_draw(processed, run):
        used.append(original(processed, run))
        return used[-1]

    monkeypatch.setattr(gen, "_direct_draw", direct_draw)

    def run():
        return specdec_ext.generate(target, draft, input_ids, attention_mask, max_new_tokens=12, num_draft_tokens=3,
                                    generator=torch.Generator().manual_seed(5), **keywords).sequences

    direct = run()
    assert used and all(used)  # every draft draw went straight to the kernel
    monkeypatch.setattr(gen, "_direct_draw", lambda processed, run: False)
    assert torch.equal(direct, run())
