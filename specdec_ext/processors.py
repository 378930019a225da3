"""transformers' logits processors inside the speculative loop, applied exactly.

Speculative sampling keeps the target's law only if the draft's q is processed exactly like the
target's p, at every draft position, with that position's prefix (the committed tokens and the
drafts before it). A :class:`LogitsPipeline` takes transformers' ``LogitsProcessorList`` (in its
order) and splits it into three kinds of work:

* **kernel parameters**: a trailing temperature / top-k / top-p (and min-p when top-p is off) are
  handed to ``specdec_ext.verify`` / ``sample``, which fuse them with the softmax and the draw;
* **fused stages**: the common processors whose effect is a function of per-row token counts,
  lengths or a fixed vocabulary mask (repetition and presence penalties, single-token logit bias /
  ``sequence_bias`` / ``bad_words_ids``, ``suppress_tokens``, min-length / min-new-tokens EOS
  suppression, min-p), evaluated for every row and every position of a block in a few tensor ops
  (the repetition penalty on CPU float32 scores: one C++ call, ``csrc/penalties.cpp``, same bits);
* **per-position stages**: any other ``LogitsProcessor`` (no_repeat_ngram_size, multi-token bad
  words, user processors) is called as transformers calls it -- ``processor(input_ids, scores)`` with
  the exact ``input_ids`` the row would have at that position (its left-padded prompt, its generated
  tokens and the drafts before the position), once per position for each group of rows that have
  the same length. Such a processor must be a function of ``(input_ids, scores)``: one that keeps
  state between calls, or that looks rows up by their batch index, cannot be speculated exactly.

Stages run in the list's order, so processors that do not commute (a bias, then a multiplicative
penalty) keep transformers' semantics.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

# Processors that look rows up by batch index or keep state across calls: they cannot be called on
# row subsets, with rejected drafts, or twice per position.
UNSUPPORTED_PROCESSORS = {
    "PrefixConstrainedLogitsProcessor": "prefix_allowed_tokens_fn",
    "UnbatchedClassifierFreeGuidanceLogitsProcessor": "guidance_scale",
    "ClassifierFreeGuidanceLogitsProcessor": "guidance_scale",
    "SynthIDTextWatermarkLogitsProcessor": "watermarking_config",
    "WatermarkLogitsProcessor": "watermarking_config",
    "WhisperTimeStampLogitsProcessor": "return_timestamps",
    "WhisperNoSpeechDetection": "no_speech_threshold",
    "AlternatingCodebooksLogitsProcessor": "logits_processor",
    "BarkEosPrioritizerLogitsProcessor": "logits_processor",
    "ForcedBOSTokenLogitsProcessor": "forced_bos_token_id",
    "ForcedEOSTokenLogitsProcessor": "forced_eos_token_id",
}
# Warpers that read only the scores (never input_ids): applied to whole blocks at once.
_LINE_WARPERS = ("TemperatureLogitsWarper", "TopKLogitsWarper", "TopPLogitsWarper", "MinPLogitsWarper", "TypicalLogitsWarper",
                 "EpsilonLogitsWarper", "EtaLogitsWarper", "TopHLogitsWarper", "LogitNormalization")


class PresencePenaltyLogitsProcessor:
    """Additive presence / frequency penalties on the generated tokens (OpenAI's definition).

    ``scores[v] -= presence_penalty * (count_v > 0) + frequency_penalty * count_v``, where count_v is
    how often v occurs in ``input_ids[:, prompt_length:]`` (the generated part). A transformers
    ``LogitsProcessor`` (usable with ``model.generate(logits_processor=[...])``), fused by the loop.
    """

    def __init__(self, presence_penalty: float = 0.0, frequency_penalty: float = 0.0, prompt_length: int = 0):
        for name, value in (("presence_penalty", presence_penalty), ("frequency_penalty", frequency_penalty)):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                raise ValueError(f"{name} must be a finite number, got {value!r}")
        if isinstance(prompt_length, bool) or not isinstance(prompt_length, int) or prompt_length < 0:
            raise ValueError(f"prompt_length must be an integer >= 0, got {prompt_length!r}")
        self.presence_penalty = float(presence_penalty)
        self.frequency_penalty = float(frequency_penalty)
        self.prompt_length = prompt_length

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        vocab = scores.shape[-1]
        generated = input_ids[:, self.prompt_length:].clamp(max=vocab)
        counts = torch.zeros((scores.shape[0], vocab + 1), dtype=scores.dtype, device=scores.device)
        counts.scatter_add_(1, generated, torch.ones_like(generated, dtype=scores.dtype))
        counts = counts[:, :vocab]
        return scores - self.presence_penalty * (counts > 0).to(scores.dtype) - self.frequency_penalty * counts


class Context:
    """Where the rows' tokens are, for processors that need prefixes.

    ``sequences[index[b], :committed[b]]`` are row b's committed tokens exactly as transformers would
    show them (left-padded prompt, then generated tokens); ``drafts`` (b, K) follow them. A block
    position j stands for the prefix that ends after ``first + j`` drafts.
    """

    def __init__(self, sequences: torch.Tensor, index: torch.Tensor, committed: list[int], drafts: torch.Tensor | None = None):
        self.sequences = sequences
        self.index = index
        self.committed = committed
        self.drafts = drafts
        self._committed_device: dict = {}
        self._counts: dict = {}

    def committed_on(self, device) -> torch.Tensor:
        key = str(device)
        if key not in self._committed_device:
            self._committed_device[key] = torch.tensor(self.committed, device=device)
        return self._committed_device[key]

    def groups(self) -> list[tuple[list[int], int]]:
        """Rows that share a committed length (they can be called as one rectangular batch)."""
        by_length: dict[int, list[int]] = {}
        for row, length in enumerate(self.committed):
            by_length.setdefault(length, []).append(row)
        return [(members, length) for length, members in by_length.items()]

    def prefix(self, members: list[int], length: int, num_drafts: int, device) -> torch.Tensor:
        """(len(members), length + num_drafts) input_ids of those rows after ``num_drafts`` drafts."""
        member_index = torch.tensor(members, device=self.index.device)
        ids = self.sequences[self.index[member_index], :length]
        if num_drafts:
            ids = torch.cat([ids, self.drafts[member_index.to(self.drafts.device), :num_drafts].to(ids.device)], 1)
        return ids.to(device)

    def base_counts(self, start: torch.Tensor | int, vocab: int, device, owner: int = 0) -> torch.Tensor:
        """(b, V) float32 counts of each id among committed tokens at positions >= ``start`` (per row or one int).

        Cached for the step; ``owner`` tells apart per-row ``start`` tensors of different processors.
        """
        key = (owner if isinstance(start, torch.Tensor) else start, vocab, str(device))
        if key not in self._counts:
            width = max(self.committed)
            ids = self.sequences[self.index, :width].to(device)
            position = torch.arange(width, device=device)[None, :]
            start = start.to(device)[:, None] if isinstance(start, torch.Tensor) else start
            live = (position < self.committed_on(device)[:, None]) & (position >= start)
            ids = torch.where(live, ids.clamp(min=0, max=vocab), vocab)
            counts = torch.zeros((ids.shape[0], vocab + 1), dtype=torch.float32, device=device)
            counts.scatter_add_(1, ids, torch.ones_like(ids, dtype=torch.float32))
            self._counts[key] = counts[:, :vocab]
        return self._counts[key]

    def block_counts(self, start, vocab: int, first: int, positions: int, device, owner: int = 0) -> torch.Tensor:
        """(b, positions, V) counts at each block position: committed tokens from ``start`` plus the drafts before it."""
        if positions == 1 and self.drafts is not None:
            return self._running_counts(start, vocab, first, device, owner)[:, None, :]
        counts = self.base_counts(start, vocab, device, owner)[:, None, :].repeat(1, positions, 1)
        if self.drafts is not None:
            drafts = self.drafts.to(device).clamp(min=0, max=vocab - 1)
            ones = torch.ones((drafts.shape[0], 1, 1), dtype=counts.dtype, device=device)
            valid = (self.drafts.to(device) < vocab).to(counts.dtype)
            for i in range(first + positions - 1):
                # Draft i is in the prefix of every position j with first + j > i.
                from_position = max(i + 1 - first, 0)
                if from_position >= positions:
                    continue
                width = positions - from_position
                index = drafts[:, i].view(-1, 1, 1).expand(-1, width, 1)
                counts[:, from_position:].scatter_add_(2, index, (ones * valid[:, i].view(-1, 1, 1)).expand(-1, width, 1))
        return counts

    def _running_counts(self, start, vocab: int, first: int, device, owner: int) -> torch.Tensor:
        """(b, V) counts after ``first`` drafts, one draft added to the previous position's (drafting goes in order)."""
        key = ("running", owner if isinstance(start, torch.Tensor) else start, vocab, str(device))
        previous = self._counts.get(key)
        if first == 0:
            counts = self.base_counts(start, vocab, device, owner)
        elif previous is not None and previous[0] == first - 1:
            draft = self.drafts[:, first - 1].to(device)
            counts = previous[1].clone()
            counts.scatter_add_(1, draft.clamp(min=0, max=vocab - 1)[:, None], (draft < vocab).to(counts.dtype)[:, None])
        else:
            counts = self._counts_after(start, vocab, first, device, owner)
        self._counts[key] = (first, counts)
        return counts

    def _counts_after(self, start, vocab: int, first: int, device, owner: int) -> torch.Tensor:
        counts = self.base_counts(start, vocab, device, owner).clone()
        for i in range(first):
            draft = self.drafts[:, i].to(device)
            counts.scatter_add_(1, draft.clamp(min=0, max=vocab - 1)[:, None], (draft < vocab).to(counts.dtype)[:, None])
        return counts

    def cpu_repetition_penalty(self, scores: torch.Tensor, start, first: int, penalty: float) -> torch.Tensor | None:
        """The repetition penalty of the whole block in one C++ call (CPU float32 scores), bit for bit the
        torch stage's result; None where it does not apply (other devices or dtypes, no extension)."""
        kernel = _cpp_repetition_penalty()
        if kernel is None or not scores.is_cpu or scores.dtype != torch.float32 or not self.sequences.is_cpu or not self.index.is_cpu:
            return None
        drafts = self.drafts
        if drafts is None:
            if first != 0 or scores.shape[1] != 1:
                return None
        elif not drafts.is_cpu or drafts.dtype != torch.long:
            return None
        if isinstance(start, torch.Tensor):
            starts = start.to("cpu", torch.long).reshape(-1)
        else:
            starts = torch.full((len(self.committed),), int(start), dtype=torch.long)
        return kernel(scores, self.sequences, self.index, starts, self.committed_on("cpu"), drafts, first, penalty)

    def lengths(self, first: int, positions: int, device) -> torch.Tensor:
        """(b, positions) ``input_ids.shape[-1]`` at each block position."""
        return self.committed_on(device)[:, None] + first + torch.arange(positions, device=device)[None, :]


def _cpp_repetition_penalty():
    """The C++ block repetition penalty, or None (extension not built, or built before it existed)."""
    from . import _cpp_backend

    return getattr(_cpp_backend._C, "repetition_penalty", None) if _cpp_backend.is_available() else None


# --------------------------------------------------------------------------------------------- stages


class _Stage:
    name = "stage"

    def __call__(self, scores: torch.Tensor, context: Context, first: int) -> torch.Tensor:
        raise NotImplementedError


class _RepetitionPenalty(_Stage):
    def __init__(self, processor):
        self.name = type(processor).__name__
        self.penalty = float(processor.penalty)
        self.ignore = getattr(processor, "prompt_ignore_length", None)

    def __call__(self, scores, context, first):
        start = 0
        if isinstance(self.ignore, int):
            start = self.ignore
        elif isinstance(self.ignore, torch.Tensor):
            start = self.ignore.to(context.index.device)[context.index]
        fused = context.cpu_repetition_penalty(scores, start, first, self.penalty)
        if fused is not None:
            return fused
        seen = context.block_counts(start, scores.shape[-1], first, scores.shape[1], scores.device, owner=id(self)) > 0
        penalised = torch.where(scores < 0, scores * self.penalty, scores / self.penalty)
        return torch.where(seen, penalised, scores)


class _PresencePenalty(_Stage):
    def __init__(self, processor):
        self.name = type(processor).__name__
        self.processor = processor

    def __call__(self, scores, context, first):
        counts = context.block_counts(self.processor.prompt_length, scores.shape[-1], first, scores.shape[1], scores.device)
        return scores - self.processor.presence_penalty * (counts > 0).to(scores.dtype) - self.processor.frequency_penalty * counts


class _StaticBias(_Stage):
    """A fixed (V,) additive bias (single-token sequence_bias and bad words) or -inf mask (suppress_tokens)."""

    def __init__(self, name: str, token_values: dict[int, float], additive: bool):
        self.name = name
        self.token_values = token_values
        self.additive = additive
        self._bias: dict = {}

    def _vector(self, vocab: int, device) -> torch.Tensor:
        key = (vocab, str(device))
        if key not in self._bias:
            out_of_range = [t for t in self.token_values if t >= vocab and self.additive]
            if out_of_range:
                raise ValueError(f"{self.name}: token ids {out_of_range} are outside the vocabulary ({vocab} ids)")
            bias = torch.zeros(vocab, dtype=torch.float32)
            for token, value in self.token_values.items():
                if token < vocab:
                    bias[token] += value
            self._bias[key] = bias.to(device)
        return self._bias[key]

    def __call__(self, scores, context, first):
        bias = self._vector(scores.shape[-1], scores.device)
        if self.additive:
            return scores + bias
        return torch.where(bias != 0, float("-inf"), scores)


class _EosUntilLength(_Stage):
    """MinLength / MinNewTokensLength: EOS ids get -inf while the position's length is below the minimum."""

    def __init__(self, processor):
        self.name = type(processor).__name__
        self.eos = torch.as_tensor(processor.eos_token_id).reshape(-1).long().cpu()
        if self.name == "MinLengthLogitsProcessor":
            self.minimum, self.skip = processor.min_length, 0
        else:
            self.minimum, self.skip = processor.min_new_tokens, processor.prompt_length_to_skip

    def __call__(self, scores, context, first):
        short = (context.lengths(first, scores.shape[1], scores.device) - self.skip) < self.minimum  # (b, P)
        vocab = scores.shape[-1]
        is_eos = torch.isin(torch.arange(vocab, device=scores.device), self.eos.to(scores.device))
        return torch.where(short[..., None] & is_eos, float("-inf"), scores)


class _MinP(_Stage):
    """min-p on the temperature-scaled scores, as MinPLogitsWarper computes it, written back as -inf.

    Used only when top-p is off: min-p keeps {s >= max s + log(min_p)} whatever top-k removed (the top
    token survives both), so it commutes with top-k but not with top-p's renormalised cut.
    """

    name = "MinPLogitsWarper"

    def __init__(self, min_p: float, temperature: float):
        self.min_p = min_p
        self.temperature = temperature

    def __call__(self, scores, context, first):
        scaled = scores if self.temperature == 1.0 else scores / self.temperature
        probs = torch.softmax(scaled, dim=-1)
        remove = probs < self.min_p * probs.amax(dim=-1, keepdim=True)
        return scores.masked_fill(remove, float("-inf"))


class _LineWarpers(_Stage):
    """Known input-independent warpers in transformers' order, applied to all lines at once."""

    def __init__(self, warpers):
        self.warpers = list(warpers)
        self.name = "+".join(type(w).__name__ for w in self.warpers)

    def __call__(self, scores, context, first):
        shape = scores.shape
        lines = scores.reshape(-1, shape[-1])
        dummy = torch.zeros((lines.shape[0], 1), dtype=torch.long, device=lines.device)
        for warper in self.warpers:
            lines = warper(dummy, lines)
        return lines.reshape(shape)


class _PerPosition(_Stage):
    """Processors called as transformers calls them, with each position's exact input_ids."""

    def __init__(self, processors):
        self.processors = list(processors)
        self.name = "+".join(type(p).__name__ for p in self.processors)

    def __call__(self, scores, context, first):
        scores = scores.clone()
        single_group = len(set(context.committed)) == 1
        for members, length in context.groups():
            rows = slice(None) if single_group else torch.tensor(members, device=scores.device)
            for j in range(scores.shape[1]):
                ids = context.prefix(members, length, first + j, scores.device)
                line = scores[rows, j]
                for processor in self.processors:
                    line = processor(ids, line)
                scores[rows, j] = line
        return scores


@dataclass
class KernelSampling:
    """What verify() / sample() apply themselves: temperature (0 = greedy), top-k, top-p."""

    temperature: float = 1.0
    top_k: int | None = None
    top_p: float | None = None

    def as_kwargs(self) -> dict:
        return {"temperature": self.temperature, "top_k": self.top_k, "top_p": self.top_p}


class LogitsPipeline:
    """A transformers ``LogitsProcessorList`` split into kernel parameters, fused and per-position stages.

    ``apply(scores (b, P, V), context, first)`` returns the scores every processor before the kernel's
    own temperature / top-k / top-p would produce at each of the P positions; ``kernel`` holds those
    parameters. ``score_warpers`` turn kernel inputs into what transformers reports as ``scores``.
    """

    def __init__(self, processors=None, *, do_sample: bool = True):
        processors = list(processors or [])
        for processor in processors:
            name = type(processor).__name__
            if name in UNSUPPORTED_PROCESSORS:
                raise UnsupportedProcessor(UNSUPPORTED_PROCESSORS[name], name)
        # The trailing run of input-independent warpers (transformers appends them after every processor).
        split = len(processors)
        while split > 0 and type(processors[split - 1]).__name__ in _LINE_WARPERS:
            split -= 1
        head, tail = processors[:split], processors[split:]
        self.stages: list[_Stage] = [self._stage(p) for p in head]
        self._merge_per_position()
        self.kernel = KernelSampling(temperature=1.0 if do_sample else 0.0)
        self.torch_warped = False
        self.score_warpers = [w for w in tail if type(w).__name__ != "LogitNormalization"]
        self.renormalize = any(type(w).__name__ == "LogitNormalization" for w in tail)
        kernel = self._kernel_parameters(tail) if do_sample else None
        if kernel is None:
            # Greedy, or warpers the kernel does not implement: all of them in torch, in order; the kernel
            # then samples the warped scores as they are (temperature 1, no filter).
            warpers = [w for w in tail if type(w).__name__ != "LogitNormalization"]
            if warpers:
                self.stages.append(_LineWarpers(warpers))
            self.torch_warped = True
        else:
            self.kernel, min_p = kernel
            if min_p is not None:
                self.stages.append(_MinP(min_p, self.kernel.temperature))

    @staticmethod
    def _stage(processor) -> _Stage:
        name = type(processor).__name__
        if name == "RepetitionPenaltyLogitsProcessor" and getattr(processor, "logits_indices", None) is None:
            return _RepetitionPenalty(processor)
        if isinstance(processor, PresencePenaltyLogitsProcessor):
            return _PresencePenalty(processor)
        if name == "SuppressTokensLogitsProcessor":
            return _StaticBias(name, {int(t): -1.0 for t in processor.suppress_tokens.reshape(-1).tolist()}, additive=False)
        if name in ("SequenceBiasLogitsProcessor", "NoBadWordsLogitsProcessor"):
            bias = getattr(processor, "sequence_bias", None)
            if isinstance(bias, dict) and all(len(tokens) == 1 for tokens in bias):
                values: dict[int, float] = {}
                for tokens, value in bias.items():
                    values[int(tokens[0])] = values.get(int(tokens[0]), 0.0) + float(value)
                return _StaticBias(name, values, additive=True)
        if name in ("MinLengthLogitsProcessor", "MinNewTokensLengthLogitsProcessor"):
            return _EosUntilLength(processor)
        if name in _LINE_WARPERS:
            return _LineWarpers([processor])
        return _PerPosition([processor])

    def _merge_per_position(self) -> None:
        merged: list[_Stage] = []
        for stage in self.stages:
            if isinstance(stage, _PerPosition) and merged and isinstance(merged[-1], _PerPosition):
                merged[-1] = _PerPosition(merged[-1].processors + stage.processors)
            else:
                merged.append(stage)
        self.stages = merged

    @staticmethod
    def _kernel_parameters(tail) -> tuple[KernelSampling, float | None] | None:
        """Kernel parameters when the warpers are temperature, top-k, top-p, min-p in transformers' order; else None."""
        order = ("TemperatureLogitsWarper", "TopKLogitsWarper", "TopPLogitsWarper", "MinPLogitsWarper")
        kernel, min_p, last = KernelSampling(), None, -1
        for warper in tail:
            name = type(warper).__name__
            if name == "LogitNormalization":
                continue  # a per-line shift: changes no probability
            if name not in order or order.index(name) <= last:
                return None
            last = order.index(name)
            if getattr(warper, "min_tokens_to_keep", 1) != 1:
                return None
            if name == "TemperatureLogitsWarper":
                kernel.temperature = float(warper.temperature)
            elif name == "TopKLogitsWarper":
                kernel.top_k = int(warper.top_k)
            elif name == "TopPLogitsWarper":
                kernel.top_p = float(warper.top_p)
            else:
                min_p = float(warper.min_p)
        if min_p is not None and kernel.top_p is not None and kernel.top_p < 1.0:
            return None  # top-p renormalises before min-p: both in torch
        return kernel, min_p

    @property
    def empty(self) -> bool:
        return not self.stages

    @property
    def needs_prefixes(self) -> bool:
        return any(not isinstance(stage, (_StaticBias, _MinP, _LineWarpers)) for stage in self.stages)

    def apply(self, scores: torch.Tensor, context: Context, first: int = 0) -> torch.Tensor:
        """(b, P, V) raw scores -> processed scores (everything but the kernel's temperature / top-k / top-p)."""
        for stage in self.stages:
            scores = stage(scores, context, first)
        return scores

    def reported_scores(self, lines: torch.Tensor) -> torch.Tensor:
        """(N, V) kernel inputs -> the scores transformers reports: its warpers applied, in its order.

        On the kernel path, min-p already masked the lines; applying MinPLogitsWarper again after
        temperature / top-k finds the same set (the top token and the ratios to it are unchanged).
        """
        out = lines
        if not self.torch_warped and self.score_warpers:
            out = _LineWarpers(self.score_warpers)(lines[:, None], None, 0)[:, 0]
        if self.renormalize:
            out = out.log_softmax(dim=-1)
        return out


class UnsupportedProcessor(ValueError):
    """A processor the speculative loop cannot apply exactly; ``argument`` names what set it."""

    def __init__(self, argument: str, processor: str):
        super().__init__(f"{processor} (set by {argument}) keeps state between calls or indexes rows by batch position; "
                         "speculative decoding cannot apply it exactly")
        self.argument = argument
        self.processor = processor
