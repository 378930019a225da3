"""Golden outputs: fixed calls of every verification entry point, on every backend.

Each case is built from its own seed (inputs drawn with a CPU ``torch.Generator``) and run with fixed
keys, so its outputs are a pure function of the code. ``record.py`` stores them in ``outputs.json``;
``tests/exactness/test_golden.py`` runs the same cases and demands the same tokens, accepted counts and nodes
(log-probabilities and acceptance probabilities to 1e-5), so a restructuring of any layer that
changes what a seed produces fails there.
"""

from __future__ import annotations

import inspect

import torch

import specdec_ext

LOGPROB_TOLERANCE = 1e-5


def _logits(generator: torch.Generator, shape, dtype: torch.dtype, scale: float) -> torch.Tensor:
    return (torch.randn(shape, generator=generator) * scale).to(dtype)


def _drafts_from(draft_logits: torch.Tensor, generator: torch.Generator, vocab: int) -> torch.Tensor:
    """(B, K) draft ids sampled from softmax(draft_logits) (q need not match for a golden record)."""
    batch, positions, width = draft_logits.shape
    if positions == 0:
        return torch.empty((batch, 0), dtype=torch.int64)
    probs = draft_logits.float().softmax(-1).reshape(batch * positions, width)
    return torch.multinomial(probs, 1, generator=generator).reshape(batch, positions).clamp(max=vocab - 1)


def _per_row(value, batch, dtype):
    if isinstance(value, list):
        return torch.tensor(value, dtype=dtype)
    return value


# ------------------------------------------------------------------------------------------------
# Chains: verify (token and block) and sample.

CHAIN_SETTINGS = [
    # name, dtype, temperature, top_k, top_p, draft ("dense", "narrow", None), keys ("generator", "seeds"), ragged, logprobs, accept_probs
    ("plain", torch.float32, 1.0, None, None, "dense", "generator", False, False, False),
    ("t07_topk", torch.float32, 0.7, 5, None, "dense", "seeds", False, "processed", True),
    ("t1_topp", torch.float32, 1.0, None, 0.8, "dense", "seeds", True, "processed", True),
    ("both", torch.float32, 0.8, 20, 0.9, "dense", "seeds", False, "raw", False),
    ("greedy", torch.float32, 0.0, None, None, "dense", "generator", False, "processed", True),
    ("mixed_rows", torch.float32, [0.0, 0.8, 1.3, 1.0], [0, 7, 0, 3], [1.0, 0.9, 0.7, 1.0], "dense", "seeds", True, "processed", True),
    ("bf16", torch.bfloat16, 0.9, None, 0.95, "dense", "seeds", False, "processed", False),
    ("bf16_plain", torch.bfloat16, 1.0, None, None, "dense", "generator", True, False, True),
    ("narrow_draft", torch.float32, 1.0, 10, None, "narrow", "seeds", False, "processed", True),
    ("one_hot", torch.float32, 1.0, None, None, None, "seeds", True, "raw", True),
    ("one_hot_filtered", torch.float32, 0.6, 8, 0.85, None, "generator", False, False, False),
    ("peaked", torch.float32, 1.0, None, 0.5, "dense", "seeds", False, "processed", True),
    ("fp16", torch.float16, 1.2, 15, None, "dense", "seeds", False, False, True),
]
CHAIN_SHAPE = (4, 3, 200)  # B, K, V
NARROW_VOCAB = 150


def chain_inputs(index: int, setting) -> dict:
    name, dtype, temperature, top_k, top_p, draft_kind, keys, ragged, logprobs, accept_probs = setting
    batch, positions, vocab = CHAIN_SHAPE
    generator = torch.Generator().manual_seed(1000 + index)
    scale = 6.0 if name == "peaked" else 2.5
    target = _logits(generator, (batch, positions + 1, vocab), dtype, scale)
    draft_vocab = NARROW_VOCAB if draft_kind == "narrow" else vocab
    noise = _logits(generator, (batch, positions, draft_vocab), torch.float32, 1.0)
    dense = (target[:, :positions, :draft_vocab].float() + noise).to(dtype)
    drafts = _drafts_from(dense if draft_kind else target[:, :positions], generator, draft_vocab)
    args = {
        "target_logits": target, "draft_logits": dense if draft_kind else None, "draft_tokens": drafts,
        "temperature": _per_row(temperature, batch, torch.float32), "top_k": _per_row(top_k, batch, torch.int64),
        "top_p": _per_row(top_p, batch, torch.float32), "return_logprobs": logprobs, "return_accept_probs": accept_probs,
    }
    if ragged:
        args["num_draft_tokens"] = torch.tensor([3, 0, 2, 1])
    if keys == "seeds":
        args["seeds"] = torch.tensor([11, 2**40 + 3, 7, 123456789])
        args["offsets"] = torch.tensor([0, 17, 2**33, 5])
    else:
        args["generator"] = torch.Generator().manual_seed(77 + index)
    return args


