"""Locate and load the target/draft pair embedded in the package."""

from __future__ import annotations

from pathlib import Path

import torch

#: Directory holding ``tokenizer/``, ``target/`` and ``draft/`` (written by ``train_pair``).
#: Resolved relative to this file so it works from a source checkout and an installed wheel alike.
PAIR_DIR = Path(__file__).parent / "pair"


def load_pair(device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32):
    """Return ``(target, draft, tokenizer)`` from :data:`PAIR_DIR`, in eval mode.

    Loading is strictly local (``local_files_only=True``): the demo must never reach a model hub. The
    weights are stored in float16 to keep the package small; ``dtype`` chooses the compute precision
    (float32 by default, since float16 matmuls are slow or unsupported on many CPUs).
    """
    # Imported here so that importing the package does not pay for transformers.
    from transformers import AutoTokenizer, LlamaForCausalLM

    if not (PAIR_DIR / "target" / "config.json").is_file():
        raise FileNotFoundError(
            f"demo model pair not found in {PAIR_DIR}; regenerate it with "
            "`python -m specdec_ext.demo.train_pair --out specdec_ext/demo/pair`"
        )
    tokenizer = AutoTokenizer.from_pretrained(PAIR_DIR / "tokenizer", local_files_only=True)
    models = []
    for name in ("target", "draft"):
        model = LlamaForCausalLM.from_pretrained(PAIR_DIR / name, local_files_only=True, dtype=dtype)
        models.append(model.to(device).eval())
    target, draft = models
    return target, draft, tokenizer


def early_exit_draft(target, num_layers: int = 1):
    """A weak draft with no weights of its own: the target's first ``num_layers`` decoder layers,
    followed by its final norm and LM head (self-speculative, "early exit" drafting).

    The modules are the target's own (shared, not copied), so it costs no memory; it has its own
    KV cache like any draft. It was never trained to predict from an early layer, so it proposes
    much worse than the distilled draft: the harder setting in which several siblings per node pay
    off (see ``bench/e2e_tree.py``). Works for Llama-style ``*ForCausalLM`` models
    (``model.embed_tokens``, ``model.layers``, ``model.norm``, ``model.rotary_emb``, ``lm_head``).
    """
    import copy

    layers = target.model.layers
    if not 1 <= num_layers <= len(layers):
        raise ValueError(f"num_layers must lie in [1, {len(layers)}] (the target's decoder layers), got {num_layers}")
    config = copy.deepcopy(target.config)
    config.num_hidden_layers = num_layers
    if getattr(config, "layer_types", None) is not None:
        config.layer_types = config.layer_types[:num_layers]
    with torch.device("meta"):
        draft = type(target)(config)
    draft.model.embed_tokens = target.model.embed_tokens
    draft.model.layers = torch.nn.ModuleList(layers[:num_layers])
    draft.model.norm = target.model.norm
    draft.model.rotary_emb = target.model.rotary_emb
    draft.lm_head = target.lm_head
    draft.generation_config = copy.deepcopy(target.generation_config)
    return draft.eval()
