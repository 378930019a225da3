"""specdec_ext.generate with chains, token-wise and block verification: exactness (greedy equality, exact
sampling laws), cache hygiene, processors, keys, stopping, vocabularies; and what every kind of call
(chain, block, tree) shares: one output type, every argument honoured or refused by name."""

from __future__ import annotations

import pytest
import torch
from support.sequence_laws import (  # noqa: F401 (one_thread: an autouse fixture)
    PROMPTS,
    RecordingStreamer,
    eos_ending_some_rows,
    fits,
    keeping_every_node,
    kernel_law,
    model_pair,
    one_thread,
    per_prompt_chi_square,
    target_only,
)
from support.tiny_models import left_pad, tiny_gpt2, tiny_llama
from transformers.generation.logits_process import LogitsProcessorList, RepetitionPenaltyLogitsProcessor, TypicalLogitsWarper

import specdec_ext
from specdec_ext.generation import adaptive, cache, chain_steps, draws, loop, tree_steps
from specdec_ext.generation.cache import ModelCache
from specdec_ext.generation.rows import Rows
from specdec_ext.generation.stats import SpeculativeStats
from specdec_ext.processors import LogitsPipeline

# ---------------------------------------------------------------------------------------------- greedy


@pytest.mark.parametrize(("pair", "num_draft_tokens", "method"),
                         [("llama-gpt2", 3, "token"), ("gpt2-close", 4, "token"), ("llama-close", "auto", "token"), ("llama-close", 1, "token"),
                          ("llama-close", 3, "block"), ("gpt2-close", "auto", "block")])
def test_greedy_equals_target_only_generate(pair, num_draft_tokens, method):
    target, draft = model_pair(pair)
    input_ids, attention_mask = left_pad(PROMPTS)
    max_new = 24
    eos = eos_ending_some_rows(target, input_ids, attention_mask, max_new)
    expected = target_only(target, input_ids, attention_mask, max_new, eos, 0)
    out = specdec_ext.generate(target, draft, input_ids, attention_mask, max_new_tokens=max_new, do_sample=False,
                               num_draft_tokens=num_draft_tokens, method=method, eos_token_id=eos, pad_token_id=0)
    assert out.sequences.shape == expected.shape
    for row in range(len(PROMPTS)):
        assert out.sequences[row].tolist() == expected[row].tolist(), f"row {row}"
    stats = out.stats
    assert stats.target_forwards == len(stats.draft_lengths) + 1
    assert stats.draft_forwards == sum(stats.draft_lengths) + 1
    assert stats.trees == [(1,) * k for k in stats.draft_lengths]
    assert 0 <= stats.mean_acceptance <= 1 and stats.tokens_per_target_forward >= 1
    if pair != "llama-gpt2":  # the test only means something if long accepted runs and rejections both happen
        assert 0.3 < stats.mean_acceptance < 0.98, stats
        assert 0 < stats.tokens_per_target_forward_stderr < 1, stats  # steps emitted different numbers of tokens


@pytest.mark.parametrize("attention", ["eager", "2-d mask"])
def test_greedy_on_the_other_attention_paths(attention, monkeypatch):
    # sdpa (above) and eager get a 4-D mask built here; other implementations get the 2-D live-slot mask.
    if attention == "2-d mask":
        monkeypatch.setattr(ModelCache, "_causal_mask", lambda self, width: self.live.long())
    implementation = "eager" if attention == "eager" else "sdpa"
    target = tiny_llama(16, seed=7, attn_implementation=implementation)
    draft = tiny_gpt2(16, seed=3, attn_implementation=implementation)
    input_ids, attention_mask = left_pad(PROMPTS)
    expected = target_only(target, input_ids, attention_mask, 20, None, 0)
    out = specdec_ext.generate(target, draft, input_ids, attention_mask, max_new_tokens=20, do_sample=False, num_draft_tokens=3)
    assert out.sequences.tolist() == expected.tolist()


@pytest.mark.parametrize(("pair", "attention", "kind"), [("llama-close", "sdpa", {"num_draft_tokens": 3}),
                                                       ("llama3-gpt2", "eager", {"tree": (2, 2)})])
def test_greedy_with_holes_squeezed_every_step(pair, attention, kind, monkeypatch):
    monkeypatch.setattr(cache, "COMPACT_MIN_HOLES", 0)
    monkeypatch.setattr(cache, "COMPACT_HOLE_RATIO", 0.0)
    squeezes = []
    original = ModelCache.squeeze

    def counting(self, max_live):
        before = self.live.shape[1]
        original(self, max_live)
        squeezes.append(before - self.live.shape[1])

    monkeypatch.setattr(ModelCache, "squeeze", counting)
    target, draft = model_pair(pair, attention=attention)
    input_ids, attention_mask = left_pad(PROMPTS)
    expected = target_only(target, input_ids, attention_mask, 20, None, 0)
    out = specdec_ext.generate(target, draft, input_ids, attention_mask, max_new_tokens=20, do_sample=False, eos_token_id=[], **kind)
    assert out.sequences.tolist() == expected.tolist()
    assert sum(squeezes) > 0


def test_finished_rows_leave_the_batch(monkeypatch):
    sizes = []
    original = chain_steps.ChainSteps.verify

    def recording(self, run, rows, shape, proposal, target_logits):
        sizes.append(target_logits.shape[0])
        return original(self, run, rows, shape, proposal, target_logits)

    monkeypatch.setattr(chain_steps.ChainSteps, "verify", recording)
    target, draft = model_pair("llama-close")
    input_ids, attention_mask = left_pad(PROMPTS)
    eos = eos_ending_some_rows(target, input_ids, attention_mask, 24)
    out = specdec_ext.generate(target, draft, input_ids, attention_mask, max_new_tokens=24, do_sample=False, eos_token_id=eos, pad_token_id=0)
    assert sizes == sorted(sizes, reverse=True) and sizes[0] == len(PROMPTS) and sizes[-1] < len(PROMPTS)
    finished = (out.sequences[:, input_ids.shape[1]:] == eos).any(1)
    assert finished.any() and not finished.all()


