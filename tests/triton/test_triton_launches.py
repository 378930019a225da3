"""What one Triton call costs the device, counted on the interpreter: launches per call (a chain:
two without top-k / top-p, three with them; a tree or block: three either way), no tensor
allocated or computed besides the outputs once the workspace is warm, no host synchronisation,
and the same launches the GPU model (bench/gpu_model.py) plans and compiles."""

from __future__ import annotations

import contextlib
import dataclasses

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import specdec_ext
from specdec_ext import _params, _triton_backend, _triton_tree

pytestmark = pytest.mark.skipif("triton" not in specdec_ext.available_backends("cpu"), reason="triton is not installed")

# aten ops that allocate or compute (views, metadata and the interpreter's own copies are left out).
_VIEW_OPS = {"view", "_unsafe_view", "slice", "select", "as_strided", "alias", "detach", "expand", "t", "transpose", "unsqueeze", "squeeze", "reshape",
             "permute", "_reshape_alias", "lift_fresh", "unbind", "split", "split_with_sizes"}
# aten ops that make the host wait for the device: a scalar read, a truth value, a copy to the host.
_SYNC_OPS = {"_local_scalar_dense", "item", "is_nonzero", "equal"}
_KERNELS = ("cutoff_kernel", "line_stats_kernel", "race_kernel", "tree_walk_kernel", "cut_walk_kernel", "tree_race_kernel", "block_walk_kernel",
            "block_race_kernel")


class _Recorder(TorchDispatchMode):
    """Every aten op run while active, except views; paused inside kernel launches."""

    def __init__(self):
        super().__init__()
        self.ops: list[str] = []
        self.paused = False

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if not self.paused:
            name = func.overloadpacket.__name__
            if name in ("_to_copy", "copy_") and _to_host(func, args, kwargs or {}):
                name = "copy to host"
            if name not in _VIEW_OPS:
                self.ops.append(name)
        return func(*args, **(kwargs or {}))

    @property
    def syncs(self) -> list[str]:
        return [op for op in self.ops if op in _SYNC_OPS or op == "copy to host"]

    @property
    def allocations(self) -> list[str]:
        return [op for op in self.ops if op not in _SYNC_OPS]


def _to_host(func, args, kwargs) -> bool:
    """A copy from a device tensor to a CPU one (never on the interpreter, whose tensors are all on
    the CPU: there a read shows up as _local_scalar_dense)."""
    if func.overloadpacket.__name__ == "copy_":
        return args[0].device.type == "cpu" and args[1].device.type != "cpu"
    target = kwargs.get("device")
    return target is not None and torch.device(target).type == "cpu" and args[0].device.type != "cpu"


@contextlib.contextmanager
def _count_launches(recorder: _Recorder):
    """Patch every kernel's launcher to count launches (and pause the op recorder inside them:
    the interpreter copies arguments with aten ops of its own)."""
    launched: list[str] = []
    kernels = _triton_backend.kernels()
    originals = {}
    for name in _KERNELS:
        kernel = getattr(kernels, name)
        originals[name] = kernel.run

        def run(*args, _name=name, _run=kernel.run, **kwargs):
            launched.append(_name)
            recorder.paused = True
            try:
                return _run(*args, **kwargs)
            finally:
                recorder.paused = False

        kernel.run = run
    try:
        yield launched
    finally:
        for name, run in originals.items():
            getattr(kernels, name).run = run


def _inputs(filtered: bool, logprobs: bool):
    g = torch.Generator().manual_seed(0)
    target = torch.randn(2, 3, 700, generator=g)
    draft = target[:, :2] + torch.randn(2, 2, 700, generator=g)
    tokens = torch.randint(0, 700, (2, 2), generator=g)
    kw = {"temperature": 0.8, "top_k": 30 if filtered else None, "top_p": 0.9 if filtered else None, "num_draft_tokens": None, "generator": None,
          "check": False, "seeds": torch.tensor([3, 4]), "offsets": torch.tensor([10, 0])}
    if logprobs:
        kw |= {"return_logprobs": "raw", "return_accept_probs": True}
    return _params.validate_verify(target, draft, tokens, **kw)


