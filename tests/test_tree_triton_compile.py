"""The Triton tree / block kernels compile for a Hopper GPU (sm_90) here, without one: the interpreter
tests check what they compute, this checks that the GPU compiler accepts every variant the launchers
use (see tests/tree_triton_compile_check.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton")

CHECK = Path(__file__).resolve().parent / "tree_triton_compile_check.py"


@pytest.mark.slow  # a minute with a cold Triton cache; CI runs it (make test-slow)
def test_every_tree_kernel_variant_compiles_for_hopper():
    env = dict(os.environ, TRITON_INTERPRET="0", TRITON_DEFAULT_FP_FUSION="1")
    result = subprocess.run([sys.executable, str(CHECK)], capture_output=True, text=True, env=env, timeout=900)
    if result.returncode == 3:
        pytest.skip(result.stdout.strip().splitlines()[-1])
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    assert result.stdout.strip().splitlines()[-1].startswith("ok ")
