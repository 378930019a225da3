"""The GPU model's reading of compiled code (bench/gpu_model.py) on a hand-written SASS listing:
a search item's loop, its tile loop, and a tail whose sort only a gather's last item runs."""

from __future__ import annotations

import pytest

gpu_model = pytest.importorskip("bench.gpu_model")

# An outer work-item loop (0x10-0xd0) around a tile loop (0x20-0x50, loads and exponentiates); after
# the tiles, the last item's tail: a test, a branch past the sort (0x90-0xb0, a bitonic
# compare-exchange: ISETP.GT.XOR and two SELs) and a store common to every pass.
_SASS = """
        /*0000*/                   MOV R1, c[0x0][0x28] ;
        /*0010*/                   IADD3 R2, R2, 0x1, RZ ;
        /*0020*/                   LDG.E R3, desc[UR4][R4.64] ;
        /*0030*/                   MUFU.EX2 R3, R3 ;
        /*0040*/                   ATOMS.POPC.INC.32 RZ, [R5] ;
        /*0050*/               @P0 BRA 0x20 ;
        /*0060*/                   ISETP.NE.AND P1, PT, R2, R6, PT ;
        /*0070*/               @P1 BRA 0xd0 ;
        /*0080*/               @P2 BRA 0xc0 ;
        /*0090*/                   ISETP.GT.XOR P3, PT, R7, R8, P4 ;
        /*00a0*/                   SEL R7, R7, R8, P3 ;
        /*00b0*/                   SEL R8, R8, R7, P3 ;
        /*00c0*/                   STG.E desc[UR4][R4.64], R7 ;
        /*00d0*/               @P5 BRA 0x10 ;
        /*00e0*/                   EXIT ;
        /*00f0*/                   BRA 0xf0 ;
"""
_RESOURCES = "REG:32 STACK:0 SHARED:0 LOCAL:0"


def _item_loop():
    code = gpu_model.analyse(_SASS, _RESOURCES)
    outer = [loop for loop in code.loops if loop.parent is None]
    assert len(code.loops) == 2 and len(outer) == 1
    return outer[0]


def test_a_search_items_tail_is_counted_with_and_without_the_sort():
    loop = _item_loop()
    # The tail: 0x60-0xd0 (8 instructions) on its longest path; 5 past the sort's block.
    assert loop.tail == 8
    assert loop.tail_without_sort == 5
    assert loop.instructions == 1 + 8  # the head (outside the tile loop) and the longest tail
    assert gpu_model.sorted_blocks(gpu_model.parse_sass(_SASS)) == {0x90, 0xA0, 0xB0}


# The threshold items' loop (0x10-0xd0, before the kernel's acquire, CCTL.IVALL): a line of the
# top-p route runs its window's steps (the tile loop 0x30-0x50) and rejoins at the store; any other
# takes the top-k route (0x70-0x90: 3 instructions), whose window may settle it (to 0xc0) before
# the sort (0xa0-0xb0).
_THRESHOLDS = """
        /*0000*/                   MOV R1, c[0x0][0x28] ;
        /*0010*/                   IADD3 R2, R2, 0x1, RZ ;
        /*0020*/               @P0 BRA 0x70 ;
        /*0030*/                   LDG.E R3, desc[UR4][R4.64] ;
        /*0040*/                   MUFU.EX2 R3, R3 ;
        /*0050*/               @P1 BRA 0x30 ;
        /*0060*/                   BRA 0xc0 ;
        /*0070*/                   IADD3 R6, R6, 0x1, RZ ;
        /*0080*/                   IADD3 R7, R7, 0x1, RZ ;
        /*0090*/               @P2 BRA 0xc0 ;
        /*00a0*/                   ISETP.GT.XOR P3, PT, R7, R8, P4 ;
        /*00b0*/                   SEL R7, R7, R8, P3 ;
        /*00c0*/                   STG.E desc[UR4][R4.64], R7 ;
        /*00d0*/               @P5 BRA 0x10 ;
        /*00e0*/                   CCTL.IVALL ;
        /*00f0*/                   EXIT ;
        /*0100*/                   BRA 0x100 ;
"""


def test_a_threshold_item_takes_its_longest_path_whole_and_around_the_sort():
    """A threshold item's loop counts its longest path whole (0x10, 0x20, the top-k route, the
    sort, the store and the branch: 9), around the sort (the top-k route settled: 7) and through
    its tile loop around the sort (the top-p route: 5); each line weighs the path its kind takes."""
    code = gpu_model.analyse(_THRESHOLDS, _RESOURCES)
    loop = next(loop for loop in code.loops if loop.parent is None)
    assert (loop.instructions, loop.around_sort, loop.through_tiles) == (9, 7, 5)
    for p_share, k_share in ((0.0, 0.0), (1.0, 0.0), (0.0, 1.0), (0.25, 0.5)):
        call = gpu_model.Call("x", 64, 8, 128256, "bf16", top_p=0.99, top_p_settled_share=p_share, top_k_window_share=k_share)
        expected = (1 - p_share - k_share) + (5 * p_share + 7 * k_share) / 9
        assert gpu_model.threshold_item_trips(loop, call, 2.0) == pytest.approx(2.0 * expected)