def run_chain(index: int, setting, backend: str, method: str) -> dict:
    args = chain_inputs(index, setting)
    if method == "block":
        args.pop("return_accept_probs")
    out = specdec_ext.verify(**args, backend=backend, method=method)
    record = {"tokens": out.tokens.tolist(), "num_accepted": out.num_accepted.tolist()}
    if out.logprobs is not None:
        record["logprobs"] = out.logprobs.tolist()
    if out.accept_probs is not None:
        record["accept_probs"] = out.accept_probs.tolist()
    return record


SAMPLE_SETTINGS = [
    ("plain", torch.float32, 1.0, None, None, "generator"),
    ("filtered", torch.float32, 0.7, 12, 0.9, "seeds"),
    ("greedy_mixed", torch.float32, [0.0, 1.0, 0.5, 0.0, 2.0], None, [1.0, 0.6, 1.0, 1.0, 0.99], "seeds"),
    ("bf16_topp", torch.bfloat16, 1.0, None, 0.7, "seeds"),
    ("topk_only", torch.float32, 1.5, [1, 2, 50, 0, 199], None, "generator"),
]
SAMPLE_SHAPE = (5, 300)


def run_sample(index: int, setting, backend: str) -> dict:
    name, dtype, temperature, top_k, top_p, keys = setting
    batch, vocab = SAMPLE_SHAPE
    generator = torch.Generator().manual_seed(2000 + index)
    logits = _logits(generator, (batch, vocab), dtype, 3.0)
    kwargs = {"temperature": _per_row(temperature, batch, torch.float32), "top_k": _per_row(top_k, batch, torch.int64),
              "top_p": _per_row(top_p, batch, torch.float32)}
    if keys == "seeds":
        kwargs["seeds"] = torch.tensor([5, 6, 2**50, 8, 9])
        kwargs["offsets"] = torch.tensor([0, 1, 2, 3, 2**32 + 1])
    else:
        kwargs["generator"] = torch.Generator().manual_seed(300 + index)
    return {"tokens": specdec_ext.sample(logits, **kwargs, backend=backend).tolist()}


# ------------------------------------------------------------------------------------------------
# Trees.

TREES = {
    "wide": [-1, -1, -1, 0, 0, 1, 3],
    "chain": [-1, 0, 1, 2],
    "mixed": [-1, -1, 0, 0, 1, 2, 2, 4],
}
TREE_SETTINGS = [
    # name, tree, siblings, draft ("dense", "narrow", None), dtype, temperature, top_k, top_p, keys, ragged
    ("wide_iid", "wide", "iid", "dense", torch.float32, 1.0, None, None, "seeds", False),
    ("wide_wor", "wide", "without_replacement", "dense", torch.float32, 1.0, None, None, "seeds", False),
    ("wide_det", "wide", "iid", None, torch.float32, 1.0, None, None, "seeds", False),
    ("mixed_iid_filtered", "mixed", "iid", "dense", torch.float32, 0.8, 10, 0.9, "generator", False),
    ("mixed_wor_filtered", "mixed", "without_replacement", "dense", torch.float32, 0.7, None, 0.8, "seeds", True),
    ("mixed_det_filtered", "mixed", "iid", None, torch.float32, 1.2, 6, None, "seeds", True),
    ("chain_iid", "chain", "iid", "dense", torch.float32, 1.0, None, None, "seeds", False),
    ("greedy_rows", "mixed", "without_replacement", "dense", torch.float32, [0.0, 1.0, 0.0, 0.9], None, None, "seeds", False),
    ("bf16_wor", "wide", "without_replacement", "narrow", torch.bfloat16, 1.0, None, 0.95, "seeds", False),
    ("peaked_det", "wide", "iid", None, torch.float32, 1.0, None, None, "generator", False),
]
TREE_BATCH, TREE_VOCAB = 4, 120


def tree_inputs(index: int, setting) -> dict:
    name, tree, siblings, draft_kind, dtype, temperature, top_k, top_p, keys, ragged = setting
    parents = torch.tensor([TREES[tree]] * TREE_BATCH)
    nodes = parents.shape[1]
    generator = torch.Generator().manual_seed(3000 + index)
    scale = 5.0 if name.startswith("peaked") else 2.0
    target = _logits(generator, (TREE_BATCH, nodes + 1, TREE_VOCAB), dtype, scale)
    draft_vocab = 90 if draft_kind == "narrow" else TREE_VOCAB
    draft = (target[:, :, :draft_vocab].float() + _logits(generator, (TREE_BATCH, nodes + 1, draft_vocab), torch.float32, 1.0)).to(dtype)
    context = parents + 1  # the context each node was drawn at
    lines = torch.gather(draft, 1, context[:, :, None].expand(TREE_BATCH, nodes, draft_vocab))
    tokens = _drafts_from(lines, generator, draft_vocab)
    args = {
        "target_logits": target, "draft_logits": draft if draft_kind else None, "draft_tokens": tokens, "parents": parents,
        "siblings": siblings, "temperature": _per_row(temperature, TREE_BATCH, torch.float32),
        "top_k": _per_row(top_k, TREE_BATCH, torch.int64), "top_p": _per_row(top_p, TREE_BATCH, torch.float32),
    }
    if ragged:
        args["num_nodes"] = torch.tensor([nodes, 0, 3, nodes - 1])
    if keys == "seeds":
        args["seeds"] = torch.tensor([1, 2**45, 3, 4])
        args["offsets"] = torch.tensor([0, 9, 2**32 - 1, 40])
    else:
        args["generator"] = torch.Generator().manual_seed(500 + index)
    return args


