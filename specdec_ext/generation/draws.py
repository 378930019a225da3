"""The one place the loop draws draft tokens, from the law verification is told they come from.

* :func:`draw_draft` -- a chain's next draft per row (token-wise or block verification), from its
  processed draft line, by a prepared :class:`~specdec_ext.Sampler` (``sample`` bound once to the
  loop's parameters): with per-row keys (``seeds``) at the row's absolute position (the same number
  decides it in any batch), else with a key from the loop's generator;
* :func:`draw_children` -- a tree node's children, by one exponential race per level on the generator
  (draws without replacement are the race's first places, which ``sample`` does not return).

Either way the proposals follow the processed draft law exactly, which is what keeps the output exact.
"""

from __future__ import annotations

import torch

from .. import _params
from ..api import sample
from ..prepared import Sampler
from ..reference import process_lines


def pad_vocab(logits: torch.Tensor, vocab: int) -> torch.Tensor:
    """A draft line over the target's vocabulary: ids only the target has get -inf (q = 0 there)."""
    if logits.shape[-1] >= vocab:
        return logits
    return torch.nn.functional.pad(logits, (0, vocab - logits.shape[-1]), value=float("-inf"))


def draw_draft(raw: torch.Tensor, processed: torch.Tensor, run, keys: dict) -> torch.Tensor:
    """One draft per row (b,) from the processed draft lines (b, V); verification is told q = their law.

    ``raw``: the same lines before the logits processors (an exact draw never reads them; a test
    substitutes a wrong draw that does). ``keys``: {"seeds", "offsets"} for keyed rows, else {}.
    """
    draw = _prepared_sampler(processed, run)
    if draw is None:
        return sample(processed, generator=None if keys else run.generator, check=False, backend=run.backend, **keys, **run.sampling)
    return draw(processed, generator=None if keys else run.generator, **keys)


def _prepared_sampler(processed: torch.Tensor, run) -> Sampler | None:
    """The loop's :class:`~specdec_ext.Sampler` for lines like ``processed`` (built once per batch
    size, dtype and device, with the loop's parameters validated once), or None where ``sample`` is
    called instead: logits of a dtype the kernels do not take, or a loop traced by torch.compile.
    Either way the same keys give the same tokens."""
    if processed.dtype not in _params.LOGIT_DTYPES or torch.compiler.is_compiling():
        return None
    batch, vocab = processed.shape
    signature = (batch, vocab, processed.dtype, processed.device)
    draw = run.draft_samplers.get(signature)
    if draw is None:
        draw = run.draft_samplers[signature] = Sampler(batch, vocab, dtype=processed.dtype, device=processed.device, backend=run.backend, check=False,
                                                       **run.sampling)
    return draw


def draw_children(lines: torch.Tensor, width: int, run) -> torch.Tensor:
    """(R, width) children of R contexts from their (R, V) draft lines (processed by the logits
    processors; the kernel's temperature / top-k / top-p are applied here).

    Sampled rows: i.i.d. draws from the processed law q (one exponential race per child), or the first
    ``width`` places of one race (a draw without replacement: the order statistics of q(y) / E_y).
    Greedy (temperature 0): the top ``width`` lines' entries, lowest id first on ties.
    """
    sampling = run.sampling
    rows, vocab = lines.shape
    if sampling["temperature"] == 0:
        return torch.sort(lines.float(), dim=1, descending=True, stable=True).indices[:, :width]
    q = process_lines(lines, torch.full((rows,), float(sampling["temperature"]), device=lines.device),
                      torch.full((rows,), int(sampling["top_k"] or 0), device=lines.device),
                      torch.full((rows,), float(1.0 if sampling["top_p"] is None else sampling["top_p"]), device=lines.device)).probs()
    copies = width if run.siblings == "iid" else 1
    generator = run.generator
    noise_device = generator.device if generator is not None else lines.device  # a CPU generator may drive a CUDA model
    noise = torch.empty(rows, copies, vocab, device=noise_device).exponential_(generator=generator).to(lines.device)
    keys = q[:, None, :] / noise
    if run.siblings == "iid":
        return keys.argmax(dim=2)
    return torch.topk(keys[:, 0], width, dim=1).indices
