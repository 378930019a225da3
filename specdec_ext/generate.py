"""Batched speculative generation with any pair of transformers causal LMs sharing a vocabulary.

One step, for every row still generating: the draft proposes K tokens (``specdec_ext.sample``), the
target scores the row's pending token and the K drafts in one forward, ``specdec_ext.verify`` accepts a
prefix of the drafts and emits one more token. Raw logits and the sampling parameters go straight to
the kernels; the loop reads back to the host once per step (how far each row got), never per token.

KV caches, and why they never serve stale entries. Each model keeps one DynamicCache whose slots are
shared by all rows, plus a (rows, slots) 0/1 mask of the slots that hold a live token of that row.
Every row feeds the same number of tokens per step, so the batch stays rectangular; a row that
rejects draft j turns the slots of draft j and after into holes: masked out for good, and never fed
again. Positions come from per-row token counts (``position_ids``), not from slot indices, so holes do
not shift them. The target's logits are recomputed every step from live slots only: scores and cache
entries conditioned on a rejected continuation are never read again. Slots past the longest row's
live end are cropped; holes are squeezed out (a per-row gather) once they outweigh the live slots; rows
that finish are dropped from the batch, so they stop costing work.
"""

from __future__ import annotations

import inspect
import time
from dataclasses import dataclass, field

import torch

from .api import sample, verify

#: ``num_draft_tokens="auto"`` chooses K in [1, AUTO_MAX_DRAFT_TOKENS], starting at AUTO_FIRST_DRAFT_TOKENS.
AUTO_MAX_DRAFT_TOKENS = 8
AUTO_FIRST_DRAFT_TOKENS = 4
#: Squeeze holes out of a cache once they exceed COMPACT_MIN_HOLES slots and COMPACT_HOLE_RATIO times
#: the longest row's live slots: one gather of the cache then saves attention work on every later step.
COMPACT_MIN_HOLES = 64
COMPACT_HOLE_RATIO = 0.5


@dataclass
class SpeculativeStats:
    """What a :func:`generate` call did. Counts cover every row; times cover the whole call.

    acceptance_per_position: entry k-1 is the rate at which draft k was accepted when it was verified
        (drafts before it all accepted and the row's budget covering it).
    mean_acceptance: accepted drafts / drafts judged (a rejection ends a row's judging for the step):
        the per-token acceptance rate ``a`` of Leviathan et al.
    mean_accepted_per_step: accepted drafts per row per step.
    tokens_per_target_forward: new tokens per row per verification forward (accepted drafts plus the
        corrected or bonus token, after cutting at EOS and ``max_new_tokens``).
    target_forwards / draft_forwards: model calls, each prefill included.
    draft_seconds / target_seconds / verify_seconds: time drafting (draft forwards and sampling), in the
        target's forwards, and verifying (the kernel, cutting at EOS, writing the tokens out). Each
        prefill counts to its model; the cache bookkeeping after the step's sync is in none of them.
        Measured with CUDA events on GPU (no extra syncs) and the wall clock on CPU.
    draft_lengths: K used at each step.
    """

    acceptance_per_position: list[float]
    mean_acceptance: float
    mean_accepted_per_step: float
    tokens_per_target_forward: float
    target_forwards: int
    draft_forwards: int
    draft_seconds: float
    target_seconds: float
    verify_seconds: float
    draft_lengths: list[int]


@dataclass
class SpeculativeOutput:
    """sequences: (B, L_in + max_new_tokens) int64, prompt as given, then new tokens, then padding after EOS."""

    sequences: torch.Tensor
    stats: SpeculativeStats


def expected_speedup(acceptance: float, cost_ratio: float, num_draft_tokens: int) -> float:
    """Leviathan et al. (2023): expected walltime improvement ``(1 - a^(K+1)) / ((1 - a)(K c + 1))``.

    ``a`` is the per-token acceptance rate, ``c`` the cost of one draft forward over one target forward.
    """
    a = min(max(acceptance, 0.0), 1.0 - 1e-6)
    k = num_draft_tokens
    return (1.0 - a ** (k + 1)) / ((1.0 - a) * (k * cost_ratio + 1.0))