@pytest.mark.parametrize("kind", [{"num_draft_tokens": 3}, {"num_draft_tokens": 3, "method": "block"}, {"tree": (2, 2, 1)}])
def test_caches_hold_exactly_the_committed_tokens(kind, monkeypatch):
    """After every step, each row's live target slots are its committed tokens but the pending one, and
    the draft's are those minus the tokens it has yet to be fed: whichever commit mode (prefix or path)."""
    checks = []
    original = loop._commit

    def checking(run, kind, target, draft, rows, *args):
        original(run, kind, target, draft, rows, *args)
        if rows.index.numel():
            checks.append(torch.equal(target.live.sum(1), rows.length - 1))
            checks.append(torch.equal(draft.live.sum(1), rows.length - (rows.unfed >= 0).sum(1)))
            checks.append(rows.unfed_host == (rows.unfed >= 0).sum(1).tolist())

    monkeypatch.setattr(loop, "_commit", checking)
    target, draft = model_pair("llama-close")
    input_ids, attention_mask = left_pad(PROMPTS)
    specdec_ext.generate(target, draft, input_ids, attention_mask, max_new_tokens=20, generator=torch.Generator().manual_seed(1), eos_token_id=[],
                         **kind)
    assert len(checks) > 6 and all(checks)


# ------------------------------------------------------------------------------------- fresh scores


def _record_scores(monkeypatch):
    """Record, for every verification, the rows, their progress and the logits and drafts it was given."""
    records = []
    original = chain_steps.ChainSteps.verify

    def recording(self, run, rows, shape, proposal, target_logits):
        verdict = original(self, run, rows, shape, proposal, target_logits)
        records.append((rows.index.clone(), rows.generated.clone(), target_logits.clone(), proposal.lines.clone(), proposal.tokens.clone(),
                        verdict.accepted.clone()))
        return verdict

    monkeypatch.setattr(chain_steps.ChainSteps, "verify", recording)
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
                fresh = draft(torch.cat([committed, drafts[b, : k - 1]])[None]).logits[0, -k:]
                worst_draft = max(worst_draft, float((fresh - draft_logits[b]).abs().max()))
    return worst_target, worst_draft


def _fresh_run(monkeypatch, pair: str, method: str = "token"):
    target, draft = model_pair(pair)
    input_ids, attention_mask = left_pad(PROMPTS)
    records = _record_scores(monkeypatch)
    out = specdec_ext.generate(target, draft, input_ids, attention_mask, max_new_tokens=16, num_draft_tokens=3, method=method,
                               generator=torch.Generator().manual_seed(0), eos_token_id=[])
    return _stalest_scores(target, draft, records, out.sequences, attention_mask), out.stats


@pytest.mark.parametrize(("pair", "method"), [("llama-gpt2", "token"), ("llama-close", "token"), ("llama-gpt2", "block")])
def test_every_step_scores_fresh_logits(pair, method, monkeypatch):
    (target_gap, draft_gap), stats = _fresh_run(monkeypatch, pair, method)
    assert target_gap < 1e-4 and draft_gap < 1e-4
    if pair == "llama-gpt2":
        assert stats.mean_acceptance < 0.7  # many rejections: holes in both caches
    else:
        assert stats.acceptance_per_position[-1] > 0.25  # blocks fully accepted: the draft catches up


def test_fresh_score_check_catches_stale_entries(monkeypatch):
    # A cache that keeps rejected drafts live ...
    original_keep = ModelCache.keep_prefix
    monkeypatch.setattr(ModelCache, "keep_prefix", lambda self, live_tail, drop, all_live=False: original_keep(self, torch.ones_like(live_tail), drop))
    assert _fresh_run(monkeypatch, "llama-gpt2")[0][0] > 1e-2
    monkeypatch.undo()

    # ... target scores carried over from the previous step's forward ...
    previous = {}
    original_forward = ModelCache.forward

    def reusing(self, tokens, positions, live, **kwargs):
        logits = original_forward(self, tokens, positions, live, **kwargs)
        old = previous.get(id(self))
        previous[id(self)] = logits
        if old is not None and old.shape == logits.shape and tokens.shape[1] > 1:
            logits = torch.cat([logits[:, :1], old[:, 1:]], 1)
        return logits

    monkeypatch.setattr(ModelCache, "forward", reusing)
    assert _fresh_run(monkeypatch, "llama-gpt2")[0][0] > 1e-2
    monkeypatch.undo()

    # ... and a draft that never sees the last draft of a fully accepted block.
    monkeypatch.setattr(Rows, "advance", _forgetful_advance(Rows.advance))
    assert _fresh_run(monkeypatch, "llama-close")[0][1] > 1e-2


def _forgetful_advance(original):
    """Wrong: after a step the draft is fed the pending token only, never a fully accepted block's last draft."""

    def advance(self, *args):
        original(self, *args)
        self.unfed, self.unfed_host = self.unfed[:, -1:], [1] * len(self.unfed_host)

    return advance


# ----------------------------------------------------------------------------------- exact sampling laws