@pytest.mark.parametrize("filtered,logprobs,expected", [(False, False, 2), (False, True, 2), (True, True, 3)])
def test_launches_and_allocations_per_call(filtered, logprobs, expected):
    args = _inputs(filtered, logprobs)
    _triton_backend.verify(args, 7)  # warm-up: the workspace and the launch plan are made once
    recorder = _Recorder()
    with _count_launches(recorder) as launched, recorder:
        out = _triton_backend.verify(args, 7)
    assert len(launched) == expected, launched
    outputs = 2 + (2 if logprobs else 0)
    # Only the outputs are allocated (torch.empty), and nothing else runs on the device.
    assert recorder.ops == ["empty"] * outputs, recorder.ops
    assert out[0].shape == (2, 3)
    # The GPU model plans the very same launches.
    planned = [launch.name.split(":")[0] for launch in _triton_backend.launches_for(args, 7)]
    assert [name.replace("_kernel", "") for name in launched] == planned


def test_the_workspace_counters_reset_themselves():
    """The race's arrival counters are back at zero after every call (a CUDA graph replays the
    launches with the counters it captured), whatever the number of chunks per row."""
    args = _inputs(False, False)
    for chunks in (1, 3, 5):
        _triton_backend.verify(args, 1, race_chunks=chunks, race_block=64)
        ws = _triton_backend.workspace(args.target_logits.device)
        assert int(ws.counters.abs().sum()) == 0
    # The whole-line search's counters too (top-k 600 of 700 values: every line searches).
    args = _params.validate_verify(*_inputs(False, False)[:3], temperature=0.8, top_k=600, top_p=None, num_draft_tokens=None, generator=None, check=False)
    _triton_backend.verify(args, 1, select_chunk=256, stats_tile=128, stats_parts=2)
    ws = _triton_backend.workspace(args.target_logits.device)
    assert int(ws.counters.abs().sum()) == 0


def test_batch_size_does_not_enter_the_compiled_signature():
    """Batch-dependent integers are not specialised by the JIT (a new batch size is no new compile
    or graph capture); the constexprs depend on dtype, flags, K and V only. (The compile check,
    tests/support/triton_compile_check.py, also compares the JIT's whole specialisation across batch sizes.)"""
    race = _triton_backend.kernels().race_kernel
    stats = _triton_backend.kernels().line_stats_kernel
    cutoffs = _triton_backend.kernels().cutoff_kernel
    for kernel, names in ((race, ("batch", "base_key", "t_parts", "d_parts", "tiles_per_chunk", "num_chunks")), (stats, ("batch", "tiles_per_part")),
                          (cutoffs, ("batch", "t_parts", "d_parts"))):
        declared = getattr(kernel, "do_not_specialize", None) or getattr(kernel, "kwargs", {}).get("do_not_specialize", ())
        dns = set(declared)
        assert set(names) <= dns, (kernel, dns)
    constexprs = []
    for batch in (1, 3, 64):
        g = torch.Generator().manual_seed(batch)
        target = torch.randn(batch, 3, 500, generator=g).to("meta")
        args = _params.VerifyArgs(
            target, torch.empty(batch, 2, 500, device="meta"), torch.empty(batch, 2, dtype=torch.int64, device="meta"),
            *(torch.empty(batch, dtype=dt, device="meta") for dt in (torch.float32, torch.int64, torch.float32, torch.int64)), None, False, False,
        )
        constexprs.append([launch.constexprs for launch in _triton_backend.launches_for(args, 0, sm_count=132)])
    assert constexprs[0] == constexprs[1] == constexprs[2]


# --------------------------------------------------------------------------------------------------
# Trees and blocks


def _costs(run):
    """(kernels launched, allocating ops, host synchronisations, result) of one call of ``run``."""
    recorder = _Recorder()
    with _count_launches(recorder) as launched, recorder:
        out = run()
    return launched, recorder.allocations, recorder.syncs, out


def _tree_inputs(filtered: bool, with_draft: bool, siblings: str):
    g = torch.Generator().manual_seed(1)
    target = torch.randn(2, 5, 300, generator=g)
    draft = target + torch.randn(2, 5, 300, generator=g)
    tokens = torch.randint(0, 300, (2, 4), generator=g)
    parents = torch.tensor([[-1, -1, 0, 2], [-1, 0, 0, 1]])
    return _params.validate_tree(
        target, draft if with_draft else None, tokens, parents, temperature=0.9, top_k=40 if filtered else None, top_p=0.9 if filtered else None,
        num_nodes=torch.tensor([4, 3]), siblings=siblings, generator=None, seeds=torch.tensor([5, 6]), offsets=torch.tensor([0, 3]), check=False,
    )