# A warp-divergence check before a shuffle (BRA.DIV: a diverged warp leaves for the out-of-line
# code past the final self-branch, a converged one goes on), then the shuffle's sum and a store.
_DIVERGENCE = """
        /*0000*/                   MOV R1, c[0x0][0x28] ;
        /*0010*/                   BRA.DIV UR4, 0x70 ;
        /*0020*/                   SHFL.BFLY PT, R2, R3, 0x1, 0x1f ;
        /*0030*/                   FADD R3, R3, R2 ;
        /*0040*/                   STG.E desc[UR4][R4.64], R3 ;
        /*0050*/                   EXIT ;
        /*0060*/                   BRA 0x60 ;
        /*0070*/                   WARPSYNC.ALL ;
"""


def test_code_after_a_divergence_check_is_on_the_path():
    code = gpu_model.analyse(_DIVERGENCE, _RESOURCES)
    assert code.path == 6


@pytest.mark.parametrize("gather_share, expected", [(0.0, 5.0), (1.0, 8.0), (0.25, 5.75)])
def test_only_the_gathers_share_of_the_passes_pays_for_the_sort(gather_share, expected):
    call = gpu_model.Call("x", 64, 8, 128256, "bf16", top_p=0.99, search_fraction=1.0, search_passes=2.0, search_gather_share=gather_share)
    assert gpu_model.search_tail(_item_loop(), call) == pytest.approx(expected)


# A search item's loop (0x10-0x100) around a tile loop (0x20-0x50), then a tail whose last item
# either sorts (0x90-0xb0) or, a top-k gather alone, finds its cut by byte histograms (0xd0-0xe0:
# shared-memory atomics, DIGIT_SELECT), then a store common to every pass.
_DIGITS_TAIL = """
        /*0000*/                   MOV R1, c[0x0][0x28] ;
        /*0010*/                   IADD3 R2, R2, 0x1, RZ ;
        /*0020*/                   LDG.E R3, desc[UR4][R4.64] ;
        /*0030*/                   MUFU.EX2 R3, R3 ;
        /*0040*/                   ATOMS.POPC.INC.32 RZ, [R5] ;
        /*0050*/               @P0 BRA 0x20 ;
        /*0060*/                   ISETP.NE.AND P1, PT, R2, R6, PT ;
        /*0070*/               @P1 BRA 0x100 ;
        /*0080*/               @P2 BRA 0xd0 ;
        /*0090*/                   ISETP.GT.XOR P3, PT, R7, R8, P4 ;
        /*00a0*/                   SEL R7, R7, R8, P3 ;
        /*00b0*/                   SEL R8, R8, R7, P3 ;
        /*00c0*/                   BRA 0xf0 ;
        /*00d0*/                   ATOMS.POPC.INC.32 RZ, [R6] ;
        /*00e0*/                   BAR.SYNC.DEFER_BLOCKING 0x0 ;
        /*00f0*/                   STG.E desc[UR4][R4.64], R7 ;
        /*0100*/               @P5 BRA 0x10 ;
        /*0110*/                   EXIT ;
        /*0120*/                   BRA 0x120 ;
"""


@pytest.mark.parametrize("gather_share", [0.0, 1.0, 0.25])
def test_a_top_k_gather_goes_through_its_byte_histograms(gather_share):
    """The tail's longest path sorts (9); a top-k gather goes through its byte histograms around
    the sort (7), under top-p too (its cut inside the set by halvings, a loop of its own); a top-p
    window's gather, like any other pass, around both (5: the sort's block holds its branch).
    Where the code has no byte histograms (Triton 3.6, 3.7) a top-k gather sorts."""
    loop = next(loop for loop in gpu_model.analyse(_DIGITS_TAIL, _RESOURCES).loops if loop.parent is None)
    assert (loop.tail, loop.tail_top_k, loop.tail_without_sort) == (9, 7, 5)
    top_k = gpu_model.Call("x", 64, 8, 128256, "bf16", top_k=1000, search_fraction=1.0, search_passes=1.0, search_gather_share=gather_share)
    top_p = gpu_model.Call("x", 64, 8, 128256, "bf16", top_k=1000, top_p=0.9, search_fraction=1.0, search_passes=1.0,
                           search_gather_share=gather_share)
    window = gpu_model.Call("x", 64, 8, 128256, "fp32", top_p=0.9, search_fraction=1.0, search_passes=1.0, search_gather_share=gather_share,
                            search_window_share=gather_share)
    assert gpu_model.search_tail(loop, top_k) == pytest.approx(gather_share * 7 + (1 - gather_share) * 5)
    assert gpu_model.search_tail(loop, top_p) == pytest.approx(gather_share * 7 + (1 - gather_share) * 5)
    assert gpu_model.search_tail(loop, window) == pytest.approx(5)
    assert gpu_model.search_tail(_item_loop(), top_k) == pytest.approx(gather_share * 8 + (1 - gather_share) * 5)


