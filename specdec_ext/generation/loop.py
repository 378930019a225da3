"""The generation loop shared by chains, trees and block verification.

One step, for every row still generating (the kind's step functions do the parts that differ):
choose the draft shape, draft, score (one target forward), verify; then, shared by every kind, cut
each row at its first EOS, write the tokens out, read back to the host once (how far each row got),
apply the stop criteria, tally, and commit: the caches keep the accepted entries, finished rows leave
the batch, holes are squeezed out. Raw logits and the sampling parameters go straight to the kernels;
the loop never reads back per token.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from ..processors import Context, LogitsPipeline
from ..stopping import Stopping
from .adaptive import ShapeChooser
from .cache import ModelCache
from .chain_steps import ChainSteps
from .inputs import check_attention_span, check_max_new_tokens, output_vocab
from .output import Recorder, SpeculativeOutput
from .rows import Rows
from .stats import Clock, Tally
from .tree_steps import TreeSteps


@dataclass
class Run:
    """What one generation call fixes up front, and where it keeps its results."""

    pipeline: LogitsPipeline
    stopping: Stopping
    chooser: ShapeChooser
    generator: torch.Generator | None
    seeds: torch.Tensor | None  # (B,) int64 per-row keys on the rows' device
    backend: str
    eos: torch.Tensor | None
    pad: int
    sequences: torch.Tensor  # (B, L_in + max_new_tokens + 1): the last column is scratch
    prompt_width: int
    max_new_tokens: int
    vocab: int  # the target's output vocabulary
    clock: Clock
    siblings: str = "without_replacement"
    streamer: object | None = None
    recorder: Recorder | None = None
    ngram: int = 0  # > 0: prompt-lookup drafting with this longest n-gram
    first_token: torch.Tensor | None = None  # (B,) first non-padding column of each prompt
    verify_device: torch.device | None = None
    tally: Tally = field(default_factory=Tally)
    new_tokens: list[int] = field(default_factory=list)
    context: Context | None = None  # the current step's prefixes, for processors
    processed: torch.Tensor | None = None  # the current step's processed target logits
    draft_samplers: dict = field(default_factory=dict)  # (batch, vocab, dtype, device) -> the draft draw's prepared Sampler

    @property
    def sampling(self) -> dict:
        return self.pipeline.kernel.as_kwargs()


def steps_for(tree, method: str, num_draft_tokens) -> tuple[ChainSteps | TreeSteps, ShapeChooser]:
    """The step functions and the shape chooser of a call: a chain (``tree`` None, or all ones with
    block verification) or a tree."""
    if method not in ("token", "block"):
        raise ValueError(f"method must be 'token' or 'block', got {method!r}")
    if tree is None:
        return ChainSteps(method), ShapeChooser.for_chain(num_draft_tokens)
    chooser = ShapeChooser.for_tree(tree)
    if method == "block":
        if chooser.auto or not chooser.fixed.is_chain:
            raise ValueError(f"method='block' verifies chains: give tree=None or (1, ..., 1), got tree={tree!r}")
        return ChainSteps(method), chooser
    return TreeSteps(), chooser


def speculate(target_model, draft_model, input_ids: torch.Tensor, attention_mask: torch.Tensor, *, pipeline: LogitsPipeline,
              stopping: Stopping, max_new_tokens: int, num_draft_tokens, ngram: int, generator, eos: torch.Tensor | None, pad: int,
              streamer=None, output_scores: bool = False, output_logits: bool = False, seeds: torch.Tensor | None = None,
              backend: str = "auto", tree=None, method: str = "token", siblings: str = "without_replacement") -> SpeculativeOutput:
    """The loop behind :func:`specdec_ext.generate` and the transformers hook, on checked inputs.

    ``pipeline`` and ``stopping`` carry every processor and criterion; ``draft_model`` None with
    ``ngram`` > 0 drafts by prompt lookup. ``tree`` / ``method`` / ``siblings``: as for generate().
    """
    check_max_new_tokens(max_new_tokens)
    if streamer is not None and input_ids.shape[0] != 1:
        raise ValueError(f"streamer supports batch size 1 (like transformers' TextStreamer), got batch size {input_ids.shape[0]}")
    kind, chooser = steps_for(tree, method, num_draft_tokens)
    if isinstance(kind, TreeSteps):
        # generate() names the argument; these guard direct callers.
        if draft_model is None:
            raise ValueError("tree generation needs a draft model")
        if seeds is not None:
            raise ValueError("seeds: tree drafts are drawn from generator (per-row keys cover chains and block verification)")
        if pipeline.needs_prefixes:
            raise ValueError("tree generation takes only logits processors that read the line alone (no per-prefix processors)")
    else:
        longest = input_ids.shape[1] + max_new_tokens * (chooser.deepest + 1)
        for name, model in (("target_model", target_model), ("draft_model", draft_model)):
            if model is not None:
                check_attention_span(model, name, longest)
    device = target_model.device
    width = input_ids.shape[1]
    batch = input_ids.shape[0]
    # One extra last column takes the writes that fall past a row's end (see _write).
    sequences = torch.full((batch, width + max_new_tokens + 1), pad, dtype=torch.long, device=device)
    sequences[:, :width] = input_ids
    recorder = Recorder(batch, output_scores, output_logits) if (output_scores or output_logits) else None
    run = Run(pipeline, stopping, chooser, generator, seeds, backend, eos, pad, sequences, width, max_new_tokens, output_vocab(target_model),
              Clock(device), siblings=siblings, streamer=streamer, recorder=recorder, ngram=ngram, first_token=(attention_mask == 0).sum(1),
              new_tokens=[0] * batch)
    draft = None
    with torch.no_grad():
        marks = [run.clock.mark()]
        target = ModelCache(target_model, "target_model", input_ids, attention_mask, tree_masks=kind.tree_masks)
        marks.append(run.clock.mark())
        if draft_model is not None:
            draft = ModelCache(draft_model, "draft_model", input_ids, attention_mask, tree_masks=kind.tree_masks)
        marks.append(run.clock.mark())
        run.verify_device = target.logits_device or _head_device(target_model)
        rows = Rows.start(input_ids, attention_mask)
        while max_new_tokens and rows.index.numel():
            _step(run, kind, target, draft, rows)
        target_prefill, draft_prefill = run.clock.spans(marks)
    if streamer is not None:
        streamer.end()
    run.tally.prefill_seconds = [draft_prefill, target_prefill]
    scores = logits = None
    if recorder is not None:
        scores = recorder.assemble(recorder.scores, pad, run.vocab, run.verify_device)
        logits = recorder.assemble(recorder.logits, pad, run.vocab, run.verify_device)
    return SpeculativeOutput(sequences[:, :-1].contiguous(), run.tally.stats(target, draft), run.new_tokens, scores, logits)


def _head_device(model) -> torch.device:
    """Where the model's logits are produced (a one-token prompt has no prefill that would tell)."""
    head = model.get_output_embeddings() if callable(getattr(model, "get_output_embeddings", None)) else None
    weight = getattr(head, "weight", None)
    return weight.device if isinstance(weight, torch.Tensor) else model.device