def _block_inputs(filtered: bool, with_draft: bool, logprobs: bool):
    args = _inputs(filtered, logprobs)
    return args._replace(draft_logits=args.draft_logits if with_draft else None, accept_probs=False)


def _expected_launches(kind: str, filtered: bool) -> list[str]:
    """Statistics, walk, race; with top-k / top-p the walk runs in the cut-offs launch."""
    return ["line_stats_kernel", "cut_walk_kernel" if filtered else f"{kind}_walk_kernel", f"{kind}_race_kernel"]


TREE_CASES = [(filtered, with_draft, siblings) for filtered in (False, True) for with_draft in (True, False)
              for siblings in (("iid", "without_replacement") if with_draft else ("iid",))]


@pytest.mark.parametrize("filtered,with_draft,siblings", TREE_CASES)
def test_tree_launches_allocations_and_syncs(filtered, with_draft, siblings):
    args = _tree_inputs(filtered, with_draft, siblings)
    _triton_tree.verify_tree(args, 7)  # warm-up: the workspace and the launch plan are made once
    launched, allocations, syncs, out = _costs(lambda: _triton_tree.verify_tree(args, 7))
    assert launched == _expected_launches("tree", filtered)
    assert allocations == ["empty"] * 3, allocations  # tokens, num_accepted, accepted_nodes
    assert syncs == [], syncs  # the outputs' width is N's, not the deepest node's (which lives on the device)
    assert out[0].shape == (2, 5) and out[2].shape == (2, 4)
    assert all((out[0][row, n + 1 :] == -1).all() and (out[2][row, n:] == -1).all() for row, n in enumerate(out[1].tolist()))
    planned = [launch.kernel.fn.__name__ for launch in _triton_tree.launches_for(args, 7)]
    assert launched == planned


@pytest.mark.parametrize("filtered,with_draft,logprobs", [(False, True, False), (False, False, True), (True, True, True), (True, False, False)])
def test_block_launches_allocations_and_syncs(filtered, with_draft, logprobs):
    args = _block_inputs(filtered, with_draft, logprobs)
    _triton_tree.verify_block(args, 7)
    launched, allocations, syncs, out = _costs(lambda: _triton_tree.verify_block(args, 7))
    assert launched == _expected_launches("block", filtered)
    assert allocations == ["empty"] * (3 if logprobs else 2), allocations
    assert syncs == [], syncs
    assert out[0].shape == (2, 3)
    planned = [launch.kernel.fn.__name__ for launch in _triton_tree.launches_for(args, 7)]
    assert launched == planned


def test_the_counts_catch_a_host_read_and_an_allocation(monkeypatch):
    """The recorder sees what a launcher must not do: a read of a device value and a temporary."""
    args = _block_inputs(False, True, False)
    tree = _tree_inputs(False, True, "iid")
    call = _triton_tree.Runner.__call__

    def reading(self, a, key):
        bool((a.temperature > 0).any())  # a host read, as a launcher might test a flag
        return call(self, a, key)

    monkeypatch.setattr(_triton_tree.Runner, "__call__", reading)
    _, allocations, syncs, _ = _costs(lambda: _triton_tree.verify_block(args, 7))
    assert len(syncs) == 1 and allocations == ["gt", "any", "empty", "empty"], (syncs, allocations)
    monkeypatch.setattr(_triton_tree.Runner, "__call__", lambda self, a, key: (a.temperature.sum().item(), call(self, a, key))[1])
    for run in (lambda: _triton_tree.verify_block(args, 7), lambda: _triton_tree.verify_tree(tree, 7)):
        _, _, syncs, _ = _costs(run)
        assert syncs == ["_local_scalar_dense"]


def test_tree_and_block_counters_reset_themselves():
    """The walk's and the race's arrival counters are back at zero after every call."""
    tree = _tree_inputs(False, True, "without_replacement")
    block = _block_inputs(False, True, False)
    for chunks in (1, 3):
        _triton_tree.verify_tree(tree, 1, race_chunks=chunks, race_block=64)
        _triton_tree.verify_block(block, 1, race_chunks=chunks, race_block=64)
        assert int(_triton_backend.workspace(torch.device("cpu")).counters.abs().sum()) == 0


