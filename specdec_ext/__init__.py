"""Fast, exact speculative decoding for Hugging Face transformers.

``verify`` runs modified rejection sampling over a block of draft tokens straight from raw logits;
``sample`` draws tokens with the same processing. Both dispatch to fused Triton kernels (CUDA), a
C++ kernel (CPU) or the eager PyTorch reference, which share one random stream. ``generate`` runs
batched speculative generation with a transformers target and draft; ``specdec_ext.hf`` (imported on
first use) hooks transformers' own assisted generation.
"""

from .api import VerifyResult, available_backends, sample, verify
from .generate import SpeculativeOutput, generate
from .tree import TreeResult, verify_tree

__all__ = ["SpeculativeOutput", "TreeResult", "VerifyResult", "available_backends", "generate", "sample", "verify", "verify_tree"]
__version__ = "0.1.0"


def __getattr__(name):
    # specdec_ext.hf imports transformers' generation utilities: load it only when asked for.
    if name == "hf":
        import importlib

        return importlib.import_module(".hf", __name__)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
