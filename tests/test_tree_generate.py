"""generate(tree=..., method=...): greedy equality, fresh scores at every node, exact sampling laws, cache hygiene."""

from __future__ import annotations

import importlib
import itertools
import warnings

import pytest
import torch
from scipy.stats import chi2
from tiny_models import left_pad, perturbed_copy, tiny_gpt2, tiny_llama
from transformers import Qwen2Config, Qwen2ForCausalLM

import specdec_ext
from specdec_ext.reference import process_lines

tg = importlib.import_module("specdec_ext.tree_generate")


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny models: one intra-op thread is many times faster on a shared machine
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*eager backend.*")
        yield
    torch.set_num_threads(threads)


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


PROMPTS = [[5, 6, 7, 8, 9], [1, 2], [4, 11, 4, 12, 4, 13, 4], [7], [3, 9, 10]]


def _pair(name: str, vocab: int = 16, attention: str = "sdpa"):
    if name == "llama-close":
        target = tiny_llama(vocab, seed=7, attn_implementation=attention)
        return target, perturbed_copy(target, noise=0.02)
    if name == "llama-gpt2":  # unrelated draft, learned positions: wrong position ids would show
        return tiny_llama(vocab, seed=3, attn_implementation=attention), tiny_gpt2(vocab, seed=3, attn_implementation=attention)
    if name == "qwen2":
        target = tiny_qwen2(vocab, seed=4, attn_implementation=attention)
        return target, perturbed_copy(target, noise=0.05)
    raise KeyError(name)


def _target_only(target, input_ids, attention_mask, max_new_tokens, eos, pad):
    out = target.generate(input_ids, attention_mask=attention_mask, do_sample=False, max_new_tokens=max_new_tokens, eos_token_id=eos, pad_token_id=pad)
    return torch.nn.functional.pad(out, (0, input_ids.shape[1] + max_new_tokens - out.shape[1]), value=pad)


