"""The GPU rows (bench/gpu_rows.py): the inputs they state, a dry run of a row, the comparison with
the model, and the reading of the first suite log (bench/experiments/import_suite_log.py)."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

gpu_rows = pytest.importorskip("bench.gpu_rows")
from bench.gpu_model import Call  # noqa: E402


def test_rows_are_the_models_goal_vllm_block_and_tree_calls():
    names = [call.name for call in gpu_rows.calls()]
    assert "B=64 K=8 bf16 flat top-p 0.99 (whole-line search)" in names and "tree B=1 N=8 D=4 V=128256 fp32 iid" in names
    vllm = [call for call in gpu_rows.calls()[len(gpu_rows.GOAL_CALLS):] if call.method == "token"]
    assert [call.name for call in vllm] == [name for name in names if name.startswith("vLLM ")] and len(vllm) == 4
    assert all(call.dtype == "fp32" and call.batch == 64 for call in vllm)
    assert all(call.method in ("block", "tree") for call in gpu_rows.calls()[len(gpu_rows.GOAL_CALLS) + len(vllm):])
    assert {name for name, _ in gpu_rows.VARIANTS} <= set(names)


def test_inputs_put_the_top_p_cut_where_the_row_says():
    """Lines the candidates settle hold ~99 % of their mass in four tokens; whole-line rows are flat."""
    peaked = Call("peaked", 2, 3, 5000, "fp32", top_p=0.95)
    probs = gpu_rows.inputs(peaked, "cpu")["args"]["target"].softmax(-1)
    assert (probs.topk(4, dim=-1).values.sum(-1) > 0.95).all()
    flat = replace(peaked, name="flat", top_p=0.99, search_fraction=1.0)
    probs = gpu_rows.inputs(flat, "cpu")["args"]["target"].softmax(-1)
    assert (probs.topk(64, dim=-1).values.sum(-1) < 0.05).all()


@pytest.mark.parametrize("call", [Call("bf16 filtered", 1, 2, 3000, "bf16", temperature=0.7, top_k=50, top_p=0.9),
                                  Call("tree", 1, 8, 3000, "fp32", method="tree", siblings="without_replacement", tree_depth=4),
                                  Call("block one-hot", 1, 4, 3000, "fp32", draft="one-hot", method="block")])
def test_a_row_makes_the_call_and_matches_eager(call):
    """The row's call runs (interpreted Triton) and gives the eager reference's tokens."""
    import specdec_ext

    got = gpu_rows.runner(call, "cpu")()
    made = gpu_rows.inputs(call, "cpu")
    made["kwargs"]["backend"] = "eager"
    a = made["args"]
    want = (specdec_ext.verify_tree(a["target"], a["draft"], a["tokens"], a["parents"], **made["kwargs"]) if call.method == "tree"
            else specdec_ext.verify(a["target"], a["draft"], a["tokens"], **made["kwargs"]))
    assert torch.equal(got.tokens, want.tokens) and torch.equal(got.num_accepted, want.num_accepted)


def test_a_dry_row_times_one_eager_call():
    row = gpu_rows.measure(Call("small", 1, 2, 1000, "fp32"), "cpu")
    assert row["call"]["name"] == "small" and row["eager_us"] > 0 and "kernels_us" not in row


def test_compare_sets_each_kernel_beside_its_launches():
    """Phases of one launch (``cutoff`` and its ``cutoff:search`` passes) add up to its kernel;
    back-to-back time is preferred to one replay, and rows the model lacks are left out."""
    model = {"results": [{"call": {"name": "row"}, "replayed_us": 100.0,
                          "launches": [{"name": "line_stats", "time_us": 40.0}, {"name": "cutoff", "time_us": 10.0},
                                       {"name": "cutoff:search", "time_us": 20.0}, {"name": "cutoff:search", "time_us": 20.0}]}]}
    measured = {"rows": [{"call": {"name": "row"}, "replay_us": 300.0, "back_to_back_us": 150.0,
                          "kernels_us": {"line_stats_kernel": 60.0, "cutoff_kernel": 90.0}},
                         {"call": {"name": "row"}, "replay_us": 120.0, "back_to_back_us": None, "kernels_us": {"line_stats_kernel": 60.0}},
                         {"call": {"name": "not modelled"}, "replay_us": 1.0, "back_to_back_us": 1.0, "kernels_us": {}}]}
    table = gpu_rows.compare(measured, model).splitlines()
    assert len(table) == 4  # head, rule, two rows
    assert table[2] == "| row | 100.0 | 150.0 (back to back) | 1.50 | line_stats 40.0 → 60.0; cutoff 50.0 → 90.0 |"
    assert table[3].startswith("| row | 100.0 | 120.0 (one replay) | 1.20 |")


def test_the_first_suite_log_maps_to_the_models_calls():
    from bench.experiments import import_suite_log

    log = "\n".join([
        "goal row | B=64 K=8 V=128256 bf16 | top-p 0.95: graph replay median 2388.2 us, 18.09x unfiltered (goal <= 2.0x)",
        "kernel | B=64 K=8 V=128256 bf16 | top-p 0.95 | line_stats_kernel: 273.0 us x 1 per call",
        "kernel | B=64 K=8 V=128256 bf16 | top-p 0.95 | cutoff_kernel: 2057.4 us x 1 per call",
        "model row | block B=1 K=4 V=128256 fp32: graph replay median 26.7 us",
        "kernel | block B=1 K=4 V=128256 fp32 | block_walk_kernel: 3.6 us x 1 per call",
    ])
    rows = import_suite_log.parse(log)
    assert [r["call"]["name"] for r in rows] == ["B=64 K=8 bf16 T=1.0 top-k 0 top-p 0.95, as measured on tiny_llama logits (searched 1.0)",
                                                "block B=1 K=4 V=128256 fp32"]
    assert rows[0]["call"]["search_fraction"] == 1.0 and rows[0]["replay_us"] == 2388.2
    assert rows[0]["kernels_us"] == {"line_stats_kernel": 273.0, "cutoff_kernel": 2057.4} and rows[1]["kernels_us"] == {"block_walk_kernel": 3.6}


def test_geometry_variants_name_rows_and_valid_geometries():
    from specdec_ext import _triton_backend

    names = {call.name for call in gpu_rows.calls()}
    for name, geometry in gpu_rows.VARIANTS:
        assert name in names
        _triton_backend.geometry(torch.device("meta"), sm_count=132, **geometry)  # raises on a bad override


def test_a_geometry_variant_gives_the_default_calls_tokens():
    """Another statistics tile and more parts read the lines differently, with the same result."""
    call = Call("bf16 filtered", 1, 2, 3000, "bf16", temperature=0.7, top_k=50, top_p=0.9)
    default = gpu_rows.runner(call, "cpu")()
    tokens, accepted, _, _ = gpu_rows.runner(call, "cpu", {"stats_tile": 1024, "stats_parts": 2})()
    assert torch.equal(tokens, default.tokens) and torch.equal(accepted, default.num_accepted)


def test_variants_table_sets_each_geometry_beside_the_default():
    measured = {"rows": [{"call": {"name": "row"}, "replay_us": 30.0, "back_to_back_us": 20.0, "kernels_us": {"line_stats_kernel": 12.0}},
                         {"call": {"name": "row"}, "geometry": {"stats_tile": 16384}, "replay_us": 25.0, "back_to_back_us": 15.0,
                          "kernels_us": {"line_stats_kernel": 7.0}}]}
    table = gpu_rows.variants_table(measured).splitlines()
    assert table[2] == "| row | stats_tile=16384 | 20.0 | 15.0 | 0.75 | line_stats 12.0 → 7.0 |"
    assert gpu_rows.variants_table({"rows": measured["rows"][:1]}) == ""