def _redraw_from_target_after_rejection(target_logits, draft_logits, draft_tokens, *, num_draft_tokens, generator, check, backend, method, **options):
    """A wrong verifier: after a rejection it samples the target's law instead of the residual max(p - q, 0)."""
    result = specdec_ext.verify(target_logits, draft_logits, draft_tokens, num_draft_tokens=num_draft_tokens, generator=generator, check=check,
                                backend=backend, method=method, **options)
    sampling = {name: value for name, value in options.items() if name in ("temperature", "top_k", "top_p")}
    rows = torch.arange(target_logits.shape[0])
    redrawn = specdec_ext.sample(target_logits[rows, result.num_accepted], generator=generator, **sampling)
    tokens = result.tokens.clone()
    rejected = result.num_accepted < num_draft_tokens
    tokens[rows, result.num_accepted] = torch.where(rejected, redrawn, tokens[rows, result.num_accepted])
    return specdec_ext.VerifyResult(tokens, result.num_accepted, None, result.accept_probs)


LAW_CASES = {
    # name: (target vocab, draft vocab, new tokens, generate() keywords, temperature, top_k, top_p, rows per prompt)
    "plain": (8, 8, 3, {"num_draft_tokens": 2}, 1.0, None, None, 8000),
    "filtered": (8, 8, 3, {"num_draft_tokens": 3}, 0.8, 5, 0.9, 8000),
    "padded-target": (10, 8, 2, {"num_draft_tokens": "auto"}, 1.3, None, 0.95, 6000),
    # Block verification (the wrong verifier redraws from the target where the block residual is due).
    "block-padded-target": (10, 8, 3, {"num_draft_tokens": 2, "method": "block"}, 1.3, None, 0.95, 6000),
    # Trees (the wrong verifier redraws from the target where every child of a context was rejected).
    "tree-without-replacement": (8, 8, 3, {"tree": (2, 2)}, 1.0, None, None, 6000),
    "tree-iid-filtered": (8, 8, 3, {"tree": (3, 1), "siblings": "iid"}, 0.8, 5, 0.9, 6000),
    "tree-padded-target": (10, 8, 3, {"tree": (2, 1)}, 1.3, None, 0.95, 6000),
}
LAW_PROMPTS = [[1, 2, 3], [4]]


def _sample_counts(case, generator_seed):
    target_vocab, draft_vocab, new, keywords, temperature, top_k, top_p, rows = LAW_CASES[case]
    # Mildly peaked laws: many cells carry mass, and the draft disagrees often (acceptance 0.3-0.5).
    target, draft = tiny_llama(target_vocab, seed=11, logit_scale=1.0), tiny_gpt2(draft_vocab, seed=1, logit_scale=1.0)
    input_ids, attention_mask = left_pad([p for p in LAW_PROMPTS for _ in range(rows)])
    out = specdec_ext.generate(target, draft, input_ids, attention_mask, max_new_tokens=new, temperature=temperature, top_k=top_k, top_p=top_p,
                               generator=torch.Generator().manual_seed(generator_seed), eos_token_id=[], **keywords)
    laws = [kernel_law(target, prompt, new, temperature, top_k, top_p) for prompt in LAW_PROMPTS]
    return per_prompt_chi_square(out.sequences[:, input_ids.shape[1]:], target_vocab, laws), out.stats


def _redraw_after_rejecting_every_child(target_logits, draft_logits, tokens, parents, *, num_nodes, generator, check, siblings, backend, **sampling):
    """A wrong tree verifier: where a walk rejects every child of a context it draws the target's law
    there instead of the residual."""
    result = specdec_ext.verify_tree(target_logits, draft_logits, tokens, parents, num_nodes=num_nodes, siblings=siblings, generator=generator,
                                     check=check, backend=backend, **sampling)
    rows = torch.arange(tokens.shape[0])
    path = torch.cat([result.accepted_nodes, torch.full_like(rows[:, None], -1)], 1)
    nodes = path.gather(1, (result.num_accepted - 1).clamp(min=0)[:, None])[:, 0]
    context = torch.where(result.num_accepted > 0, nodes + 1, 0)
    used = torch.arange(tokens.shape[1])[None, :] < num_nodes[:, None]
    has_children = (((parents + 1) == context[:, None]) & used).any(1)
    redrawn = specdec_ext.sample(target_logits[rows, context], generator=generator, backend="eager", **sampling)
    out = result.tokens.clone()
    out[rows, result.num_accepted] = torch.where(has_children, redrawn, out[rows, result.num_accepted])
    return specdec_ext.TreeResult(out, result.num_accepted, result.accepted_nodes)


#: Cases that repeat a kind the default suite already covers: run with ``-m slow``.
SLOW_CASES = {"tree-padded-target", "block lookup+frequency"}


def _cases(names):
    return [pytest.param(name, marks=pytest.mark.slow) if name in SLOW_CASES else name for name in names]


@pytest.mark.parametrize("case", _cases(LAW_CASES))
def test_joint_law_of_new_tokens_is_the_targets(case, monkeypatch):
    results, stats = _sample_counts(case, generator_seed=1)
    for statistic, threshold in results:
        assert statistic < threshold, (statistic, threshold)
    assert 0.1 < stats.mean_acceptance < 0.95, stats  # both branches of the verifier were exercised

    # The same check rejects a verifier that redraws from the target where the residual is due.
    if "tree" in LAW_CASES[case][3]:
        monkeypatch.setattr(tree_steps, "verify_tree", _redraw_after_rejecting_every_child)
    else:
        monkeypatch.setattr(chain_steps, "verify", _redraw_from_target_after_rejection)
    wrong, _ = _sample_counts(case, generator_seed=1)
    assert any(statistic > threshold for statistic, threshold in wrong), wrong


