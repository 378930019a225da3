"""Hugging Face integration.

* :func:`install` / :func:`uninstall` / :func:`fused_verification`: with the hook installed,
  ``model.generate(input_ids, attention_mask=..., assistant_model=draft, ...)`` (or
  ``prompt_lookup_num_tokens=...``) runs the batched speculative loop of :mod:`specdec_ext.generate`
  for any batch size -- transformers' own assisted generation takes batch size 1 only -- with the
  processors, stopping criteria, streamer and outputs transformers prepared. transformers' generate()
  dispatches to ``GenerationMixin._assisted_decoding`` by name on every call; the hook replaces that
  method. An argument the loop cannot honour makes it run transformers' own code instead, with one
  warning naming the argument: its assisted generation at batch size 1, its target-only decoding
  (the same law) above. The module global ``_speculative_sampling``, which transformers' assisted
  generation calls for sampled verification, is replaced by a fused version too (same argument and
  return types), so that fallback verifies with the fused kernel as well.
* :func:`speculative_generate`: the same loop as a ``custom_generate`` callable:
  ``target.generate(ids, custom_generate=speculative_generate, draft_model=draft)``.
"""

from __future__ import annotations

import functools
import inspect
import warnings
from contextlib import contextmanager

import torch

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
_counts = {"fused": 0, "fallback": 0, "loop": 0, "fallback_loop": 0}
_last: dict = {}


def _warn_once(key: str, message: str) -> None:
    if key not in _warned:
        _warned.add(key)
        warnings.warn(message, RuntimeWarning, stacklevel=3)


def call_counts() -> dict[str, int]:
    """How often the hooks ran: "loop" (generate calls run by the batched loop), "fallback_loop" (calls
    handed back to transformers), "fused" / "fallback" (verifications by the fused function / the original)."""
    return dict(_counts)


def last_stats():
    """:class:`specdec_ext.generate.SpeculativeStats` of the latest generate() call the loop ran (None before any)."""
    return _last.get("stats")


