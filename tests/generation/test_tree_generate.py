"""generate(tree=...): greedy equality, fresh scores at every node, exact sampling laws, cache hygiene."""

from __future__ import annotations

import pytest
import torch
from support.sequence_laws import PROMPTS, eos_ending_some_rows, fits, keeping_every_node, model_pair, one_thread, target_only  # noqa: F401
from support.tiny_models import left_pad, perturbed_copy, tiny_gpt2, tiny_llama
from transformers import Qwen2Config, Qwen2ForCausalLM

import specdec_ext
from specdec_ext.generation import loop, tree_steps
from specdec_ext.generation.adaptive import ShapeChooser
from specdec_ext.generation.cache import ModelCache
from specdec_ext.generation.rows import Rows
from specdec_ext.generation.shapes import AUTO_MAX_NODES, DraftTree, candidate_trees, expected_tokens
from specdec_ext.processors import LogitsPipeline


def tiny_qwen2(vocab_size: int = 16, *, seed: int = 0, attn_implementation: str = "sdpa") -> Qwen2ForCausalLM:
    """A random 2-layer Qwen2 (RoPE, grouped-query attention, biased q/k/v projections)."""
    config = Qwen2Config(vocab_size=vocab_size, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, max_position_embeddings=256, tie_word_embeddings=False, bos_token_id=None, eos_token_id=None,
                         pad_token_id=None, attn_implementation=attn_implementation)
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(config)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for parameter in model.parameters():
            if parameter.dim() >= 2:
                parameter.copy_(torch.randn(parameter.shape, generator=generator) * 0.2)
        model.get_output_embeddings().weight.mul_(2.0)
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = None
    return model.eval()


def _pair(name: str, vocab: int = 16, attention: str = "sdpa"):
    if name == "qwen2":
        target = tiny_qwen2(vocab, seed=4, attn_implementation=attention)
        return target, perturbed_copy(target, noise=0.05)
    return model_pair(name, vocab, attention)


# ------------------------------------------------------------------------------------------------ greedy


@pytest.mark.parametrize(("pair", "tree"), [("llama-close", (2, 2, 1)), ("llama-close", "auto"), ("llama3-gpt2", (3, 1)), ("qwen2", (2, 1, 1)),
                                            ("qwen2", (1, 1, 1, 1))])
def test_greedy_equals_target_only_generate(pair, tree):
    target, draft = _pair(pair)
    input_ids, attention_mask = left_pad(PROMPTS)
    max_new = 24
    eos = eos_ending_some_rows(target, input_ids, attention_mask, max_new)
    expected = target_only(target, input_ids, attention_mask, max_new, eos, 0)
    out = specdec_ext.generate(target, draft, input_ids, attention_mask, max_new_tokens=max_new, do_sample=False, tree=tree, eos_token_id=eos,
                               pad_token_id=0)
    for row in range(len(PROMPTS)):
        assert out.sequences[row].tolist() == expected[row].tolist(), f"row {row}"
    stats = out.stats
    assert stats.target_forwards == len(stats.trees) + 1 and stats.tokens_per_target_forward >= 1
    assert stats.draft_lengths == [DraftTree.from_branching(t).num_nodes for t in stats.trees]
    if pair != "llama3-gpt2":
        assert stats.tokens_per_target_forward > 1.5  # trees were entered: the test exercises kept paths


LINE_PROCESSORS = {
    "suppress": {"suppress_tokens": [4, 10]},
    "bad_words, one token": {"bad_words_ids": [[3], [9]]},
    "sequence_bias, one token": {"sequence_bias": [[[3], 2.0], [[4], -1.5]]},
}


@pytest.mark.parametrize("case", list(LINE_PROCESSORS))
def test_greedy_tree_with_line_processors_equals_target_only(case):
    target, draft = _pair("llama-close")
    input_ids, attention_mask = left_pad(PROMPTS)
    eos = eos_ending_some_rows(target, input_ids, attention_mask, 20)
    expected = target_only(target, input_ids, attention_mask, 20, eos, 0, **LINE_PROCESSORS[case])
    out = specdec_ext.generate(target, draft, input_ids, attention_mask, max_new_tokens=20, do_sample=False, tree=(2, 1, 1), eos_token_id=eos,
                               pad_token_id=0, **LINE_PROCESSORS[case])
    assert out.sequences.tolist() == expected.tolist()


