"""Train the embedded target/draft pair used by ``specdec demo``.

    python -m specdec_ext.demo.train_pair --out specdec_ext/demo/pair

Pipeline (everything local, nothing is downloaded):

1. generate the synthetic financial corpus (:mod:`specdec_ext.demo.corpus`);
2. train a byte-level BPE tokenizer on it and save it as a transformers fast
   tokenizer, so ``AutoTokenizer.from_pretrained(dir)`` works offline;
3. train the TARGET ``LlamaForCausalLM`` with the plain LM loss;
4. distil a one-layer DRAFT ``LlamaForCausalLM`` from the frozen target
   (KL to the target's next-token distribution, mixed with a little LM loss),
   which is what makes the draft's proposals get accepted often;
5. save both in float16, reload them from disk and measure what the demo
   cares about on the shipped weights: held-out losses and the acceptance
   rate of modified rejection sampling;
6. write ``metrics.json`` and ``TRAINING.md`` next to the weights.

The script is sized for a 2-core CPU (about 20-25 minutes in total).  Matmuls
run under bfloat16 autocast, which is much faster than float32 on CPUs with
AMX/AVX512-BF16 and keeps float32 master weights.  Runs are seeded; bit-exact
reproduction additionally needs the same CPU kind, thread count and library
versions.
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import random
import shutil
import sys
import time
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path

import tokenizers
import torch
import torch.nn.functional as F
import transformers
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from tqdm import tqdm
from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from specdec_ext.demo.corpus import DEMO_PROMPTS, generate_corpus

PAD, BOS, EOS = "<pad>", "<s>", "</s>"
SEQ_LEN = 256  # training row length == max_position_embeddings of both models
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")
IGNORE = -100  # label value skipped by the losses


@dataclass
class Args:
    out: Path
    seed: int
    train_docs: int
    heldout_docs: int
    vocab_size: int
    batch_size: int
    target_steps: int
    target_lr: float
    draft_steps: int
    draft_lr: float
    distill_weight: float
    warmup_steps: int
    threads: int
    accept_prompts: int
    accept_prompt_tokens: int
    accept_new_tokens: int
    spec_prompts: int
    spec_k: int


# ---------------------------------------------------------------------------
# Tokenizer
# ---------------------------------------------------------------------------


def train_tokenizer(docs: list[str], vocab_size: int) -> PreTrainedTokenizerFast:
    """Byte-level BPE with digits split one by one.

    Splitting digits keeps every number a sequence of the same ten tokens, so
    the models learn number formats from plenty of examples instead of
    hundreds of rarely seen number tokens.  The vocabulary then saturates at
    the corpus' word count, so the trained size can come out below
    ``vocab_size``.  Byte-level coverage means any text still encodes.
    """
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False)]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=[PAD, BOS, EOS],  # ids 0, 1, 2
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(docs, trainer)
    # Every encoded text starts with <s>, as every training document does, so
    # prompts encoded by the demo look like the start of a training document.
    tok.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A {BOS} $B", special_tokens=[(BOS, tok.token_to_id(BOS))]
    )
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=BOS, eos_token=EOS, pad_token=PAD, model_max_length=SEQ_LEN)


def save_tokenizer(tokenizer: PreTrainedTokenizerFast, directory: Path) -> None:
    """Save in the classic three-file layout that any transformers >= 4 loads."""
    tokenizer.save_pretrained(directory)
    config_path = directory / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    # transformers 5 records its internal backend class; the public alias
    # loads the same way there and also in older releases.
    config["tokenizer_class"] = "PreTrainedTokenizerFast"
    config_path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    special = {"bos_token": BOS, "eos_token": EOS, "pad_token": PAD}
    (directory / "special_tokens_map.json").write_text(json.dumps(special, indent=2) + "\n")


def encode_documents(tokenizer: PreTrainedTokenizerFast, docs: list[str]) -> list[list[int]]:
    """``<s> doc </s>`` token ids per document."""
    return [ids + [tokenizer.eos_token_id] for ids in tokenizer(docs)["input_ids"]]


def pack_rows(seqs: list[list[int]], pad_id: int, bos_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Greedily pack whole documents into rows of ``SEQ_LEN`` tokens.

    Rows always start at a document boundary (``<s>`` at position 0, as at
    inference) and never split a document; the tail is padding.  No attention
    mask is needed: padding only follows real tokens, so with causal attention
    no real token ever sees it, and its labels are ignored.  ``<s>`` labels
    are ignored too (the model never has to predict a document start).
    """
    rows: list[list[int]] = []
    current: list[int] = []
    for seq in seqs:
        seq = seq[:SEQ_LEN]
        if len(current) + len(seq) > SEQ_LEN:
            rows.append(current)
            current = []
        current = current + seq
    if current:
        rows.append(current)
    ids = torch.full((len(rows), SEQ_LEN), pad_id, dtype=torch.long)
    for i, row in enumerate(rows):
        ids[i, : len(row)] = torch.tensor(row)
    labels = ids.clone()
    labels[(ids == pad_id) | (ids == bos_id)] = IGNORE
    return ids, labels


