"""``torch.ops.specdec.verify`` and ``torch.ops.specdec.sample``: one operator for CPU and CUDA.

Schemas (all parameters already normalised to per-row tensors, as in :class:`~specdec_ext._params.VerifyArgs`)::

    specdec::verify(Tensor target_logits, Tensor? draft_logits, Tensor draft_tokens, Tensor temperature,
                    Tensor top_k, Tensor top_p, Tensor num_draft_tokens, Tensor? seeds, Tensor? offsets,
                    int base_key, int stream=1, bool check=True, int logprobs=0,
                    bool accept_probs=False) -> (Tensor, Tensor, Tensor, Tensor)
    specdec::sample(Tensor logits, Tensor temperature, Tensor top_k, Tensor top_p, Tensor? seeds,
                    Tensor? offsets, int base_key) -> Tensor

``seeds`` / ``base_key`` / ``offsets`` / ``stream``: the random stream (specdec_ext/_philox.py).
``check``: True blanks a row (tokens -1) for a bad value in any line up to its n_b, False only
for a bad value in a line its verification reads (the lines after the first rejection are not read).
``logprobs`` (0 none, 1 processed, 2 raw) and ``accept_probs`` ask for the optional outputs; the
verify op returns them as (B, K+1) / (B, K) float32 tensors, or empty (0,) tensors when not asked.

Kernels: CPU -> the C++ kernel (``specdec_ext._C``, which defines the schemas in C++ so compiled
graphs reach it without Python), or the eager reference when the extension is absent; CUDA -> the
Triton kernels; Meta / fake tensors -> shape functions below, so ``torch.compile(fullgraph=True)``
traces a call without a graph break.

:func:`specdec_ext.verify` goes through this operator only while ``torch.compile`` traces; eager
calls use the backend modules directly, which skips the dispatcher (bench/bench_cpp.py measures the
difference). Importing this module is what registers the CUDA and fake kernels, after the C++
extension (imported first, through :mod:`specdec_ext._cpp_backend`) defined the schemas;
``import specdec_ext`` imports it through the backend table (:mod:`specdec_ext._dispatch`), so the
ops trace under FakeTensorMode and torch.compile from the start.
"""

from __future__ import annotations

import torch

from . import _cpp_backend
from ._params import LOGPROBS_NONE, VerifyArgs
from ._philox import SAMPLE_STREAM, VERIFY_STREAM

VERIFY_SCHEMA = (
    "verify(Tensor target_logits, Tensor? draft_logits, Tensor draft_tokens, Tensor temperature, Tensor top_k, Tensor top_p, "
    "Tensor num_draft_tokens, Tensor? seeds, Tensor? offsets, int base_key, int stream=1, bool check=True, int logprobs=0, "
    "bool accept_probs=False) -> (Tensor, Tensor, Tensor, Tensor)"
)
SAMPLE_SCHEMA = "sample(Tensor logits, Tensor temperature, Tensor top_k, Tensor top_p, Tensor? seeds, Tensor? offsets, int base_key) -> Tensor"


def _args(target_logits, draft_logits, draft_tokens, temperature, top_k, top_p, num_draft_tokens, seeds, offsets, stream, check, logprobs, accept_probs) -> VerifyArgs:
    """A VerifyArgs for the Python backends (``.to`` is free when the dtype already matches)."""
    return VerifyArgs(
        target_logits, draft_logits, draft_tokens, temperature.to(torch.float32), top_k.to(torch.int64), top_p.to(torch.float32),
        num_draft_tokens.to(torch.int64), generator=None, check=check, seeds=seeds, offsets=offsets, stream=stream,
        logprobs=logprobs, accept_probs=accept_probs,
    )


def _optional_outputs(target_logits, logprobs_out, accept_out):
    """The op always returns four tensors: the optional outputs, or empty (0,) float32 ones."""
    def empty():  # one each: outputs of a custom op may not alias each other
        return target_logits.new_empty((0,), dtype=torch.float32)

    return (logprobs_out if logprobs_out is not None else empty()), (accept_out if accept_out is not None else empty())


def _verify_with(backend_verify):
    def verify_kernel(
        target_logits, draft_logits, draft_tokens, temperature, top_k, top_p, num_draft_tokens, seeds, offsets, base_key,
        stream=VERIFY_STREAM, check=True, logprobs=LOGPROBS_NONE, accept_probs=False,
    ):
        args = _args(target_logits, draft_logits, draft_tokens, temperature, top_k, top_p, num_draft_tokens, seeds, offsets, stream, check, logprobs, accept_probs)
        tokens, num_accepted, logprobs_out, accept_out = backend_verify(args, base_key)
        return (tokens, num_accepted, *_optional_outputs(target_logits, logprobs_out, accept_out))

    return verify_kernel


def _verify_eager_backend(args, base_key):
    from .reference import verify_eager

    return verify_eager(args, base_key)


def _verify_triton_backend(args, base_key):
    from . import _triton_backend

    return _triton_backend.verify(args, base_key)


def _sample_with(verify_kernel):
    """sample = the bonus draw of verify with K = 0, raced on the sample stream."""

    def sample_kernel(logits, temperature, top_k, top_p, seeds, offsets, base_key):
        batch = logits.shape[0]
        no_drafts = torch.empty((batch, 0), dtype=torch.int64, device=logits.device)
        none_used = torch.zeros((batch,), dtype=torch.int64, device=logits.device)
        tokens = verify_kernel(logits[:, None, :], None, no_drafts, temperature, top_k, top_p, none_used, seeds, offsets, base_key, SAMPLE_STREAM)[0]
        return tokens[:, 0].contiguous()

    return sample_kernel


_verify_eager = _verify_with(_verify_eager_backend)
_verify_triton = _verify_with(_verify_triton_backend)


def _verify_fake(
    target_logits, draft_logits, draft_tokens, temperature, top_k, top_p, num_draft_tokens, seeds, offsets, base_key,
    stream=VERIFY_STREAM, check=True, logprobs=LOGPROBS_NONE, accept_probs=False,
):
    batch, length, _ = target_logits.shape
    logprobs_out = target_logits.new_empty((batch, length) if logprobs != LOGPROBS_NONE else (0,), dtype=torch.float32)
    accept_out = target_logits.new_empty((batch, length - 1) if accept_probs else (0,), dtype=torch.float32)
    return target_logits.new_empty((batch, length), dtype=torch.int64), target_logits.new_empty((batch,), dtype=torch.int64), logprobs_out, accept_out


def _sample_fake(logits, temperature, top_k, top_p, seeds, offsets, base_key):
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


def verify(args: VerifyArgs, base_key: int):
    """Run a validated call through ``torch.ops.specdec.verify`` (the path compiled graphs take);
    returns (tokens, num_accepted, logprobs or None, accept_probs or None)."""
    tokens, num_accepted, logprobs, accept_probs = torch.ops.specdec.verify(
        args.target_logits, args.draft_logits, args.draft_tokens, args.temperature, args.top_k, args.top_p, args.num_draft_tokens,
        args.seeds, args.offsets, base_key, args.stream, args.check, args.logprobs, args.accept_probs,
    )
    return tokens, num_accepted, (logprobs if args.logprobs != LOGPROBS_NONE else None), (accept_probs if args.accept_probs else None)