def test_tree_and_block_batch_size_does_not_enter_the_compiled_signature():
    """As for chains: the walks' and races' batch-dependent integers are not specialised, and the
    constexprs of a call's launches do not depend on B."""
    k = _triton_backend.kernels()
    walks = (k.tree_walk_kernel, k.block_walk_kernel, k.cut_walk_kernel)
    for kernel, names in (*((walk, ("base_key", "batch", "t_parts", "d_parts")) for walk in walks),
                          (k.tree_race_kernel, ("base_key", "tiles_per_chunk", "num_chunks")),
                          (k.block_race_kernel, ("base_key", "batch", "t_parts", "tiles_per_chunk", "num_chunks"))):
        declared = getattr(kernel, "do_not_specialize", None) or getattr(kernel, "kwargs", {}).get("do_not_specialize", ())
        assert set(names) <= set(declared), (kernel, declared)
    from bench.gpu_model import Call, meta_args

    for call in (Call("tree", 1, 6, 500, method="tree", siblings="without_replacement", top_k=5), Call("block", 1, 3, 500, method="block", logprobs=1)):
        constexprs = [[launch.constexprs for launch in _triton_tree.launches_for(meta_args(dataclasses.replace(call, batch=batch)), 0, sm_count=132)]
                      for batch in (1, 3, 64)]
        assert constexprs[0] == constexprs[1] == constexprs[2]


def test_filtered_bf16_lines_are_read_whole_from_64_lines():
    """A filtered bf16 call from WHOLE_LINE_STATS_LINES lines up reads each line in one statistics
    program where the top-p windows are on (only a line read whole has its window counted); fewer
    lines, other dtypes, unfiltered calls, trees and blocks keep several programs a line."""
    from bench.gpu_model import Call, launches
    from specdec_ext._triton_backend import WHOLE_LINE_STATS_LINES, key_window_default

    def parts(batch, k, dtype, **filters):
        return next(launch.grid for launch in launches(Call("", batch, k, 128256, dtype, **filters), 132) if launch.name == "line_stats")[1]

    assert 8 * (2 * 4 + 1) >= WHOLE_LINE_STATS_LINES > 4 * (2 * 4 + 1)
    assert parts(8, 4, "bf16", top_p=0.95) == (1 if key_window_default() else 2)
    assert parts(32, 8, "bf16", temperature=0.7, top_k=50, top_p=0.9) == (1 if key_window_default() else 2)
    assert parts(4, 4, "bf16", top_p=0.95) == 2
    assert parts(8, 4, "fp32", top_p=0.95) > 1
    assert parts(8, 4, "bf16") > 1
    tree = Call("", 64, 8, 128256, "bf16", draft="one-hot", temperature=0.7, top_p=0.95, method="tree", tree_depth=4)
    assert next(launch.grid for launch in launches(tree, 132) if launch.name == "line_stats")[1] == 2  # trees and blocks keep their plan


def test_block_walk_items_spread_over_the_device():
    """An unfiltered block call's walk is one work item a program: every position i < K of every
    row in chunks of whole walk blocks, about WALK_ITEMS_PER_SM items a multiprocessor (a row of
    one position, one item); the grid does not follow the coins."""
    from bench.gpu_model import Call, launches

    def walk_grid(batch, k, vocab=128256, dtype="bf16"):
        found = [launch for launch in launches(Call("block", batch, k, vocab, dtype, method="block"), 132) if launch.name == "block_walk"]
        return found[0].grid

    assert _triton_tree.WALK_ITEMS_PER_SM == 4
    assert walk_grid(64, 8) == (64 * 7 * 2,)  # 448 positions: two chunks each for 528 items
    assert walk_grid(1, 4, dtype="fp32") == (3 * 126,)  # three positions: every walk block of 1024 ids its own item
    assert walk_grid(8, 1) == (8,)  # no position below K: one item a row, which only walks
    assert walk_grid(200, 8) == (200 * 7,)