# ---------------------------------------------------------------------------
# Models
# ---------------------------------------------------------------------------


def make_config(tokenizer: PreTrainedTokenizerFast, *, hidden: int, layers: int, heads: int, intermediate: int) -> LlamaConfig:
    return LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=heads,
        intermediate_size=intermediate,
        max_position_embeddings=SEQ_LEN,
        # Tied input/output embeddings: the embedding matrix is a large share
        # of such small models, and tying halves it on disk.
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )


def count_params(model: torch.nn.Module) -> int:
    # parameters() yields a tied tensor once, so this is the unique count.
    return sum(p.numel() for p in model.parameters())


def shifted(logits: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Flatten next-token logits and their labels (position t predicts t+1)."""
    return logits[:, :-1].flatten(0, 1).float(), labels[:, 1:].flatten()


def lm_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    flat_logits, flat_labels = shifted(logits, labels)
    return F.cross_entropy(flat_logits, flat_labels, ignore_index=IGNORE)


def distill_losses(target_logits: torch.Tensor, draft_logits: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(KL(p_target || q_draft), draft cross-entropy)``, means over real positions, in nats.

    Forward KL makes the draft cover all of the target's probability mass,
    which is what drives sum_x min(p, q) -- the acceptance probability -- up.
    Both terms share one log-softmax of the draft logits.
    """
    t_logits, flat_labels = shifted(target_logits, labels)
    d_logits, _ = shifted(draft_logits, labels)
    keep = flat_labels != IGNORE
    log_p = F.log_softmax(t_logits[keep], dim=-1)
    log_q = F.log_softmax(d_logits[keep], dim=-1)
    kl = (log_p.exp() * (log_p - log_q)).sum(-1).mean()
    ce = -log_q.gather(1, flat_labels[keep][:, None]).mean()
    return kl, ce


def lr_at(step: int, total: int, peak: float, warmup: int) -> float:
    """Linear warm-up, then cosine decay to 10% of the peak."""
    if step < warmup:
        return peak * (step + 1) / warmup
    progress = (step - warmup) / max(1, total - warmup)
    return peak * (0.1 + 0.9 * 0.5 * (1.0 + math.cos(math.pi * progress)))


def batches(num_rows: int, batch_size: int, steps: int, generator: torch.Generator):
    """Row indices for ``steps`` batches, reshuffling once per epoch."""
    order = torch.randperm(num_rows, generator=generator)
    pos = 0
    for _ in range(steps):
        if pos + batch_size > num_rows:
            order = torch.randperm(num_rows, generator=generator)
            pos = 0
        yield order[pos : pos + batch_size]
        pos += batch_size


def make_optimizer(model: torch.nn.Module, lr: float) -> torch.optim.Optimizer:
    # No weight decay on norms (1-D tensors), the usual recipe for Llama-style models.
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=lr, betas=(0.9, 0.95))


def autocast():
    return torch.autocast("cpu", dtype=torch.bfloat16)


def train_target(model: LlamaForCausalLM, ids: torch.Tensor, labels: torch.Tensor, args: Args) -> list[float]:
    generator = torch.Generator().manual_seed(args.seed + 1)
    opt = make_optimizer(model, args.target_lr)
    model.train()
    losses = []
    bar = tqdm(batches(len(ids), args.batch_size, args.target_steps, generator), total=args.target_steps, desc="target", mininterval=5)
    for step, idx in enumerate(bar):
        for group in opt.param_groups:
            group["lr"] = lr_at(step, args.target_steps, args.target_lr, args.warmup_steps)
        with autocast():
            logits = model(input_ids=ids[idx]).logits
        loss = lm_loss(logits, labels[idx])
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
        bar.set_postfix(loss=f"{loss.item():.3f}")
    return losses