def test_greedy_equals_target_only_on_the_embedded_pair():
    from specdec_ext.demo.assets import load_pair
    from specdec_ext.demo.corpus import DEMO_PROMPTS

    target, draft, tokenizer = load_pair()
    tokenizer.padding_side = "left"
    enc = tokenizer(list(DEMO_PROMPTS[:3]), return_tensors="pt", padding=True)
    expected = target_only(target, enc["input_ids"], enc["attention_mask"], 16, tokenizer.eos_token_id, tokenizer.pad_token_id)
    for tree, method in (((2, 2, 1), "token"), (None, "block")):
        out = specdec_ext.generate(target, draft, enc["input_ids"], enc["attention_mask"], max_new_tokens=16, do_sample=False, tree=tree,
                                   method=method, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
        assert out.sequences.tolist() == expected.tolist(), (tree, method)
        assert out.stats.tokens_per_target_forward > 2


def test_early_exit_draft_is_the_targets_first_layers_shared_and_drafts_exactly():
    import copy

    from specdec_ext.demo.assets import early_exit_draft, load_pair
    from specdec_ext.demo.corpus import DEMO_PROMPTS

    target, _, tokenizer = load_pair()
    draft = early_exit_draft(target, 2)
    # Shared modules, no copies: the draft costs no weights of its own.
    assert draft.model.layers[1] is target.model.layers[1] and draft.lm_head is target.lm_head
    assert not any(p.is_meta for p in draft.parameters()) and not any(b.is_meta for b in draft.buffers())
    truncated = copy.deepcopy(target)
    truncated.model.layers = truncated.model.layers[:2]
    truncated.config.num_hidden_layers = 2
    ids = tokenizer(list(DEMO_PROMPTS[:1]), return_tensors="pt")["input_ids"]
    with torch.no_grad():
        torch.testing.assert_close(draft(ids).logits, truncated(ids).logits, rtol=0, atol=0)
    # A weak draft still gives the target's greedy tokens exactly.
    expected = target_only(target, ids, torch.ones_like(ids), 12, tokenizer.eos_token_id, tokenizer.pad_token_id)
    out = specdec_ext.generate(target, draft, ids, torch.ones_like(ids), max_new_tokens=12, do_sample=False, tree=(3, 1),
                               eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    assert out.sequences.tolist() == expected.tolist()
    assert out.stats.tokens_per_target_forward_stderr > 0
    for bad in (0, len(target.model.layers) + 1):
        with pytest.raises(ValueError, match="num_layers"):
            early_exit_draft(target, bad)


def test_stderr_of_tokens_per_forward():
    from specdec_ext.generation.stats import stderr_of_mean

    values = [1, 3, 2, 5, 1, 1, 4]
    mean = sum(values) / len(values)
    sample_variance = sum((v - mean) ** 2 for v in values) / (len(values) - 1)
    assert stderr_of_mean(sum(values), sum(v * v for v in values), len(values)) == pytest.approx((sample_variance / len(values)) ** 0.5)
    assert stderr_of_mean(3, 9, 1) != stderr_of_mean(3, 9, 1)  # NaN: one value has no spread estimate


# ------------------------------------------------------------------------------------ fresh scores


def _record(monkeypatch):
    """Record every step's rows (before it) and the verifier's inputs and outputs."""
    records = []
    original_step, original_verify = loop._step, tree_steps.verify_tree

    def step(run, kind, target, draft, rows):
        records.append({"index": rows.index.clone(), "generated": rows.generated.clone()})
        return original_step(run, kind, target, draft, rows)

    def recording_verify(target_logits, draft_logits, tokens, parents, **kwargs):
        result = original_verify(target_logits, draft_logits, tokens, parents, **kwargs)
        records[-1].update(target_logits=target_logits.clone(), draft_logits=None if draft_logits is None else draft_logits.clone(),
                           tokens=tokens.clone(), parents=parents[0].tolist(), num_nodes=kwargs["num_nodes"].clone(), result=result)
        return result

    monkeypatch.setattr(loop, "_step", step)
    monkeypatch.setattr(tree_steps, "verify_tree", recording_verify)
    return records


def _stalest_scores(target, draft, records, sequences, attention_mask) -> tuple[float, float]:
    """Largest gaps between the logits a step used and fresh, cache-free forwards: the target at every
    node's context (its committed tokens and its ancestors), the draft at every context it expanded."""
    width = attention_mask.shape[1]
    worst_target = worst_draft = 0.0
    with torch.no_grad():
        for record in records:
            parents = record["parents"]
            for b, row in enumerate(record["index"].tolist()):
                done = int(record["generated"][b])
                committed = torch.cat([sequences[row, :width][attention_mask[row].bool()], sequences[row, width : width + done]])
                used = int(record["num_nodes"][b])
                for context in range(used + 1):  # 0 = the root, i + 1 = node i
                    path, node = [], context - 1
                    while node >= 0:
                        path.insert(0, int(record["tokens"][b, node]))
                        node = parents[node]
                    ids = torch.cat([committed, torch.tensor(path, dtype=torch.long)])[None]
                    fresh = target(ids).logits[0, -1]
                    worst_target = max(worst_target, float((fresh - record["target_logits"][b, context]).abs().max()))
                    has_children = any(parents[i] == context - 1 for i in range(used))
                    if record["draft_logits"] is not None and has_children:
                        fresh = draft(ids).logits[0, -1]
                        worst_draft = max(worst_draft, float((fresh - record["draft_logits"][b, context]).abs().max()))
    return worst_target, worst_draft


def _fresh_run(monkeypatch, pair="llama3-gpt2", tree=(2, 2)):
    target, draft = _pair(pair)
    input_ids, attention_mask = left_pad(PROMPTS)
    records = _record(monkeypatch)
    out = specdec_ext.generate(target, draft, input_ids, attention_mask, max_new_tokens=14, tree=tree, generator=torch.Generator().manual_seed(0), eos_token_id=[])
    return _stalest_scores(target, draft, records, out.sequences, attention_mask), out.stats


@pytest.mark.parametrize(("pair", "tree"), [("llama3-gpt2", (2, 2)), ("llama-close", (2, 1, 1)), ("qwen2", (3, 2))])
def test_every_node_is_scored_with_fresh_logits(pair, tree, monkeypatch):
    (target_gap, draft_gap), stats = _fresh_run(monkeypatch, pair, tree)
    assert target_gap < 1e-4 and draft_gap < 1e-4, (target_gap, draft_gap)
    if pair == "llama-close":
        assert stats.acceptance_per_position[-1] > 0.3  # full paths accepted: the draft catches up on the deepest node


def test_fresh_score_check_catches_kept_rejected_branches(monkeypatch):
    monkeypatch.setattr(ModelCache, "keep_segment", keeping_every_node(ModelCache.keep_segment))
    (target_gap, _), _ = _fresh_run(monkeypatch)
    assert target_gap > 1e-2
    monkeypatch.undo()

    # ... and a draft that never sees the deepest node of a fully accepted path.
    original_advance = Rows.advance

    def forgetful(self, *args):
        original_advance(self, *args)
        self.unfed, self.unfed_host = self.unfed[:, -1:], [1] * len(self.unfed_host)

    monkeypatch.setattr(Rows, "advance", forgetful)
    (_, draft_gap), _ = _fresh_run(monkeypatch, "llama-close", (2, 1, 1))
    assert draft_gap > 1e-2


# ------------------------------------------------------------------------------------ exact sampling laws
# (the joint-law checks of trees run with the chain's in tests/generation/test_generate.py)


def test_law_with_line_processors_is_target_only_sampling_with_them(monkeypatch):
    """Trees take the processors that read a line alone (here suppress_tokens and min_p): drafts and
    verification see the processed lines; the check rejects a loop that drops the processors."""
    from transformers.generation import logits_process as lp
    from transformers.generation.logits_process import LogitsProcessorList

    target, draft = tiny_llama(8, seed=11, logit_scale=1.0), tiny_gpt2(8, seed=1, logit_scale=1.0)
    prompt = [1, 2, 3]
    reference = LogitsProcessorList([lp.SuppressTokensLogitsProcessor([5]), lp.TemperatureLogitsWarper(1.3), lp.MinPLogitsWarper(0.1)])

    def run():
        out = specdec_ext.generate(target, draft, torch.tensor([prompt] * 8000), max_new_tokens=3, tree=(2, 1), temperature=1.3, min_p=0.1,
                                   suppress_tokens=[5], generator=torch.Generator().manual_seed(3), eos_token_id=[])
        return fits(out.sequences[:, len(prompt):], target, prompt, reference), out.stats

    (ok, statistic, threshold), stats = run()
    assert ok, (statistic, threshold)
    assert 0.1 < stats.mean_acceptance < 0.95, stats
    monkeypatch.setattr(LogitsPipeline, "apply", lambda self, scores, context, first=0: scores)
    (ok, statistic, threshold), _ = run()
    assert not ok, (statistic, threshold)


# --------------------------------------------------------------------------------------------- misc


def test_tree_shapes_and_auto_choice():
    tree = DraftTree.from_branching((2, 2, 1))
    assert tree.num_nodes == 10 and tree.parents == (-1, -1, 0, 0, 1, 1, 2, 3, 4, 5) and tree.nodes_within(2) == 6
    assert tree.truncated(2).branching == (2, 2) and tree.truncated(0).branching == (2,) and tree.truncated(5) is tree
    assert all(t.num_nodes <= AUTO_MAX_NODES for t in candidate_trees())
    assert expected_tokens(DraftTree.from_branching((1, 1)), 1.0) == 3.0
    shapes = ShapeChooser.for_tree("auto")
    for _ in range(10):
        shapes.update(5, 100, DraftTree.from_branching((2, 1, 1)), draft_seconds=0.03, target_seconds=1.0)
    assert shapes.choose().branching[0] >= 2  # a poor draft: wide at the root
    for _ in range(30):
        shapes.update(98, 100, DraftTree.from_branching((2, 1, 1)), draft_seconds=0.03, target_seconds=1.0)
    assert len(shapes.choose().branching) >= 4  # an accurate cheap draft: deep


def test_bad_arguments_raise():
    target, draft = _pair("llama-close")
    input_ids, attention_mask = left_pad(PROMPTS)
    with pytest.raises(ValueError, match="tree must"):
        specdec_ext.generate(target, draft, input_ids, attention_mask, max_new_tokens=4, tree=(2, 0))
    with pytest.raises(ValueError, match="tree must"):
        specdec_ext.generate(target, draft, input_ids, attention_mask, max_new_tokens=4, tree="wide")
    with pytest.raises(ValueError, match="siblings must be"):
        specdec_ext.generate(target, draft, input_ids, attention_mask, max_new_tokens=4, tree=(2, 1), siblings="some")
    flash = tiny_llama(16, seed=7)
    flash.config._attn_implementation = "flash_attention_2"
    with pytest.raises(ValueError, match="4-D attention mask"):
        specdec_ext.generate(flash, draft, input_ids, attention_mask, max_new_tokens=4, tree=(2, 1))


def test_demo_rows_for_block_and_tree(capsys, monkeypatch):
    from specdec_ext import _cpp_backend
    from specdec_ext.demo.tree_rows import DEMO_TREE, print_rows, sum_nodes, tree_and_block_rows

    monkeypatch.setattr(_cpp_backend, "_C", None)  # chain verification on the eager reference: this is about the rows

    target, draft = _pair("llama-close")
    input_ids, attention_mask = left_pad(PROMPTS[:2])
    rows = tree_and_block_rows(target, draft, input_ids, attention_mask, max_new_tokens=8, temperature=1.0, num_draft_tokens=3, eos_ids=[], pad_id=0,
                               rounds=2)
    assert [r["method"] for r in rows] == ["chain K=3, token-wise", "chain K=3, block verification", f"tree {DEMO_TREE}, {sum_nodes(DEMO_TREE)} nodes"]
    assert all(r["new_tokens"] == 16 and r["tokens_per_target_forward"] >= 1 and len(r["rounds"]) == 2 for r in rows)
    for r in rows:  # the phases of a step, measured by the loop's clocks, fit in the step
        phases = r["ms_per_step"]
        assert all(phases[name] > 0 for name in ("draft", "target", "verify", "commit"))
        assert phases["draft"] + phases["target"] + phases["verify"] + phases["commit"] <= phases["step"]
    print_rows(rows)
    assert "block verification" in capsys.readouterr().out and sum_nodes((2, 2, 1)) == 10