def run_tree(index: int, setting, backend: str) -> dict:
    out = specdec_ext.verify_tree(**tree_inputs(index, setting), backend=backend)
    return {"tokens": out.tokens.tolist(), "num_accepted": out.num_accepted.tolist(), "accepted_nodes": out.accepted_nodes.tolist()}


# ------------------------------------------------------------------------------------------------
# Generation with tiny models (transformers, CPU).

GENERATE_SETTINGS = [
    # name, extra generate() keywords
    ("chain", {"num_draft_tokens": 3}),
    ("chain_filtered", {"num_draft_tokens": 4, "temperature": 0.8, "top_k": 8, "top_p": 0.9}),
    ("block", {"num_draft_tokens": 3, "method": "block"}),
    ("tree_wor", {"tree": (2, 1)}),
    ("tree_iid", {"tree": (2, 2), "siblings": "iid"}),
    ("greedy_tree", {"tree": (2, 1), "do_sample": False}),
    # The embedded, trained pair (the demo's models) on a few prompts of its corpus.
    ("pair_chain", {"num_draft_tokens": 4, "temperature": 0.7, "pair": True}),
    ("pair_block", {"num_draft_tokens": 4, "temperature": 0.7, "method": "block", "pair": True}),
    ("pair_tree", {"tree": (2, 1, 1), "temperature": 0.7, "pair": True}),
]


def _tiny_pair():
    from tests.support.tiny_models import left_pad, tiny_llama

    target = tiny_llama(32, seed=0, logit_scale=3.0)
    draft = tiny_llama(32, seed=5, hidden=16, layers=1, logit_scale=3.0)
    ids, mask = left_pad([[3, 4, 5, 6], [7, 8], [9, 10, 11]])
    return target, draft, ids, mask


_PAIR = None


def _embedded_pair():
    global _PAIR
    if _PAIR is None:
        from specdec_ext.demo.assets import load_pair

        target, draft, tokenizer = load_pair()
        tokenizer.padding_side = "left"
        batch = tokenizer(["Market wrap: ", "Shares of ", "The central bank said", "Quarterly revenue"], return_tensors="pt", padding=True)
        _PAIR = target, draft, batch["input_ids"], batch["attention_mask"]
    return _PAIR


def run_generate(index: int, setting, backend: str) -> dict:
    name, extra = setting
    kwargs = dict(extra)
    target, draft, ids, mask = _embedded_pair() if kwargs.pop("pair", False) else _tiny_pair()
    length = 12 if ids.shape[0] == 3 else 24
    if "tree" in kwargs or kwargs.get("method") == "block":
        # Trees and blocks draw from a generator (no per-row seeds).
        kwargs["generator"] = torch.Generator().manual_seed(40 + index)
        if "siblings" in kwargs and "siblings" not in inspect.signature(specdec_ext.generate).parameters:
            from specdec_ext.tree_generate import generate_tree  # (before generate() took siblings)

            return {"sequences": generate_tree(target, draft, ids, mask, max_new_tokens=length, **kwargs).sequences.tolist()}
        out = specdec_ext.generate(target, draft, ids, mask, max_new_tokens=length, backend=backend, **kwargs)
        return {"sequences": out.sequences.tolist()}
    seeds = [21, 22, 23, 24][: ids.shape[0]]
    out = specdec_ext.generate(target, draft, ids, mask, max_new_tokens=length, seeds=seeds, backend=backend, **kwargs)
    return {"sequences": out.sequences.tolist()}


# ------------------------------------------------------------------------------------------------


def all_cases():
    """(kind, name, runner(backend) -> record, backends) for every golden case."""
    cases = []
    for index, setting in enumerate(CHAIN_SETTINGS):
        for method in ("token", "block"):
            cases.append(("verify_" + method, setting[0], lambda b, i=index, s=setting, m=method: run_chain(i, s, b, m)))
    for index, setting in enumerate(SAMPLE_SETTINGS):
        cases.append(("sample", setting[0], lambda b, i=index, s=setting: run_sample(i, s, b)))
    for index, setting in enumerate(TREE_SETTINGS):
        cases.append(("verify_tree", setting[0], lambda b, i=index, s=setting: run_tree(i, s, b)))
    for index, setting in enumerate(GENERATE_SETTINGS):
        cases.append(("generate", setting[0], lambda b, i=index, s=setting: run_generate(i, s, b)))
    return cases


BACKENDS = ("eager", "cpp", "triton")
GENERATE_BACKENDS = ("eager", "cpp")


def backends_for(kind: str) -> tuple[str, ...]:
    return GENERATE_BACKENDS if kind == "generate" else BACKENDS


def key(kind: str, name: str, backend: str) -> str:
    return f"{kind}/{name}/{backend}"


assert len({(kind, name) for kind, name, _ in all_cases()}) == len(all_cases())