@pytest.mark.parametrize("case", ["plain", "tree-without-replacement"])
def test_joint_law_check_rejects_stale_cache_entries(case, monkeypatch):
    """Entries of rejected drafts left live (a chain's holes not marked, a tree's rejected branches kept):
    the law check must see it."""
    if "tree" in LAW_CASES[case][3]:
        monkeypatch.setattr(ModelCache, "keep_segment", keeping_every_node(ModelCache.keep_segment))
    else:
        original_keep = ModelCache.keep_prefix
        monkeypatch.setattr(ModelCache, "keep_prefix",
                            lambda self, live_tail, drop, all_live=False: original_keep(self, torch.ones_like(live_tail), drop))
    wrong, _ = _sample_counts(case, generator_seed=1)
    assert any(statistic > threshold for statistic, threshold in wrong), wrong


# ----------------------------------------------------------------------------------------- vocabularies


def test_padded_target_vocabulary_works():
    target, draft = tiny_llama(20, seed=7), tiny_gpt2(16, seed=2)
    input_ids, attention_mask = left_pad(PROMPTS)
    expected = target_only(target, input_ids, attention_mask, 12, None, 0)
    out = specdec_ext.generate(target, draft, input_ids, attention_mask, max_new_tokens=12, do_sample=False, eos_token_id=[])
    assert out.sequences.tolist() == expected.tolist()
    for method in ("token", "block"):
        sampled = specdec_ext.generate(target, draft, input_ids, attention_mask, max_new_tokens=12, method=method,
                                       generator=torch.Generator().manual_seed(0))
        new = sampled.sequences[:, input_ids.shape[1]:]
        assert ((new >= 0) & (new < 20)).all()


def test_unrelated_vocabularies_are_refused():
    input_ids, attention_mask = left_pad(PROMPTS)
    with pytest.raises(ValueError, match="vocabulary"):
        specdec_ext.generate(tiny_llama(16), tiny_gpt2(24), input_ids, attention_mask, max_new_tokens=4)


# --------------------------------------------------------------------------------------- adaptive K


def test_auto_k_picks_long_drafts_only_when_they_pay():
    def chosen(acceptance, draft_seconds):
        lengths = adaptive.ShapeChooser.for_chain("auto")
        assert lengths.choose().max_depth == adaptive.AUTO_FIRST_DRAFT_TOKENS
        for _ in range(20):
            lengths.update(int(100 * acceptance), 100, lengths.choose(), draft_seconds=4 * draft_seconds, target_seconds=1.0)
        return lengths.choose().max_depth

    assert chosen(0.9, 0.02) == adaptive.AUTO_MAX_DRAFT_TOKENS  # cheap, accurate draft: the longest blocks
    assert chosen(0.3, 0.3) == 1  # poor, costly draft: the shortest block
    assert 2 <= chosen(0.7, 0.1) <= 5


def test_auto_k_follows_the_expected_speedup():
    for a, c in [(0.9, 0.05), (0.5, 0.2), (0.2, 0.5), (0.99, 0.01)]:
        best = adaptive.best_num_draft_tokens(a, c)
        assert adaptive.expected_speedup(a, c, best) == max(adaptive.expected_speedup(a, c, k) for k in range(1, adaptive.AUTO_MAX_DRAFT_TOKENS + 1))
        # The loop's chooser, over chains, picks the same K (its planning model is the same formula).
        chooser = adaptive.ShapeChooser.for_chain("auto")
        chooser.accepted, chooser.judged, chooser.cost_ratio = a * 1e6 - 1.0, 1e6 - 2.0, c
        assert chooser.choose().max_depth == best
    assert adaptive.best_num_draft_tokens(0.9, 0.05) > adaptive.best_num_draft_tokens(0.3, 0.5)
    assert adaptive.expected_speedup(0.0, 0.1, 1) == pytest.approx(1 / 1.1)


def test_adaptive_k_reads_accept_probs(monkeypatch):
    calls = []
    original = chain_steps.verify

    def spy(*args, **kwargs):
        calls.append(kwargs.get("return_accept_probs", False))
        return original(*args, **kwargs)

    monkeypatch.setattr(chain_steps, "verify", spy)
    target, draft = model_pair("llama-close")
    input_ids, attention_mask = left_pad(PROMPTS)
    seen = []
    original_update = adaptive.ShapeChooser.update

    def update(self, accepted, judged, *args):
        seen.append((accepted, judged))
        return original_update(self, accepted, judged, *args)

    monkeypatch.setattr(adaptive.ShapeChooser, "update", update)
    specdec_ext.generate(target, draft, input_ids, attention_mask, max_new_tokens=12, num_draft_tokens="auto", eos_token_id=[],
                         generator=torch.Generator().manual_seed(0))
    assert calls and all(calls)
    assert any(accepted != int(accepted) for accepted, _ in seen)  # sums of min(1, p/q), not counts
    assert all(0 <= accepted <= judged for accepted, judged in seen)


# ------------------------------------------------------------------------------------------- arguments


def test_bad_arguments_raise():
    target, draft = model_pair("llama-close")
    input_ids, attention_mask = left_pad(PROMPTS)
    with pytest.raises(ValueError, match="left-padded"):
        specdec_ext.generate(target, draft, input_ids, attention_mask.flip(1), max_new_tokens=4)
    with pytest.raises(ValueError, match="num_draft_tokens"):
        specdec_ext.generate(target, draft, input_ids, attention_mask, max_new_tokens=4, num_draft_tokens=0)
    with pytest.raises(ValueError, match="top_p"):
        specdec_ext.generate(target, draft, input_ids, attention_mask, max_new_tokens=4, top_p=1.5)
    with pytest.raises(ValueError, match="method must be"):
        specdec_ext.generate(target, draft, input_ids, attention_mask, max_new_tokens=4, method="joint")
    with pytest.raises(ValueError, match="method='block' verifies chains"):
        specdec_ext.generate(target, draft, input_ids, attention_mask, max_new_tokens=4, tree=(2, 1), method="block")
    with pytest.raises(ValueError, match="siblings applies to trees"):
        specdec_ext.generate(target, draft, input_ids, attention_mask, max_new_tokens=4, method="block", siblings="iid")
    for kind in ({}, {"method": "block"}, {"tree": (2, 1)}):
        empty = specdec_ext.generate(target, draft, input_ids, attention_mask, max_new_tokens=0, **kind)
        assert empty.sequences.tolist() == input_ids.tolist()


