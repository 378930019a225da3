"""Engine-independent pieces of the vLLM integration: vLLM's flattened rows in, specdec_ext's verification out.

vLLM lays a step's logits out flat: request r owns ``n_r + 1`` consecutive rows (its n_r draft positions,
then the bonus position). specdec_ext verifies padded (B, K+1, V) blocks with per-row draft counts, so a
batch whose requests all carry K drafts is a view of vLLM's tensor and a ragged one is gathered once (the
raw logits, never a processed copy).

What vLLM applies before temperature (penalties, logit bias, bad words, allowed ids, min-tokens, custom
processors) is applied by vLLM's own code in the runner modules; min-p, which vLLM applies after
temperature, is a mask on the unscaled logits here; temperature, top-k and top-p are the fused kernels'.

Exactness hinges on q being the law the drafts were drawn from. vLLM draws probabilistic drafts from the
draft's temperature-scaled softmax *without* top-k / top-p, while ``specdec_ext.verify`` applies a row's
filters to both sides. For a filtered row with probabilistic drafts the target is therefore masked to its
exact top-k / top-p support first (the reference's thresholds) and verified with the filters off: p is the
same processed law, q stays the unfiltered law the drafts came from.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch

import specdec_ext
from specdec_ext._params import inverse_temperature
from specdec_ext.reference import process_lines

# vLLM's seeds are any int64; specdec_ext's keys are non-negative int64 (both Philox key words are used).
_KEY_MASK = (1 << 63) - 1


class Block(NamedTuple):
    """One step's verification problem in specdec_ext's padded layout (tensors on the logits' device)."""

    target_logits: torch.Tensor  # (B, K+1, V) logits after vLLM's pre-temperature processing
    draft_logits: torch.Tensor | None  # (B, K, V) unscaled draft logits, or None for one-hot drafts
    draft_tokens: torch.Tensor  # (B, K) int64, 0 where no draft
    num_draft_tokens: torch.Tensor  # (B,) int64: drafts to verify (up to the first placeholder)
    temperature: torch.Tensor  # (B,) float32, 0 = greedy
    top_k: torch.Tensor  # (B,) int64, 0 = off
    top_p: torch.Tensor  # (B,) float32, 1 = off
    seeds: torch.Tensor  # (B,) int64 >= 0, one Philox key per request
    offsets: torch.Tensor  # (B,) int64, the request's position of draft position 0


def run_verification(block: Block, method: str = "token") -> specdec_ext.VerifyResult:
    """The one call into specdec_ext on the serving path (a prepared ``specdec_ext.Verifier`` can replace
    this body): fused verification, no validation pass and no host sync (``check=False``)."""
    return specdec_ext.verify(
        block.target_logits, block.draft_logits, block.draft_tokens, temperature=block.temperature, top_k=block.top_k,
        top_p=block.top_p, num_draft_tokens=block.num_draft_tokens, seeds=block.seeds, offsets=block.offsets,
        check=False, method=method,
    )


def request_keys(seeds: torch.Tensor) -> torch.Tensor:
    """(B,) int64 vLLM seeds (any sign) -> specdec_ext keys (>= 0): the seed with its sign bit cleared."""
    return seeds.to(torch.int64) & _KEY_MASK


def padded_slots(starts: torch.Tensor, counts: torch.Tensor, width: int, num_rows: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Flat row index of every padded slot (B, width) of requests whose rows start at ``starts`` and number
    ``counts``; slots past a request's last row repeat that row (they are never read). Also the (B, width)
    mask of real slots."""
    columns = torch.arange(width, device=starts.device)
    real = columns[None, :] < counts[:, None]
    last = (starts + counts - 1).clamp(min=0)
    index = torch.minimum(starts[:, None] + columns[None, :], last[:, None]).clamp(max=max(num_rows - 1, 0))
    return index, real


def pad_rows(flat: torch.Tensor, starts: torch.Tensor, counts: torch.Tensor, width: int, uniform: bool) -> torch.Tensor:
    """(B, width, V) padded view of flat (N, V) rows: a view when every request owns exactly ``width``
    consecutive rows (``uniform``), else one gather."""
    batch = starts.shape[0]
    if uniform:
        return flat.unflatten(0, (batch, width))
    index, _ = padded_slots(starts, counts, width, flat.shape[0])
    return flat[index.reshape(-1)].unflatten(0, (batch, width))


def drafts_until_placeholder(draft_tokens: torch.Tensor, num_draft: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """vLLM marks drafts that must not be accepted with -1 (a grammar's rejection, a step that starts in
    the prefill): verification stops there and that position draws from the target, which is exactly a
    row whose draft count ends before the first placeholder. Returns (drafts with 0 in unused slots,
    per-row counts)."""
    columns = torch.arange(draft_tokens.shape[1], device=draft_tokens.device)
    valid = (draft_tokens >= 0) & (columns[None, :] < num_draft[:, None])
    counts = valid.to(torch.int64).cumprod(dim=1).sum(dim=1)
    return torch.where(valid, draft_tokens, torch.zeros_like(draft_tokens)).to(torch.int64), counts


def draft_logits_from_probs(draft_probs: torch.Tensor, temperature: torch.Tensor) -> torch.Tensor:
    """Logits d whose processed law under the row's temperature is ``draft_probs``, the law vLLM's V1
    drafter sampled from (softmax of the draft logits / T, unfiltered): ``d = T * log(probs)``, so the
    kernel's ``softmax(d * (1 / T))`` gives back the probabilities up to one float32 rounding of each
    log-probability; zero probabilities stay impossible (-inf). ``temperature`` broadcasts against the
    leading dimensions; greedy rows (T = 0) never read their draft line."""
    scale = torch.where(temperature > 0, temperature, torch.ones_like(temperature)).to(torch.float32)
    return torch.log(draft_probs.to(torch.float32)) * scale[..., None]


def mask_min_p(lines: torch.Tensor, temperature: torch.Tensor, min_p: torch.Tensor) -> torch.Tensor:
    """vLLM's min-p, which it applies to the temperature-scaled logits s = l / T: tokens with
    ``s < max(s) + log(min_p)`` become -inf. Applied here to the unscaled (N, V) lines with the kernels'
    own scaling (``l * (1 / T)``, one rounded reciprocal), so the fused temperature / top-k / top-p that
    follow see exactly the min-p support. Greedy rows (T = 0) and rows with min_p = 0 are left alone.
    Returns a float32 copy."""
    lines = lines.float()
    active = (min_p > 0) & (temperature > 0)
    scaled = lines * inverse_temperature(temperature.float())[:, None]
    log_min_p = torch.log(torch.where(active, min_p.float(), torch.ones_like(min_p, dtype=torch.float32)))
    cut = scaled.amax(dim=1) + log_min_p
    drop = (scaled < cut[:, None]) & active[:, None]
    return lines.masked_fill(drop, float("-inf"))


def mask_to_filtered_support(target: torch.Tensor, temperature: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """(B, L, V) target logits with every token outside the row's top-k / top-p support set to -inf, the
    support computed exactly as every backend computes it (``specdec_ext.reference``). Verifying the result
    with the filters off gives the same p; used when the drafts were drawn without the filters."""
    batch, length, vocab = target.shape
    lines = process_lines(target.reshape(batch * length, vocab), temperature.repeat_interleave(length),
                          top_k.repeat_interleave(length), top_p.repeat_interleave(length))
    drop = lines.scaled < lines.threshold[:, None]
    return target.reshape(batch * length, vocab).masked_fill(drop, float("-inf")).reshape(batch, length, vocab)


def processed_logits(block: Block, vocab: int) -> torch.Tensor:
    """(B, K+1, vocab) vLLM's "processed" logits of a block, what its processed-logprobs modes read: the
    logits after temperature, top-k and top-p (-inf outside the support; greedy rows unscaled), from the
    very law the block is verified with (specdec_ext's reference). Columns past the block's vocabulary
    (vLLM verifies over the vocabulary target and draft share) are -inf."""
    batch, width, used = block.target_logits.shape
    lines = process_lines(block.target_logits.reshape(batch * width, used), block.temperature.repeat_interleave(width),
                          block.top_k.repeat_interleave(width), block.top_p.repeat_interleave(width))
    out = lines.scaled.masked_fill(lines.scaled < lines.threshold[:, None], float("-inf"))
    if vocab > used:
        out = torch.nn.functional.pad(out, (0, vocab - used), value=-math.inf)
    return out.reshape(batch, width, vocab)


def emitted_counts(result: specdec_ext.VerifyResult) -> torch.Tensor:
    """(B,) tokens each request emits: accepted drafts + 1, or 0 for a row that ``check=False`` blanked
    (NaN / inf logits): such a row emits nothing this step instead of an arbitrary id."""
    emitted = result.num_accepted + 1
    return torch.where(result.tokens[:, 0] >= 0, emitted, torch.zeros_like(emitted))