def _early_eos(target, input_ids, attention_mask, max_new_tokens) -> int:
    free = _target_only(target, input_ids, attention_mask, max_new_tokens, None, 0)[:, input_ids.shape[1]:]
    for token in range(target.config.vocab_size):
        if (free[:, : max_new_tokens // 2] == token).any(1).any() and not (free == token).any(1).all():
            return token
    raise AssertionError("no token ends some rows but not all")


# ------------------------------------------------------------------------------------------------ greedy


@pytest.mark.parametrize(
    ("pair", "tree", "method"),
    [("llama-close", (2, 2, 1), "token"), ("llama-close", "auto", "token"), ("llama-gpt2", (3, 1), "token"), ("qwen2", (2, 1, 1), "token"),
     ("llama-close", None, "block"), ("qwen2", (1, 1, 1, 1), "block")],
)
def test_greedy_equals_target_only_generate(pair, tree, method):
    target, draft = _pair(pair)
    input_ids, attention_mask = left_pad(PROMPTS)
    max_new = 24
    eos = _early_eos(target, input_ids, attention_mask, max_new)
    expected = _target_only(target, input_ids, attention_mask, max_new, eos, 0)
    out = specdec_ext.generate(target, draft, input_ids, attention_mask, max_new_tokens=max_new, do_sample=False, tree=tree, method=method,
                               num_draft_tokens=3, eos_token_id=eos, pad_token_id=0)
    for row in range(len(PROMPTS)):
        assert out.sequences[row].tolist() == expected[row].tolist(), f"row {row}"
    stats = out.stats
    assert stats.target_forwards == len(stats.trees) + 1 and stats.tokens_per_target_forward >= 1
    if pair != "llama-gpt2":
        assert stats.tokens_per_target_forward > 1.5  # trees were entered: the test exercises kept paths


def test_greedy_equals_target_only_on_the_embedded_pair():
    from specdec_ext.demo.assets import load_pair
    from specdec_ext.demo.corpus import DEMO_PROMPTS

    target, draft, tokenizer = load_pair()
    tokenizer.padding_side = "left"
    enc = tokenizer(list(DEMO_PROMPTS[:3]), return_tensors="pt", padding=True)
    expected = _target_only(target, enc["input_ids"], enc["attention_mask"], 16, tokenizer.eos_token_id, tokenizer.pad_token_id)
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
    expected = _target_only(target, ids, torch.ones_like(ids), 12, tokenizer.eos_token_id, tokenizer.pad_token_id)
    out = specdec_ext.generate(target, draft, ids, torch.ones_like(ids), max_new_tokens=12, do_sample=False, tree=(3, 1),
                               eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    assert out.sequences.tolist() == expected.tolist()
    assert out.stats.tokens_per_target_forward_stderr > 0
    for bad in (0, len(target.model.layers) + 1):
        with pytest.raises(ValueError, match="num_layers"):
            early_exit_draft(target, bad)


def test_stderr_of_tokens_per_forward():
    from specdec_ext.generate import stderr_of_mean

    values = [1, 3, 2, 5, 1, 1, 4]
    mean = sum(values) / len(values)
    sample_variance = sum((v - mean) ** 2 for v in values) / (len(values) - 1)
    assert stderr_of_mean(sum(values), sum(v * v for v in values), len(values)) == pytest.approx((sample_variance / len(values)) ** 0.5)
    assert stderr_of_mean(3, 9, 1) != stderr_of_mean(3, 9, 1)  # NaN: one value has no spread estimate


def test_greedy_with_eager_attention_and_dead_slots_squeezed_every_step(monkeypatch):
    monkeypatch.setattr(tg, "SQUEEZE_MIN_DEAD", 0)
    monkeypatch.setattr(tg, "SQUEEZE_DEAD_RATIO", 0.0)
    squeezes = []
    original = tg._ModelCache.squeeze

    def counting(self):
        before = self.live.shape[1]
        original(self)
        squeezes.append(before - self.live.shape[1])

    monkeypatch.setattr(tg._ModelCache, "squeeze", counting)
    target, draft = _pair("llama-gpt2", attention="eager")
    input_ids, attention_mask = left_pad(PROMPTS)
    expected = _target_only(target, input_ids, attention_mask, 20, None, 0)
    out = specdec_ext.generate(target, draft, input_ids, attention_mask, max_new_tokens=20, do_sample=False, tree=(2, 2), eos_token_id=[])
    assert out.sequences.tolist() == expected.tolist()
    assert sum(squeezes) > 0


# ------------------------------------------------------------------------------------ fresh scores


def _record(monkeypatch):
    """Record every step's rows (before it) and the verifier's inputs and outputs."""
    records = []
    original_step, original_verify = tg._step, tg.verify_tree

    def step(target, draft, rows, *args):
        records.append({"index": rows.index.clone(), "generated": rows.generated.clone()})
        return original_step(target, draft, rows, *args)

    def recording_verify(target_logits, draft_logits, tokens, parents, **kwargs):
        result = original_verify(target_logits, draft_logits, tokens, parents, **kwargs)
        records[-1].update(target_logits=target_logits.clone(), draft_logits=None if draft_logits is None else draft_logits.clone(),
                           tokens=tokens.clone(), parents=parents[0].tolist(), num_nodes=kwargs["num_nodes"].clone(), result=result)
        return result

    monkeypatch.setattr(tg, "_step", step)
    monkeypatch.setattr(tg, "verify_tree", recording_verify)
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


def _fresh_run(monkeypatch, pair="llama-gpt2", tree=(2, 2)):
    target, draft = _pair(pair)
    input_ids, attention_mask = left_pad(PROMPTS)
    records = _record(monkeypatch)
    out = specdec_ext.generate(target, draft, input_ids, attention_mask, max_new_tokens=14, tree=tree, generator=torch.Generator().manual_seed(0), eos_token_id=[])
    return _stalest_scores(target, draft, records, out.sequences, attention_mask), out.stats


@pytest.mark.parametrize(("pair", "tree"), [("llama-gpt2", (2, 2)), ("llama-close", (2, 1, 1)), ("qwen2", (3, 2))])
def test_every_node_is_scored_with_fresh_logits(pair, tree, monkeypatch):
    (target_gap, draft_gap), stats = _fresh_run(monkeypatch, pair, tree)
    assert target_gap < 1e-4 and draft_gap < 1e-4, (target_gap, draft_gap)
    if pair == "llama-close":
        assert stats.acceptance_per_position[-1] > 0.3  # full paths accepted: the draft catches up on the deepest node


def test_fresh_score_check_catches_kept_rejected_branches(monkeypatch):
    """A cache that keeps every node of the step (not only the accepted path) serves stale entries."""
    original = tg._ModelCache.end_segment
    monkeypatch.setattr(tg._ModelCache, "end_segment", lambda self, keep: original(self, torch.ones_like(keep)))
    (target_gap, _), _ = _fresh_run(monkeypatch)
    assert target_gap > 1e-2
    monkeypatch.undo()

    # ... and a draft that never sees the deepest node of a fully accepted path.
    original_commit = tg._commit

    def forgetful(target, draft, rows, *args):
        original_commit(target, draft, rows, *args)
        rows.draft_unfed = rows.draft_unfed[:, -1:]

    monkeypatch.setattr(tg, "_commit", forgetful)
    (_, draft_gap), _ = _fresh_run(monkeypatch, "llama-close", (2, 1, 1))
    assert draft_gap > 1e-2


def test_caches_hold_exactly_the_committed_tokens(monkeypatch):
    """After every step, each row's live target slots are its committed tokens but the pending one,
    and the draft's are those minus the tokens it has yet to be fed."""
    checks = []
    original = tg._commit

    def checking(target, draft, rows, *args):
        original(target, draft, rows, *args)
        if rows.index.numel():
            checks.append(torch.equal(target.live.sum(1), rows.length - 1))
            checks.append(torch.equal(draft.live.sum(1), rows.length - (rows.draft_unfed >= 0).sum(1)))

    monkeypatch.setattr(tg, "_commit", checking)
    target, draft = _pair("llama-close")
    input_ids, attention_mask = left_pad(PROMPTS)
    specdec_ext.generate(target, draft, input_ids, attention_mask, max_new_tokens=20, tree=(2, 2, 1), generator=torch.Generator().manual_seed(1), eos_token_id=[])
    assert checks and all(checks)


# ------------------------------------------------------------------------------------ exact sampling laws


def _exact_law(target, prompt, num_tokens, temperature, top_k, top_p) -> torch.Tensor:
    """P(x_1..x_n | prompt) under the processed target, flattened (x_1 most significant), by enumeration."""
    vocab = target.config.vocab_size
    heads = torch.tensor(list(itertools.product(range(vocab), repeat=num_tokens - 1)), dtype=torch.long).reshape(-1, num_tokens - 1)
    ids = torch.cat([torch.tensor(prompt).expand(heads.shape[0], -1), heads], 1)
    with torch.no_grad():
        logits = target(ids).logits[:, len(prompt) - 1:]
    lines = logits.reshape(-1, vocab)
    count = lines.shape[0]
    probs = process_lines(lines, torch.full((count,), float(temperature)), torch.full((count,), top_k or 0),
                          torch.full((count,), float(top_p or 1.0))).probs().reshape(heads.shape[0], num_tokens, vocab)
    law = torch.ones(heads.shape[0], dtype=torch.float64)
    for i in range(num_tokens - 1):
        law = law * probs[torch.arange(heads.shape[0]), i, heads[:, i]].double()
    return (law[:, None] * probs[:, -1].double()).reshape(-1)


def _chi_square(counts: torch.Tensor, law: torch.Tensor, alpha: float) -> tuple[float, float]:
    if counts[law == 0].sum() > 0:
        return float("inf"), 0.0
    expected = counts.sum() * law
    big = expected >= 20
    observed = torch.cat([counts[big].double(), counts[~big].sum()[None].double()])
    expected = torch.cat([expected[big], expected[~big].sum()[None]])
    keep = expected > 0
    statistic = float(((observed[keep] - expected[keep]) ** 2 / expected[keep]).sum())
    return statistic, float(chi2.isf(alpha, int(keep.sum()) - 1))


LAW_CASES = {
    # name: (target vocab, draft vocab, new tokens, tree, method, siblings, temperature, top_k, top_p, rows per prompt)
    "tree-without-replacement": (8, 8, 3, (2, 2), "token", "without_replacement", 1.0, None, None, 6000),
    "tree-iid-filtered": (8, 8, 3, (3, 1), "token", "iid", 0.8, 5, 0.9, 6000),
    "block-padded-target": (10, 8, 3, None, "block", "without_replacement", 1.3, None, 0.95, 6000),
}
LAW_PROMPTS = [[1, 2, 3], [4]]


def _sample_counts(case, seed):
    target_vocab, draft_vocab, new, tree, method, siblings, temperature, top_k, top_p, rows = LAW_CASES[case]
    target, draft = tiny_llama(target_vocab, seed=11, logit_scale=1.0), tiny_gpt2(draft_vocab, seed=1, logit_scale=1.0)
    input_ids, attention_mask = left_pad([p for p in LAW_PROMPTS for _ in range(rows)])
    out = tg.generate_tree(target, draft, input_ids, attention_mask, max_new_tokens=new, temperature=temperature, top_k=top_k, top_p=top_p,
                           tree=tree, method=method, siblings=siblings, num_draft_tokens=2, generator=torch.Generator().manual_seed(seed), eos_token_id=[])
    drawn = out.sequences[:, input_ids.shape[1]:]
    cells = (drawn * target_vocab ** torch.arange(new - 1, -1, -1)).sum(1)
    results = []
    for i, prompt in enumerate(LAW_PROMPTS):
        law = _exact_law(target, prompt, new, temperature, top_k, top_p)
        counts = torch.bincount(cells[i * rows : (i + 1) * rows], minlength=law.numel())
        results.append(_chi_square(counts, law, alpha=1e-6 / len(LAW_PROMPTS)))
    return results, out.stats


def _redraw_after_rejecting_every_child(target_logits, draft_logits, tokens, parents, *, num_nodes, generator, check, siblings, **sampling):
    """A wrong verifier: where a walk rejects every child of a context it draws the target's law there
    instead of the residual."""
    result = specdec_ext.verify_tree(target_logits, draft_logits, tokens, parents, num_nodes=num_nodes, siblings=siblings, generator=generator,
                                     check=check, **sampling)
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


def _block_redrawing_from_the_target(target_logits, draft_logits, tokens, *, num_draft_tokens, generator, check, method, **sampling):
    """A wrong block verifier: where it stops before the last draft it draws the target's law instead of
    the block residual max(p_tau P - Q, 0)."""
    result = specdec_ext.verify(target_logits, draft_logits, tokens, num_draft_tokens=num_draft_tokens, generator=generator, check=check,
                                method=method, **sampling)
    rows = torch.arange(tokens.shape[0])
    stopped = result.num_accepted < num_draft_tokens
    redrawn = specdec_ext.sample(target_logits[rows, result.num_accepted], generator=generator, backend="eager", **sampling)
    out = result.tokens.clone()
    out[rows, result.num_accepted] = torch.where(stopped, redrawn, out[rows, result.num_accepted])
    return specdec_ext.VerifyResult(out, result.num_accepted)


@pytest.mark.parametrize("case", list(LAW_CASES))
def test_joint_law_of_new_tokens_is_the_targets(case, monkeypatch):
    results, stats = _sample_counts(case, seed=1)
    for statistic, threshold in results:
        assert statistic < threshold, (statistic, threshold)
    assert 0.1 < stats.mean_acceptance < 0.95, stats  # both branches of the verifier were exercised
    # The same check rejects a verifier that draws from the target where it should draw the residual.
    if LAW_CASES[case][4] == "token":
        monkeypatch.setattr(tg, "verify_tree", _redraw_after_rejecting_every_child)
    else:
        monkeypatch.setattr(tg, "verify", _block_redrawing_from_the_target)
    wrong, _ = _sample_counts(case, seed=1)
    assert any(statistic > threshold for statistic, threshold in wrong), wrong


def test_joint_law_check_rejects_kept_rejected_branches(monkeypatch):
    original = tg._ModelCache.end_segment
    monkeypatch.setattr(tg._ModelCache, "end_segment", lambda self, keep: original(self, torch.ones_like(keep)))
    wrong, _ = _sample_counts("tree-without-replacement", seed=1)
    assert any(statistic > threshold for statistic, threshold in wrong), wrong


# --------------------------------------------------------------------------------------------- misc


def test_tree_shapes_and_auto_choice():
    tree = tg.DraftTree.from_branching((2, 2, 1))
    assert tree.num_nodes == 10 and tree.parents == (-1, -1, 0, 0, 1, 1, 2, 3, 4, 5) and tree.nodes_within(2) == 6
    assert all(t.num_nodes <= tg.AUTO_MAX_NODES for t in tg.candidate_trees())
    assert tg.expected_tokens(tg.DraftTree.from_branching((1, 1)), 1.0) == 3.0
    shapes = tg._TreeShapes("auto", 4)
    for _ in range(10):
        shapes.update(entered=5, tested=100, tree=tg.DraftTree.from_branching((2, 1, 1)), draft_seconds=0.03, target_seconds=1.0)
    assert shapes.choose().branching[0] >= 2  # a poor draft: wide at the root
    for _ in range(30):
        shapes.update(entered=98, tested=100, tree=tg.DraftTree.from_branching((2, 1, 1)), draft_seconds=0.03, target_seconds=1.0)
    assert len(shapes.choose().branching) >= 4  # an accurate cheap draft: deep


def test_bad_arguments_raise():
    target, draft = _pair("llama-close")
    input_ids, attention_mask = left_pad(PROMPTS)
    with pytest.raises(ValueError, match="method='block' verifies chains"):
        specdec_ext.generate(target, draft, input_ids, attention_mask, max_new_tokens=4, tree=(2, 1), method="block")
    with pytest.raises(ValueError, match="tree must"):
        specdec_ext.generate(target, draft, input_ids, attention_mask, max_new_tokens=4, tree=(2, 0))
    with pytest.raises(ValueError, match="tree must"):
        specdec_ext.generate(target, draft, input_ids, attention_mask, max_new_tokens=4, tree="wide")
    with pytest.raises(ValueError, match="method must be"):
        specdec_ext.generate(target, draft, input_ids, attention_mask, max_new_tokens=4, method="joint")
    flash = tiny_llama(16, seed=7)
    flash.config._attn_implementation = "flash_attention_2"
    with pytest.raises(ValueError, match="4-D attention mask"):
        specdec_ext.generate(flash, draft, input_ids, attention_mask, max_new_tokens=4, tree=(2, 1))
    empty = specdec_ext.generate(target, draft, input_ids, attention_mask, max_new_tokens=0, tree=(2, 1))
    assert empty.sequences.tolist() == input_ids.tolist()


def test_demo_rows_for_block_and_tree(capsys, monkeypatch):
    from specdec_ext import _cpp_backend
    from specdec_ext.demo.tree_rows import DEMO_TREE, print_rows, sum_nodes, tree_and_block_rows

    monkeypatch.setattr(_cpp_backend, "_C", None)  # chain verification on the eager reference: this is about the rows

    target, draft = _pair("llama-close")
    input_ids, attention_mask = left_pad(PROMPTS[:2])
    rows = tree_and_block_rows(target, draft, input_ids, attention_mask, max_new_tokens=8, temperature=1.0, num_draft_tokens=3, eos_ids=[], pad_id=0)
    assert [r["method"] for r in rows] == ["chain K=3, token-wise", "chain K=3, block verification", f"tree {DEMO_TREE}, {sum_nodes(DEMO_TREE)} nodes"]
    assert all(r["new_tokens"] == 16 and r["tokens_per_target_forward"] >= 1 for r in rows)
    print_rows(rows)
    assert "block verification" in capsys.readouterr().out and sum_nodes((2, 2, 1)) == 10