def _step(run: Run, kind, target: ModelCache, draft: ModelCache | None, rows: Rows) -> None:
    """One step for every row still generating: draft, score, verify, commit. One host sync."""
    started = time.perf_counter()
    # Rows near the end verify only the depths whose tokens they can still use.
    shape = run.chooser.choose().truncated(run.max_new_tokens - min(rows.generated_host) - 1)
    depth_budget = (run.max_new_tokens - 1 - rows.generated).clamp(max=shape.max_depth)
    run.context = None
    if not run.pipeline.empty:
        run.context = Context(run.sequences, rows.index, [run.prompt_width + g for g in rows.generated_host])
    marks = [run.clock.mark()]
    proposal = kind.draft(run, draft, rows, shape, depth_budget)
    marks.append(run.clock.mark())
    target_logits = kind.score(run, target, rows, shape, proposal)
    marks.append(run.clock.mark())
    verdict = kind.verify(run, rows, shape, proposal, target_logits)
    emitted, hit_eos = _write(run, rows, verdict)
    depth = torch.arange(shape.max_depth, device=emitted.device)[None, :]
    # Per depth: rows at a context with children within their budget, and rows that entered one.
    reached = (verdict.accepted[:, None] >= depth) & (depth < proposal.depth_budget.to(emitted.device)[:, None])
    entered = verdict.accepted[:, None] > depth
    parts = [verdict.accepted, emitted, hit_eos.long(), (verdict.tokens[:, 0] < 0).long(), reached.sum(0), entered.sum(0)]
    if verdict.estimate is not None:
        parts = [part.double() for part in parts] + verdict.estimate
    marks.append(run.clock.mark())
    b = emitted.shape[0]
    host = torch.cat(parts).tolist()  # the step's one sync
    estimate = None
    if verdict.estimate is not None:
        estimate, host = host[-2:], [int(value) for value in host[:-2]]
    accepted_host, emitted_host, finished_host, invalid_host = host[:b], host[b:2 * b], host[2 * b:3 * b], host[3 * b:4 * b]
    reached_host, entered_host = host[4 * b:4 * b + shape.max_depth], host[4 * b + shape.max_depth:]
    if any(invalid_host):
        row = rows.index_host[invalid_host.index(1)]
        raise ValueError(f"row {row}: the target or draft model produced NaN / +inf logits, or logits that are -inf everywhere")
    _apply_stops(run, rows, emitted_host, finished_host)
    spans = run.clock.spans(marks)
    run.tally.add(shape, accepted_host, emitted_host, reached_host, entered_host, spans)
    run.chooser.update(*(estimate or (sum(entered_host), sum(reached_host))), shape, spans[0], spans[1])
    for row, count in enumerate(emitted_host):
        run.new_tokens[rows.index_host[row]] += count
    if run.recorder is not None:
        run.recorder.add(run.pipeline, rows.index_host, emitted_host, verdict.contexts, run.processed, target_logits)
    if run.streamer is not None:
        run.streamer.put(verdict.tokens[:1, : emitted_host[0]].cpu())
    committing = time.perf_counter()
    _commit(run, kind, target, draft, rows, shape, proposal, verdict, emitted, accepted_host, emitted_host, finished_host)
    now = time.perf_counter()
    run.tally.commit_seconds += now - committing
    run.tally.step_seconds += now - started