# A search item's loop (0x10-0xe0) over two copies of its pass (a target line's and a draft
# line's), the compiler placing the first copy's tile loop (0x30-0x50) and tail (0x60-0x70)
# before the second copy's tile loop (0x80-0xa0) and tail (0xb0-0xd0); then the latch (0xe0).
_TWO_COPIES = """
        /*0000*/                   MOV R1, c[0x0][0x28] ;
        /*0010*/                   IADD3 R2, R2, 0x1, RZ ;
        /*0020*/               @P6 BRA 0x80 ;
        /*0030*/                   LDG.E R3, desc[UR4][R4.64] ;
        /*0040*/                   MUFU.EX2 R3, R3 ;
        /*0050*/               @P0 BRA 0x30 ;
        /*0060*/                   ISETP.NE.AND P1, PT, R2, R6, PT ;
        /*0070*/                   BRA 0xe0 ;
        /*0080*/                   LDG.E R3, desc[UR4][R4.64] ;
        /*0090*/                   MUFU.EX2 R3, R3 ;
        /*00a0*/               @P0 BRA 0x80 ;
        /*00b0*/                   IADD3 R7, R7, 0x1, RZ ;
        /*00c0*/                   IADD3 R7, R7, 0x1, RZ ;
        /*00d0*/                   IADD3 R7, R7, 0x1, RZ ;
        /*00e0*/               @P5 BRA 0x10 ;
        /*00f0*/                   EXIT ;
        /*0100*/                   BRA 0x100 ;
"""


def test_a_search_items_tail_is_the_code_after_its_tiles_that_leads_to_none():
    """Every trip runs the item's head (2: the ticket and the branch to one copy), a line's last
    item one tail (the longer copy's: 3 and the latch), though the first copy's tail lies before
    the second copy's tiles in the listing: the tail is what a tile loop leads to and that leads
    to none, not what follows the last tile loop."""
    loop = next(loop for loop in gpu_model.analyse(_TWO_COPIES, _RESOURCES).loops if loop.parent is None)
    assert (loop.instructions - loop.tail, loop.tail) == (2, 4)


# A tile loop (0x10-0x50) that keeps two values on the stack (STL / LDL.LU every trip), as a build
# at the register limit does, then a store.
_SPILLING = """
        /*0000*/                   MOV R1, c[0x0][0x28] ;
        /*0010*/                   LDG.E.128 R4, desc[UR4][R2.64] ;
        /*0020*/                   STL [R1+0x8], R4 ;
        /*0030*/                   FMNMX R6, R6, R5, !PT ;
        /*0040*/                   LDL.LU R4, [R1+0x8] ;
        /*0050*/               @P0 BRA 0x10 ;
        /*0060*/                   STG.E desc[UR4][R2.64], R6 ;
        /*0070*/                   EXIT ;
        /*0080*/                   BRA 0x80 ;
"""


def test_a_stack_frame_counts_as_spilled_only_where_a_tile_loop_uses_it():
    """A frame the innermost loop reads and writes is a spill; one the loop never touches (the
    division's CALL saves values there) is not, whatever its size, nor one a spin-wait (strong
    loads only) reloads from."""
    assert gpu_model.analyse(_SPILLING, "REG:255 STACK:600 SHARED:0 LOCAL:0").spill_bytes == 600
    spin = _SPILLING.replace("LDG.E.128 R4", "LDG.E.STRONG.GPU R4")
    assert gpu_model.analyse(spin, "REG:128 STACK:416 SHARED:0 LOCAL:0").spill_bytes == 0
    assert gpu_model.analyse(_SASS, "REG:128 STACK:48 SHARED:0 LOCAL:0").spill_bytes == 0
    assert gpu_model.analyse(_SPILLING, "REG:255 STACK:0 SHARED:0 LOCAL:16").spill_bytes == 16