KINDS = {"chain": {"num_draft_tokens": 3}, "block": {"num_draft_tokens": 3, "method": "block"}, "tree": {"tree": (2, 1)}}


@pytest.mark.parametrize("kind", list(KINDS))
def test_one_output_type_for_every_kind(kind):
    target, draft = model_pair("llama-close")
    input_ids, attention_mask = left_pad(PROMPTS)
    out = specdec_ext.generate(target, draft, input_ids, attention_mask, max_new_tokens=10, generator=torch.Generator().manual_seed(2),
                               eos_token_id=[], **KINDS[kind])
    assert type(out) is specdec_ext.SpeculativeOutput and type(out.stats) is SpeculativeStats
    assert out.new_tokens == [10] * len(PROMPTS)
    assert out.stats.trees and len(out.stats.trees) == len(out.stats.draft_lengths) == out.stats.target_forwards - 1
    stats = out.stats
    assert 0 < stats.draft_prefill_seconds < stats.draft_seconds and 0 < stats.target_prefill_seconds < stats.target_seconds
    in_steps = stats.draft_seconds - stats.draft_prefill_seconds + stats.target_seconds - stats.target_prefill_seconds + stats.verify_seconds
    assert 0 < stats.commit_seconds and in_steps + stats.commit_seconds < stats.step_seconds


@pytest.mark.parametrize("kind", list(KINDS))
def test_do_sample_with_temperature_zero_raises_transformers_warper_error(kind):
    """One rule for every kind: as transformers' generate() does, a sampled call needs temperature > 0
    (greedy is do_sample=False); verify()'s temperature 0 is greedy, generate()'s is an error."""
    target, draft = model_pair("llama-close")
    input_ids, attention_mask = left_pad(PROMPTS)
    with pytest.raises(ValueError, match="temperature"):
        specdec_ext.generate(target, draft, input_ids, attention_mask, max_new_tokens=4, do_sample=True, temperature=0.0, **KINDS[kind])


@pytest.mark.parametrize("kind", list(KINDS))
def test_backend_is_honoured(kind, monkeypatch):
    """Every verification (verify, verify(method="block"), verify_tree) and draft draw runs on the backend asked for."""
    backends = []

    def spying(inner):
        def call(*args, **kwargs):
            backends.append(kwargs.get("backend"))
            return inner(*args, **kwargs)

        return call

    monkeypatch.setattr(chain_steps, "verify", spying(chain_steps.verify))
    monkeypatch.setattr(tree_steps, "verify_tree", spying(tree_steps.verify_tree))
    monkeypatch.setattr(draws, "sample", spying(draws.sample))
    target, draft = model_pair("llama-close")
    input_ids, attention_mask = left_pad(PROMPTS)
    common = {"max_new_tokens": 6, "eos_token_id": [], **KINDS[kind]}
    out = specdec_ext.generate(target, draft, input_ids, attention_mask, generator=torch.Generator().manual_seed(3), backend="eager", **common)
    assert backends and set(backends) == {"eager"}
    monkeypatch.undo()
    # The same stream on every backend: the same tokens.
    cpp = specdec_ext.generate(target, draft, input_ids, attention_mask, generator=torch.Generator().manual_seed(3), backend="cpp", **common)
    assert cpp.sequences.tolist() == out.sequences.tolist()
    with pytest.raises(ValueError, match="backend"):
        specdec_ext.generate(target, draft, input_ids, attention_mask, backend="fastest", **common)


@pytest.mark.parametrize("kind", list(KINDS))
def test_max_time_ends_every_row_after_the_step_that_crossed_it(kind):
    target, draft = model_pair("llama-close")
    input_ids, attention_mask = left_pad(PROMPTS)
    out = specdec_ext.generate(target, draft, input_ids, attention_mask, max_new_tokens=20, max_time=1e-6, generator=torch.Generator().manual_seed(0),
                               eos_token_id=[], **KINDS[kind])
    assert len(out.stats.draft_lengths) == 1 and all(1 <= count <= 4 for count in out.new_tokens)


def test_block_of_tree_ones_is_the_chain():
    target, draft = model_pair("llama-close")
    input_ids, attention_mask = left_pad(PROMPTS)
    chain = specdec_ext.generate(target, draft, input_ids, attention_mask, max_new_tokens=10, num_draft_tokens=3, method="block",
                                 generator=torch.Generator().manual_seed(6))
    ones = specdec_ext.generate(target, draft, input_ids, attention_mask, max_new_tokens=10, tree=(1, 1, 1), method="block",
                                generator=torch.Generator().manual_seed(6))
    assert ones.sequences.tolist() == chain.sequences.tolist() and ones.stats.trees == chain.stats.trees


TREE_REFUSED = {
    "repetition_penalty": {"repetition_penalty": 1.2},
    "presence_penalty": {"presence_penalty": 0.5},
    "frequency_penalty": {"frequency_penalty": 0.5},
    "no_repeat_ngram_size": {"no_repeat_ngram_size": 2},
    "bad_words_ids": {"bad_words_ids": [[1, 4]]},
    "sequence_bias": {"sequence_bias": [[[2, 3], 1.0]]},
    "min_new_tokens": {"min_new_tokens": 2, "eos_token_id": 4},
    "logits_processor": {"logits_processor": ["BanSuccessor"]},
    "seeds": {"seeds": [1, 2, 3, 4, 5]},
    "draft": {"draft": "prompt_lookup"},
    "num_draft_tokens": {"num_draft_tokens": 3},
}