def _write(run: Run, rows: Rows, verdict) -> tuple[torch.Tensor, torch.Tensor]:
    """Cut each row's tokens at its first EOS and write them into the output; (emitted (b,), hit_eos (b,))."""
    device = rows.index.device
    tokens = verdict.tokens
    emitted = verdict.accepted + 1
    offsets = torch.arange(tokens.shape[1], device=device)[None, :]
    hit_eos = torch.zeros_like(emitted, dtype=torch.bool)
    if run.eos is not None:
        is_eos = torch.isin(tokens, run.eos) & (offsets < emitted[:, None])
        hit_eos = is_eos.any(1)
        emitted = torch.where(hit_eos, is_eos.long().argmax(1) + 1, emitted)
    inside = offsets < emitted[:, None]
    # Tokens past a row's end go to the scratch last column, so one index_put writes every row.
    columns = torch.where(inside, run.prompt_width + rows.generated[:, None] + offsets, run.sequences.shape[1] - 1)
    run.sequences.index_put_((rows.index[:, None].expand_as(columns), columns), tokens)
    return emitted, hit_eos


def _apply_stops(run: Run, rows: Rows, emitted_host: list[int], finished_host: list[int]) -> None:
    """Stopping criteria on the tokens just written: cut each row at its first stop (host lists updated in place)."""
    stopping = run.stopping
    if stopping.per_token:
        start = [run.prompt_width + g for g in rows.generated_host]
        stops = stopping.first_stops(run.sequences, rows.index_host, start, emitted_host)
        for b, stop in enumerate(stops):
            if stop is None:
                continue
            if stop + 1 < emitted_host[b]:
                # Tokens after the stop were written: the row ends at the stop, padding after it.
                run.sequences[rows.index_host[b], start[b] + stop + 1: start[b] + emitted_host[b]] = run.pad
            emitted_host[b] = stop + 1
            finished_host[b] = 1
    if stopping.out_of_time():
        finished_host[:] = [1] * len(finished_host)


def _commit(run: Run, kind, target: ModelCache, draft: ModelCache | None, rows: Rows, shape, proposal, verdict, emitted: torch.Tensor,
            accepted_host: list[int], emitted_host: list[int], finished_host: list[int]) -> None:
    """The caches keep the accepted entries, the rows advance, finished rows leave the batch, holes are squeezed."""
    keep = [b for b, (g, e) in enumerate(zip(rows.generated_host, emitted_host, strict=True))
            if not finished_host[b] and g + e < run.max_new_tokens]
    if keep:
        kind.commit(target, draft, rows, shape, proposal, verdict, accepted_host, keep)
    final = verdict.tokens.gather(1, verdict.accepted[:, None])[:, 0]
    depth = shape.max_depth
    whole_host = [draft is not None and a == depth for a in accepted_host]
    rows.advance(final, emitted, emitted_host, verdict.last_draft, verdict.accepted == depth, whole_host)
    if len(keep) < len(accepted_host):
        index = rows.select(keep)
        if keep:
            target.select_rows(index)
            if draft is not None:
                draft.select_rows(index)
    if keep:
        target.squeeze(max(rows.length_host) - 1)  # live slots: every committed token but the pending one
        if draft is not None:
            draft.squeeze(max(n - u for n, u in zip(rows.length_host, rows.unfed_host, strict=True)))
