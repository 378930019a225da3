"""The GPU model's stored trips (bench/gpu_model.py's _measured): a model takes the newest
measurement made where the statistics count windows as they do under its own Triton, since a top-p
line measured without them has no outcome for them."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

gpu_model = pytest.importorskip("bench.gpu_model")
from specdec_ext import _triton_backend  # noqa: E402


def _write(folder, name: str, triton: str, measured: str, **extra) -> None:
    trips = {"measured": measured, "results": [{"source": name}], **extra}
    (folder / f"gpu-model-{name}.json").write_text(json.dumps({"versions": {"triton": triton}, "measured_trips": trips}))


@pytest.fixture
def results(tmp_path):
    _write(tmp_path, "windows-older", "3.9.0", "2026-12-06T01:30Z")
    _write(tmp_path, "ballots-newer", "3.6.0", "2026-12-06T21:40Z")
    # A copy of the ballots' measurement in a later 3.9 run: never a source of its own.
    _write(tmp_path, "copy-newest", "3.9.0", "2026-12-06T21:40Z", **{"from": "gpu-model-ballots-newer.json"})
    # Marked explicitly: made with windows although its file's Triton had none.
    _write(tmp_path, "marked", "3.6.0", "2026-12-05T00:00Z", statistics_windows=True)
    return tmp_path


@pytest.mark.parametrize(("windows", "expected"), [(True, "windows-older"), (False, "ballots-newer")])
def test_a_model_takes_the_newest_trips_measured_as_its_triton_counts(results, monkeypatch, windows, expected):
    monkeypatch.setattr(_triton_backend, "key_window_default", lambda: windows)
    stored = gpu_model._measured(SimpleNamespace(measure=False), results)
    assert stored["results"] == [{"source": expected}]
    assert stored["from"] == f"gpu-model-{expected}.json"


def test_a_measurement_marks_what_it_was_measured_with(results, monkeypatch):
    monkeypatch.setattr(_triton_backend, "key_window_default", lambda: True)
    (results / "gpu-model-windows-older.json").unlink()
    assert gpu_model._measured(SimpleNamespace(measure=False), results)["from"] == "gpu-model-marked.json"
    assert gpu_model.measured_windows({"statistics_windows": False}, {"triton": "3.9.0"}) is False
    assert gpu_model.measured_windows({}, {"triton": "3.10.1"}) is True
