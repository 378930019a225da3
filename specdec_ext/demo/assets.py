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