# A threshold items' loop (0x10-0xb0, before the acquire) whose sort (0x30-0x50) a branch with a
# predicate operand skips ("@P5 BRA P6": taken when both hold), then a sample's bisection loop
# (0x70-0x90: no load, no exponential) that a line which does not sample goes around (0x60).
_SAMPLED_ITEM = """
        /*0000*/                   MOV R1, c[0x0][0x28] ;
        /*0010*/                   IADD3 R2, R2, 0x1, RZ ;
        /*0020*/               @P5 BRA P6, 0x60 ;
        /*0030*/                   ISETP.GT.XOR P3, PT, R7, R8, P4 ;
        /*0040*/                   SEL R7, R7, R8, P3 ;
        /*0050*/                   SEL R8, R8, R7, P3 ;
        /*0060*/               @P0 BRA 0xa0 ;
        /*0070*/                   IADD3 R9, R9, 0x1, RZ ;
        /*0080*/                   ISETP.GE.AND P1, PT, R9, R10, PT ;
        /*0090*/               @P1 BRA 0x70 ;
        /*00a0*/                   STG.E desc[UR4][R4.64], R7 ;
        /*00b0*/               @P2 BRA 0x10 ;
        /*00c0*/                   CCTL.IVALL ;
        /*00d0*/                   EXIT ;
        /*00e0*/                   BRA 0xe0 ;
"""


@pytest.mark.parametrize("branch", ["@P5 BRA P6, 0x60", "BRA !P6, 0x60"])
def test_a_sampled_line_goes_around_the_sort_its_branch_skips(branch):
    """A branch that also tests a predicate operand (with a guard or without) is a conditional
    branch to its target: the path around the sort exists. A line that samples takes the path
    through the bisection around the sort (5 of the longest 8: the item's head, the bisection's
    branch, the store and the loop's branch; the bisection's own steps counted as its trips); any
    other, the longest around the sample."""
    sass = _SAMPLED_ITEM.replace("@P5 BRA P6, 0x60", branch)
    code = gpu_model.analyse(sass, _RESOURCES)
    assert gpu_model._branch_target(gpu_model.parse_sass(sass)[2]) == 0x60
    loop = next(loop for loop in code.loops if loop.parent is None)
    assert gpu_model.loop_kinds("cutoff", code) == ["threshold ticket loop", "sample bisection step"]
    assert (loop.instructions, loop.around_sort, loop.through_sample, loop.around_sample) == (8, 5, 5, 8)
    for sampled in (0.0, 0.5, 1.0):
        call = gpu_model.Call("x", 64, 8, 128256, "bf16", top_k=1000, search_fraction=1.0, sampled_share=sampled)
        assert gpu_model.threshold_item_trips(loop, call, 2.0) == pytest.approx(2.0 * (sampled * 5 + (1 - sampled) * 8) / 8)


@pytest.mark.parametrize("sampled", [0.0, 0.5, 1.0])
def test_a_threshold_item_meets_the_barriers_of_the_route_it_takes(sampled):
    """A barrier in the sort: a line that samples goes around the sort and meets none; any other,
    around its sample through the sort, meets it. The barriers are the routes' own (2 items: 2 at
    sampled share 0, none at 1), not the longest path's scaled by the instructions a route runs."""
    sass = _SAMPLED_ITEM.replace("/*0040*/                   SEL R7, R7, R8, P3 ;", "/*0040*/                   BAR.SYNC.DEFER_BLOCKING 0x0 ;")
    loop = next(loop for loop in gpu_model.analyse(sass, _RESOURCES).loops if loop.parent is None)
    assert loop.path_barriers == 1
    assert (loop.route_barriers["through_sample"], loop.route_barriers["around_sample"]) == (0, 1)
    call = gpu_model.Call("x", 64, 8, 128256, "bf16", top_k=1000, search_fraction=1.0, sampled_share=sampled)
    trips = gpu_model.threshold_item_trips(loop, call, 2.0)
    assert gpu_model.loop_barriers(loop, "threshold ticket loop", trips, call, {}) == pytest.approx(2.0 * (1 - sampled))


@pytest.mark.parametrize("gather_share", [0.0, 1.0, 0.25])
def test_a_search_items_barriers_are_its_heads_each_item_and_its_tails_route_once_a_pass(gather_share):
    """Every item meets its head's barriers (none here); a line's last item of a pass, its tail's: a
    top-k gather's byte histograms (one barrier), any other pass's route none."""
    loop = next(loop for loop in gpu_model.analyse(_DIGITS_TAIL, _RESOURCES).loops if loop.parent is None)
    assert loop.route_barriers == {"head": 0, "tail": 1, "tail_without_sort": 0, "tail_top_k": 1}
    call = gpu_model.Call("x", 64, 8, 128256, "bf16", top_k=1000, search_fraction=1.0, search_passes=1.0, search_gather_share=gather_share)
    work = {"loops": {"search ticket loop": (3.0, 8192)}, "finalisers": 0.5}
    trips = (3.0 * (loop.instructions - loop.tail) + 0.5 * gpu_model.search_tail(loop, call)) / loop.instructions
    assert gpu_model.loop_barriers(loop, "search ticket loop", trips, call, work) == pytest.approx(0.5 * gather_share)
    assert gpu_model.search_tail(loop, call, barriers=True) == pytest.approx(gather_share)


