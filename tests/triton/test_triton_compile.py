"""The Triton kernels compile for a Hopper GPU (sm_90) here, without one. The interpreter tests
check what the kernels compute; this checks that the GPU compiler accepts every variant the
launchers use, which the interpreter never does (see tests/support/triton_compile_check.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton")

CHECK = Path(__file__).resolve().parents[1] / "support" / "triton_compile_check.py"


@pytest.mark.slow  # a minute with a cold Triton cache; CI runs it (make test-slow)
def test_every_kernel_variant_compiles_for_hopper():
    env = dict(os.environ, TRITON_INTERPRET="0", TRITON_DEFAULT_FP_FUSION="1")
    result = subprocess.run([sys.executable, str(CHECK)], capture_output=True, text=True, env=env, timeout=600)
    if result.returncode == 3:
        pytest.skip(result.stdout.strip().splitlines()[-1])
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    assert result.stdout.strip().splitlines()[-1].startswith("ok ")


_SASS = """
        /*0000*/                   MOV R1, c[0x0][0x28] ;
        /*0010*/                   LDG.E R2, desc[UR4][R4.64] ;
        /*0020*/                   FMNMX R3, R2, R3, !PT ;
        /*0030*/               @P0 BRA 0x10 ;
        /*0040*/                   EXIT ;
        /*0050*/                   BRA 0x30 ;
        /*0060*/                   BRA 0x60 ;
"""


def test_the_model_finds_every_backward_branch():
    """A backward branch before the last EXIT is a loop the model must know; one after it (the
    return from an out-of-line warp-divergence path) is none. A kernel the model has no kinds for
    leaves its loop unknown, which fails the compile check."""
    from bench.gpu_model import analyse, unknown_loops

    code = analyse(_SASS, "REG:8 STACK:0 SHARED:0 LOCAL:0")
    assert [(loop.start, loop.end, loop.instructions) for loop in code.loops] == [(0x10, 0x30, 3)]
    assert unknown_loops("line_stats", code) == []  # a statistics tile (a load, no exp: greedy)
    assert unknown_loops("no such kernel", code) == code.loops



def test_key_windows_follow_the_histogram_lowering():
    """The top-k and top-p key windows (``key_window_default``, chosen by Triton's version) are on
    exactly where this Triton's tl.histogram takes one shared-memory atomic a value (3.8 and later;
    3.6 and 3.7 take warp ballots and popcounts): the probe's SASS decides, not the version."""
    env = dict(os.environ, TRITON_INTERPRET="0")
    result = subprocess.run([sys.executable, str(CHECK), "--lowering"], capture_output=True, text=True, env=env, timeout=300)
    if result.returncode == 3:
        pytest.skip(result.stdout.strip().splitlines()[-1])
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
