"""The benchmark report's own logic (bench/micro.py): which backends run where, and how the goals
are judged from result rows. Timing itself is never tested."""

from __future__ import annotations

import pytest

micro = pytest.importorskip("bench.micro")


def _row(backend, median_us, speedup, **case):
    row = {"op": "verify", "batch": 1, "k": 4, "vocab": 128256, "dtype": "fp32", "filters": False, "check": False}
    row.update(case, backend=backend, median_us=median_us, speedup_vs_baseline=speedup, wall_us=median_us + 5, peak_extra_bytes=None)
    return row


def _b1_goals(rows):
    doc = {"device": "NVIDIA H200", "device_type": "cuda", "results": rows}
    return [g for g in micro.evaluate_goals(doc) if g["goal"].startswith("fused verify B=1")]


def test_graph_replay_is_benchmarked_on_cuda_small_batches_only():
    case = micro.Case("verify", 1, 4, 128256, "fp32", False)
    assert micro.GRAPHED not in micro.backends_for("verify", "cpu", case)
    assert micro.GRAPHED not in micro.backends_for("sample", "cpu")


def test_b1_goal_needs_both_launch_paths_within_their_limits_and_shows_both():
    # B=1 unfiltered: <= 8 us replayed from a CUDA graph and <= 15 us launched from Python.
    fp32 = _b1_goals([_row("triton", 14.0, 40.0), _row(micro.GRAPHED, 7.5, 110.0)])[0]
    assert fp32["status"] == "pass" and "launched 14.0 us" in fp32["measured"] and "graph replay 7.5 us" in fp32["measured"]
    fp32 = _b1_goals([_row("triton", 35.0, 40.0), _row(micro.GRAPHED, 7.5, 110.0)])[0]  # launched too slow
    assert fp32["status"] == "fail"
    fp32 = _b1_goals([_row("triton", 14.0, 40.0), _row(micro.GRAPHED, 9.0, 60.0)])[0]  # replay too slow
    assert fp32["status"] == "fail"
    fp32 = _b1_goals([_row("triton", 14.0, 40.0)])[0]  # no graph replay measured: not shown to pass
    assert fp32["status"] == "fail" and "graph replay" not in fp32["measured"]
    filtered = _b1_goals([_row("triton", 40.0, 9.0, filters=True), _row(micro.GRAPHED, 24.0, 20.0, filters=True)])[2]
    assert filtered["status"] == "pass"  # filtered: only the replay limit (25 us)
    bf16 = _b1_goals([_row("triton", 35.0, 40.0)])[1]
    assert bf16["status"] == "n/a"


def test_e2e_runs_takes_the_median_of_each_goal_over_the_runs(tmp_path, monkeypatch):
    import json
    import subprocess
    import sys
    from pathlib import Path

    runs = pytest.importorskip("bench.e2e_runs")
    values = iter([1.2, 1.5, 1.3])
    real_run = subprocess.run

    def fake_e2e(command, *args, **kwargs):  # one bench.e2e run: writes its report where --out says
        if command[:3] != [sys.executable, "-m", "bench.e2e"]:
            return real_run(command, *args, **kwargs)  # the result header's git commit
        out = Path(command[command.index("--out") + 1])
        out.mkdir(parents=True)
        goal = {"hook B=1 vs transformers assisted, default call (goal >= 1.3)": next(values), "other": 2.0}
        report = {"device": "x86_64", "device_type": "cpu", "num_draft_tokens": 4, "max_new_tokens": 8,
                  "load_average": {"start": [0.1, 0.1, 0.1], "end": [0.2, 0.1, 0.1]}, "goals": {"plain sampling": goal}}
        (out / "e2e-cpu-2026-12-01.json").write_text(json.dumps(report))

    monkeypatch.setattr(subprocess, "run", fake_e2e)
    assert runs.main(["--runs", "3", "--out", str(tmp_path), "--", "--threads", "1"]) == 0
    written = json.loads(next(tmp_path.glob("e2e-cpu-*-runs.json")).read_text())
    assert written["median_over_runs"]["plain sampling"]["hook B=1 vs transformers assisted, default call (goal >= 1.3)"] == 1.3
    assert [run["goals"]["plain sampling"]["other"] for run in written["runs"]] == [2.0, 2.0, 2.0]
    assert [run["load_average"]["end"][0] for run in written["runs"]] == [0.2, 0.2, 0.2]
    assert {"kind", "date", "device", "device_type", "machine", "versions", "load_average"} <= set(written)
    with pytest.raises(ValueError, match="runs"):
        runs.main(["--runs", "0"])


def test_result_files_are_named_what_device_date_tag():
    report = pytest.importorskip("bench.harness.report")
    date = "2026-12-01T08:00:00+00:00"
    assert report.result_path("/r", None, date, "cpu-amd-epyc").name == "cpu-amd-epyc-2026-12-01.json"
    assert report.result_path("/r", "e2e", date, "cpu", tag="runs").name == "e2e-cpu-2026-12-01-runs.json"
    assert report.result_path("/r", "cpu-cpp", date, tag="t1-smoke").name == "cpu-cpp-2026-12-01-t1-smoke.json"
    assert report.result_path("/r", "host-overhead", date).name == "host-overhead-2026-12-01.json"


def test_side_by_side_rounds_call_every_method_as_asked():
    from collections import Counter

    timing = pytest.importorskip("bench.harness.timing")
    counts = Counter()
    calls = {name: (lambda name=name: counts.update([name])) for name in ("a", "b")}
    samples = timing.take_turns(calls, min_rounds=3, max_rounds=3, warmup=2, untimed=1, samples=2, block=4, gc_every=2)
    assert {name: len(values) for name, values in samples.items()} == {"a": 6, "b": 6}
    assert counts == {"a": 2 + 3 * (1 + 2 * 4), "b": 2 + 3 * (1 + 2 * 4)}


def test_quantiles_are_times_some_call_took():
    timing = pytest.importorskip("bench.harness.timing")
    values = [float(v) for v in range(10, 0, -1)]
    assert timing.quantile(values, 0.2) == 3.0 and timing.quantile(values, 1.0) == 10.0  # rank int(q * n)
    assert timing.quantile(values, 0.1, inclusive=True) == 1.0  # rank int(q * (n - 1))
    assert timing.summarise(values).median_s == 5.5
