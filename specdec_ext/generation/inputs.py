"""Checks of what a generation call is given: models, prompts, keys, sampling, EOS and padding."""

from __future__ import annotations

import torch


def output_vocab(model) -> int:
    """The size of the model's output (logit) vocabulary."""
    head = model.get_output_embeddings() if callable(getattr(model, "get_output_embeddings", None)) else None
    weight = getattr(head, "weight", None)
    if isinstance(weight, torch.Tensor):
        return weight.shape[0]
    return model.config.get_text_config().vocab_size


def check_models(target_model, draft_model) -> None:
    """Decoder-only causal LMs whose vocabularies agree (the draft's may be a prefix of the target's)."""
    for name, model in (("target_model", target_model), ("draft_model", draft_model)):
        if model is None and name == "draft_model":
            return
        if getattr(model, "config", None) is None or not callable(getattr(model, "get_input_embeddings", None)):
            raise ValueError(f"{name} must be a transformers causal language model, got {type(model).__name__}")
        if getattr(model.config, "is_encoder_decoder", False):
            raise ValueError(f"{name} ({type(model).__name__}) is an encoder-decoder model; generate() takes decoder-only causal LMs")
    target_vocab, draft_vocab = output_vocab(target_model), output_vocab(draft_model)
    if draft_vocab > target_vocab:
        raise ValueError(
            f"the draft's vocabulary ({draft_vocab} ids) is larger than the target's ({target_vocab}): the models do not share a "
            "vocabulary. The draft's token ids must mean the same as the target's; only the target may have extra (padding) ids."
        )


def check_inputs(input_ids, attention_mask, device) -> tuple[torch.Tensor, torch.Tensor]:
    """(input_ids, attention_mask) as int64 on ``device``; prompts must be left-padded."""
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


def check_max_new_tokens(max_new_tokens) -> None:
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 0:
        raise ValueError(f"max_new_tokens must be an integer >= 0, got {max_new_tokens!r}")


def check_seeds(seeds, batch: int, device) -> torch.Tensor | None:
    """(B,) int64 per-row keys on ``device``, or None."""
    if seeds is None:
        return None
    try:
        values = torch.as_tensor(seeds)
    except (TypeError, ValueError, RuntimeError):
        raise ValueError(f"seeds must be {batch} integers >= 0, got {seeds!r}") from None
    if values.dtype not in (torch.int32, torch.int64) or values.shape != (batch,) or bool((values < 0).any()):
        raise ValueError(f"seeds must be {batch} integers >= 0 (one per row), got {seeds!r}")
    return values.to(device=device, dtype=torch.int64)


def check_sampling(do_sample, temperature, top_k, top_p) -> dict:
    """The kernel's sampling parameters; greedy (temperature 0, no filter) when ``do_sample`` is False."""
    if not do_sample:
        return {"temperature": 0.0, "top_k": None, "top_p": None}
    from .._params import _check_scalar_params

    for name, value in (("temperature", temperature), ("top_k", top_k), ("top_p", top_p)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))):
            raise ValueError(f"{name} must be a number or None, got {value!r}")
    if top_k is not None and not isinstance(top_k, int):
        raise ValueError(f"top_k must be an integer or None, got {top_k!r}")
    _check_scalar_params(temperature, top_k, top_p)
    return {"temperature": float(temperature), "top_k": top_k, "top_p": top_p}


def eos_ids(model, eos_token_id, device) -> torch.Tensor | None:
    """The ids that end a row: ``eos_token_id``, else the target's generation_config's; None for none."""
    if eos_token_id is None:
        eos_token_id = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    if eos_token_id is None:
        return None
    ids = eos_token_id.tolist() if isinstance(eos_token_id, torch.Tensor) else eos_token_id
    ids = [ids] if isinstance(ids, int) else list(ids)
    return torch.tensor(ids, dtype=torch.long, device=device) if ids else None


def pad_value(model, pad_token_id, eos) -> int:
    """The id that fills rows after their end: ``pad_token_id``, the generation_config's, the first EOS, or 0."""
    if pad_token_id is None:
        pad_token_id = getattr(getattr(model, "generation_config", None), "pad_token_id", None)
    if pad_token_id is None:
        pad_token_id = int(eos[0]) if eos is not None else 0
    return int(pad_token_id)


def check_attention_span(model, name: str, longest: int) -> None:
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
