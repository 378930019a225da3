"""Test set-up: Triton kernels run on CPU tensors through the interpreter."""

import os

# Must be set before triton is imported anywhere.
os.environ.setdefault("TRITON_INTERPRET", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest  # noqa: E402
import torch  # noqa: E402

import specdec_ext  # noqa: E402


def cpu_backends() -> list[str]:
    """Backends fast enough on CPU for large statistical runs (the interpreter is not)."""
    return [b for b in specdec_ext.available_backends("cpu") if b != "triton"]


def all_cpu_backends() -> list[str]:
    return specdec_ext.available_backends("cpu")


@pytest.fixture(autouse=True)
def _deterministic_threads():
    torch.manual_seed(0)
    yield


# Property tests explore the same examples on every run: CI stays reproducible.
from hypothesis import settings  # noqa: E402

settings.register_profile("deterministic", derandomize=True, print_blob=True)
settings.load_profile("deterministic")