def train_draft(
    draft: LlamaForCausalLM, target: LlamaForCausalLM, ids: torch.Tensor, labels: torch.Tensor, args: Args
) -> tuple[list[float], list[float]]:
    generator = torch.Generator().manual_seed(args.seed + 2)
    opt = make_optimizer(draft, args.draft_lr)
    target.eval()
    draft.train()
    kls, ces = [], []
    bar = tqdm(batches(len(ids), args.batch_size, args.draft_steps, generator), total=args.draft_steps, desc="draft", mininterval=5)
    for step, idx in enumerate(bar):
        for group in opt.param_groups:
            group["lr"] = lr_at(step, args.draft_steps, args.draft_lr, args.warmup_steps)
        with torch.no_grad(), autocast():
            target_logits = target(input_ids=ids[idx]).logits
        with autocast():
            draft_logits = draft(input_ids=ids[idx]).logits
        kl, ce = distill_losses(target_logits, draft_logits, labels[idx])
        # Mostly imitate the target (what acceptance depends on); the small
        # LM term anchors the draft to the data early on, when the KL signal
        # of a random draft is noisy.
        loss = args.distill_weight * kl + (1.0 - args.distill_weight) * ce
        loss.backward()
        torch.nn.utils.clip_grad_norm_(draft.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        kls.append(kl.item())
        ces.append(ce.item())
        bar.set_postfix(kl=f"{kl.item():.3f}", ce=f"{ce.item():.3f}")
    return kls, ces


# ---------------------------------------------------------------------------
# Evaluation (float32, on the weights reloaded from disk)
# ---------------------------------------------------------------------------


@torch.no_grad()
def evaluate_text(target: LlamaForCausalLM, draft: LlamaForCausalLM, ids: torch.Tensor, labels: torch.Tensor) -> dict[str, float]:
    """Token-weighted LM losses, KL and sum_x min(p, q) on packed corpus text."""
    totals = Counter()
    for start in range(0, len(ids), 16):
        x, y = ids[start : start + 16], labels[start : start + 16]
        t_logits, flat_labels = shifted(target(input_ids=x).logits, y)
        d_logits, _ = shifted(draft(input_ids=x).logits, y)
        keep = flat_labels != IGNORE
        n = int(keep.sum())
        log_p = F.log_softmax(t_logits[keep], dim=-1)
        log_q = F.log_softmax(d_logits[keep], dim=-1)
        targets = flat_labels[keep]
        totals["tokens"] += n
        totals["target_lm"] += -log_p.gather(1, targets[:, None]).sum().item()
        totals["draft_lm"] += -log_q.gather(1, targets[:, None]).sum().item()
        totals["kl"] += (log_p.exp() * (log_p - log_q)).sum().item()
        totals["overlap"] += torch.minimum(log_p.exp(), log_q.exp()).sum().item()
    n = totals.pop("tokens")
    return {key: value / n for key, value in totals.items()} | {"tokens": n}


@torch.no_grad()
def sample_target(
    target: LlamaForCausalLM, prompts: torch.Tensor, new_tokens: int, temperature: float, eos_id: int, generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """Pure ancestral sampling from softmax(target_logits / T), with KV cache.

    Written out instead of ``generate()`` so that no default top-k/top-p
    filtering sneaks in: the acceptance measurement needs exact samples of p.
    Returns the full sequences and a mask of the sampled positions that count
    (up to and including the first ``</s>``).
    """
    out = target(input_ids=prompts, use_cache=True)
    cache, logits = out.cache, out.logits[:, -1]
    seqs, counted = [prompts], []
    alive = torch.ones(len(prompts), dtype=torch.bool)
    for _ in range(new_tokens):
        probs = torch.softmax(logits.float() / temperature, dim=-1)
        token = torch.multinomial(probs, 1, generator=generator)
        seqs.append(token)
        counted.append(alive.clone())
        alive &= token[:, 0] != eos_id
        if not alive.any():
            break
        out = target(input_ids=token, cache=cache, use_cache=True)
        cache, logits = out.cache, out.logits[:, -1]
    return torch.cat(seqs, dim=1), torch.stack(counted, dim=1)


@torch.no_grad()
def expected_acceptance(
    target: LlamaForCausalLM, draft: LlamaForCausalLM, seqs: torch.Tensor, counted: torch.Tensor, temperature: float
) -> float:
    """Mean of sum_x min(p_T(x), q_T(x)) over the sampled positions.

    This is the probability that modified rejection sampling accepts a draft
    token at that position (Leviathan et al., 2023; Chen et al., 2023),
    averaged over the target's own continuations.
    """
    prompt_len = seqs.shape[1] - counted.shape[1]
    # Position t's logits predict token t+1, so the distributions behind the
    # sampled tokens are at positions prompt_len-1 ... len-2.
    sl = slice(prompt_len - 1, seqs.shape[1] - 1)
    p = torch.softmax(target(input_ids=seqs).logits[:, sl].float() / temperature, dim=-1)
    q = torch.softmax(draft(input_ids=seqs).logits[:, sl].float() / temperature, dim=-1)
    overlap = torch.minimum(p, q).sum(-1)
    return (overlap[counted].sum() / counted.sum()).item()


@torch.no_grad()
def speculative_run(
    target: LlamaForCausalLM,
    draft: LlamaForCausalLM,
    prompt: list[int],
    k: int,
    temperature: float,
    new_tokens: int,
    eos_id: int,
    generator: torch.Generator,
) -> Counter:
    """One generation by modified rejection sampling; returns its counts.

    A direct, unoptimised implementation (full recompute at every step) used
    only to confirm the analytic acceptance figure empirically.
    """
    seq = list(prompt)
    stats = Counter()
    while stats["generated"] < new_tokens:
        proposal, q_rows = [], []
        for _ in range(k):
            logits = draft(input_ids=torch.tensor([seq + proposal])).logits[0, -1].float()
            q = torch.softmax(logits / temperature, dim=-1)
            proposal.append(int(torch.multinomial(q, 1, generator=generator)))
            q_rows.append(q)
            if proposal[-1] == eos_id:
                break  # nothing follows a finished document
        logits = target(input_ids=torch.tensor([seq + proposal])).logits[0, -len(proposal) - 1 :].float()
        p_rows = torch.softmax(logits / temperature, dim=-1)
        stats["target_calls"] += 1
        stats["proposed"] += len(proposal)
        # Each draft token that reaches the accept/reject test counts as
        # verified; the accepted fraction of those estimates sum min(p, q).
        emitted = []
        for token, p, q in zip(proposal, p_rows[: len(proposal)], q_rows, strict=True):
            stats["verified"] += 1
            if torch.rand((), generator=generator) < p[token] / q[token]:
                emitted.append(token)
                stats["accepted"] += 1
                continue
            # Rejected: the replacement comes from the residual max(p - q, 0).
            residual = torch.clamp(p - q, min=0.0)
            emitted.append(int(torch.multinomial(residual / residual.sum(), 1, generator=generator)))
            break
        else:
            if proposal[-1] != eos_id:
                # All drafts accepted: the target's next distribution comes for free.
                emitted.append(int(torch.multinomial(p_rows[len(proposal)], 1, generator=generator)))
        seq += emitted
        stats["generated"] += len(emitted)
        if eos_id in emitted:
            break
    return stats


# ---------------------------------------------------------------------------
# Driver
# ---------------------------------------------------------------------------

TARGET_SHAPE = {"hidden": 256, "layers": 8, "heads": 8, "intermediate": 688}
DRAFT_SHAPE = {"hidden": 192, "layers": 1, "heads": 6, "intermediate": 512}


def parse_args(argv: list[str] | None) -> Args:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True, help="output directory (the package's demo/pair)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--train-docs", type=int, default=40_000)
    parser.add_argument("--heldout-docs", type=int, default=500)
    parser.add_argument("--vocab-size", type=int, default=2048, help="upper bound; BPE stops when the corpus runs out of merges")
    # Step counts are sized so the whole run takes about 20-25 minutes on a
    # shared 2-core CPU (about 1.5-2.5 s per target step, 0.3-0.6 s per draft
    # step at one thread).  Small batches make the most of a short budget.
    parser.add_argument("--batch-size", type=int, default=8, help=f"rows of {SEQ_LEN} tokens per step")
    parser.add_argument("--target-steps", type=int, default=560)
    parser.add_argument("--target-lr", type=float, default=1.5e-3)
    parser.add_argument("--draft-steps", type=int, default=840)
    parser.add_argument("--draft-lr", type=float, default=2e-3)
    parser.add_argument("--distill-weight", type=float, default=0.8, help="weight of the KL term; the LM loss gets the rest")
    parser.add_argument("--warmup-steps", type=int, default=30)
    # One intra-op thread by default: on a 2-core machine shared with other
    # work, two threads stall on each other (measured 7-22 s per target step
    # against 2.3 s with one thread), and one thread also makes the float
    # reduction order independent of the machine's core count.
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads (at most 2 on the reference machine)")
    parser.add_argument("--accept-prompts", type=int, default=128, help="held-out prompts for the analytic acceptance")
    parser.add_argument("--accept-prompt-tokens", type=int, default=8)
    parser.add_argument("--accept-new-tokens", type=int, default=160)
    parser.add_argument("--spec-prompts", type=int, default=24, help="prompts for the empirical speculative run")
    parser.add_argument("--spec-k", type=int, default=4)
    return Args(**vars(parser.parse_args(argv)))


def unigram_cross_entropy(train_labels: torch.Tensor, heldout_labels: torch.Tensor, vocab: int) -> float:
    """Held-out cross-entropy (nats/token) of an add-one unigram model of the training tokens.

    The baseline a context-free model reaches; a learned LM must be far below it.
    """
    counts = torch.bincount(train_labels[train_labels != IGNORE], minlength=vocab).double() + 1.0
    log_probs = (counts / counts.sum()).log()
    return -log_probs[heldout_labels[heldout_labels != IGNORE]].mean().item()


def directory_size(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    random.seed(args.seed)
    torch.manual_seed(args.seed)
    out = args.out
    out.mkdir(parents=True, exist_ok=True)
    timings: dict[str, float] = {}
    started = time.perf_counter()

    # -- data and tokenizer --------------------------------------------------
    tick = time.perf_counter()
    train_docs = generate_corpus(args.train_docs, seed=args.seed)
    # A different seed gives a different stream of documents; exact repeats
    # of training documents (possible for the shortest templates) are dropped
    # so the held-out figures never score memorised text.
    seen = set(train_docs)
    heldout_docs = [doc for doc in generate_corpus(args.heldout_docs, seed=args.seed + 1000) if doc not in seen]
    tok_dir = out / "tokenizer"
    save_tokenizer(train_tokenizer(train_docs, args.vocab_size), tok_dir)
    # Continue with the tokenizer as reloaded from disk: what ships is what is measured.
    tokenizer = AutoTokenizer.from_pretrained(tok_dir, local_files_only=True)
    pad_id, bos_id, eos_id = tokenizer.pad_token_id, tokenizer.bos_token_id, tokenizer.eos_token_id
    train_seqs = encode_documents(tokenizer, train_docs)
    heldout_seqs = encode_documents(tokenizer, heldout_docs)
    train_ids, train_labels = pack_rows(train_seqs, pad_id, bos_id)
    heldout_ids, heldout_labels = pack_rows(heldout_seqs, pad_id, bos_id)
    unigram = unigram_cross_entropy(train_labels, heldout_labels, len(tokenizer))
    timings["data_and_tokenizer_s"] = time.perf_counter() - tick
    print(
        f"corpus: {len(train_docs)} train docs ({int((train_labels != IGNORE).sum())} predicted tokens, {len(train_ids)} rows), "
        f"{len(heldout_docs)} held-out docs; vocab {len(tokenizer)}; unigram held-out CE {unigram:.3f} nats"
    )

    # -- target ----------------------------------------------------------------
    torch.manual_seed(args.seed)
    target = LlamaForCausalLM(make_config(tokenizer, **TARGET_SHAPE))
    tick = time.perf_counter()
    target_losses = train_target(target, train_ids, train_labels, args)
    timings["target_training_s"] = time.perf_counter() - tick

    # -- draft -----------------------------------------------------------------
    torch.manual_seed(args.seed + 3)
    draft = LlamaForCausalLM(make_config(tokenizer, **DRAFT_SHAPE))
    tick = time.perf_counter()
    draft_kls, draft_ces = train_draft(draft, target, train_ids, train_labels, args)
    timings["draft_training_s"] = time.perf_counter() - tick

    # -- save in float16 (transformers 5 always writes safetensors) ------------
    params = {"target": count_params(target), "draft": count_params(draft)}
    for name, model in (("target", target), ("draft", draft)):
        model_dir = out / name
        model.half().save_pretrained(model_dir)
        # safetensors files are written owner-only (0600); make them readable
        # like the rest of the package data, or a system-wide install breaks.
        (model_dir / "model.safetensors").chmod(0o644)
        # Each model directory loads standalone with AutoTokenizer.
        for filename in TOKENIZER_FILES:
            shutil.copy(tok_dir / filename, model_dir / filename)

    # -- evaluate the shipped weights -------------------------------------------
    tick = time.perf_counter()

    def load(name: str) -> LlamaForCausalLM:
        return LlamaForCausalLM.from_pretrained(out / name, local_files_only=True, dtype=torch.float32).eval()

    target, draft = load("target"), load("draft")
    heldout = evaluate_text(target, draft, heldout_ids, heldout_labels)
    # The same number of rows from the training set, for a like-for-like train figure.
    train_eval = evaluate_text(target, draft, train_ids[: len(heldout_ids)], train_labels[: len(heldout_ids)])

    prompt_seqs = [seq[: args.accept_prompt_tokens] for seq in heldout_seqs[: args.accept_prompts]]
    acceptance = {}
    for temperature in (1.0, 0.7):
        generator = torch.Generator().manual_seed(args.seed + 10)
        seqs, counted = sample_target(target, torch.tensor(prompt_seqs), args.accept_new_tokens, temperature, eos_id, generator)
        alpha = expected_acceptance(target, draft, seqs, counted, temperature)
        spec = Counter()
        for prompt in tqdm(prompt_seqs[: args.spec_prompts], desc=f"speculative T={temperature}", mininterval=5):
            spec += speculative_run(target, draft, prompt, args.spec_k, temperature, args.accept_new_tokens, eos_id, generator)
        k = args.spec_k
        acceptance[f"{temperature:.1f}"] = {
            "expected_acceptance": alpha,
            "positions": int(counted.sum()),
            "sequences": len(prompt_seqs),
            # Under an i.i.d. acceptance model (Leviathan et al., 2023, eq. 1).
            "expected_tokens_per_target_call_k4": (1 - alpha ** (k + 1)) / (1 - alpha),
            "empirical_k": k,
            "empirical_sequences": len(prompt_seqs[: args.spec_prompts]),
            "empirical_proposed": spec["proposed"],
            "empirical_verified": spec["verified"],
            "empirical_accepted": spec["accepted"],
            "empirical_acceptance_rate": spec["accepted"] / spec["verified"],
            "empirical_accepted_per_proposed": spec["accepted"] / spec["proposed"],
            "empirical_tokens_per_target_call": spec["generated"] / spec["target_calls"],
        }
        print(f"T={temperature}: expected acceptance {alpha:.3f}; empirical K={k}: {acceptance[f'{temperature:.1f}']}")

    samples = {}
    generator = torch.Generator().manual_seed(args.seed + 20)
    for prompt in DEMO_PROMPTS:
        ids = tokenizer(prompt, return_tensors="pt")["input_ids"]
        seq, _ = sample_target(target, ids, args.accept_new_tokens, 0.7, eos_id, generator)
        samples[prompt] = tokenizer.decode(seq[0], skip_special_tokens=True)
    timings["evaluation_s"] = time.perf_counter() - tick
    timings["total_s"] = time.perf_counter() - started

    sizes = {name: directory_size(out / name) for name in ("tokenizer", "target", "draft")}
    metrics = {
        "command": "python -m specdec_ext.demo.train_pair " + " ".join(sys.argv[1:] if argv is None else argv),
        "args": {key: str(value) if isinstance(value, Path) else value for key, value in asdict(args).items()},
        "environment": {
            "python": platform.python_version(),
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "tokenizers": tokenizers.__version__,
            "threads": args.threads,
            "cpu": platform.processor() or platform.machine(),
        },
        "corpus": {
            "train_documents": len(train_docs),
            "heldout_documents": len(heldout_docs),
            "train_characters": sum(map(len, train_docs)),
            "train_tokens": int((train_labels != IGNORE).sum()),
            "heldout_tokens": heldout.pop("tokens"),
            "train_rows": len(train_ids),
            "seq_len": SEQ_LEN,
        },
        "tokenizer": {"vocab_size": len(tokenizer), "requested_vocab_size": args.vocab_size, "special_tokens": [PAD, BOS, EOS]},
        "target": {"shape": TARGET_SHAPE, "parameters": params["target"], "config": target.config.to_diff_dict()},
        "draft": {"shape": DRAFT_SHAPE, "parameters": params["draft"], "config": draft.config.to_diff_dict()},
        "training": {
            "batch_rows": args.batch_size,
            "batch_tokens": args.batch_size * SEQ_LEN,
            "target_steps": args.target_steps,
            "target_lr": args.target_lr,
            "draft_steps": args.draft_steps,
            "draft_lr": args.draft_lr,
            "distill_weight": args.distill_weight,
            "warmup_steps": args.warmup_steps,
            "target_train_loss_last50": sum(target_losses[-50:]) / len(target_losses[-50:]),
            "draft_train_kl_last50": sum(draft_kls[-50:]) / len(draft_kls[-50:]),
            "draft_train_lm_loss_last50": sum(draft_ces[-50:]) / len(draft_ces[-50:]),
        },
        "losses_nats_per_token": {
            "unigram_heldout_cross_entropy": unigram,
            "train": {key: value for key, value in train_eval.items() if key != "tokens"},
            "heldout": heldout,
        },
        "acceptance": acceptance,
        "timings_s": timings,
        "sizes_bytes": sizes | {"total": sum(sizes.values())},
        "samples_t0.7": samples,
    }
    (out / "metrics.json").write_text(json.dumps(metrics, indent=2) + "\n")
    (out / "TRAINING.md").write_text(render_report(metrics))
    print(f"done in {timings['total_s'] / 60:.1f} min; {sum(sizes.values()) / 1e6:.1f} MB in {out}")


def render_report(m: dict) -> str:
    """TRAINING.md: the human-readable record of one run of this script."""
    t, d, tr, c = m["target"], m["draft"], m["training"], m["corpus"]
    losses, timings = m["losses_nats_per_token"], m["timings_s"]
    held, train = losses["heldout"], losses["train"]

    def shape(s: dict) -> str:
        layers = f"{s['layers']} layer" + ("s" if s["layers"] != 1 else "")
        return f"{layers}, hidden {s['hidden']}, {s['heads']} heads, MLP {s['intermediate']}"

    lines = [
        "# Demo model pair: how it was trained",
        "",
        "Both models were trained from scratch on this machine by `specdec_ext/demo/train_pair.py`;",
        "nothing was downloaded. Everything below is written by that script from the run that produced",
        "the weights in this directory (all numbers are also in `metrics.json`).",
        "",
        "## Command",
        "",
        "```",
        m["command"],
        "```",
        "",
        f"Environment: Python {m['environment']['python']}, torch {m['environment']['torch']}, "
        f"transformers {m['environment']['transformers']}, tokenizers {m['environment']['tokenizers']}, "
        f"torch intra-op threads: {m['environment']['threads']}. Seeded; bit-exact reproduction also needs the same CPU kind "
        "and library versions (training matmuls run under bfloat16 autocast).",
        "",
        "## Data",
        "",
        f"- Corpus: `specdec_ext.demo.corpus.generate_corpus({m['args']['train_docs']}, seed={m['args']['seed']})`, "
        f"{c['train_documents']:,} synthetic financial-news documents, {c['train_characters']:,} characters, "
        f"{c['train_tokens']:,} predicted tokens.",
        f"- Held-out: `generate_corpus({m['args']['heldout_docs']}, seed={int(m['args']['seed']) + 1000})` minus exact "
        f"repeats of training documents: {c['heldout_documents']:,} documents, {c['heldout_tokens']:,} tokens.",
        f"- Each document is encoded as `<s> text </s>`; whole documents are packed into {c['train_rows']:,} rows of "
        f"{c['seq_len']} tokens (rows start at a document boundary, tails are padding with ignored labels).",
        f"- Tokenizer: byte-level BPE with digits split individually, {m['tokenizer']['vocab_size']:,} tokens "
        f"(requested at most {m['tokenizer']['requested_vocab_size']:,}; merges run out at the corpus' vocabulary), "
        "special tokens `<pad>`=0, `<s>`=1, `</s>`=2; encoding prepends `<s>`.",
        "",
        "## Models (`LlamaForCausalLM`, tied embeddings, max 256 positions, stored as float16 safetensors)",
        "",
        "| model | shape | parameters |",
        "|---|---|---|",
        f"| target | {shape(t['shape'])} | {t['parameters']:,} |",
        f"| draft | {shape(d['shape'])} | {d['parameters']:,} |",
        "",
        "## Training",
        "",
        f"- Batches of {tr['batch_rows']} rows x {c['seq_len']} tokens ({tr['batch_tokens']:,} token slots), AdamW "
        f"(betas 0.9/0.95, weight decay 0.1 on matrices), {tr['warmup_steps']} warm-up steps then cosine decay to 10% of "
        "the peak learning rate, gradient clipping at 1.0.",
        f"- Target: {tr['target_steps']} steps, peak lr {tr['target_lr']}, next-token cross-entropy. "
        f"Wall time {timings['target_training_s'] / 60:.1f} min.",
        f"- Draft: {tr['draft_steps']} steps, peak lr {tr['draft_lr']}, loss = {tr['distill_weight']} x KL(target || draft) "
        f"+ {1 - tr['distill_weight']:.1f} x cross-entropy, with the frozen target's next-token distributions computed "
        f"on the same batches. Wall time {timings['draft_training_s'] / 60:.1f} min.",
        f"- Data + tokenizer {timings['data_and_tokenizer_s']:.0f} s, evaluation {timings['evaluation_s'] / 60:.1f} min, "
        f"total {timings['total_s'] / 60:.1f} min.",
        "",
        "## Losses (nats per token)",
        "",
        'Measured in float32 on the float16 weights reloaded from this directory. "Train" is the same number of '
        "rows as the held-out set, taken from the training data; the last column is the training-loop average over "
        "the final 50 steps (bfloat16 autocast).",
        "",
        "| quantity | train | held-out | last 50 steps |",
        "|---|---|---|---|",
        f"| target LM loss | {train['target_lm']:.4f} | {held['target_lm']:.4f} | {tr['target_train_loss_last50']:.4f} |",
        f"| draft LM loss | {train['draft_lm']:.4f} | {held['draft_lm']:.4f} | {tr['draft_train_lm_loss_last50']:.4f} |",
        f"| KL(target \\|\\| draft) | {train['kl']:.4f} | {held['kl']:.4f} | {tr['draft_train_kl_last50']:.4f} |",
        f"| sum_x min(p, q) at T=1 | {train['overlap']:.4f} | {held['overlap']:.4f} | |",
        "",
        f"For scale: an add-one unigram model of the training tokens scores {losses['unigram_heldout_cross_entropy']:.4f} "
        "nats per token on the held-out text.",
        "",
        "## Acceptance of modified rejection sampling",
        "",
        "How it was measured, per temperature T:",
        "",
        f"1. Prompts: the first {m['args']['accept_prompt_tokens']} tokens (`<s>`, header, first words) of the first "
        f"{m['args']['accept_prompts']} held-out documents.",
        f"2. The target continues each prompt by pure ancestral sampling from softmax(logits / T) (no top-k/top-p), "
        f"for up to {m['args']['accept_new_tokens']} tokens or through `</s>`.",
        "3. At every sampled position (the prompt excluded, `</s>` included), p = softmax(target logits / T) and "
        "q = softmax(draft logits / T) given the same prefix; the acceptance probability of a draft token there is "
        "sum_x min(p(x), q(x)) (Leviathan et al., 2023; Chen et al., 2023). The figure is its mean over all positions.",
        f"4. Expected tokens per target call with K={m['args']['spec_k']} follow from the i.i.d. approximation (1 - a^(K+1)) / (1 - a).",
        f"5. Cross-check: actual modified-rejection-sampling generations with K={m['args']['spec_k']} from the first "
        f"{m['args']['spec_prompts']} prompts (same length limit). Every draft token that reaches the accept/reject test "
        "is *verified*; accepted / verified estimates the same acceptance probability (weighted towards the positions "
        "that were reached). Accepted / proposed also counts the drafts discarded after a rejection, so it is lower "
        "by construction; tokens per target call include the corrected or bonus token of each block.",
        "",
        "| T | positions | expected acceptance: mean sum min(p, q) | expected tokens / target call (K=4, i.i.d.) "
        "| empirical accepted / verified | empirical accepted / proposed | empirical tokens / target call |",
        "|---|---|---|---|---|---|---|",
    ]
    for temperature, a in m["acceptance"].items():
        lines.append(
            f"| {temperature} | {a['positions']:,} | {a['expected_acceptance']:.4f} | "
            f"{a['expected_tokens_per_target_call_k4']:.2f} | {a['empirical_acceptance_rate']:.4f} "
            f"({a['empirical_accepted']:,} / {a['empirical_verified']:,}) | {a['empirical_accepted_per_proposed']:.4f} "
            f"({a['empirical_accepted']:,} / {a['empirical_proposed']:,}) | {a['empirical_tokens_per_target_call']:.2f} |"
        )
    lines += [
        "",
        "## Files",
        "",
        "| directory | bytes |",
        "|---|---|",
    ]
    lines += [f"| `{name}/` | {size:,} |" for name, size in m["sizes_bytes"].items() if name != "total"]
    lines += [
        f"| total | {m['sizes_bytes']['total']:,} |",
        "",
        "`target/` and `draft/` each hold a copy of the tokenizer files, so either loads standalone with",
        "`AutoTokenizer.from_pretrained`.",
        "",
        "## Samples from the target (T=0.7, demo prompts)",
        "",
    ]
    for prompt, text in m["samples_t0.7"].items():
        lines += [f"- `{prompt}` -> {text}", ""]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