@pytest.mark.parametrize("argument", list(TREE_REFUSED))
def test_tree_refuses_what_it_cannot_honour_by_name(argument):
    target, draft = model_pair("llama-close")
    input_ids, attention_mask = left_pad(PROMPTS)
    keywords = dict(TREE_REFUSED[argument])
    if keywords.get("logits_processor"):
        keywords["logits_processor"] = [BanSuccessor()]
    with pytest.raises(ValueError, match=f"^{argument}: "):
        specdec_ext.generate(target, draft, input_ids, attention_mask, max_new_tokens=4, tree=(2, 1), **keywords)


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
    }[case.removeprefix("block ")]()


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
    # Block verification takes the same processors, drafts and stops: the same steps.
    "block repetition+min_p": ({"repetition_penalty": 2.5, "min_p": 0.15, "method": "block"}, "stale prefix"),
    "block lookup+frequency": ({"frequency_penalty": 2.0, "draft": "prompt_lookup", "ngram": 1, "method": "block"}, "stale prefix"),
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


def _raw_draws(raw, processed, run, keys):
    """Wrong: drafts drawn from the raw draft logits (processing applied to p only) while verify() is told q
    is the processed line. (Drafts from raw q verified against raw q would be exact: any q the drafts
    really come from keeps the law; processing q like p only raises acceptance.)"""
    return specdec_ext.sample(draws.pad_vocab(raw, run.vocab), generator=run.generator, check=False)


def _processor_samples(case: str, rows: int = 8000):
    keywords, _ = PROCESSOR_CASES[case]
    target, draft = tiny_llama(8, seed=11, logit_scale=1.0), tiny_gpt2(8, seed=1, logit_scale=1.0)
    keywords = dict(keywords)
    if keywords.get("draft") == "prompt_lookup":
        draft = None
    keywords.setdefault("eos_token_id", [])
    prompt = PROCESSOR_PROMPTS.get(case.removeprefix("block "), [1, 2, 3])
    input_ids = torch.tensor([prompt] * rows)
    out = specdec_ext.generate(target, draft, input_ids, max_new_tokens=3, num_draft_tokens=2, generator=torch.Generator().manual_seed(3),
                               **keywords)
    eos = keywords["eos_token_id"] if isinstance(keywords["eos_token_id"], int) else None
    return fits(out.sequences[:, len(prompt):], target, prompt, LogitsProcessorList(_reference_processors(case)), eos), out.stats


@pytest.mark.parametrize("case", _cases(PROCESSOR_CASES))
def test_law_with_processors_is_target_only_sampling_with_them(case, monkeypatch):
    (ok, statistic, threshold), stats = _processor_samples(case)
    assert ok, (statistic, threshold)
    assert 0.05 < stats.mean_acceptance < 0.95, stats  # acceptances and rejections both happened

    wrong = PROCESSOR_CASES[case][1]
    if wrong == "stale prefix":
        monkeypatch.setattr(LogitsPipeline, "apply", _stale_prefix(LogitsPipeline.apply))
    else:
        monkeypatch.setattr(draws, "draw_draft", _raw_draws)
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


@pytest.mark.parametrize("draft_kind", ["model", "prompt_lookup", "model, block"])
@pytest.mark.parametrize("case", list(GREEDY_PROCESSORS))
def test_greedy_with_processors_equals_target_only(case, draft_kind):
    from specdec_ext.processors import PresencePenaltyLogitsProcessor

    target, draft = model_pair("llama-close")
    input_ids, attention_mask = left_pad(PROMPTS)
    keywords = dict(GREEDY_PROCESSORS[case])
    reference = dict(keywords)
    if "presence_penalty" in reference:
        reference = {"logits_processor": LogitsProcessorList([PresencePenaltyLogitsProcessor(1.5, 0.3, prompt_length=input_ids.shape[1])])}
    eos = eos_ending_some_rows(target, input_ids, attention_mask, 20)
    expected = target_only(target, input_ids, attention_mask, 20, eos, 0, **reference)
    lookup = draft_kind == "prompt_lookup"
    out = specdec_ext.generate(target, None if lookup else draft, input_ids, attention_mask, max_new_tokens=20, do_sample=False,
                               num_draft_tokens=3, draft="prompt_lookup" if lookup else "model", ngram=2, eos_token_id=eos, pad_token_id=0,
                               method="block" if "block" in draft_kind else "token", **keywords)
    assert out.sequences.tolist() == expected.tolist()


# -------------------------------------------------------------------------------- per-request keys


@pytest.mark.parametrize(("processors", "method"), [({}, "token"), ({"repetition_penalty": 1.3, "min_p": 0.05}, "token"), ({}, "block")])
def test_a_seeded_row_is_the_same_in_any_batch(processors, method):
    """Row b of a batch equals the same prompt generated alone under its seed, token for token, whatever
    the batch and the row order (every draw is keyed by the row's seed and absolute position). With a
    fixed draft length: K decides which positions get a bonus draw instead of a draft and its check."""
    target, draft = model_pair("llama-gpt2")
    prompts = torch.tensor([[5, 6, 7, 8], [1, 2, 3, 4], [4, 11, 4, 12], [7, 7, 1, 9]])
    seeds = torch.tensor([11, 12, 2**40 + 3, 14])
    common = {"max_new_tokens": 16, "temperature": 0.9, "eos_token_id": [], "num_draft_tokens": 3, "method": method, **processors}
    whole = specdec_ext.generate(target, draft, prompts, seeds=seeds, **common).sequences
    for b in range(4):
        alone = specdec_ext.generate(target, draft, prompts[b: b + 1], seeds=seeds[b: b + 1], **common).sequences
        assert alone[0].tolist() == whole[b].tolist(), b
    order = torch.tensor([2, 0, 3, 1])
    permuted = specdec_ext.generate(target, draft, prompts[order], seeds=seeds[order], **common).sequences
    assert permuted.tolist() == whole[order].tolist()
    other = specdec_ext.generate(target, draft, prompts, seeds=seeds + 1, **common).sequences
    assert other.tolist() != whole.tolist()  # the seed decides


