"""The Triton kernels compile for a Hopper GPU (sm_90) here, without one. The interpreter tests
check what the kernels compute; this checks that the GPU compiler accepts every variant the
launchers use, which the interpreter never does (see tests/triton_compile_check.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton")

CHECK = Path(__file__).resolve().parent / "triton_compile_check.py"


@pytest.mark.slow  # a minute with a cold Triton cache; CI runs it (make test-slow)
def test_every_kernel_variant_compiles_for_hopper():
    env = dict(os.environ, TRITON_INTERPRET="0", TRITON_DEFAULT_FP_FUSION="1")
    result = subprocess.run([sys.executable, str(CHECK)], capture_output=True, text=True, env=env, timeout=600)
    if result.returncode == 3:
        pytest.skip(result.stdout.strip().splitlines()[-1])
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    assert result.stdout.strip().splitlines()[-1].startswith("ok ")