def best_num_draft_tokens(acceptance: float, cost_ratio: float, max_draft_tokens: int = AUTO_MAX_DRAFT_TOKENS) -> int:
    """The K in [1, max_draft_tokens] with the largest :func:`expected_speedup` (smallest K on ties)."""
    return max(range(1, max_draft_tokens + 1), key=lambda k: (expected_speedup(acceptance, cost_ratio, k), -k))


class _DraftLength:
    """K for each step: fixed, or "auto" from the running acceptance rate and measured cost ratio.

    Both estimates decay (weight 0.8 per step) so K follows the text's drift; the first step's timing is
    skipped because it carries one-off start-up costs.
    """

    def __init__(self, num_draft_tokens):
        self.auto = num_draft_tokens == "auto"
        if not self.auto and (isinstance(num_draft_tokens, bool) or not isinstance(num_draft_tokens, int) or num_draft_tokens < 1):
            raise ValueError(f"num_draft_tokens must be an integer >= 1 or 'auto', got {num_draft_tokens!r}")
        self.fixed = num_draft_tokens
        self.accepted = self.judged = 0.0
        self.cost_ratio: float | None = None
        self.steps = 0

    def choose(self) -> int:
        if not self.auto:
            return self.fixed
        if self.cost_ratio is None:
            return AUTO_FIRST_DRAFT_TOKENS
        return best_num_draft_tokens((self.accepted + 1.0) / (self.judged + 2.0), self.cost_ratio)

    def update(self, accepted: int, judged: int, k: int, draft_seconds: float, target_seconds: float) -> None:
        self.steps += 1
        self.accepted = 0.8 * self.accepted + accepted
        self.judged = 0.8 * self.judged + judged
        if self.steps == 1 or k == 0 or target_seconds <= 0:
            return
        ratio = draft_seconds / k / target_seconds
        self.cost_ratio = ratio if self.cost_ratio is None else 0.8 * self.cost_ratio + 0.2 * ratio