def _fused_sampling(candidate_input_ids, candidate_logits, candidate_length, new_logits, is_done_candidate=None):
    """Algorithm 1 of Leviathan et al. on the processed logits transformers passes, by one fused call.

    The logits arrive already processed by the warpers (-inf where filtered), so no temperature or
    filter is applied again. ``new_logits`` is read again by the caller and is never written.
    Returns what the original returns: (valid_tokens (1, n+1) int64 on the logits' device, n_matches
    a 0-d int64 tensor on the same device).
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
        return drafts[:, :length], torch.tensor(length - 1, device=new_logits.device)
    return result.tokens[:, :emitted], torch.tensor(n_matches, device=new_logits.device)


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


_original_assisted = None  # GenerationMixin._assisted_decoding, while the loop hook is installed
_settings = {"num_draft_tokens": None}


def install(*, loop: bool = True, num_draft_tokens: int | str | None = None) -> bool:
    """Install the hooks; idempotent. Returns True when the fused verification function is in place.

    Args:
        loop: also route ``generate(..., assistant_model=...)`` / ``prompt_lookup_num_tokens=...`` through
            the batched speculative loop (any batch size). False keeps transformers' assisted loop and
            only swaps its verification function.
        num_draft_tokens: drafts per step for the loop. None: the assistant's ``num_assistant_tokens``
            when its schedule is "constant" and ``assistant_confidence_threshold`` is off, else "auto"
            (the K that maximises the expected speed-up from the measured acceptance and cost).

    For a ``_speculative_sampling`` signature this module does not know, it warns once and leaves
    that function alone (returns False).
    """
    global _original, _original_assisted
    from transformers.generation import utils

    _settings["num_draft_tokens"] = num_draft_tokens
    if loop and _original_assisted is None and hasattr(utils.GenerationMixin, "_assisted_decoding"):
        _original_assisted = utils.GenerationMixin._assisted_decoding
        utils.GenerationMixin._assisted_decoding = _make_loop_hook(_original_assisted)
    elif not loop:
        _uninstall_loop()
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


def _uninstall_loop() -> None:
    global _original_assisted
    from transformers.generation import utils

    if _original_assisted is None:
        return
    if getattr(utils.GenerationMixin._assisted_decoding, "__specdec_hook__", False):
        utils.GenerationMixin._assisted_decoding = _original_assisted
    else:
        warnings.warn("specdec_ext.hf: GenerationMixin._assisted_decoding was replaced by someone else since install(); leaving it",
                      RuntimeWarning, stacklevel=3)
    _original_assisted = None


def uninstall() -> None:
    """Restore what :func:`install` replaced (no-op when not installed)."""
    global _original
    from transformers.generation import utils

    _uninstall_loop()
    if _original is None:
        return
    if getattr(utils._speculative_sampling, "__specdec_hook__", False):
        utils._speculative_sampling = _original
    else:
        warnings.warn("specdec_ext.hf: _speculative_sampling was replaced by someone else since install(); leaving it", RuntimeWarning, stacklevel=2)
    _original = None


def installed() -> bool:
    return _original is not None or _original_assisted is not None


@contextmanager
def fused_verification(*, loop: bool = True, num_draft_tokens: int | str | None = None):
    """``with fused_verification(): model.generate(..., assistant_model=draft, ...)``.

    Restores the previous state on exit (an outer install() stays installed).
    """
    had_verification, had_loop, settings = _original is not None, _original_assisted is not None, dict(_settings)
    install(loop=loop, num_draft_tokens=num_draft_tokens)
    try:
        yield
    finally:
        if not had_loop:
            _uninstall_loop()
        elif _original_assisted is None:
            install(loop=True)
        _settings.update(settings)
        if not had_verification:
            _uninstall_verification()


def _uninstall_verification() -> None:
    global _original
    from transformers.generation import utils

    if _original is not None and getattr(utils._speculative_sampling, "__specdec_hook__", False):
        utils._speculative_sampling = _original
    _original = None


# ------------------------------------------------------------------------------------ the loop hook

# Model inputs transformers prepares itself; the loop rebuilds what it needs from the mask.
_PREPARED_MODEL_KWARGS = ("attention_mask", "cache", "past_key_values", "use_cache", "logits_to_keep", "position_ids", "cache_position")


def _make_loop_hook(original):
    signature = inspect.signature(original)

    @functools.wraps(original)
    def _assisted_decoding(self, *args, **kwargs):
        arguments = signature.bind(self, *args, **kwargs).arguments
        model_kwargs = dict(arguments.pop("model_kwargs", {}))
        input_ids = arguments["input_ids"]
        arguments["attention_mask"] = model_kwargs.get("attention_mask")  # None when transformers saw no padding
        try:
            plan = _plan(self, arguments, model_kwargs)
        except _Unsupported as reason:
            _counts["fallback_loop"] += 1
            batch = input_ids.shape[0]
            route = "its assisted generation" if batch == 1 else "its target-only decoding (the same law; its assisted generation takes batch size 1)"
            _warn_once(f"loop-{reason.argument}", f"specdec_ext.hf: {reason.argument}: {reason}; running transformers' own code, {route}")
            if batch == 1:
                return original(self, *args, **kwargs)
            return _target_only(self, arguments, model_kwargs)
        _counts["loop"] += 1
        return _run_loop(self, arguments, plan)

    _assisted_decoding.__specdec_hook__ = True
    return _assisted_decoding


class _Unsupported(Exception):
    def __init__(self, argument: str, why: str):
        super().__init__(why)
        self.argument = argument


def _target_only(model, arguments: dict, model_kwargs: dict):
    from transformers.generation.utils import GenerationMixin

    keep = {name: arguments[name] for name in ("logits_processor", "stopping_criteria", "generation_config", "synced_gpus", "streamer") if name in arguments}
    return GenerationMixin._sample(model, arguments["input_ids"], **keep, **model_kwargs)


def _plan(model, arguments: dict, model_kwargs: dict) -> dict:
    """Everything the loop needs from what transformers prepared, or _Unsupported naming what it cannot honour."""
    from .generation.inputs import check_attention_span, check_models
    from .processors import LogitsPipeline, UnsupportedProcessor
    from .stopping import Stopping

    config = arguments["generation_config"]
    input_ids = arguments["input_ids"]
    draft_model = arguments.get("assistant_model")
    lookup = getattr(config, "prompt_lookup_num_tokens", None)
    checks = [
        ("assistant_ensemble_weight", getattr(config, "assistant_ensemble_weight", None) is not None, "changes the sampling law on purpose"),
        ("assistant_early_exit", getattr(config, "assistant_early_exit", None) is not None, "self-speculation is not implemented here"),
        ("use_mtp", bool(getattr(config, "use_mtp", False)), "multi-token-prediction drafting is not implemented here"),
        ("speculation_type", getattr(config, "speculation_type", None) not in (None, "", "default"), "only draft-model and prompt-lookup drafting are implemented"),
        ("assistant_tokenizer", arguments.get("assistant_tokenizer") is not None, "the draft must share the target's vocabulary"),
        ("synced_gpus", bool(arguments.get("synced_gpus")), "multi-process lock-step decoding is not implemented"),
        ("output_attentions", bool(config.output_attentions) and bool(config.return_dict_in_generate), "attentions are not collected"),
        ("output_hidden_states", bool(config.output_hidden_states) and bool(config.return_dict_in_generate), "hidden states are not collected"),
        ("num_return_sequences", (config.num_return_sequences or 1) > 1, "one sequence per prompt"),
        ("cache_implementation", getattr(config, "cache_implementation", None) not in (None, "dynamic"), "the loop keeps its own dynamic caches"),
        ("streamer", arguments.get("streamer") is not None and input_ids.shape[0] > 1, "streamers take batch size 1"),
        ("encoder-decoder model", bool(getattr(model.config, "is_encoder_decoder", False)), "decoder-only models only"),
    ]
    for argument, bad, why in checks:
        if bad:
            raise _Unsupported(argument, why)
    if lookup is None and draft_model is None:
        raise _Unsupported("assistant_model", "no draft model and no prompt_lookup_num_tokens")
    if lookup is None and draft_model.__class__.__name__.startswith(("Gemma4Assistant", "Gemma4UnifiedAssistant")):
        raise _Unsupported("assistant_model", "shared-KV assistants are not implemented here")
    mask = model_kwargs.get("attention_mask")
    if mask is not None and (mask.dim() != 2 or not bool((mask[:, -1] != 0).all())):
        raise _Unsupported("attention_mask", "prompts must be left-padded (a 2-D mask whose last column is all ones)")
    for name, value in model_kwargs.items():
        if name in ("cache", "past_key_values"):
            if value is not None and hasattr(value, "get_seq_length") and value.get_seq_length() > 0:
                raise _Unsupported(name, "continuing from a filled cache is not implemented")
        elif name not in _PREPARED_MODEL_KWARGS and value is not None and value is not False:
            raise _Unsupported(name, "model inputs other than input_ids and attention_mask are not implemented")
    try:
        pipeline = LogitsPipeline(arguments["logits_processor"], do_sample=bool(config.do_sample))
    except UnsupportedProcessor as error:
        raise _Unsupported(error.argument, str(error)) from None
    criteria = list(arguments.get("stopping_criteria") or [])
    stopping = Stopping(criteria)
    eos = getattr(config, "_eos_token_tensor", None)
    pad = getattr(config, "_pad_token_tensor", None)
    max_new_tokens = max(int(config.max_length) - input_ids.shape[1], 0)
    if lookup is not None:
        draft_model, ngram, k = None, int(getattr(config, "max_matching_ngram_size", None) or 2), int(lookup)
    else:
        ngram = 0
        assistant_config = draft_model.generation_config
        constant = getattr(assistant_config, "num_assistant_tokens_schedule", "constant") == "constant"
        threshold = getattr(assistant_config, "assistant_confidence_threshold", None)
        k = int(assistant_config.num_assistant_tokens) if constant and not threshold else "auto"
    if _settings["num_draft_tokens"] is not None:
        k = _settings["num_draft_tokens"]
    try:
        check_models(model, draft_model)
        for name, each in (("target_model", model), ("draft_model", draft_model)):
            if each is not None:
                if "position_ids" not in inspect.signature(each.forward).parameters:
                    raise ValueError(f"{type(each).__name__}.forward takes no position_ids")
                check_attention_span(each, name, input_ids.shape[1] + max_new_tokens * ((k if isinstance(k, int) else 8) + 1))
    except ValueError as error:
        raise _Unsupported("assistant_model" if "draft" in str(error) or "vocabulary" in str(error) else "model", str(error)) from None
    return {"pipeline": pipeline, "stopping": stopping, "eos": eos, "pad": pad, "max_new_tokens": max_new_tokens, "draft_model": draft_model,
            "ngram": ngram, "num_draft_tokens": k}


def _run_loop(model, arguments: dict, plan: dict):
    from .generation.loop import speculate

    config = arguments["generation_config"]
    input_ids = arguments["input_ids"].to(model.device)
    mask = arguments["attention_mask"]
    mask = torch.ones_like(input_ids) if mask is None else mask.to(device=model.device, dtype=torch.long)
    eos = plan["eos"]
    eos = eos.reshape(-1).to(model.device) if eos is not None and eos.numel() else None
    pad = plan["pad"]
    pad = int(pad.reshape(-1)[0]) if pad is not None else (int(eos[0]) if eos is not None else 0)
    want_dict = bool(config.return_dict_in_generate)
    output = speculate(
        model, plan["draft_model"], input_ids, mask, pipeline=plan["pipeline"], stopping=plan["stopping"],
        max_new_tokens=plan["max_new_tokens"], num_draft_tokens=plan["num_draft_tokens"], ngram=plan["ngram"], generator=None,
        eos=eos, pad=pad, streamer=arguments.get("streamer"), output_scores=want_dict and bool(config.output_scores),
        output_logits=want_dict and bool(config.output_logits),
    )
    _last["stats"] = output.stats
    # transformers returns every row up to the longest one's end (later columns would be padding only).
    sequences = output.sequences[:, : input_ids.shape[1] + max(output.new_tokens, default=0)]
    if not want_dict:
        return sequences
    from transformers.generation.utils import GenerateDecoderOnlyOutput

    fields = {"sequences": sequences, "scores": output.scores, "logits": output.logits}
    return GenerateDecoderOnlyOutput(**{name: value for name, value in fields.items() if name in GenerateDecoderOnlyOutput.__dataclass_fields__})


# ------------------------------------------------------------------------------ custom_generate entry


def speculative_generate(model, input_ids, logits_processor=None, stopping_criteria=None, generation_config=None,
                         synced_gpus=False, streamer=None, *, draft_model=None, num_draft_tokens=4, generator=None, **model_kwargs):
    """The batched speculative loop as a transformers ``custom_generate`` callable.

    ``target.generate(input_ids, attention_mask=mask, custom_generate=speculative_generate,
    draft_model=draft, do_sample=True, temperature=0.7, max_new_tokens=64)``. transformers does not
    pass ``assistant_model`` to a callable, so the draft comes as ``draft_model``; ``num_draft_tokens``
    (int or "auto") and ``generator`` may be passed the same way. Processors, stopping criteria,
    lengths, EOS and padding come from what transformers prepared. Returns the (B, L_in + max_new_tokens)
    sequences, or a ``GenerateDecoderOnlyOutput`` when ``return_dict_in_generate`` is set.
    """
    from .generation.loop import speculate
    from .processors import LogitsPipeline
    from .stopping import Stopping

    if draft_model is None:
        raise ValueError("speculative_generate needs the draft as draft_model=... (transformers does not pass assistant_model to a callable)")
    config = generation_config
    if synced_gpus or (config.num_beams or 1) > 1:
        raise ValueError("speculative_generate does not support synced_gpus or beam search")
    _check_model_kwargs(model_kwargs)
    eos = getattr(config, "_eos_token_tensor", None)
    eos = eos.reshape(-1).to(model.device) if eos is not None and eos.numel() else None
    pad = getattr(config, "_pad_token_tensor", None)
    pad = int(pad.reshape(-1)[0]) if pad is not None else (int(eos[0]) if eos is not None else 0)
    mask = model_kwargs.get("attention_mask")
    want_dict = bool(config.return_dict_in_generate)
    output = speculate(
        model, draft_model, input_ids, mask if mask is not None else torch.ones_like(input_ids),
        pipeline=LogitsPipeline(logits_processor, do_sample=bool(config.do_sample)), stopping=Stopping(stopping_criteria),
        max_new_tokens=max(config.max_length - input_ids.shape[1], 0), num_draft_tokens=num_draft_tokens, ngram=0,
        generator=generator, eos=eos, pad=pad, streamer=streamer, output_scores=want_dict and bool(config.output_scores),
        output_logits=want_dict and bool(config.output_logits),
    )
    if want_dict:
        from transformers.generation.utils import GenerateDecoderOnlyOutput

        return GenerateDecoderOnlyOutput(sequences=output.sequences, scores=output.scores, logits=output.logits)
    return output.sequences


def _check_model_kwargs(model_kwargs: dict) -> None:
    for name, value in model_kwargs.items():
        if name in ("cache", "past_key_values") and value is not None and value.get_seq_length() > 0:
            raise ValueError("speculative_generate starts from the prompt; continuing from a filled cache is not supported")
        if name not in _PREPARED_MODEL_KWARGS and value is not None and value is not False:
            raise ValueError(f"speculative_generate does not support the model input {name!r}")
