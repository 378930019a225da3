"""Hugging Face integration.

* :func:`install` / :func:`uninstall` / :func:`fused_verification`: replace the module global
  ``transformers.generation.utils._speculative_sampling`` with a version built on
  :func:`specdec_ext.verify`. ``GenerationMixin._assisted_decoding`` looks that global up on every call,
  so ``model.generate(..., assistant_model=draft, do_sample=True)`` then verifies with the fused kernel.
  Greedy assisted generation never calls it and is left alone.
* :func:`speculative_generate`: batched speculative generation (:func:`specdec_ext.generate`) as a
  ``custom_generate`` callable: ``target.generate(ids, custom_generate=speculative_generate, draft_model=draft)``.
"""

from __future__ import annotations

import functools
import inspect
import warnings
from contextlib import contextmanager

from .api import available_backends, verify

# Parameter lists of _speculative_sampling this hook understands. Checked against transformers 5.17
# (with is_done_candidate) and 5.24 (without); anything else keeps transformers' own function.
_KNOWN_SIGNATURES = {
    ("candidate_input_ids", "candidate_logits", "candidate_length", "new_logits", "is_done_candidate"),
    ("candidate_input_ids", "candidate_logits", "candidate_length", "new_logits", "is_done_candidate", "assistant_ensemble_weight"),
    ("candidate_input_ids", "candidate_logits", "candidate_length", "new_logits", "assistant_ensemble_weight"),
}

_original = None  # the function install() replaced, while installed
_warned: set[str] = set()
_counts = {"fused": 0, "fallback": 0}


def _warn_once(key: str, message: str) -> None:
    if key not in _warned:
        _warned.add(key)
        warnings.warn(message, RuntimeWarning, stacklevel=3)


def call_counts() -> dict[str, int]:
    """How often the installed hook verified with the fused kernel and how often it fell back to the original."""
    return dict(_counts)


def _fused_sampling(candidate_input_ids, candidate_logits, candidate_length, new_logits, is_done_candidate=None):
    """Algorithm 1 of Leviathan et al. on the processed logits transformers passes, by one fused call.

    The logits arrive already processed by the warpers (-inf where filtered), so no temperature or
    filter is applied again. ``new_logits`` is read again by the caller and is never written.
    Returns (valid_tokens (1, n+1) int64, n) like the original.
    """
    length = int(candidate_length)
    drafts = candidate_input_ids[:, candidate_input_ids.shape[1] - length:]
    result = verify(new_logits, candidate_logits[:, :length], drafts, check=False)
    row = result.tokens[0].tolist()  # the one host sync: how many tokens to keep
    emitted = sum(token >= 0 for token in row)
    if emitted == 0:
        raise ValueError("assisted generation: the target or assistant logits contain NaN / +inf, or a position where every logit is -inf")
    n_matches = emitted - 1
    if length and is_done_candidate is not None and bool(is_done_candidate) and n_matches == length:
        # transformers <= 5.17: the candidates end the sequence (EOS or max length), so no bonus token.
        return drafts, length - 1
    return result.tokens[:, :emitted], n_matches


def _has_fused_backend(device) -> bool:
    backends = available_backends(device)
    return "triton" in backends if device.type == "cuda" else "cpp" in backends


def _make_hook(original):
    signature = inspect.signature(original)

    @functools.wraps(original)
    def hook(*args, **kwargs):
        arguments = signature.bind(*args, **kwargs).arguments
        if arguments.get("assistant_ensemble_weight") is not None:
            # Ensemble verification deliberately changes the law; the fused kernel implements exact sampling only.
            _warn_once("ensemble", "specdec_ext.hf: assistant_ensemble_weight is set; using transformers' own _speculative_sampling")
            _counts["fallback"] += 1
            return original(*args, **kwargs)
        device = arguments["new_logits"].device
        if not _has_fused_backend(device):
            # The eager reference is the specification, not a speed-up: without a fused kernel
            # (the C++ extension did not build, or Triton is missing) transformers' own code is faster.
            _warn_once(f"eager-{device.type}", f"specdec_ext.hf: no fused kernel on {device} (backends: {available_backends(device)}); "
                                               "using transformers' own _speculative_sampling")
            _counts["fallback"] += 1
            return original(*args, **kwargs)
        _counts["fused"] += 1
        return _fused_sampling(arguments["candidate_input_ids"], arguments["candidate_logits"], arguments["candidate_length"],
                               arguments["new_logits"], arguments.get("is_done_candidate"))

    hook.__specdec_hook__ = True
    return hook


