"""The sampled-start study's rules (bench/experiments/sampled_start.py): what they report about a
line is what its exact counts and masses say."""

import numpy as np
import pytest

from bench.experiments import sampled_start as study
from bench.gpu_model import _fixed_weights, _order_key, _order_keys, _top_p_floor, fixed_point_cut, sample_ids

VOCAB = 128256


def _keys(line):
    return _order_keys(line), _fixed_weights(line, float(line.max()))


def test_sampled_ids_are_evenly_spaced_runs():
    ids = sample_ids(VOCAB, 32)
    assert ids.size == 32 * study.RUN and np.all(np.diff(ids) > 0)
    assert ids[0] == 0 and VOCAB - 32 <= ids[-1] < VOCAB  # (runs (V - 256) // 31 apart: the last ends within 31 of the line's end)
    assert np.array_equal(sample_ids(1000, 32), np.arange(1000))  # a short line is its own sample


def test_a_top_k_gather_that_settles_holds_the_cut():
    rng = np.random.default_rng(1)
    settled = 0
    for _ in range(16):
        line = (3 * rng.standard_normal(VOCAB)).astype(np.float32)
        keys, _ = _keys(line)
        found = study.top_k_start(keys, line, 1000, 32)
        assert found["taken"] and found["count"] == int((keys >= found["lo"]).sum())
        if found["outcome"] == "settles":
            settled += 1
            assert found["lo"] <= fixed_point_cut(line, 1000, 1.0) and found["count"] <= study.GATHER
    assert settled >= 15  # the rule's margin: 2.9 standard deviations of the sampled rank either side


def test_a_sample_that_misses_the_top_values_reports_short():
    # Every sampled value lies above every other: the sample reads the line's top as 16 times
    # denser than it is and places lo too high.
    line = np.random.default_rng(2).standard_normal(VOCAB).astype(np.float32)
    line[sample_ids(VOCAB, 32)] += 20.0
    found = study.top_k_start(_order_keys(line), line, 1000, 32)
    assert found["outcome"] == "short" and found["count"] < 1000


@pytest.mark.parametrize("top_p", [0.99, 0.9])
def test_a_top_p_window_that_settles_holds_the_cut(top_p):
    # A short line is its own sample: the window is placed on exact masses and holds the cut.
    line = (2 * np.random.default_rng(3).standard_normal(1500)).astype(np.float32)
    keys, weights = _keys(line)
    row_max = float(line.max())
    mass = float(np.exp(line.astype(np.float64) - row_max).sum())
    budget = float(np.float32(top_p) * np.float32(mass))
    floor = _top_p_floor(row_max, mass, budget, line.size)
    top = _order_key(row_max)
    found = study.top_p_start(keys, weights, sample_ids(line.size, 32), budget, floor, top, 3.0, top)
    assert found["taken"] and found["outcome"] == "settles"
    assert found["lo"] <= fixed_point_cut(line, 0, top_p) <= found["hi"]


def test_a_top_p_window_placed_wrong_is_reported_missed():
    # A window placed for top-p 0.5, judged against top-p 0.99's budget, lies above its cut; one
    # below that cut is missed the other way; a window holding every value overflows.
    line = (2 * np.random.default_rng(3).standard_normal(1500)).astype(np.float32)
    keys, weights = _keys(line)
    row_max = float(line.max())
    mass = float(np.exp(line.astype(np.float64) - row_max).sum())
    top = _order_key(row_max)
    sample = sample_ids(line.size, 32)
    placed = study.top_p_start(keys, weights, sample, float(np.float32(0.5) * np.float32(mass)), -(2**31), top, 3.0, top)
    assert placed["taken"] and placed["outcome"] == "settles"
    budget = float(np.float32(0.99) * np.float32(mass))
    cut = fixed_point_cut(line, 0, 0.99)
    assert placed["lo"] > cut
    assert study.judge_window(keys, weights, placed["lo"], placed["hi"], budget)[1] == "missed (cut below)"
    assert study.judge_window(keys, weights, -(2**31), cut - 1, budget)[1] == "missed (cut above)"
    assert study.judge_window(keys, weights, -(2**31), top, budget, gather=1024)[1] == "overflow"
    assert study.judge_window(keys, weights, cut, top, budget) == (int((keys >= cut).sum()), "settles")
