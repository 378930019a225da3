"""``torch.ops.specdec.verify`` and ``torch.ops.specdec.sample``: one operator for CPU and CUDA.

Schemas (all parameters already normalised to per-row tensors, as in :class:`~specdec_ext._params.VerifyArgs`)::

    specdec::verify(Tensor target_logits, Tensor? draft_logits, Tensor draft_tokens, Tensor temperature,
                    Tensor top_k, Tensor top_p, Tensor num_draft_tokens, Tensor seed,
                    bool check=True) -> (Tensor, Tensor)

``check``: True blanks a row (tokens -1) for a bad value in any line up to its n_b, False only
for a bad value in a line its verification reads (the lines after the first rejection are not read).
    specdec::sample(Tensor logits, Tensor temperature, Tensor top_k, Tensor top_p, Tensor seed) -> Tensor

Kernels: CPU -> the C++ kernel (``specdec_ext._C``, which defines the schemas in C++ so compiled
graphs reach it without Python), or the eager reference when the extension is absent; CUDA -> the
Triton kernels; Meta / fake tensors -> shape functions below, so ``torch.compile(fullgraph=True)``
traces a call without a graph break.

:func:`specdec_ext.verify` goes through this operator only while ``torch.compile`` traces; eager
calls use the backend modules directly, which skips the dispatcher (bench/bench_cpp.py measures the
difference). Importing this module is what registers the CUDA and fake kernels; the C++ schema
points fake-tensor tracing here (``set_python_module``) so it is imported on demand as well.
"""

from __future__ import annotations

import torch

from . import _cpp_backend
from ._params import VerifyArgs

VERIFY_SCHEMA = (
    "verify(Tensor target_logits, Tensor? draft_logits, Tensor draft_tokens, Tensor temperature, Tensor top_k, Tensor top_p, "
    "Tensor num_draft_tokens, Tensor seed, bool check=True) -> (Tensor, Tensor)"
)
SAMPLE_SCHEMA = "sample(Tensor logits, Tensor temperature, Tensor top_k, Tensor top_p, Tensor seed) -> Tensor"


def _args(target_logits, draft_logits, draft_tokens, temperature, top_k, top_p, num_draft_tokens, check) -> VerifyArgs:
    """A VerifyArgs for the Python backends (``.to`` is free when the dtype already matches)."""
    return VerifyArgs(
        target_logits, draft_logits, draft_tokens, temperature.to(torch.float32), top_k.to(torch.int64), top_p.to(torch.float32),
        num_draft_tokens.to(torch.int64), generator=None, check=check,
    )


def _verify_eager(target_logits, draft_logits, draft_tokens, temperature, top_k, top_p, num_draft_tokens, seed, check=True):
    from .reference import verify_eager

    return verify_eager(_args(target_logits, draft_logits, draft_tokens, temperature, top_k, top_p, num_draft_tokens, check), seed)


def _verify_triton(target_logits, draft_logits, draft_tokens, temperature, top_k, top_p, num_draft_tokens, seed, check=True):
    from . import _triton_backend

    return _triton_backend.verify(_args(target_logits, draft_logits, draft_tokens, temperature, top_k, top_p, num_draft_tokens, check), seed)


def _sample_with(verify_kernel):
    """sample = verify with K = 0 (the bonus draw), so both draw from one stream."""

    def sample_kernel(logits, temperature, top_k, top_p, seed):
        batch = logits.shape[0]
        no_drafts = torch.empty((batch, 0), dtype=torch.int64, device=logits.device)
        none_used = torch.zeros((batch,), dtype=torch.int64, device=logits.device)
        tokens, _ = verify_kernel(logits[:, None, :], None, no_drafts, temperature, top_k, top_p, none_used, seed)
        return tokens[:, 0].contiguous()

    return sample_kernel


def _verify_fake(target_logits, draft_logits, draft_tokens, temperature, top_k, top_p, num_draft_tokens, seed, check=True):
    batch, length, _ = target_logits.shape
    return target_logits.new_empty((batch, length), dtype=torch.int64), target_logits.new_empty((batch,), dtype=torch.int64)


def _sample_fake(logits, temperature, top_k, top_p, seed):
    return logits.new_empty((logits.shape[0],), dtype=torch.int64)


def _already_defined() -> bool:
    # The C++ extension defines both schemas when it loads. Checking the registry (rather than
    # is_available()) also copes with a test that hides a loaded extension from Python.
    return hasattr(torch.ops.specdec, "verify")


if _cpp_backend.is_available() or _already_defined():
    _lib = torch.library.Library("specdec", "FRAGMENT")  # schemas and CPU kernels come from C++
    CPU_KERNEL = "cpp"
else:
    _lib = torch.library.Library("specdec", "DEF")
    _lib.define(VERIFY_SCHEMA)
    _lib.define(SAMPLE_SCHEMA)
    _lib.impl("verify", _verify_eager, "CPU")
    _lib.impl("sample", _sample_with(_verify_eager), "CPU")
    CPU_KERNEL = "eager"

_lib.impl("verify", _verify_triton, "CUDA")
_lib.impl("sample", _sample_with(_verify_triton), "CUDA")
torch.library.register_fake("specdec::verify", _verify_fake, lib=_lib)
torch.library.register_fake("specdec::sample", _sample_fake, lib=_lib)


def verify(args: VerifyArgs, seed: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Run a validated call through ``torch.ops.specdec.verify`` (the path compiled graphs take)."""
    return torch.ops.specdec.verify(
        args.target_logits, args.draft_logits, args.draft_tokens, args.temperature, args.top_k, args.top_p, args.num_draft_tokens, seed, args.check
    )