def install() -> bool:
    """Replace transformers' ``_speculative_sampling`` with the fused version; idempotent.

    Returns True when the fused version is in place. For a signature this module does not know, it
    warns once and leaves transformers' function alone (returns False).
    """
    global _original
    from transformers.generation import utils

    current = utils._speculative_sampling
    if getattr(current, "__specdec_hook__", False):
        return True
    names = tuple(inspect.signature(current).parameters)
    if names not in _KNOWN_SIGNATURES:
        _warn_once("signature", f"specdec_ext.hf: unknown _speculative_sampling{inspect.signature(current)}; keeping transformers' own")
        return False
    _original = current
    utils._speculative_sampling = _make_hook(current)
    return True


def uninstall() -> None:
    """Restore the function :func:`install` replaced (no-op when not installed)."""
    global _original
    from transformers.generation import utils

    if _original is None:
        return
    if getattr(utils._speculative_sampling, "__specdec_hook__", False):
        utils._speculative_sampling = _original
    else:
        warnings.warn("specdec_ext.hf: _speculative_sampling was replaced by someone else since install(); leaving it", RuntimeWarning, stacklevel=2)
    _original = None


@contextmanager
def fused_verification():
    """``with fused_verification(): model.generate(..., assistant_model=draft, do_sample=True)``.

    Restores the previous state on exit (an outer install() stays installed).
    """
    was_installed = _original is not None
    install()
    try:
        yield
    finally:
        if not was_installed:
            uninstall()


_SUPPORTED_PROCESSORS = ("TemperatureLogitsWarper", "TopKLogitsWarper", "TopPLogitsWarper")
_SUPPORTED_CRITERIA = ("MaxLengthCriteria", "EosTokenCriteria")
# Model inputs transformers prepares itself; generate() rebuilds what it needs from the mask.
_IGNORED_MODEL_KWARGS = ("attention_mask", "cache", "past_key_values", "use_cache", "logits_to_keep", "position_ids", "cache_position")


def speculative_generate(model, input_ids, logits_processor=None, stopping_criteria=None, generation_config=None,
                         synced_gpus=False, streamer=None, *, draft_model=None, num_draft_tokens=4, generator=None, **model_kwargs):
    """:func:`specdec_ext.generate` as a transformers ``custom_generate`` callable.

    ``target.generate(input_ids, attention_mask=mask, custom_generate=speculative_generate,
    draft_model=draft, do_sample=True, temperature=0.7, max_new_tokens=64)``. transformers passes a
    callable neither ``assistant_model`` nor ``streamer``, so the draft comes as ``draft_model``;
    ``num_draft_tokens`` (int or "auto") and ``generator`` may be passed the same way. Sampling
    parameters, lengths, EOS and padding come from the generation config; logits processors other
    than temperature / top-k / top-p and stopping criteria other than length / EOS raise ValueError.
    Returns the (B, L_in + max_new_tokens) sequences, or a ``GenerateDecoderOnlyOutput`` holding them
    when ``return_dict_in_generate`` is set.
    """
    from .generate import generate

    if draft_model is None:
        raise ValueError("speculative_generate needs the draft as draft_model=... (transformers does not pass assistant_model to a callable)")
    unsupported = [type(p).__name__ for p in (logits_processor or []) if type(p).__name__ not in _SUPPORTED_PROCESSORS]
    unsupported += [type(c).__name__ for c in (stopping_criteria or []) if type(c).__name__ not in _SUPPORTED_CRITERIA]
    if unsupported:
        raise ValueError(f"speculative_generate supports temperature, top-k, top-p, max length and EOS only; got {unsupported}")
    config = generation_config
    if streamer is not None or synced_gpus or (config.num_beams or 1) > 1:
        raise ValueError("speculative_generate does not support streamer, synced_gpus or beam search")
    _check_model_kwargs(model_kwargs)
    output = generate(
        model, draft_model, input_ids, model_kwargs.get("attention_mask"),
        max_new_tokens=max(config.max_length - input_ids.shape[1], 0), do_sample=bool(config.do_sample),
        temperature=1.0 if config.temperature is None else config.temperature, top_k=config.top_k or None,
        top_p=config.top_p, num_draft_tokens=num_draft_tokens, generator=generator,
        eos_token_id=config.eos_token_id, pad_token_id=config.pad_token_id,
    )
    if config.return_dict_in_generate:
        from transformers.generation.utils import GenerateDecoderOnlyOutput

        return GenerateDecoderOnlyOutput(sequences=output.sequences)
    return output.sequences


def _check_model_kwargs(model_kwargs: dict) -> None:
    for name, value in model_kwargs.items():
        if name in ("cache", "past_key_values") and value is not None and value.get_seq_length() > 0:
            raise ValueError("speculative_generate starts from the prompt; continuing from a filled cache is not supported")
        if name not in _IGNORED_MODEL_KWARGS and value is not None and value is not False:
            raise ValueError(f"speculative_generate does not support the model input {name!r}")