class _Clock:
    """Phase timings. On CUDA, events read after the step's one sync; on CPU, the wall clock."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self.device = device

    def mark(self):
        if not self.cuda:
            return time.perf_counter()
        event = torch.cuda.Event(enable_timing=True)
        event.record(torch.cuda.current_stream(self.device))
        return event

    def spans(self, marks) -> list[float]:
        """Seconds between consecutive marks (called after a sync that covers them, so no wait)."""
        if self.cuda:
            marks[-1].synchronize()
            return [start.elapsed_time(end) / 1000.0 for start, end in zip(marks, marks[1:], strict=False)]
        return [end - start for start, end in zip(marks, marks[1:], strict=False)]


def new_cache(model):
    """An empty DynamicCache for ``model`` (the constructor's arguments differ across transformers 5.x)."""
    from transformers import DynamicCache

    if "config" in inspect.signature(DynamicCache.__init__).parameters:
        return DynamicCache(config=model.config)
    return DynamicCache()


class _Cache:
    """One model's KV cache and its (rows, slots) mask of live slots (see the module docstring)."""

    def __init__(self, model, input_ids: torch.Tensor, attention_mask: torch.Tensor):
        parameters = inspect.signature(model.forward).parameters
        if "position_ids" not in parameters:
            # Holes in the cache make slot index and position differ, so positions must be passed explicitly.
            raise ValueError(f"{type(model).__name__}.forward takes no position_ids, which speculative generation needs")
        self.model = model
        self.device = model.device
        self.cache_argument = "cache" if "cache" in parameters else "past_key_values"
        self.keeps_logits = "logits_to_keep" in parameters
        self.vocab_in = model.get_input_embeddings().num_embeddings
        # For sdpa and eager attention the 4-D mask is built here: from a 2-D mask with holes,
        # transformers would test on the host whether the mask is all ones, a sync per draft token.
        self.attention = getattr(model.config, "_attn_implementation", None)
        self.dtype = model.dtype
        self.cache = new_cache(model)
        self.forwards = 0
        self.slots = attention_mask[:, :0].to(self.device)
        positions = (attention_mask.cumsum(1) - 1).clamp(min=0)
        self.forward(input_ids, positions, attention_mask, logits_to_keep=1)
        if not getattr(self.cache, "is_croppable", True):
            raise ValueError(f"{type(model).__name__}: speculative decoding needs a KV cache that can be cropped (no recurrent or linear-attention layers)")
        # The last prompt token is fed again with the first drafts, which gives its logits there.
        self.drop_last(1)

    def forward(self, tokens, positions, live, logits_to_keep: int | None = None) -> torch.Tensor:
        """Run the model on (rows, W) new tokens appended after the cache; ``live`` masks them."""
        tokens = tokens.to(self.device)
        # A token the model cannot embed (an id only the larger target vocabulary has, or -1 from an
        # invalid row) is shown as id 0: only this model's proposals depend on it, never exactness.
        tokens = torch.where((tokens >= 0) & (tokens < self.vocab_in), tokens, 0)
        self.slots = torch.cat([self.slots, live.to(self.device, torch.long)], dim=1)
        kwargs = {self.cache_argument: self.cache}
        if logits_to_keep is not None and self.keeps_logits:
            kwargs["logits_to_keep"] = logits_to_keep
        output = self.model(input_ids=tokens, attention_mask=self._attention_mask(tokens.shape[1]), position_ids=positions.to(self.device),
                            use_cache=True, **kwargs)
        self.forwards += 1
        return output.logits

    def _attention_mask(self, width: int) -> torch.Tensor:
        """The 2-D live-slot mask, or for sdpa / eager the (rows, 1, W, slots) mask: new token i sees live slots up to its own."""
        if self.attention not in ("sdpa", "eager"):
            return self.slots
        slot = torch.arange(self.slots.shape[1], device=self.device)
        visible = (slot[None, :] <= slot[slot.shape[0] - width:, None])[None, None] & self.slots.bool()[:, None, None, :]
        if self.attention == "sdpa":
            # A query that sees nothing (padding in the prefill) would give NaN: let it see all, as transformers does.
            return visible | ~visible.any(-1, keepdim=True)
        return torch.zeros(visible.shape, dtype=self.dtype, device=self.device).masked_fill_(~visible, torch.finfo(self.dtype).min)

    def settle(self, live_tail: torch.Tensor) -> None:
        """Mark the last slots dead where their drafts were rejected: they are never attended again."""
        width = live_tail.shape[1]
        if width:
            self.slots[:, -width:] = live_tail.to(self.device, torch.long)

    def drop_last(self, count: int) -> None:
        if count > 0:  # crop(0) would mean "crop to length 0" in older transformers
            self.cache.crop(-count)
            self.slots = self.slots[:, :-count]

    def select_rows(self, index: torch.Tensor) -> None:
        index = index.to(self.device)
        self.cache.batch_select_indices(index)
        self.slots = self.slots[index]

    def squeeze_holes(self, max_live: int) -> None:
        """Gather every row's live slots to the right end, when holes outweigh them (``max_live``: the most any row has)."""
        total = self.slots.shape[1]
        holes = total - max_live
        if holes <= 0 or holes <= COMPACT_MIN_HOLES or holes <= COMPACT_HOLE_RATIO * max_live:
            return
        layers = getattr(self.cache, "layers", None)
        if not layers or not all(_plain_layer(layer, total) for layer in layers):
            return  # unknown cache layout: holes only cost attention work
        # A stable sort puts dead slots first and live ones last, each in slot order.
        keep = torch.sort(self.slots, dim=1, stable=True).indices[:, total - max_live:]
        self.slots = self.slots.gather(1, keep)
        index = keep[:, None, :, None]
        for layer in layers:
            layer.keys = torch.take_along_dim(layer.keys, index, dim=2)
            layer.values = torch.take_along_dim(layer.values, index, dim=2)


def _plain_layer(layer, total: int) -> bool:
    keys, values = getattr(layer, "keys", None), getattr(layer, "values", None)
    return (type(layer).__name__ == "DynamicLayer" and isinstance(keys, torch.Tensor) and isinstance(values, torch.Tensor)
            and keys.dim() == 4 and keys.shape[2] == total and values.shape[2] == total)


@dataclass
class _Rows:
    """The rows still generating. Device tensors unless marked host."""

    index: torch.Tensor  # (b,) row of the output
    pending: torch.Tensor  # (b,) last committed token: in neither cache yet
    length: torch.Tensor  # (b,) committed tokens without padding, pending included
    generated: torch.Tensor  # (b,) new tokens so far
    before: torch.Tensor  # (b,) the token before `pending` where `behind`
    behind: torch.Tensor  # (b,) bool: the draft cache lacks `before` too (the row accepted all K drafts)
    length_host: list[int] = field(default_factory=list)
    generated_host: list[int] = field(default_factory=list)
    any_behind: bool = False

    @classmethod
    def start(cls, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> _Rows:
        batch = input_ids.shape[0]
        length = attention_mask.sum(1)
        zeros = torch.zeros_like(length)
        return cls(torch.arange(batch, device=input_ids.device), input_ids[:, -1], length, zeros, input_ids[:, -1],
                   zeros.bool(), length.tolist(), [0] * batch)

    def select(self, index: torch.Tensor, keep: list[int]) -> None:
        for name in ("index", "pending", "length", "generated", "before", "behind"):
            setattr(self, name, getattr(self, name)[index])
        self.length_host = [self.length_host[b] for b in keep]
        self.generated_host = [self.generated_host[b] for b in keep]


@dataclass
class _Tally:
    """Host-side counts behind :class:`SpeculativeStats`."""

    reached: list[int] = field(default_factory=list)
    accepted_at: list[int] = field(default_factory=list)
    accepted: int = 0
    judged: int = 0
    emitted: int = 0
    row_steps: int = 0
    draft_lengths: list[int] = field(default_factory=list)
    seconds: list[float] = field(default_factory=lambda: [0.0, 0.0, 0.0])

    def add(self, k: int, accepted: list[int], emitted: list[int], judged: int, per_position: list[int], spans: list[float]) -> None:
        while len(self.reached) < k:
            self.reached.append(0)
            self.accepted_at.append(0)
        for position in range(k):
            self.reached[position] += per_position[position]
            self.accepted_at[position] += per_position[k + position]
        self.accepted += sum(accepted)
        self.judged += judged
        self.emitted += sum(emitted)
        self.row_steps += len(accepted)
        self.draft_lengths.append(k)
        self.seconds = [total + span for total, span in zip(self.seconds, spans, strict=True)]

    def stats(self, target: _Cache, draft: _Cache) -> SpeculativeStats:
        steps = max(self.row_steps, 1)
        return SpeculativeStats(
            acceptance_per_position=[a / r if r else float("nan") for a, r in zip(self.accepted_at, self.reached, strict=True)],
            mean_acceptance=self.accepted / self.judged if self.judged else float("nan"),
            mean_accepted_per_step=self.accepted / steps,
            tokens_per_target_forward=self.emitted / steps,
            target_forwards=target.forwards, draft_forwards=draft.forwards,
            draft_seconds=self.seconds[0], target_seconds=self.seconds[1], verify_seconds=self.seconds[2],
            draft_lengths=self.draft_lengths,
        )


@dataclass
class _Run:
    """What one generate() call fixes up front, and where it keeps its results."""

    sampling: dict  # temperature, top_k, top_p as sample() and verify() take them
    generator: torch.Generator | None
    eos: torch.Tensor | None
    sequences: torch.Tensor  # (B, L_in + max_new_tokens + 1): the last column is scratch
    prompt_width: int
    max_new_tokens: int
    lengths: _DraftLength
    clock: _Clock
    tally: _Tally


def _draft(draft: _Cache, rows: _Rows, k: int, sampling: dict, generator) -> tuple[torch.Tensor, torch.Tensor | None]:
    """K proposals per row, (b, K) on the rows' device, and the (b, K, Vd) raw logits they were drawn from."""
    if k == 0:
        return rows.pending[:, None][:, :0], None
    ones = torch.ones_like(rows.length)[:, None]
    if rows.any_behind:
        # A row that accepted every draft last step has a token the draft model never saw (its last
        # draft): feed it with the pending token, and a hole in that slot for the other rows.
        tokens = torch.stack([rows.before, rows.pending], 1)
        positions = torch.stack([rows.length - 2, rows.length - 1], 1).clamp(min=0)
        live = torch.cat([rows.behind.long()[:, None], ones], 1)
    else:
        tokens, positions, live = rows.pending[:, None], rows.length[:, None] - 1, ones
    proposals, logits = [], []
    for _ in range(k):
        last = draft.forward(tokens, positions, live)[:, -1]
        token = sample(last, generator=generator, check=False, **sampling)
        proposals.append(token)
        logits.append(last)
        tokens, positions, live = token[:, None], positions[:, -1:] + 1, ones
    device = rows.pending.device
    return torch.stack(proposals, 1).to(device), torch.stack(logits, 1).to(device)


def _verify_and_write(run: _Run, rows: _Rows, target_logits, draft_logits, drafts, budget):
    """Verify, cut each row's block at its first EOS, write it into the output; returns device tensors."""
    result = verify(target_logits, draft_logits, drafts, num_draft_tokens=budget, generator=run.generator, check=False, **run.sampling)
    accepted = result.num_accepted
    emitted = accepted + 1
    offsets = torch.arange(drafts.shape[1] + 1, device=drafts.device)[None, :]
    hit_eos = torch.zeros_like(accepted, dtype=torch.bool)
    if run.eos is not None:
        is_eos = torch.isin(result.tokens, run.eos) & (offsets < emitted[:, None])
        hit_eos = is_eos.any(1)
        emitted = torch.where(hit_eos, is_eos.long().argmax(1) + 1, emitted)
    inside = offsets < emitted[:, None]
    # Tokens past a row's end go to the scratch last column, so one index_put writes every row.
    columns = torch.where(inside, run.prompt_width + rows.generated[:, None] + offsets, run.sequences.shape[1] - 1)
    run.sequences.index_put_((rows.index[:, None].expand_as(columns), columns), result.tokens)
    return result.tokens, accepted, emitted, hit_eos


def _step_counts(accepted, budget, k):
    """Per-position reached / accepted counts and the number of drafts judged, on the device."""
    position = torch.arange(1, k + 1, device=accepted.device)[None, :]
    reached = (position <= budget[:, None]) & (accepted[:, None] >= position - 1)
    taken = accepted[:, None] >= position
    judged = (accepted + (accepted < budget).long()).sum()
    return torch.cat([reached.sum(0), taken.sum(0), judged[None]])


def _advance(target: _Cache, draft: _Cache, rows: _Rows, k: int, tokens, drafts, accepted, emitted, host, max_new_tokens) -> None:
    """Commit the step: new pending tokens, dead slots for rejected drafts, crops, finished rows out."""
    accepted_host, emitted_host, eos_host = host
    rows.pending = tokens.gather(1, accepted[:, None])[:, 0]
    if k:
        rows.before = drafts[:, -1]
    rows.behind = accepted == k
    rows.length = rows.length + emitted
    rows.generated = rows.generated + emitted
    rows.length_host = [n + e for n, e in zip(rows.length_host, emitted_host, strict=True)]
    rows.generated_host = [n + e for n, e in zip(rows.generated_host, emitted_host, strict=True)]
    keep = [b for b, g in enumerate(rows.generated_host) if not eos_host[b] and g < max_new_tokens]
    if not keep:
        rows.index = rows.index[:0]
        return
    # Target slots: the old pending token and drafts 1..a stay live; draft a+1 onwards are holes.
    target.settle(torch.arange(k + 1, device=accepted.device)[None, :] <= accepted[:, None])
    draft.settle(torch.arange(1, k, device=accepted.device)[None, :] <= accepted[:, None])
    most = max(accepted_host[b] for b in keep)
    target.drop_last(k - most)
    draft.drop_last(k - 1 - min(most, k - 1))
    rows.any_behind = any(accepted_host[b] == k for b in keep)
    if len(keep) < len(rows.generated_host):
        index = torch.tensor(keep, device=rows.index.device)
        target.select_rows(index)
        draft.select_rows(index)
        rows.select(index, keep)
    longest = max(rows.length_host) - 1  # live slots of the longest row (all committed tokens but the pending one)
    target.squeeze_holes(longest)
    draft.squeeze_holes(longest)


def generate(
    target_model,
    draft_model,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor | None = None,
    *,
    max_new_tokens: int,
    do_sample: bool = True,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    num_draft_tokens: int | str = 4,
    generator: torch.Generator | None = None,
    eos_token_id: int | list[int] | None = None,
    pad_token_id: int | None = None,
    tree=None,
    method: str = "token",
) -> SpeculativeOutput:
    """Speculative generation for a batch of left-padded prompts; exactly the target's sampling law.

    Args:
        target_model, draft_model: transformers causal LMs sharing a vocabulary: the draft's may be
            smaller (a target padded with extra ids), never larger (ValueError).
        input_ids: (B, L_in) prompts, left-padded. attention_mask: (B, L_in), 0 on padding; None = all ones.
        max_new_tokens: new tokens per row.
        do_sample: False = greedy (temperature 0; ``temperature``, ``top_k`` and ``top_p`` ignored).
        temperature, top_k, top_p: processing of both models' raw logits, as transformers' warpers
            apply it (temperature, then top-k, then top-p; None = off).
        num_draft_tokens: drafts per step K, or "auto": each step takes the K in [1, 8] that maximises
            Leviathan et al.'s expected speedup (1 - a^(K+1)) / ((1 - a)(K c + 1)), with a the running
            per-token acceptance rate and c the measured cost of a draft forward over a target forward
            (K = 4 until both are measured). Rows near ``max_new_tokens`` verify fewer drafts.
        generator: torch.Generator for every random draw (None = the default one).
        eos_token_id: an id or ids ending a row; None = the target's ``generation_config``; [] = none.
        pad_token_id: fills rows after their EOS; None = the ``generation_config``'s, else the first EOS.
        tree: None (a chain of drafts), children per node at each depth (e.g. (2, 2, 1)), or "auto":
            the draft expands a tree scored by the target in one forward (see :mod:`specdec_ext.tree_generate`).
        method: "token" or "block" (block verification of the chain, Sun et al.).

    Returns:
        SpeculativeOutput(sequences (B, L_in + max_new_tokens) int64, stats).

    Example:
        >>> out = specdec_ext.generate(target, draft, ids, mask, max_new_tokens=64, temperature=0.7)  # doctest: +SKIP
        >>> out.sequences.shape, out.stats.tokens_per_target_forward  # doctest: +SKIP
    """
    if tree is not None or method != "token":
        from .tree_generate import generate_tree

        return generate_tree(target_model, draft_model, input_ids, attention_mask, max_new_tokens=max_new_tokens, do_sample=do_sample,
                             temperature=temperature, top_k=top_k, top_p=top_p, tree=tree, method=method, num_draft_tokens=num_draft_tokens,
                             generator=generator, eos_token_id=eos_token_id, pad_token_id=pad_token_id)
    _check_models(target_model, draft_model)
    device = target_model.device
    input_ids, attention_mask = _check_inputs(input_ids, attention_mask, device)
    sampling = _sampling(do_sample, temperature, top_k, top_p)
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 0:
        raise ValueError(f"max_new_tokens must be an integer >= 0, got {max_new_tokens!r}")
    lengths = _DraftLength(num_draft_tokens)
    longest = input_ids.shape[1] + max_new_tokens * ((AUTO_MAX_DRAFT_TOKENS if lengths.auto else lengths.fixed) + 1)
    _check_attention_span(target_model, "target_model", longest)
    _check_attention_span(draft_model, "draft_model", longest)
    eos = _eos_ids(target_model, eos_token_id, device)
    pad = _pad_value(target_model, pad_token_id, eos)
    width = input_ids.shape[1]
    # One extra last column takes the writes that fall past a row's end (see _verify_and_write).
    sequences = torch.full((input_ids.shape[0], width + max_new_tokens + 1), pad, dtype=torch.long, device=device)
    sequences[:, :width] = input_ids
    run = _Run(sampling, generator, eos, sequences, width, max_new_tokens, lengths, _Clock(device), _Tally())
    with torch.no_grad():
        marks = [run.clock.mark()]
        target = _Cache(target_model, input_ids, attention_mask)
        marks.append(run.clock.mark())
        draft = _Cache(draft_model, input_ids, attention_mask)
        marks.append(run.clock.mark())
        rows = _Rows.start(input_ids, attention_mask)
        while max_new_tokens and rows.index.numel():
            _speculate(run, target, draft, rows)
        target_prefill, draft_prefill = run.clock.spans(marks)
    run.tally.seconds[0] += draft_prefill
    run.tally.seconds[1] += target_prefill
    return SpeculativeOutput(sequences[:, :-1].contiguous(), run.tally.stats(target, draft))


def _speculate(run: _Run, target: _Cache, draft: _Cache, rows: _Rows) -> None:
    """One step for every row still generating: draft, score, verify, commit. One host sync."""
    k = min(run.lengths.choose(), run.max_new_tokens - min(rows.generated_host) - 1)
    budget = (run.max_new_tokens - 1 - rows.generated).clamp(max=k)  # rows near the end verify fewer drafts
    marks = [run.clock.mark()]
    drafts, draft_logits = _draft(draft, rows, k, run.sampling, run.generator)
    marks.append(run.clock.mark())
    # Every row feeds its pending token and its K drafts: all live while scored, settled after verify.
    block = torch.cat([rows.pending[:, None], drafts], 1)
    positions = rows.length[:, None] - 1 + torch.arange(k + 1, device=block.device)
    target_logits = target.forward(block, positions, torch.ones_like(block))
    marks.append(run.clock.mark())
    greedy = run.sampling["temperature"] == 0  # greedy verification never reads the draft's logits
    tokens, accepted, emitted, hit_eos = _verify_and_write(run, rows, target_logits, None if greedy else draft_logits, drafts, budget)
    counts = _step_counts(accepted, budget, k)
    marks.append(run.clock.mark())
    b = accepted.shape[0]
    host = torch.cat([accepted, emitted, hit_eos.long(), (tokens[:, 0] < 0).long(), counts]).tolist()  # the step's one sync
    accepted_host, emitted_host, eos_host, invalid_host, counts_host = host[:b], host[b:2 * b], host[2 * b:3 * b], host[3 * b:4 * b], host[4 * b:]
    if any(invalid_host):
        row = int(rows.index[invalid_host.index(1)])
        raise ValueError(f"row {row}: the target or draft model produced NaN / +inf logits, or logits that are -inf everywhere")
    spans = run.clock.spans(marks)
    run.tally.add(k, accepted_host, emitted_host, counts_host[-1], counts_host[:-1], spans)
    run.lengths.update(sum(accepted_host), counts_host[-1], k, spans[0], spans[1])
    _advance(target, draft, rows, k, tokens, drafts, accepted, emitted, (accepted_host, emitted_host, eos_host), run.max_new_tokens)


def _output_vocab(model) -> int:
    head = model.get_output_embeddings() if callable(getattr(model, "get_output_embeddings", None)) else None
    weight = getattr(head, "weight", None)
    if isinstance(weight, torch.Tensor):
        return weight.shape[0]
    return model.config.get_text_config().vocab_size


def _check_models(target_model, draft_model) -> None:
    for name, model in (("target_model", target_model), ("draft_model", draft_model)):
        if getattr(model, "config", None) is None or not callable(getattr(model, "get_input_embeddings", None)):
            raise ValueError(f"{name} must be a transformers causal language model, got {type(model).__name__}")
        if getattr(model.config, "is_encoder_decoder", False):
            raise ValueError(f"{name} ({type(model).__name__}) is an encoder-decoder model; generate() takes decoder-only causal LMs")
    target_vocab, draft_vocab = _output_vocab(target_model), _output_vocab(draft_model)
    if draft_vocab > target_vocab:
        raise ValueError(
            f"the draft's vocabulary ({draft_vocab} ids) is larger than the target's ({target_vocab}): the models do not share a "
            "vocabulary. The draft's token ids must mean the same as the target's; only the target may have extra (padding) ids."
        )


def _check_inputs(input_ids, attention_mask, device) -> tuple[torch.Tensor, torch.Tensor]:
    if not isinstance(input_ids, torch.Tensor) or input_ids.dim() != 2 or input_ids.dtype not in (torch.int32, torch.int64) or 0 in input_ids.shape:
        raise ValueError(f"input_ids must be a non-empty (batch, length) integer tensor, got {getattr(input_ids, 'shape', type(input_ids).__name__)}")
    if attention_mask is None:
        attention_mask = torch.ones_like(input_ids)
    if not isinstance(attention_mask, torch.Tensor) or attention_mask.shape != input_ids.shape:
        raise ValueError(f"attention_mask must be a tensor shaped like input_ids {tuple(input_ids.shape)}")
    attention_mask = attention_mask.to(device=device, dtype=torch.long)
    if not bool((attention_mask[:, -1] == 1).all()):
        raise ValueError("prompts must be left-padded: the last column of attention_mask must be 1 in every row")
    return input_ids.to(device=device, dtype=torch.long), attention_mask


def _sampling(do_sample, temperature, top_k, top_p) -> dict:
    if not do_sample:
        return {"temperature": 0.0, "top_k": None, "top_p": None}
    from ._params import _check_scalar_params

    for name, value in (("temperature", temperature), ("top_k", top_k), ("top_p", top_p)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))):
            raise ValueError(f"{name} must be a number or None, got {value!r}")
    if top_k is not None and not isinstance(top_k, int):
        raise ValueError(f"top_k must be an integer or None, got {top_k!r}")
    _check_scalar_params(temperature, top_k, top_p)
    return {"temperature": float(temperature), "top_k": top_k, "top_p": top_p}


