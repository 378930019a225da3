"""The one place the loop draws draft tokens, from the law verification is told they come from.

* :func:`draw_draft` -- a chain's next draft per row (token-wise or block verification), from its
  processed draft line: with per-row keys (``seeds``), ``sample`` at the row's absolute position (the
  same number decides it in any batch); with a generator, ``sample`` too (on the C++ backend by
  :func:`_cpp_sample`, the loop's direct call of the kernel);
* :func:`draw_children` -- a tree node's children, by one exponential race per level on the generator
  (draws without replacement are the race's first places, which ``sample`` does not return).

Either way the proposals follow the processed draft law exactly, which is what keeps the output exact.
"""

from __future__ import annotations

import torch

from .. import _cpp_backend, _params
from .._philox import draw_base_key
from ..api import _sample_args, sample
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
    if keys:
        return sample(processed, check=False, backend=run.backend, **keys, **run.sampling)
    if _direct_draw(processed, run):
        return _cpp_sample(processed, run)
    return sample(processed, generator=run.generator, check=False, backend=run.backend, **run.sampling)


def _direct_draw(processed: torch.Tensor, run) -> bool:
    """Whether the draw can call the C++ kernel directly: CPU logits of a kernel dtype, a CPU generator
    (or none), the cpp backend available and chosen, eager execution."""
    return (run.backend in ("auto", "cpp") and processed.is_cpu and processed.dtype in _params.LOGIT_DTYPES
            and (run.generator is None or run.generator.device.type == "cpu") and _cpp_backend.is_available()
            and not torch.compiler.is_compiling())


def _cpp_sample(processed: torch.Tensor, run) -> torch.Tensor:
    """``sample(processed, generator=run.generator, **run.sampling)`` as it runs on the C++ backend,
    without re-validating the loop's own parameters at every token (on a CPU that validation cost as
    much as the draw): the same key from the same generator, the same kernel and stream, so the same
    tokens. The loop's only call below the public API; a prepared sampler replaces this function."""
    batch = processed.shape[0]
    rows = run.draft_rows.get(batch)
    if rows is None:
        args = _sample_args(processed, generator=None, check=False, **run.sampling)
        rows = run.draft_rows[batch] = (args.temperature, args.top_k, args.top_p)
    return _cpp_backend._C.sample(processed, *rows, None, None, draw_base_key(run.generator))


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
