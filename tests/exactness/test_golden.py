"""Same seeds, same tokens, before and after: every golden case (tests/golden/cases.py) on every
backend reproduces the outputs recorded in tests/golden/outputs.json."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

import specdec_ext
from tests.golden.cases import LOGPROB_TOLERANCE, all_cases, backends_for, key

RECORDS = json.loads((Path(__file__).resolve().parents[1] / "golden" / "outputs.json").read_text())["records"]
CASES = [(kind, name, run, backend) for kind, name, run in all_cases() for backend in backends_for(kind)]


def _close(got, want) -> bool:
    if isinstance(want, list):
        return len(got) == len(want) and all(_close(g, w) for g, w in zip(got, want, strict=True))
    if math.isnan(want):
        return math.isnan(got)
    return got == want or abs(got - want) <= LOGPROB_TOLERANCE


@pytest.mark.parametrize(("kind", "name", "run", "backend"), CASES, ids=[key(k, n, b) for k, n, _, b in CASES])
def test_golden(kind, name, run, backend):
    if backend not in specdec_ext.available_backends("cpu"):
        pytest.skip(f"{backend} is not available here")
    want = RECORDS[key(kind, name, backend)]
    got = run(backend)
    assert set(got) == set(want)
    for field, value in want.items():
        if field in ("logprobs", "accept_probs"):
            assert _close(got[field], value), f"{field} differs"
        else:
            assert got[field] == value, f"{field} differs"


def test_golden_fails_on_a_changed_stream():
    """The comparison can fail: a different key gives other tokens for a recorded case."""
    from tests.golden import cases

    setting = cases.CHAIN_SETTINGS[1]
    args = cases.chain_inputs(1, setting)
    args["seeds"] = args["seeds"] + 1
    out = specdec_ext.verify(**args, backend="eager")
    assert out.tokens.tolist() != RECORDS[key("verify_token", setting[0], "eager")]["tokens"]