@pytest.mark.parametrize("batch, exact_share", [(1, 0.0), (1, 0.3), (64, 0.0)])
def test_the_first_search_pass_waits_for_no_pass_and_reads_lines_where_they_are(monkeypatch, batch, exact_share):
    """A search pass's dependent round trips: the ticket and the acquire of the previous pass, but
    in the first (a program's first search ticket is drawn before the threshold items' acquire,
    and pass 0 waits for no pass); the zeroing stores only where a pass takes stage 3; the line
    from L2 where the call's logits fit in half of it (B=1 K=4 float32: 4.6 MB), else from HBM
    (B=64 K=8 float32: 558 MB)."""
    from types import SimpleNamespace

    monkeypatch.setattr(gpu_model, "compiled_code", lambda launch: gpu_model.analyse(_SASS, _RESOURCES))
    monkeypatch.setattr(gpu_model, "_occupancy", lambda code, warps: 2)
    constexprs = {"NUM_CHUNKS": 16, "CHUNK": 8192, "TILE": 2048, "BINS": 256, "SAMPLE_RUNS": 32}
    launch = SimpleNamespace(name="cutoff", grid=(264,), constexprs=constexprs, num_warps=8, args=())
    call = gpu_model.Call("x", batch, 8 if batch > 1 else 4, 128256, "fp32", top_k=1000, search_fraction=1.0, search_passes=2.0,
                          search_exact_share=exact_share)
    first = gpu_model._work(launch, call, "cutoff:search", first_pass=True)["rounds"]
    later = gpu_model._work(launch, call, "cutoff:search")["rounds"]
    read = "l2" if batch == 1 else "dram"
    zeroing = ["l2"] if exact_share else []
    assert first == ["l2"] + zeroing + [read, "l2", "l2", "l2"]
    assert later == ["l2", "l2"] + first