@pytest.mark.parametrize("method", ["token", pytest.param("block", marks=pytest.mark.slow)])
def test_seeded_rows_follow_the_target_law(method, monkeypatch):
    """One seed per row: the joint law is exact; reusing a row's random numbers at every step (offsets
    not advanced) is caught by the same check."""
    target, draft = tiny_llama(8, seed=11, logit_scale=1.0), tiny_gpt2(8, seed=1, logit_scale=1.0)
    prompt = [1, 2, 3]

    def run():
        out = specdec_ext.generate(target, draft, torch.tensor([prompt] * 6000), max_new_tokens=3, num_draft_tokens=2, eos_token_id=[],
                                   seeds=torch.arange(6000) * 7919, method=method)
        return fits(out.sequences[:, len(prompt):], target, prompt, None)

    ok, statistic, threshold = run()
    assert ok, (statistic, threshold)

    def frozen(fn):
        def call(*args, **kwargs):
            if kwargs.get("offsets") is not None:
                kwargs["offsets"] = torch.zeros_like(kwargs["offsets"])
            return fn(*args, **kwargs)
        return call

    monkeypatch.setattr(chain_steps, "verify", frozen(chain_steps.verify))
    monkeypatch.setattr(draws, "sample", frozen(draws.sample))
    ok, statistic, threshold = run()
    assert not ok, (statistic, threshold)


def test_seeds_are_checked():
    target, draft = model_pair("llama-close")
    input_ids, attention_mask = left_pad(PROMPTS)
    for bad in ([1, 2], [-1, 2, 3, 4, 5], "seed", [0.5] * 5):
        with pytest.raises(ValueError, match="seeds"):
            specdec_ext.generate(target, draft, input_ids, attention_mask, max_new_tokens=4, seeds=bad)


def test_the_draft_block_moves_to_the_verify_device_once_per_step(monkeypatch):
    """Draft and target are separate modules (here both on the CPU): the draft's proposals and lines reach
    the device of the target's logits in one transfer each per step, whatever K, never one per token."""
    moves = []
    original = chain_steps.to_verify_device

    def counting(tensor, run):
        moves.append((tuple(tensor.shape), run.verify_device))
        return original(tensor, run)

    monkeypatch.setattr(chain_steps, "to_verify_device", counting)
    target, draft = model_pair("llama-gpt2")
    input_ids, attention_mask = left_pad(PROMPTS)
    out = specdec_ext.generate(target, draft, input_ids, attention_mask, max_new_tokens=12, num_draft_tokens=3, eos_token_id=[],
                               generator=torch.Generator().manual_seed(0), repetition_penalty=1.2)
    assert len(moves) == 2 * len(out.stats.draft_lengths)
    assert all(device == target.device for _, device in moves)
    assert {len(shape) for shape, _ in moves[0::2]} == {2} and {len(shape) for shape, _ in moves[1::2]} == {3}  # (b, K) ids, (b, K, V) lines


# ------------------------------------------------------------------------------ stopping and outputs


class _StopAfter:
    """A user stopping criterion: a row ends right after it emits ``token`` (transformers' interface)."""

    def __init__(self, token: int):
        self.token = token

    def __call__(self, input_ids, scores, **kwargs):
        return input_ids[:, -1] == self.token


@pytest.mark.parametrize("kind", list(KINDS))
def test_rows_stop_at_their_own_token_inside_accepted_blocks(kind, monkeypatch):
    """A criterion firing mid-block ends each row exactly where target-only decoding ends it; nothing after is emitted."""
    from transformers.generation.stopping_criteria import StoppingCriteriaList

    blocks = []
    original = loop._apply_stops

    def recording(run, rows, emitted_host, finished_host):
        before = list(emitted_host)
        original(run, rows, emitted_host, finished_host)
        blocks.extend((b, e) for b, e in zip(before, emitted_host, strict=True) if e < b)

    monkeypatch.setattr(loop, "_apply_stops", recording)
    target, draft = model_pair("llama-close")
    input_ids, attention_mask = left_pad(PROMPTS)
    stop = eos_ending_some_rows(target, input_ids, attention_mask, 24)
    expected = target_only(target, input_ids, attention_mask, 24, None, 0, stopping_criteria=StoppingCriteriaList([_StopAfter(stop)]))
    out = specdec_ext.generate(target, draft, input_ids, attention_mask, max_new_tokens=24, do_sample=False,
                               stopping_criteria=[_StopAfter(stop)], eos_token_id=[], pad_token_id=0, **KINDS[kind])
    new, reference = out.sequences[:, input_ids.shape[1]:], expected[:, input_ids.shape[1]:]
    for row, count in enumerate(out.new_tokens):
        # Up to the stop, target-only decoding's tokens (transformers pads finished rows only when an EOS is set).
        assert new[row, :count].tolist() == reference[row, :count].tolist(), row
    assert blocks  # some row's block was cut after its stop token: tokens already accepted behind it were dropped
    for row, count in enumerate(out.new_tokens):
        assert (new[row, count:] == 0).all() and (count == 24 or new[row, count - 1] == stop)