def test_the_sample_follows_the_histogram_lowering_and_the_lines_dtypes():
    """A top-k's first gather is placed from a sample (sample_runs) where the statistics' key windows
    are off (tl.histogram as warp ballots), or where no line of the call is 16-bit (no key window
    counts a float32 line: vLLM's calls), and the statistics then count the high bytes only of a k
    the gather cannot hold; elsewhere neither. The launches of chain, block and tree calls carry it.
    Bad sample sizes are refused, named."""
    from bench.gpu_model import Call, meta_args

    cpu = torch.device("cpu")
    default = _triton_backend.geometry(cpu)
    ballots = not _triton_backend.key_window_default()
    assert default.sample_runs == (_triton_backend.SAMPLE_RUNS if ballots else 0)
    for dtypes, sampled in (((torch.float32,), True), ((torch.float32, torch.float32), True), ((torch.bfloat16,), ballots),
                            ((torch.float32, torch.bfloat16), ballots), ((torch.float16, torch.float32), ballots)):
        geo = _triton_backend.geometry(cpu, line_dtypes=dtypes)
        assert geo.sample_runs == (_triton_backend.SAMPLE_RUNS if sampled else 0), dtypes
        assert geo.histogram_top_k == (_triton_backend.SAMPLED_HISTOGRAM_TOP_K if sampled else _triton_backend.HISTOGRAM_TOP_K), dtypes
    assert _triton_backend.geometry(cpu, line_dtypes=(torch.float32,), sample_runs=0).sample_runs == 0
    for dtype, draft_dtype, sampled in (("fp32", None, True), ("bf16", None, ballots), ("bf16", "fp32", ballots), ("fp32", "bf16", ballots)):
        for method, plan in (("token", _triton_backend.launches_for), ("block", _triton_tree.launches_for), ("tree", _triton_tree.launches_for)):
            call = Call("c", 2, 4, 3000, dtype, draft_dtype=draft_dtype, top_k=1000, method=method, tree_depth=2 if method == "tree" else None)
            cut = [launch for launch in plan(meta_args(call), 0, sm_count=132) if "cut" in launch.name]
            assert cut and all(launch.constexprs["SAMPLE_RUNS"] == (_triton_backend.SAMPLE_RUNS if sampled else 0) for launch in cut), (call, cut)
    assert _triton_backend.geometry(cpu, sample_runs=32).histogram_top_k == _triton_backend.SELECT_GATHER // 2
    assert _triton_backend.geometry(cpu, sample_runs=0).histogram_top_k == _triton_backend.HISTOGRAM_TOP_K
    assert _triton_backend.geometry(cpu, sample_runs=32, histogram_top_k=7).histogram_top_k == 7
    for bad in (1, 3, -2):
        with pytest.raises(ValueError, match="sample_runs"):
            _triton_backend.geometry(cpu, sample_runs=bad)


@pytest.mark.parametrize("digits", [False, True])
def test_a_top_p_windows_slots_are_twice_a_gathers_where_ranks_are_by_byte_histograms(digits):
    """WINDOW_GATHER, a top-p window's slots: twice GATHER where ranks are by byte histograms (its
    cut by halvings, no sort) and a line's histogram counts hold them, else GATHER (Triton 3.6 and
    3.7 sort the window); the same for a chain's and a tree's or block's cut-offs."""
    from bench.gpu_model import Call, meta_args

    for vocab, gather in ((128256, 2048), (3000, 2048), (600, 256), (600, 64)):
        for method, plan in (("token", _triton_backend.launches_for), ("block", _triton_tree.launches_for), ("tree", _triton_tree.launches_for)):
            call = Call("c", 2, 4, vocab, "fp32", top_p=0.9, method=method, tree_depth=2 if method == "tree" else None)
            cut = [launch.constexprs for launch in plan(meta_args(call), 0, sm_count=132, select_gather=gather, digit_select=digits) if "cut" in launch.name]
            assert cut, (vocab, method)
            for c in cut:
                room = c["NUM_CHUNKS"] * (_triton_backend.SELECT_BINS + 1)
                assert c["GATHER"] == _triton_backend.gather_slots(c["NUM_CHUNKS"], gather)
                assert c["WINDOW_GATHER"] == (2 if digits and 2 * c["GATHER"] <= room else 1) * c["GATHER"], (vocab, c)
                if vocab == 128256:
                    assert c["WINDOW_GATHER"] == (4096 if digits else 2048)
