"""Fast, exact speculative decoding for Hugging Face transformers.

``verify`` runs modified rejection sampling over a block of draft tokens straight from raw logits
(token-wise or block verification), ``verify_tree`` over a tree of drafts; ``sample`` draws tokens
with the same processing. They dispatch to fused Triton kernels (CUDA), a C++ kernel (CPU) or the
eager PyTorch reference, which share one random stream. ``Verifier`` and ``Sampler`` bind those
calls once for a loop's batch shape and parameters. ``generate`` runs batched speculative
generation with a transformers target and draft; ``specdec_ext.hf`` (imported on first use) hooks
transformers' own assisted generation.
"""

from .api import TreeResult, VerifyResult, available_backends, sample, verify, verify_tree
from .generate import SpeculativeOutput, generate
from .prepared import Sampler, Verifier

__all__ = ["Sampler", "SpeculativeOutput", "TreeResult", "VerifyResult", "Verifier", "available_backends", "generate", "sample", "verify", "verify_tree"]
__version__ = "0.1.0"


def __getattr__(name):
    # specdec_ext.hf imports transformers' generation utilities: load it only when asked for.
    if name == "hf":
        import importlib

        return importlib.import_module(".hf", __name__)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