def _eos_ids(model, eos_token_id, device) -> torch.Tensor | None:
    if eos_token_id is None:
        eos_token_id = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    if eos_token_id is None:
        return None
    ids = eos_token_id.tolist() if isinstance(eos_token_id, torch.Tensor) else eos_token_id
    ids = [ids] if isinstance(ids, int) else list(ids)
    return torch.tensor(ids, dtype=torch.long, device=device) if ids else None


def _pad_value(model, pad_token_id, eos) -> int:
    if pad_token_id is None:
        pad_token_id = getattr(getattr(model, "generation_config", None), "pad_token_id", None)
    if pad_token_id is None:
        pad_token_id = int(eos[0]) if eos is not None else 0
    return int(pad_token_id)


def _check_attention_span(model, name: str, longest: int) -> None:
    """Refuse sliding-window attention that could slide: holes take cache slots, so windows would shrink."""
    config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    window = getattr(config, "sliding_window", None)
    layer_types = getattr(config, "layer_types", None)
    if layer_types is not None:
        sliding = any("sliding" in str(kind) for kind in layer_types)
    else:
        sliding = bool(getattr(config, "use_sliding_window", True))
    if window is not None and sliding and longest > window:
        raise ValueError(f"{name} uses sliding-window attention (window {window}), which this generator supports only while no "
                         f"sequence can outgrow the window; this call may use up to {longest} cache slots")