def _penalty_counts_left_padding() -> bool:
    """Whether this transformers' generate() applies its repetition penalty to a row's left padding
    too (5.17: its processor takes no per-row prompt_ignore_length; later versions pass each row's
    padding length and leave the pad tokens out, as specdec_ext.generate does)."""
    try:
        RepetitionPenaltyLogitsProcessor(1.3, prompt_ignore_length=torch.tensor([0]))
    except ValueError:
        return True
    return False


@pytest.mark.parametrize("kind", list(KINDS))
def test_scores_and_logits_are_transformers(kind):
    """output_scores / output_logits: the lines transformers reports for every new token, for every kind."""
    target, draft = model_pair("llama-close")
    input_ids, attention_mask = left_pad(PROMPTS[:3])
    eos = eos_ending_some_rows(target, input_ids, attention_mask, 12)
    common = {"max_new_tokens": 12, "eos_token_id": eos, "pad_token_id": 0, "repetition_penalty": None if kind == "tree" else 1.3}
    reference = {k: v for k, v in common.items() if v is not None}
    expected = target.generate(input_ids, attention_mask=attention_mask, do_sample=False, return_dict_in_generate=True, output_scores=True,
                               output_logits=True, **reference)
    out = specdec_ext.generate(target, draft, input_ids, attention_mask, do_sample=False, output_scores=True, output_logits=True, **common,
                               **KINDS[kind])
    width = expected.sequences.shape[1]
    assert out.sequences[:, :width].tolist() == expected.sequences.tolist()
    new = expected.sequences[:, input_ids.shape[1]:]
    ended = (new == eos).long().cumsum(1)
    assert len(out.scores) == len(out.logits) == len(expected.scores)
    # Where transformers also penalises a padded row's pad token (pad_token_id 0), that row's score of
    # the pad token is the one score left out (generate() documents the row's context, padding excluded).
    padded = (attention_mask[:, 0] == 0) if common["repetition_penalty"] and _penalty_counts_left_padding() else torch.zeros(len(attention_mask), dtype=torch.bool)
    for t in range(len(expected.scores)):
        live = (ended[:, t] == 0) | ((ended[:, t] == 1) & (new[:, t] == eos))
        compared = torch.ones_like(expected.scores[t], dtype=torch.bool)
        compared[padded, 0] = False
        torch.testing.assert_close(out.scores[t][compared & live[:, None]], expected.scores[t][compared & live[:, None]], atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(out.logits[t][live], expected.logits[t][live], atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("kind", list(KINDS))
def test_streamer_receives_each_step(kind):
    target, draft = model_pair("llama-close")
    streamer = RecordingStreamer()
    out = specdec_ext.generate(target, draft, torch.tensor([[5, 6, 7]]), max_new_tokens=12, streamer=streamer,
                               generator=torch.Generator().manual_seed(4), eos_token_id=[], **KINDS[kind])
    assert streamer.ended == 1 and len(streamer.puts) == len(out.stats.draft_lengths)
    assert sum(streamer.puts, []) == out.sequences[0, 3:].tolist()


@pytest.mark.parametrize("keywords", [{}, {"temperature": 0.7, "top_k": 5, "top_p": 0.9}, {"do_sample": False}, {"repetition_penalty": 1.3, "min_p": 0.05}])
def test_prepared_draft_draws_equal_sample(keywords, monkeypatch):
    """The loop's prepared draft draw (a Sampler built once) gives the tokens sample() gives (same keys, same stream)."""
    target, draft = model_pair("llama-close")
    input_ids, attention_mask = left_pad(PROMPTS)
    used = []
    original = draws._prepared_sampler

    def prepared_sampler(processed, run):
        used.append((original(processed, run), processed.shape[0]))
        return used[-1][0]

    monkeypatch.setattr(draws, "_prepared_sampler", prepared_sampler)

    def run():
        return specdec_ext.generate(target, draft, input_ids, attention_mask, max_new_tokens=12, num_draft_tokens=3,
                                    generator=torch.Generator().manual_seed(5), **keywords).sequences

    prepared = run()
    assert used and all(isinstance(sampler, specdec_ext.Sampler) for sampler, _ in used)  # every draft draw went through a Sampler
    # One Sampler per batch size (rows that finish leave the batch), reused at every later step of that size.
    assert len({id(sampler) for sampler, _ in used}) == len({batch for _, batch in used}) < len(used)
    monkeypatch.setattr(draws, "_prepared_sampler", lambda processed, run: None)
    assert torch.equal(prepared, run())


@pytest.mark.parametrize("method", ["token", "block"])
def test_step_breakdown_times_every_phase(method):
    """measure.step_breakdown runs the loop of either method with each phase timed; the phases add up to the step."""
    from specdec_ext import measure

    target, draft = model_pair("llama-close")
    input_ids, attention_mask = left_pad(PROMPTS[:2])
    report = measure.step_breakdown(target, draft, input_ids, attention_mask, max_new_tokens=12, num_draft_tokens=3, sampling={"temperature": 1.0},
                                    repeats=1, method=method)
    phases = report["ms_per_step"]
    assert report["method"] == method and report["steps"] > 0
    for name in ("draft forwards", "draft sampling", "target forward", "verify (+ processors, EOS, write)", "cache bookkeeping (settle, crop, rows)"):
        assert phases[name] > 0, name
    inside = sum(value for name, value in phases.items() if name not in ("step total", "loop Python (sync, tallies, stops)"))
    assert inside < phases["step total"]
    assert phases["loop Python (sync, tallies, stops)"] == pytest.approx(phases["step total"] - inside)
