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

Logits processors (``processors.LogitsPipeline``) run on both models' logits at every draft position
with that position's prefix; stopping rules (``stopping.Stopping``) end a row at the exact token
that ends it, inside an accepted block. Drafts come from the draft model or, with
``draft="prompt_lookup"``, from n-gram lookup in each row's own tokens (``drafting``).
"""

from __future__ import annotations

import inspect
import math
import time
from dataclasses import dataclass, field

import torch

from . import _cpp_backend, _params
from ._philox import draw_base_key
from .api import _sample_args, sample, verify
from .drafting import prompt_lookup_drafts
from .processors import Context, LogitsPipeline, PresencePenaltyLogitsProcessor
from .stopping import Stopping

#: verify() / sample() take per-request keys (seeds, offsets) and report accept_probs (stream v2 of the
#: random-stream contract); checked once, so that the loop also runs on an API without them.
REQUEST_KEYS = all("seeds" in inspect.signature(fn).parameters and "offsets" in inspect.signature(fn).parameters for fn in (verify, sample))
ACCEPT_PROBS = "return_accept_probs" in inspect.signature(verify).parameters

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
    tokens_per_target_forward_stderr: standard error of ``tokens_per_target_forward`` (from the spread
        of the tokens each row emitted per step), to tell a difference between runs from noise.
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
    tokens_per_target_forward_stderr: float = float("nan")


@dataclass
class SpeculativeOutput:
    """What :func:`generate` returns.

    sequences: (B, L_in + max_new_tokens) int64: the prompt as given, the new tokens, then padding
        after a row's end (EOS, a stop criterion, ``max_time``).
    stats: :class:`SpeculativeStats`.
    new_tokens: tokens each row emitted (its EOS or stop token included).
    scores / logits: with ``output_scores`` / ``output_logits``, one (B, V) float32 tensor per new
        token as transformers defines them: the processed scores the token was drawn from (every
        processor and warper applied) and the raw target logits. A row that has ended gets a line
        putting all mass on the pad token (0 there, -inf elsewhere). Otherwise None.
    """

    sequences: torch.Tensor
    stats: SpeculativeStats
    new_tokens: list[int] = field(default_factory=list)
    scores: tuple[torch.Tensor, ...] | None = None
    logits: tuple[torch.Tensor, ...] | None = None


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

    def update(self, accepted: float, judged: float, k: int, draft_seconds: float, target_seconds: float) -> None:
        """``accepted`` / ``judged``: accepted drafts over drafts judged this step, or the sum of the judged
        drafts' acceptance probabilities min(1, p/q) over their count (the same mean, lower variance)."""
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
        # Host flag: some live-slot mask entry is 0 (prompt padding, or a rejected draft's hole). Without
        # holes, slot index equals position and the model's own causal masking is exact: no mask is built.
        self.holes = not bool(attention_mask.all())
        positions = (attention_mask.cumsum(1) - 1).clamp(min=0)
        self.forward(input_ids, positions, attention_mask, logits_to_keep=1)
        if not getattr(self.cache, "is_croppable", True):
            raise ValueError(f"{type(model).__name__}: speculative decoding needs a KV cache that can be cropped (no recurrent or linear-attention layers)")
        # The last prompt token is fed again with the first drafts, which gives its logits there.
        self.drop_last(1)

    def forward(self, tokens, positions, live, logits_to_keep: int | None = None, all_live: bool = True) -> torch.Tensor:
        """Run the model on (rows, W) new tokens appended after the cache; ``live`` masks them (``all_live``: it is all ones)."""
        tokens = tokens.to(self.device)
        # A token the model cannot embed (an id only the larger target vocabulary has, or -1 from an
        # invalid row) is shown as id 0: only this model's proposals depend on it, never exactness.
        tokens = torch.where((tokens >= 0) & (tokens < self.vocab_in), tokens, 0)
        self.slots = torch.cat([self.slots, live.to(self.device, torch.long)], dim=1)
        self.holes = self.holes or not all_live
        kwargs = {self.cache_argument: self.cache}
        if logits_to_keep is not None and self.keeps_logits:
            kwargs["logits_to_keep"] = logits_to_keep
        output = self.model(input_ids=tokens, attention_mask=self._attention_mask(tokens.shape[1]), position_ids=positions.to(self.device),
                            use_cache=True, **kwargs)
        self.forwards += 1
        self.logits_device = output.logits.device
        return output.logits

    def _attention_mask(self, width: int) -> torch.Tensor:
        """The 2-D live-slot mask, or for sdpa / eager the (rows, 1, W, slots) mask: new token i sees live slots up to its own.

        None while no slot is a hole: the model's causal mask is then the same, and cheaper.
        """
        if not self.holes:
            return None
        if self.attention not in ("sdpa", "eager"):
            return self.slots
        slot = torch.arange(self.slots.shape[1], device=self.device)
        visible = (slot[None, :] <= slot[slot.shape[0] - width:, None])[None, None] & self.slots.bool()[:, None, None, :]
        if self.attention == "sdpa":
            # A query that sees nothing (padding in the prefill) would give NaN: let it see all, as transformers does.
            return visible | ~visible.any(-1, keepdim=True)
        return torch.zeros(visible.shape, dtype=self.dtype, device=self.device).masked_fill_(~visible, torch.finfo(self.dtype).min)

    def settle(self, live_tail: torch.Tensor, all_live: bool = False) -> None:
        """Mark the last slots dead where their drafts were rejected: they are never attended again.

        ``all_live``: the caller knows every slot that survives its next crop is live.
        """
        width = live_tail.shape[1]
        if width:
            self.slots[:, -width:] = live_tail.to(self.device, torch.long)
            self.holes = self.holes or not all_live

    def drop_last(self, count: int) -> None:
        if count > 0:  # crop(0) would mean "crop to length 0" in older transformers
            self.cache.crop(-count)
            self.slots = self.slots[:, :-count]

    def select_rows(self, index: torch.Tensor) -> None:
        index = index.to(self.device)
        self.cache.batch_select_indices(index)
        self.slots = self.slots[index]
        if self.holes:
            self.holes = not bool(self.slots.all())

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
        self.holes = not bool(self.slots.all())


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
    index_host: list[int] = field(default_factory=list)
    any_behind: bool = False
    all_behind: bool = False

    @classmethod
    def start(cls, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> _Rows:
        batch = input_ids.shape[0]
        length = attention_mask.sum(1)
        zeros = torch.zeros_like(length)
        return cls(torch.arange(batch, device=input_ids.device), input_ids[:, -1], length, zeros, input_ids[:, -1],
                   zeros.bool(), length.tolist(), [0] * batch, list(range(batch)))

    def select(self, index: torch.Tensor, keep: list[int]) -> None:
        for name in ("index", "pending", "length", "generated", "before", "behind"):
            setattr(self, name, getattr(self, name)[index])
        self.length_host = [self.length_host[b] for b in keep]
        self.generated_host = [self.generated_host[b] for b in keep]
        self.index_host = [self.index_host[b] for b in keep]


def stderr_of_mean(total: float, squares: float, count: int) -> float:
    """Standard error of a mean from the sum and the sum of squares of ``count`` values."""
    if count < 2:
        return float("nan")
    mean = total / count
    variance = max(squares / count - mean * mean, 0.0) * count / (count - 1)
    return (variance / count) ** 0.5


@dataclass
class _Tally:
    """Host-side counts behind :class:`SpeculativeStats`."""

    reached: list[int] = field(default_factory=list)
    accepted_at: list[int] = field(default_factory=list)
    accepted: int = 0
    judged: int = 0
    emitted: int = 0
    emitted_squares: int = 0
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
        self.emitted_squares += sum(e * e for e in emitted)
        self.row_steps += len(accepted)
        self.draft_lengths.append(k)
        self.seconds = [total + span for total, span in zip(self.seconds, spans, strict=True)]

    def stats(self, target: _Cache, draft: _Cache | None) -> SpeculativeStats:
        steps = max(self.row_steps, 1)
        return SpeculativeStats(
            acceptance_per_position=[a / r if r else float("nan") for a, r in zip(self.accepted_at, self.reached, strict=True)],
            mean_acceptance=self.accepted / self.judged if self.judged else float("nan"),
            mean_accepted_per_step=self.accepted / steps,
            tokens_per_target_forward=self.emitted / steps,
            target_forwards=target.forwards, draft_forwards=draft.forwards if draft is not None else 0,
            draft_seconds=self.seconds[0], target_seconds=self.seconds[1], verify_seconds=self.seconds[2],
            draft_lengths=self.draft_lengths, tokens_per_target_forward_stderr=stderr_of_mean(self.emitted, self.emitted_squares, self.row_steps),
        )


class _Recorder:
    """Collects ``scores`` / ``logits`` lines of the emitted tokens, row by row (host lists of device tensors)."""

    def __init__(self, batch: int, scores: bool, logits: bool):
        self.scores = [[] for _ in range(batch)] if scores else None
        self.logits = [[] for _ in range(batch)] if logits else None

    def add(self, pipeline: LogitsPipeline, index: list[int], emitted: list[int], processed, raw) -> None:
        rows = [b for b, e in enumerate(emitted) for _ in range(e)]
        positions = [j for e in emitted for j in range(e)]
        if not rows:
            return
        rows_t = torch.tensor(rows, device=raw.device)
        positions_t = torch.tensor(positions, device=raw.device)
        for store, lines in ((self.scores, lambda: pipeline.reported_scores(processed[rows_t, positions_t].float())),
                             (self.logits, lambda: raw[rows_t, positions_t].float())):
            if store is None:
                continue
            values = lines()
            at = 0
            for b, e in enumerate(emitted):
                store[index[b]].extend(values[at: at + e].unbind(0))
                at += e

    def assemble(self, store, pad: int, vocab: int, device) -> tuple[torch.Tensor, ...] | None:
        if store is None:
            return None
        steps = max((len(lines) for lines in store), default=0)
        ended = torch.full((vocab,), float("-inf"), device=device)
        ended[min(max(pad, 0), vocab - 1)] = 0.0
        return tuple(torch.stack([lines[t] if t < len(lines) else ended for lines in store]) for t in range(steps))


@dataclass
class _Run:
    """What one generation call fixes up front, and where it keeps its results."""

    pipeline: LogitsPipeline
    generator: torch.Generator | None
    eos: torch.Tensor | None
    pad: int
    sequences: torch.Tensor  # (B, L_in + max_new_tokens + 1): the last column is scratch
    prompt_width: int
    max_new_tokens: int
    lengths: _DraftLength
    clock: _Clock
    tally: _Tally
    stopping: Stopping
    vocab: int  # the target's output vocabulary
    streamer: object | None = None
    recorder: _Recorder | None = None
    ngram: int = 0  # > 0: prompt-lookup drafting with this longest n-gram
    first_token: torch.Tensor | None = None  # (B,) first non-padding column of each prompt
    verify_device: torch.device | None = None
    new_tokens: list[int] = field(default_factory=list)
    context: Context | None = None  # the current step's prefixes, for processors
    processed: torch.Tensor | None = None  # the current step's processed target logits
    seeds: torch.Tensor | None = None  # (B,) int64 per-row keys on the rows' device
    draft_keys: dict = field(default_factory=dict)  # the current draft draw's seeds / offsets
    draft_rows: dict = field(default_factory=dict)  # batch -> the draft draw's (temperature, top_k, top_p) rows
    accept_probs: torch.Tensor | None = None  # the current step's min(1, p/q) of judged drafts (adaptive K)
    backend: str = "auto"

    @property
    def sampling(self) -> dict:
        return self.pipeline.kernel.as_kwargs()


def _pad_vocab(logits: torch.Tensor, vocab: int) -> torch.Tensor:
    """A draft line over the target's vocabulary: ids only the target has get -inf (q = 0 there)."""
    if logits.shape[-1] >= vocab:
        return logits
    return torch.nn.functional.pad(logits, (0, vocab - logits.shape[-1]), value=float("-inf"))


def _draft(draft: _Cache, rows: _Rows, k: int, run: _Run, context: Context | None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """K proposals per row, (b, K) on the verification device, and the (b, K, V) processed logits they were drawn from."""
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
    all_live = not rows.any_behind or rows.all_behind
    pipeline = run.pipeline
    proposals, logits = [], []
    if context is not None:
        context.drafts = torch.zeros((rows.pending.shape[0], k), dtype=torch.long, device=draft.device)
    if run.seeds is not None:
        row_seeds, row_offsets = run.seeds[rows.index].to(draft.device), rows.generated.to(draft.device)
    for i in range(k):
        if run.seeds is not None:
            # Draft i of a row sits at its absolute position generated + i: the same number decides it in
            # any batch (sample() races on its own stream, so it never shares noise with verify()).
            run.draft_keys = {"seeds": row_seeds, "offsets": row_offsets + i}
        raw = draft.forward(tokens, positions, live, all_live=all_live)[:, -1]
        last = raw
        if not pipeline.empty:
            # q at draft position i is processed with that position's prefix, exactly as p will be.
            last = pipeline.apply(_pad_vocab(raw, run.vocab)[:, None], context, i)[:, 0]
        token = _draw_draft(raw, last, run)
        if context is not None:
            context.drafts[:, i] = token
        proposals.append(token)
        logits.append(last)
        tokens, positions, live, all_live = token[:, None], positions[:, -1:] + 1, ones, True
    drafts = _to_verify_device(torch.stack(proposals, 1), run)
    if context is not None:
        context.drafts = drafts
    return drafts, _to_verify_device(torch.stack(logits, 1), run)


def _to_verify_device(tensor: torch.Tensor, run: _Run) -> torch.Tensor:
    """The step's one transfer of the draft's block (its K proposals, its (b, K, V) logits) to where the
    target's logits are and verification runs: a draft on another device than the target's last layer
    (e.g. a target split by accelerate's device_map) costs one copy per step, not one per token."""
    return tensor.to(run.verify_device, non_blocking=True)


def _draw_draft(raw: torch.Tensor, processed: torch.Tensor, run: _Run) -> torch.Tensor:
    """One draft per row from the processed draft line: verify() is told q = this line's distribution."""
    if _direct_draw(processed, run):
        # sample() as it runs on the C++ backend, without re-validating the loop's own parameters each
        # token (on a CPU that validation cost as much as the draw): the same key from the same
        # generator, the same kernel and stream, so the same tokens.
        batch = processed.shape[0]
        rows = run.draft_rows.get(batch)
        if rows is None:
            args = _sample_args(processed, generator=None, check=False, **run.sampling)
            rows = run.draft_rows[batch] = (args.temperature, args.top_k, args.top_p)
        return _cpp_backend._C.sample(processed, *rows, None, None, draw_base_key(run.generator))
    return sample(processed, generator=run.generator, check=False, backend=run.backend, **run.draft_keys, **run.sampling)


def _direct_draw(processed: torch.Tensor, run: _Run) -> bool:
    """Whether the draft draw can call the C++ kernel directly: CPU logits of a kernel dtype, no per-row
    keys, a CPU generator (or none), eager execution."""
    return (not run.draft_keys and run.backend in ("auto", "cpp") and processed.is_cpu and processed.dtype in _params.LOGIT_DTYPES
            and (run.generator is None or run.generator.device.type == "cpu") and _cpp_backend.is_available() and not torch.compiler.is_compiling())


def _verify_and_write(run: _Run, rows: _Rows, target_logits, draft_logits, drafts, budget):
    """Process the target's logits, verify, cut each row's block at its first EOS, write it into the output."""
    processed = target_logits if run.pipeline.empty else run.pipeline.apply(target_logits, run.context, 0)
    run.processed = processed
    extra = {}
    if run.seeds is not None:
        extra = {"seeds": run.seeds[rows.index].to(processed.device), "offsets": rows.generated.to(processed.device)}
    if ACCEPT_PROBS and run.lengths.auto and draft_logits is not None:
        extra["return_accept_probs"] = True
    if run.backend != "auto":
        extra["backend"] = run.backend
    result = verify(processed, draft_logits, drafts, num_draft_tokens=budget.to(processed.device), generator=run.generator, check=False,
                    **extra, **run.sampling)
    run.accept_probs = getattr(result, "accept_probs", None) if extra.get("return_accept_probs") else None
    device = rows.index.device
    tokens = result.tokens.to(device)
    accepted = result.num_accepted.to(device)
    emitted = accepted + 1
    offsets = torch.arange(drafts.shape[1] + 1, device=device)[None, :]
    hit_eos = torch.zeros_like(accepted, dtype=torch.bool)
    if run.eos is not None:
        is_eos = torch.isin(tokens, run.eos) & (offsets < emitted[:, None])
        hit_eos = is_eos.any(1)
        emitted = torch.where(hit_eos, is_eos.long().argmax(1) + 1, emitted)
    inside = offsets < emitted[:, None]
    # Tokens past a row's end go to the scratch last column, so one index_put writes every row.
    columns = torch.where(inside, run.prompt_width + rows.generated[:, None] + offsets, run.sequences.shape[1] - 1)
    run.sequences.index_put_((rows.index[:, None].expand_as(columns), columns), tokens)
    return tokens, accepted, emitted, hit_eos


def _step_counts(accepted, budget, k):
    """Per-position reached / accepted counts and the number of drafts judged, on the device."""
    position = torch.arange(1, k + 1, device=accepted.device)[None, :]
    reached = (position <= budget[:, None]) & (accepted[:, None] >= position - 1)
    taken = accepted[:, None] >= position
    judged = (accepted + (accepted < budget).long()).sum()
    return torch.cat([reached.sum(0), taken.sum(0), judged[None]])


def _advance(target: _Cache, draft: _Cache | None, rows: _Rows, k: int, tokens, drafts, accepted, emitted, host, max_new_tokens) -> None:
    """Commit the step: new pending tokens, dead slots for rejected drafts, crops, finished rows out."""
    accepted_host, emitted_host, finished_host = host
    rows.pending = tokens.gather(1, accepted[:, None])[:, 0]
    if k:
        rows.before = drafts[:, -1].to(rows.pending.device)
    rows.behind = accepted == k
    rows.length = rows.length + emitted
    rows.generated = rows.generated + emitted
    rows.length_host = [n + e for n, e in zip(rows.length_host, emitted_host, strict=True)]
    rows.generated_host = [n + e for n, e in zip(rows.generated_host, emitted_host, strict=True)]
    keep = [b for b, g in enumerate(rows.generated_host) if not finished_host[b] and g < max_new_tokens]
    if not keep:
        rows.index = rows.index[:0]
        rows.index_host = []
        return
    # Target slots: the old pending token and drafts 1..a stay live; draft a+1 onwards are holes.
    most = max(accepted_host[b] for b in keep)
    uniform = all(accepted_host[b] == most for b in keep)  # then the crops below leave no hole in kept rows
    target.settle(torch.arange(k + 1, device=accepted.device)[None, :] <= accepted[:, None], all_live=uniform)
    target.drop_last(k - most)
    if draft is not None:
        draft.settle(torch.arange(1, k, device=accepted.device)[None, :] <= accepted[:, None],
                     all_live=len({min(accepted_host[b], k - 1) for b in keep}) == 1)
        draft.drop_last(k - 1 - min(most, k - 1))
    rows.any_behind = draft is not None and any(accepted_host[b] == k for b in keep)
    rows.all_behind = rows.any_behind and all(accepted_host[b] == k for b in keep)
    if len(keep) < len(rows.generated_host):
        index = torch.tensor(keep, device=rows.index.device)
        target.select_rows(index)
        if draft is not None:
            draft.select_rows(index)
        rows.select(index, keep)
    longest = max(rows.length_host) - 1  # live slots of the longest row (all committed tokens but the pending one)
    target.squeeze_holes(longest)
    if draft is not None:
        draft.squeeze_holes(longest)


def processor_list(*, do_sample: bool, temperature: float, top_k: int | None, top_p: float | None, min_p: float | None = None,
                   repetition_penalty: float | None = None, presence_penalty: float | None = None, frequency_penalty: float | None = None,
                   no_repeat_ngram_size: int | None = None, bad_words_ids=None, sequence_bias=None, suppress_tokens=None,
                   min_new_tokens: int | None = None, eos: torch.Tensor | None = None, prompt_width: int = 0,
                   prompt_padding: torch.Tensor | None = None, logits_processor=None) -> list:
    """transformers' processor objects for these arguments, in the order its generate() builds them."""
    from transformers.generation import logits_process as lp

    processors = []
    if sequence_bias is not None:
        processors.append(lp.SequenceBiasLogitsProcessor(sequence_bias=sequence_bias))
    if repetition_penalty is not None and repetition_penalty != 1.0:
        if isinstance(repetition_penalty, bool) or not isinstance(repetition_penalty, (int, float)) or not repetition_penalty > 0 \
                or not math.isfinite(repetition_penalty):
            raise ValueError(f"repetition_penalty must be a finite number > 0, got {repetition_penalty!r}")
        processor = lp.RepetitionPenaltyLogitsProcessor(float(repetition_penalty))
        # Prompt padding is not context (transformers >= 5.24 ignores it the same way).
        processor.prompt_ignore_length = prompt_padding
        processors.append(processor)
    if presence_penalty or frequency_penalty:
        processors.append(PresencePenaltyLogitsProcessor(presence_penalty or 0.0, frequency_penalty or 0.0, prompt_length=prompt_width))
    if no_repeat_ngram_size:
        processors.append(lp.NoRepeatNGramLogitsProcessor(no_repeat_ngram_size))
    if bad_words_ids is not None:
        processors.append(lp.NoBadWordsLogitsProcessor(bad_words_ids, eos))
    if min_new_tokens and eos is not None:
        if isinstance(min_new_tokens, bool) or not isinstance(min_new_tokens, int) or min_new_tokens < 0:
            raise ValueError(f"min_new_tokens must be an integer >= 0, got {min_new_tokens!r}")
        processors.append(lp.MinNewTokensLengthLogitsProcessor(prompt_width, min_new_tokens, eos))
    if suppress_tokens is not None:
        processors.append(lp.SuppressTokensLogitsProcessor(suppress_tokens))
    processors += list(logits_processor or [])
    if do_sample:
        if temperature != 1.0:
            processors.append(lp.TemperatureLogitsWarper(temperature))
        if top_k:
            processors.append(lp.TopKLogitsWarper(top_k))
        if top_p is not None and top_p < 1.0:
            processors.append(lp.TopPLogitsWarper(top_p))
        if min_p is not None:
            if isinstance(min_p, bool) or not isinstance(min_p, (int, float)) or not 0 <= min_p <= 1:
                raise ValueError(f"min_p must be a number in [0, 1], got {min_p!r}")
            processors.append(lp.MinPLogitsWarper(float(min_p)))
    return processors


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
    min_p: float | None = None,
    repetition_penalty: float | None = None,
    presence_penalty: float | None = None,
    frequency_penalty: float | None = None,
    no_repeat_ngram_size: int | None = None,
    bad_words_ids: list[list[int]] | None = None,
    sequence_bias: list | dict | None = None,
    suppress_tokens: list[int] | None = None,
    min_new_tokens: int | None = None,
    logits_processor=None,
    stopping_criteria=None,
    stop_strings: str | list[str] | None = None,
    tokenizer=None,
    max_time: float | None = None,
    streamer=None,
    output_scores: bool = False,
    output_logits: bool = False,
    num_draft_tokens: int | str = 4,
    draft: str = "model",
    ngram: int = 3,
    generator: torch.Generator | None = None,
    seeds: torch.Tensor | list[int] | None = None,
    eos_token_id: int | list[int] | None = None,
    pad_token_id: int | None = None,
    backend: str = "auto",
    tree=None,
    method: str = "token",
) -> SpeculativeOutput:
    """Speculative generation for a batch of left-padded prompts; exactly the target's sampling law.

    Args:
        target_model, draft_model: transformers causal LMs sharing a vocabulary: the draft's may be
            smaller (a target padded with extra ids), never larger (ValueError). ``draft_model`` may
            be None with ``draft="prompt_lookup"``.
        input_ids: (B, L_in) prompts, left-padded. attention_mask: (B, L_in), 0 on padding; None = all ones.
        max_new_tokens: new tokens per row.
        do_sample: False = greedy (the argmax of the processed scores; warpers ignored).
        temperature, top_k, top_p, min_p: transformers' warpers, in its order (temperature, top-k,
            top-p, min-p; None = off).
        repetition_penalty: transformers' ``RepetitionPenaltyLogitsProcessor`` over each row's
            context (prompt padding excluded). presence_penalty / frequency_penalty: additive
            penalties on generated tokens (:class:`specdec_ext.processors.PresencePenaltyLogitsProcessor`).
        no_repeat_ngram_size, bad_words_ids, sequence_bias, suppress_tokens, min_new_tokens: as in
            transformers' ``generate``.
        logits_processor: more ``LogitsProcessor`` objects, applied after the ones above and before
            the warpers (where transformers puts a user's list), to both models' logits at every
            position with that position's input_ids.
        stopping_criteria, stop_strings (needs ``tokenizer``), max_time: end rows as transformers
            does; a row ends at the exact token that ends it, and nothing after it is emitted.
        streamer: a transformers streamer (batch size 1); it receives the tokens of each step as
            they are accepted.
        output_scores, output_logits: also return the processed scores / raw logits of every new token.
        num_draft_tokens: drafts per step K, or "auto": each step takes the K in [1, 8] that maximises
            Leviathan et al.'s expected speedup (1 - a^(K+1)) / ((1 - a)(K c + 1)), with a the running
            per-token acceptance rate and c the measured cost of a draft forward over a target forward
            (K = 4 until both are measured). Rows near ``max_new_tokens`` verify fewer drafts.
        draft: "model" (the draft model proposes) or "prompt_lookup" (each row proposes the tokens
            that followed an earlier occurrence of its last ``ngram`` .. 1 tokens; one-hot q).
        generator: torch.Generator for every random draw (None = the default one). Unused with ``seeds``.
        seeds: per-row random keys, (B,) integers >= 0: row b's draws depend only on its seed and
            its own tokens (each draft and each verification at the row's absolute position, i.e. the
            tokens it has generated so far), so with a fixed ``num_draft_tokens`` a row gives the same
            tokens in any batch, alone or with other rows (K decides which positions are bonus draws,
            so "auto" can differ). Needs verify() / sample() with per-request keys.
        eos_token_id: an id or ids ending a row; None = the target's ``generation_config``; [] = none.
        pad_token_id: fills rows after their end; None = the ``generation_config``'s, else the first EOS.
        backend: the verify() / sample() backend ("auto", "triton", "cpp", "eager").
        tree: None (a chain of drafts), children per node at each depth (e.g. (2, 2, 1)), or "auto":
            the draft expands a tree scored by the target in one forward (see :mod:`specdec_ext.tree_generate`).
            Trees and ``method="block"`` take the sampling arguments, ``generator``, EOS and padding only.
        method: "token" or "block" (block verification of the chain, Sun et al.).

    Returns:
        :class:`SpeculativeOutput` (sequences (B, L_in + max_new_tokens), stats, new_tokens, scores, logits).

    Example:
        >>> out = specdec_ext.generate(target, draft, ids, mask, max_new_tokens=64, temperature=0.7)  # doctest: +SKIP
        >>> out.sequences.shape, out.stats.tokens_per_target_forward  # doctest: +SKIP
    """
    if draft not in ("model", "prompt_lookup"):
        raise ValueError(f"draft must be 'model' or 'prompt_lookup', got {draft!r}")
    if draft == "model" and draft_model is None:
        raise ValueError("draft_model is None: pass a draft model, or draft='prompt_lookup'")
    if draft == "prompt_lookup":
        if isinstance(ngram, bool) or not isinstance(ngram, int) or ngram < 1:
            raise ValueError(f"ngram must be an integer >= 1, got {ngram!r}")
        draft_model = None
    if tree is not None or method != "token":
        extras = {"min_p": min_p, "repetition_penalty": repetition_penalty, "presence_penalty": presence_penalty,
                  "frequency_penalty": frequency_penalty, "no_repeat_ngram_size": no_repeat_ngram_size,
                  "bad_words_ids": bad_words_ids, "sequence_bias": sequence_bias, "suppress_tokens": suppress_tokens,
                  "min_new_tokens": min_new_tokens, "logits_processor": logits_processor,
                  "stopping_criteria": stopping_criteria, "stop_strings": stop_strings, "max_time": max_time,
                  "streamer": streamer, "seeds": seeds}
        given = [name for name, value in extras.items() if value is not None]
        given += [name for name, value in (("output_scores", output_scores), ("output_logits", output_logits)) if value]
        if draft != "model":
            given.append("draft")
        if given:
            raise ValueError(f"tree / method='block' generation does not take {', '.join(given)}: "
                             "use the chain (tree=None, method='token') for those")
        from .tree_generate import generate_tree

        return generate_tree(target_model, draft_model, input_ids, attention_mask, max_new_tokens=max_new_tokens, do_sample=do_sample,
                             temperature=temperature, top_k=top_k, top_p=top_p, tree=tree, method=method, num_draft_tokens=num_draft_tokens,
                             generator=generator, eos_token_id=eos_token_id, pad_token_id=pad_token_id)
    _check_models(target_model, draft_model)
    device = target_model.device
    input_ids, attention_mask = _check_inputs(input_ids, attention_mask, device)
    sampling = _sampling(do_sample, temperature, top_k, top_p)
    eos = _eos_ids(target_model, eos_token_id, device)
    padding = (attention_mask == 0).sum(1)
    processors = processor_list(
        do_sample=do_sample, temperature=sampling["temperature"], top_k=sampling["top_k"], top_p=sampling["top_p"], min_p=min_p,
        repetition_penalty=repetition_penalty, presence_penalty=presence_penalty, frequency_penalty=frequency_penalty,
        no_repeat_ngram_size=no_repeat_ngram_size, bad_words_ids=bad_words_ids, sequence_bias=sequence_bias,
        suppress_tokens=suppress_tokens, min_new_tokens=min_new_tokens, eos=eos, prompt_width=input_ids.shape[1],
        prompt_padding=padding if bool(padding.any()) else None, logits_processor=logits_processor,
    )
    criteria = list(stopping_criteria or [])
    if stop_strings is not None:
        if tokenizer is None:
            raise ValueError("stop_strings needs the tokenizer: pass tokenizer=...")
        from transformers.generation.stopping_criteria import StopStringCriteria

        criteria.append(StopStringCriteria(tokenizer=tokenizer, stop_strings=stop_strings))
    if max_time is not None and (isinstance(max_time, bool) or not isinstance(max_time, (int, float)) or max_time <= 0):
        raise ValueError(f"max_time must be a number of seconds > 0, got {max_time!r}")
    seeds = _check_seeds(seeds, input_ids.shape[0], device)
    return speculate(
        target_model, draft_model, input_ids, attention_mask, pipeline=LogitsPipeline(processors, do_sample=do_sample), seeds=seeds, backend=backend,
        stopping=Stopping(criteria, max_time=max_time), max_new_tokens=max_new_tokens, num_draft_tokens=num_draft_tokens,
        ngram=ngram if draft == "prompt_lookup" else 0, generator=generator, eos=eos, pad=_pad_value(target_model, pad_token_id, eos),
        streamer=streamer, output_scores=output_scores, output_logits=output_logits,
    )


def speculate(target_model, draft_model, input_ids: torch.Tensor, attention_mask: torch.Tensor, *, pipeline: LogitsPipeline,
              stopping: Stopping, max_new_tokens: int, num_draft_tokens, ngram: int, generator, eos: torch.Tensor | None, pad: int,
              streamer=None, output_scores: bool = False, output_logits: bool = False, seeds: torch.Tensor | None = None,
              backend: str = "auto") -> SpeculativeOutput:
    """The loop behind :func:`generate` and the transformers hook, on checked inputs.

    ``pipeline`` and ``stopping`` carry every processor and criterion; ``draft_model`` None with
    ``ngram`` > 0 drafts by prompt lookup.
    """
    device = target_model.device
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 0:
        raise ValueError(f"max_new_tokens must be an integer >= 0, got {max_new_tokens!r}")
    if streamer is not None and input_ids.shape[0] != 1:
        raise ValueError(f"streamer supports batch size 1 (like transformers' TextStreamer), got batch size {input_ids.shape[0]}")
    lengths = _DraftLength(num_draft_tokens)
    longest = input_ids.shape[1] + max_new_tokens * ((AUTO_MAX_DRAFT_TOKENS if lengths.auto else lengths.fixed) + 1)
    _check_attention_span(target_model, "target_model", longest)
    if draft_model is not None:
        _check_attention_span(draft_model, "draft_model", longest)
    width = input_ids.shape[1]
    batch = input_ids.shape[0]
    # One extra last column takes the writes that fall past a row's end (see _verify_and_write).
    sequences = torch.full((batch, width + max_new_tokens + 1), pad, dtype=torch.long, device=device)
    sequences[:, :width] = input_ids
    recorder = _Recorder(batch, output_scores, output_logits) if (output_scores or output_logits) else None
    run = _Run(pipeline, generator, eos, pad, sequences, width, max_new_tokens, lengths, _Clock(device), _Tally(), stopping,
               _output_vocab(target_model), streamer, recorder, ngram, (attention_mask == 0).sum(1), new_tokens=[0] * batch, seeds=seeds, backend=backend)
    draft = None
    with torch.no_grad():
        marks = [run.clock.mark()]
        target = _Cache(target_model, input_ids, attention_mask)
        run.verify_device = target.logits_device
        marks.append(run.clock.mark())
        if draft_model is not None:
            draft = _Cache(draft_model, input_ids, attention_mask)
        marks.append(run.clock.mark())
        rows = _Rows.start(input_ids, attention_mask)
        while max_new_tokens and rows.index.numel():
            _speculate(run, target, draft, rows)
        target_prefill, draft_prefill = run.clock.spans(marks)
    if streamer is not None:
        streamer.end()
    run.tally.seconds[0] += draft_prefill
    run.tally.seconds[1] += target_prefill
    scores = logits = None
    if recorder is not None:
        scores = recorder.assemble(recorder.scores, pad, run.vocab, run.verify_device)
        logits = recorder.assemble(recorder.logits, pad, run.vocab, run.verify_device)
    return SpeculativeOutput(sequences[:, :-1].contiguous(), run.tally.stats(target, draft), run.new_tokens, scores, logits)


def _speculate(run: _Run, target: _Cache, draft: _Cache | None, rows: _Rows) -> None:
    """One step for every row still generating: draft, score, verify, commit. One host sync."""
    k = min(run.lengths.choose(), run.max_new_tokens - min(rows.generated_host) - 1)
    budget = (run.max_new_tokens - 1 - rows.generated).clamp(max=k)  # rows near the end verify fewer drafts
    run.context = None
    if not run.pipeline.empty:
        run.context = Context(run.sequences, rows.index, [run.prompt_width + g for g in rows.generated_host])
    marks = [run.clock.mark()]
    if draft is None:
        committed = run.prompt_width + rows.generated
        drafts, found = prompt_lookup_drafts(run.sequences, rows.index, run.first_token[rows.index], committed, k, run.ngram,
                                             width=run.prompt_width + max(rows.generated_host))
        budget = torch.minimum(budget, found)
        draft_logits = None
        if run.context is not None:
            run.context.drafts = drafts
    else:
        drafts, draft_logits = _draft(draft, rows, k, run, run.context)
    marks.append(run.clock.mark())
    # Every row feeds its pending token and its K drafts: all live while scored, settled after verify.
    block = torch.cat([rows.pending[:, None], drafts.to(rows.pending.device)], 1)
    positions = rows.length[:, None] - 1 + torch.arange(k + 1, device=block.device)
    target_logits = target.forward(block, positions, torch.ones_like(block))
    marks.append(run.clock.mark())
    greedy = run.sampling["temperature"] == 0  # greedy verification never reads the draft's logits
    tokens, accepted, emitted, hit_eos = _verify_and_write(run, rows, target_logits, None if greedy else draft_logits, drafts, budget)
    counts = _step_counts(accepted, budget.to(accepted.device), k)
    parts = [accepted, emitted, hit_eos.long(), (tokens[:, 0] < 0).long(), counts]
    if run.accept_probs is not None:
        # Mean min(1, p/q) over the judged drafts: what adaptive K estimates the acceptance rate from.
        judged_probs = run.accept_probs.to(counts.device, torch.float64)
        seen = ~torch.isnan(judged_probs)
        parts = [part.double() for part in parts] + [torch.where(seen, judged_probs, 0.0).sum()[None], seen.sum()[None].double()]
    marks.append(run.clock.mark())
    b = accepted.shape[0]
    host = torch.cat(parts).tolist()  # the step's one sync
    estimate = None
    if run.accept_probs is not None:
        estimate, host = host[-2:], [int(value) for value in host[:-2]]
    accepted_host, emitted_host, finished_host, invalid_host, counts_host = host[:b], host[b:2 * b], host[2 * b:3 * b], host[3 * b:4 * b], host[4 * b:]
    if any(invalid_host):
        row = rows.index_host[invalid_host.index(1)]
        raise ValueError(f"row {row}: the target or draft model produced NaN / +inf logits, or logits that are -inf everywhere")
    _apply_stops(run, rows, emitted_host, finished_host)
    spans = run.clock.spans(marks)
    run.tally.add(k, accepted_host, emitted_host, counts_host[-1], counts_host[:-1], spans)
    run.lengths.update(*(estimate or (sum(accepted_host), counts_host[-1])), k, spans[0], spans[1])
    for b, e in enumerate(emitted_host):
        run.new_tokens[rows.index_host[b]] += e
    if run.recorder is not None:
        run.recorder.add(run.pipeline, rows.index_host, emitted_host, run.processed, target_logits)
    if run.streamer is not None:
        run.streamer.put(tokens[:1, : emitted_host[0]].cpu())
    _advance(target, draft, rows, k, tokens, drafts, accepted, emitted, (accepted_host, emitted_host, finished_host), run.max_new_tokens)


def _apply_stops(run: _Run, rows: _Rows, emitted_host: list[int], finished_host: list[int]) -> None:
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


def _output_vocab(model) -> int:
    head = model.get_output_embeddings() if callable(getattr(model, "get_output_embeddings", None)) else None
    weight = getattr(head, "weight", None)
    if isinstance(weight, torch.Tensor):
        return weight.shape[0]
    return model.config.get_text_config().vocab_size


def _check_models(target_model, draft_model) -> None:
    for name, model in (("target_model", target_model), ("draft_model", draft_model)):
        if model is None and name == "draft_model":
            return
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


def _check_seeds(seeds, batch: int, device) -> torch.Tensor | None:
    if seeds is None:
        return None
    if not REQUEST_KEYS:
        raise ValueError("seeds= needs specdec_ext.verify / sample with per-request keys (seeds, offsets), which this installation lacks")
    try:
        values = torch.as_tensor(seeds)
    except (TypeError, ValueError, RuntimeError):
        raise ValueError(f"seeds must be {batch} integers >= 0, got {seeds!r}") from None
    if values.dtype not in (torch.int32, torch.int64) or values.shape != (batch,) or bool((values < 0).any()):
        raise ValueError(f"seeds must be {batch} integers >= 0 (one per row), got {seeds!r}")
    return values.to(device=device, dtype=torch.int64)


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