def test_items_drawn_by_ticket_charge_the_pipes_their_average_share(monkeypatch):
    """The cut-offs launch's programs draw the lines' threshold items: 1088 lines over 264 resident
    programs are 4.12 items a program for the pipes and schedulers, 5 on the slowest program's
    critical path ("most"). The issue time then grows with the lines (1088 against 1056, four a
    program), not by a whole item a program (5 / 4)."""
    from types import SimpleNamespace

    code = gpu_model.analyse(_SAMPLED_ITEM, _RESOURCES)
    monkeypatch.setattr(gpu_model, "compiled_code", lambda launch: code)
    monkeypatch.setattr(gpu_model, "_occupancy", lambda code, warps: 2)
    constexprs = {"SORT": 1024, "LINE_SLOTS": 2048, "PARTS": 1, "SAMPLE_RUNS": 32, "SAMPLE_RUN": 256, "TOP_P_STEP": 1024}
    launch = SimpleNamespace(name="cutoff", grid=(528,), constexprs=constexprs, num_warps=8, args=())
    issue = {}
    for batch, k in ((64, 8), (32, 16)):  # 1088 and 1056 lines
        call = gpu_model.Call("x", batch, k, 128256, "bf16", top_k=1000, search_fraction=1.0, sampled_share=1.0)
        work = gpu_model._work(launch, call, "cutoff")
        lines = batch * (2 * k + 1)
        assert work["loops"]["threshold ticket loop"][0] == pytest.approx(lines / 264)
        assert work["most"] * lines / 264 == pytest.approx(-(-lines // 264))
        issue[lines] = gpu_model.estimate_launch(launch, call, "cutoff").issue_us
    assert issue[1088] / issue[1056] == pytest.approx(1088 / 1056, rel=0.02)


# A threshold items' loop (0x10-0x100) whose sort (0x30-0x50) a line may skip, then a top-k sample's
# bisection (0x70-0x90: no load, no exponential), then a top-p sample's: its prologue (0xb0) and
# its bisection (0xc0-0xe0: no load, each key's weight an exponential), which a top-p line that
# samples takes around the sort (its candidates' mass is short of its budget).
_TWO_SAMPLES_ITEM = """
        /*0000*/                   MOV R1, c[0x0][0x28] ;
        /*0010*/                   IADD3 R2, R2, 0x1, RZ ;
        /*0020*/               @P5 BRA P6, 0x60 ;
        /*0030*/                   ISETP.GT.XOR P3, PT, R7, R8, P4 ;
        /*0040*/                   SEL R7, R7, R8, P3 ;
        /*0050*/                   SEL R8, R8, R7, P3 ;
        /*0060*/               @P0 BRA 0xa0 ;
        /*0070*/                   IADD3 R9, R9, 0x1, RZ ;
        /*0080*/                   ISETP.GE.AND P1, PT, R9, R10, PT ;
        /*0090*/               @P1 BRA 0x70 ;
        /*00a0*/               @P3 BRA 0xf0 ;
        /*00b0*/                   IMAD.MOV.U32 R11, RZ, RZ, R12 ;
        /*00c0*/                   MUFU.EX2 R13, R11 ;
        /*00d0*/                   ISETP.GE.AND P1, PT, R13, R10, PT ;
        /*00e0*/               @P1 BRA 0xc0 ;
        /*00f0*/                   STG.E desc[UR4][R4.64], R7 ;
        /*0100*/               @P2 BRA 0x10 ;
        /*0110*/                   CCTL.IVALL ;
        /*0120*/                   EXIT ;
        /*0130*/                   BRA 0x130 ;
"""


def test_a_top_p_line_that_samples_goes_through_its_sample_around_its_sort():
    """The top-p sample's bisection (an exponential, no load) is a loop of its own kind. A line
    that samples its raw window takes the longest path through that sample around the sort (7 of
    10: the prologue only it runs); a top-k line that samples, the path through its own sample
    around the sort and the other sample (6); any other line, the longest around both samples (9).
    Each loop's own steps are counted as its trips."""
    code = gpu_model.analyse(_TWO_SAMPLES_ITEM, _RESOURCES)
    loop = next(loop for loop in code.loops if loop.parent is None)
    assert gpu_model.loop_kinds("cutoff", code) == ["threshold ticket loop", "sample bisection step", "top-p sample bisection step"]
    assert (loop.instructions, loop.through_p_sample, loop.through_sample, loop.around_sample) == (10, 7, 6, 9)
    for p_sampled, k_sampled in ((0.0, 0.0), (0.5, 0.0), (0.25, 0.5), (1.0, 0.0)):
        call = gpu_model.Call("x", 64, 8, 128256, "bf16", top_p=0.99, search_fraction=1.0, sampled_share=k_sampled, top_p_sampled_share=p_sampled)
        expected = (p_sampled * 7 + k_sampled * 6 + (1 - p_sampled - k_sampled) * 9) / 10
        assert gpu_model.threshold_item_trips(loop, call, 2.0) == pytest.approx(2.0 * expected)


# _TWO_SAMPLES_ITEM with a top-p line's test of its candidates' mass against its budget (0x30: a
# float64 test on the way to the sort, 0x50-0x70), which a top-k line branches around (0x20).
_MASS_TEST_ITEM = """
        /*0000*/                   MOV R1, c[0x0][0x28] ;
        /*0010*/                   IADD3 R2, R2, 0x1, RZ ;
        /*0020*/               @P4 BRA 0x40 ;
        /*0030*/                   DSETP.GE.AND P5, PT, R12, R14, PT ;
        /*0040*/               @P5 BRA P6, 0x80 ;
        /*0050*/                   ISETP.GT.XOR P3, PT, R7, R8, P4 ;
        /*0060*/                   SEL R7, R7, R8, P3 ;
        /*0070*/                   SEL R8, R8, R7, P3 ;
        /*0080*/               @P0 BRA 0xc0 ;
        /*0090*/                   IADD3 R9, R9, 0x1, RZ ;
        /*00a0*/                   ISETP.GE.AND P1, PT, R9, R10, PT ;
        /*00b0*/               @P1 BRA 0x90 ;
        /*00c0*/               @P3 BRA 0x110 ;
        /*00d0*/                   IMAD.MOV.U32 R11, RZ, RZ, R12 ;
        /*00e0*/                   MUFU.EX2 R13, R11 ;
        /*00f0*/                   ISETP.GE.AND P1, PT, R13, R10, PT ;
        /*0100*/               @P1 BRA 0xe0 ;
        /*0110*/                   STG.E desc[UR4][R4.64], R7 ;
        /*0120*/               @P2 BRA 0x10 ;
        /*0130*/                   CCTL.IVALL ;
        /*0140*/                   EXIT ;
        /*0150*/                   BRA 0x150 ;
"""


def test_a_top_k_line_goes_around_the_test_of_a_top_p_lines_candidates_mass():
    """The float64 test before the sort (a top-p line's candidates' mass against its budget) lies
    only on top-p lines' paths: a top-p line that samples goes through it and its sample around
    the sort (9 of 12); a top-k line that samples, around it, the sort and the top-p sample (7); a
    line that does not sample, the longest way around both samples, through the test in a top-p
    call (11), around it in a top-k call (10)."""
    code = gpu_model.analyse(_MASS_TEST_ITEM, _RESOURCES)
    loop = next(loop for loop in code.loops if loop.parent is None)
    assert gpu_model.loop_kinds("cutoff", code) == ["threshold ticket loop", "sample bisection step", "top-p sample bisection step"]
    assert (loop.instructions, loop.through_p_sample, loop.through_sample, loop.around_sample, loop.around_sample_top_k) == (12, 9, 7, 11, 10)
    for sampled in (0.0, 0.5, 1.0):
        top_p = gpu_model.Call("x", 64, 8, 128256, "fp32", top_p=0.99, search_fraction=1.0, top_p_sampled_share=sampled)
        assert gpu_model.threshold_item_trips(loop, top_p, 2.0) == pytest.approx(2.0 * (sampled * 9 + (1 - sampled) * 11) / 12)
        top_k = gpu_model.Call("x", 64, 8, 128256, "fp32", top_k=1000, search_fraction=1.0, sampled_share=sampled)
        assert gpu_model.threshold_item_trips(loop, top_k, 2.0) == pytest.approx(2.0 * (sampled * 7 + (1 - sampled) * 10) / 12)


# A threshold items' loop (0x10-0x140) with a sort (0x30-0x50), a top-k sample's bisection (0x70-0x90:
# integer counts, a popcount), then a 32-bit top-p line's sampled gather: its estimate (0xb0-0xe0,
# unrolled twice: two float64 tests a trip) and its window's bounds (0xf0-0x120: popcounts and two
# float64 tests a step).
_GATHER_SAMPLE_ITEM = """
        /*0000*/                   MOV R1, c[0x0][0x28] ;
        /*0010*/                   IADD3 R2, R2, 0x1, RZ ;
        /*0020*/               @P5 BRA P6, 0x60 ;
        /*0030*/                   ISETP.GT.XOR P3, PT, R7, R8, P4 ;
        /*0040*/                   SEL R7, R7, R8, P3 ;
        /*0050*/                   SEL R8, R8, R7, P3 ;
        /*0060*/               @P0 BRA 0xa0 ;
        /*0070*/                   POPC R9, R9 ;
        /*0080*/                   ISETP.GE.AND P1, PT, R9, R10, PT ;
        /*0090*/               @P1 BRA 0x70 ;
        /*00a0*/               @P3 BRA 0x130 ;
        /*00b0*/                   DSETP.GE.AND P1, PT, R12, R14, PT ;
        /*00c0*/                   DSETP.GE.AND P2, PT, R12, R16, PT ;
        /*00d0*/                   IADD3 R9, R9, 0x1, RZ ;
        /*00e0*/               @P1 BRA 0xb0 ;
        /*00f0*/                   POPC R11, R11 ;
        /*0100*/                   DSETP.GE.AND P1, PT, R12, R14, PT ;
        /*0110*/                   DSETP.GTU.AND P2, PT, R12, R16, PT ;
        /*0120*/               @P1 BRA 0xf0 ;
        /*0130*/                   STG.E desc[UR4][R4.64], R7 ;
        /*0140*/               @P2 BRA 0x10 ;
        /*0150*/                   CCTL.IVALL ;
        /*0160*/                   EXIT ;
        /*0170*/                   BRA 0x170 ;
"""


def test_a_float32_top_p_gather_sample_is_counted_step_by_step(monkeypatch):
    """A call of 32-bit lines bisects a top-p line's sample twice: the cut's bucket by the sampled
    mass (float64 tests, no exponential), then the window's two bounds by the sampled counts
    (popcounts). Each is a loop kind of its own, with 16 steps per sampled line over the steps one
    trip takes (the compiler unrolled the estimate twice here), not the top-k sample's (integer
    counts). Both lie on a sampled line's path around the top-k sample and the sort."""
    from types import SimpleNamespace

    code = gpu_model.analyse(_GATHER_SAMPLE_ITEM, _RESOURCES)
    assert gpu_model.loop_kinds("cutoff", code) == ["threshold ticket loop", "sample bisection step", "top-p gather estimate step",
                                                    "top-p gather window step"]
    item = next(loop for loop in code.loops if loop.parent is None)
    assert (item.instructions, item.through_p_sample, item.through_sample) == (9, 6, 6)  # (its own code: around the sort and both samples)
    monkeypatch.setattr(gpu_model, "compiled_code", lambda launch: code)
    monkeypatch.setattr(gpu_model, "_occupancy", lambda code, warps: 2)
    constexprs = {"SORT": 1024, "LINE_SLOTS": 2048, "PARTS": 1, "SAMPLE_RUNS": 32, "SAMPLE_RUN": 256, "TOP_P_STEP": 1024}
    launch = SimpleNamespace(name="cutoff", grid=(528,), constexprs=constexprs, num_warps=8, args=())
    call = gpu_model.Call("x", 64, 8, 128256, "fp32", top_p=0.99, search_fraction=1.0, top_p_sampled_share=0.5)
    trips = {kind: trips for _, kind, trips, _ in gpu_model.loop_trips(launch, call, "cutoff", code)}
    per_program = 1088 / 264 * 0.5 * 16  # lines a program, half of them sampled, 16 steps each
    assert trips["top-p gather estimate step"] == pytest.approx(per_program / 2)
    assert trips["top-p gather window step"] == pytest.approx(per_program)
    assert trips["sample bisection step"] == 0.0


# A threshold items' loop (0x10-0x140) with a sort (0x30-0x50), a top-k sample ranked by byte
# histograms (0x70-0xa0: straight code, shared-memory atomics and barriers: DIGIT_SELECT), then a
# 32-bit top-p line's sampled gather: its estimate's loop (0xc0-0xe0: float64 tests) and its
# window's bounds by byte histograms (0xf0-0x120).
_DIGITS_ITEM = """
        /*0000*/                   MOV R1, c[0x0][0x28] ;
        /*0010*/                   IADD3 R2, R2, 0x1, RZ ;
        /*0020*/               @P5 BRA P6, 0x60 ;
        /*0030*/                   ISETP.GT.XOR P3, PT, R7, R8, P4 ;
        /*0040*/                   SEL R7, R7, R8, P3 ;
        /*0050*/                   SEL R8, R8, R7, P3 ;
        /*0060*/               @P0 BRA 0xb0 ;
        /*0070*/                   ATOMS.POPC.INC.32 RZ, [R5] ;
        /*0080*/                   BAR.SYNC.DEFER_BLOCKING 0x0 ;
        /*0090*/                   ATOMS.POPC.INC.32 RZ, [R6] ;
        /*00a0*/                   BAR.SYNC.DEFER_BLOCKING 0x0 ;
        /*00b0*/               @P3 BRA 0x130 ;
        /*00c0*/                   DSETP.GE.AND P1, PT, R12, R14, PT ;
        /*00d0*/                   IADD3 R9, R9, 0x1, RZ ;
        /*00e0*/               @P1 BRA 0xc0 ;
        /*00f0*/                   ATOMS.POPC.INC.32 RZ, [R7] ;
        /*0100*/                   BAR.SYNC.DEFER_BLOCKING 0x0 ;
        /*0110*/                   IADD3 R11, R11, 0x1, RZ ;
        /*0120*/                   IADD3 R12, R12, 0x1, RZ ;
        /*0130*/                   STG.E desc[UR4][R4.64], R7 ;
        /*0140*/               @P2 BRA 0x10 ;
        /*0150*/                   CCTL.IVALL ;
        /*0160*/                   EXIT ;
        /*0170*/                   BRA 0x170 ;
"""


def test_a_samples_byte_histograms_lie_on_the_paths_of_the_lines_that_sample():
    """Where a sample is ranked by byte histograms (no loop of its own), its code is told by its
    shared-memory atomics: a top-p sample's after its estimate's loop, a top-k sample's elsewhere.
    A top-k line that samples runs its own histograms around the sort (10: the head, its branch,
    the histograms, the branch past the top-p sample, the store and the loop's branch); a top-p
    line that samples, its estimate and its histograms, around the sort too (10); any other,
    neither (9). A trip meets the barriers of one path: where the top-k sample's code leaves past the
    top-p sample's, one of the two barriers of the body."""
    code = gpu_model.analyse(_DIGITS_ITEM, _RESOURCES)
    loop = next(loop for loop in code.loops if loop.parent is None)
    assert gpu_model.loop_kinds("cutoff", code) == ["threshold ticket loop", "top-p gather estimate step"]
    assert (loop.instructions, loop.through_sample, loop.through_p_sample, loop.around_sample) == (17, 10, 10, 9)
    assert loop.path_barriers == loop.has("BAR") == 3
    apart = _DIGITS_ITEM.replace("/*00a0*/                   BAR.SYNC.DEFER_BLOCKING 0x0 ;", "/*00a0*/                   BRA 0x130 ;")
    item = next(loop for loop in gpu_model.analyse(apart, _RESOURCES).loops if loop.parent is None)
    assert (item.has("BAR"), item.path_barriers) == (2, 1)
