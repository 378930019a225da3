"""The candidate-parts study (bench/experiments/candidate_parts.py): it runs the statistics' rule at
each number of parts on the lines it is given, and a line's outcome is the rule's."""

import torch

from bench import gpu_model
from bench.experiments import candidate_parts as study
from specdec_ext._triton_backend import SORT


def test_each_number_of_parts_reports_the_rules_outcome(monkeypatch):
    g = torch.Generator().manual_seed(3)
    lines = 3 * torch.randn(3, 128256, generator=g)
    lines[2] = 0.0  # (one flat line: every value ties, none lies above the floor)
    monkeypatch.setattr("bench.experiments.sampled_start._sources", lambda: [("normal rows", lines)])
    monkeypatch.setattr(study, "SETTINGS", [(0.7, 50, 0.9)])
    found = study.run()
    (row,) = found["results"]
    assert set(row["by_parts"]) == set(study.PARTS) and row["lines"] == 3
    parts, lanes, rows, tiles_per_part, slots = gpu_model.candidate_geometry(gpu_model.Call("B=1", **gpu_model._B1, top_k=50))
    assert parts == 4 and "4 parts by default" in found["geometry"]
    for p, seen in row["by_parts"].items():
        per_part = -(-parts * tiles_per_part // p)
        outcomes = [gpu_model.candidate_outcome((line / 0.7).numpy(), -(-parts * tiles_per_part // per_part), lanes, rows, per_part, slots, SORT, 50, 0.9)
                    for line in lines]
        assert seen["settled"] == round(sum(o["resolved"] for o in outcomes) / 3, 4)
        assert seen["past_the_sort"] == round(sum(o["above_floor"] < 0 for o in outcomes) / 3, 4)
    assert row["by_parts"][4]["settled"] == round(2 / 3, 4)  # (the normal rows settle; the flat one does not)
