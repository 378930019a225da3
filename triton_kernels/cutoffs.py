"""Every filtered line's top-k / top-p cut-off in one launch: the search over the candidates, then
the whole-line search where the candidates cannot settle the cut.

The work comes as tickets, drawn from one atomic counter by a fixed number of programs (each
takes the next ticket when it is free):

* tickets [0, lines): ``threshold_line`` of that line (thresholds.py): the cut from the line's
  candidates, or a search state and a place in the search list;
* then PASSES passes of the whole-line search (select.py) over the listed lines' chunks, pass
  by pass: ticket ``lines + (pass * searching + slot) * runs + run``, an item per run of
  ``merge`` chunks (``runs`` = cdiv(NUM_CHUNKS, merge) per line). ``merge`` is 1 (an item per
  chunk) unless the listed lines' chunks outnumber the programs 8-fold (2), 16-fold (4) or
  32-fold (8): the fewer, longer items of a large search cost less fixed work (the state, the
  wait, the histogram's store and sum, a gather's counter), and every program still takes four or
  more (at B=64 K=8 V=128256, every line searched: 8 chunks an item, about 8 items a program).

An item only waits for items with smaller tickets (the search items for every threshold item;
a pass item for its line's previous pass), and tickets are handed out in order to programs that
are running, so the smallest unfinished ticket can always proceed: no wait can deadlock, however
many programs are resident (one program alone, as under the interpreter, takes every ticket in
order). A call whose lines all settled among the candidates lists no line: past the threshold
items each program draws one ticket and exits. The last program to exit resets the counters, so
the next call and a CUDA graph's next replay start from zero.

Either way a cut line leaves its statistics over the kept values (max and normaliser, in its first
partial slot), so nothing reads a line again for them. ``cutoff_items`` is the ticket loop as a
function: tree.py's filtered walks append their own items (a tree's one a row, a block's one per
position and chunk of the vocabulary), after every search item, to the same tickets, in the same
launch.
"""

import triton
import triton.language as tl

from .select import search_item
from .thresholds import threshold_line


@triton.jit
def cutoff_items(
    target_ptr, draft_ptr, tau_ptr, part_m_ptr, part_z_ptr, state_ptr, state_f_ptr, progress_ptr, part_count_ptr, part_mass_ptr, counter_ptr,
    control_ptr, searching_ptr, search_list_ptr, temperature_ptr, top_k_ptr, top_p_ptr, num_draft_ptr, cand_ptr, cand_count_ptr, cand_floor_ptr,
    sort_ptr, hist_ptr, window_ptr, top_p_window_ptr, batch, K, V, Vd, t_stride_b, t_stride_k, d_stride_b, d_stride_k, t_parts, d_parts,
    HAS_DRAFT: tl.constexpr, PARTS: tl.constexpr, PP: tl.constexpr, LINE_SLOTS: tl.constexpr, SORT: tl.constexpr, NUM_CHUNKS: tl.constexpr,
    CHUNK: tl.constexpr, TILE: tl.constexpr, BINS: tl.constexpr, PASSES: tl.constexpr, GATHER: tl.constexpr, WINDOW_GATHER: tl.constexpr,
    HISTOGRAM_TOP_K: tl.constexpr,
    KEY_WINDOW: tl.constexpr, TOP_P_BINS: tl.constexpr, TOP_P_STEP: tl.constexpr, SAMPLE_RUNS: tl.constexpr, SAMPLE_RUN: tl.constexpr,
    DIGIT_SELECT: tl.constexpr, VECTOR_LINES: tl.constexpr, WINDOW_ATOMICS: tl.constexpr = True,
):
    """The threshold and search items of a program (arguments as cutoff_kernel's); returns
    (the program's first ticket past them, where the items after them start). WINDOW_ATOMICS
    (search_item's): a kernel with more code after these items passes False."""
    lines = batch * (K + 1) + (batch * K if HAS_DRAFT else 0)
    ticket = tl.atomic_add(control_ptr, 1, sem="relaxed", scope="gpu")
    while ticket < lines:
        threshold_line(
            ticket, target_ptr, draft_ptr, tau_ptr, part_m_ptr, part_z_ptr, state_ptr, state_f_ptr, progress_ptr, searching_ptr, search_list_ptr,
            temperature_ptr, top_k_ptr, top_p_ptr, num_draft_ptr, cand_ptr, cand_count_ptr, cand_floor_ptr, sort_ptr, hist_ptr, window_ptr,
            top_p_window_ptr, batch, K, V, Vd, t_stride_b, t_stride_k, d_stride_b, d_stride_k, t_parts, d_parts, HAS_DRAFT, PARTS, PP, LINE_SLOTS,
            SORT, HISTOGRAM_TOP_K, GATHER, WINDOW_GATHER, KEY_WINDOW, TOP_P_BINS, TOP_P_STEP, SAMPLE_RUNS, SAMPLE_RUN, DIGIT_SELECT,
        )
        tl.debug_barrier()  # every thread's stores precede the release
        tl.atomic_add(control_ptr + 1, 1, sem="release", scope="gpu")
        ticket = tl.atomic_add(control_ptr, 1, sem="relaxed", scope="gpu")
    # The search list is complete once every threshold item has finished.
    finished = tl.atomic_add(control_ptr + 1, 0, sem="acquire", scope="gpu")
    while finished < lines:
        finished = tl.atomic_add(control_ptr + 1, 0, sem="acquire", scope="gpu")
    tl.debug_barrier()  # every thread reads the list after the acquire
    searching = tl.load(searching_ptr, cache_modifier=".cg")
    programs = tl.num_programs(0)
    merge = (1 + (searching * NUM_CHUNKS >= 8 * programs).to(tl.int32) + 2 * (searching * NUM_CHUNKS >= 16 * programs).to(tl.int32)
             + 4 * (searching * NUM_CHUNKS >= 32 * programs).to(tl.int32))
    runs = tl.cdiv(NUM_CHUNKS, merge)
    per_pass = searching * runs
    while ticket < lines + PASSES * per_pass:
        item = ticket - lines
        search_pass = item // per_pass
        slot = item % per_pass
        line = tl.load(search_list_ptr + slot // runs, cache_modifier=".cg")
        search_item(
            target_ptr, draft_ptr, tau_ptr, part_m_ptr, part_z_ptr, temperature_ptr, top_k_ptr, top_p_ptr, state_ptr, state_f_ptr, part_count_ptr,
            part_mass_ptr, counter_ptr, progress_ptr, control_ptr + 3, line, slot % runs, merge, search_pass, batch, K, V, Vd, t_stride_b, t_stride_k,
            d_stride_b, d_stride_k, t_parts, d_parts, NUM_CHUNKS, HAS_DRAFT, CHUNK, TILE, BINS, PASSES, PARTS, PP, GATHER, WINDOW_GATHER, SAMPLE_RUNS,
            DIGIT_SELECT, VECTOR_LINES, WINDOW_ATOMICS,
        )
        ticket = tl.atomic_add(control_ptr, 1, sem="relaxed", scope="gpu")
    return ticket, lines + PASSES * per_pass


@triton.jit
def searches_ended(control_ptr, searching_ptr):
    """Wait until every listed line's search has ended (its cut and statistics written): for an item
    whose ticket follows every search item's."""
    searching = tl.load(searching_ptr, cache_modifier=".cg")
    ended = tl.atomic_add(control_ptr + 3, 0, sem="acquire", scope="gpu")
    while ended < searching:
        ended = tl.atomic_add(control_ptr + 3, 0, sem="acquire", scope="gpu")
    tl.debug_barrier()  # every thread reads the lines' results after the acquire


@triton.jit
def cutoff_exit(control_ptr):
    """The last program out resets the counters (no program draws a ticket after its exit)."""
    if tl.atomic_add(control_ptr + 2, 1, sem="acq_rel", scope="gpu") == tl.num_programs(0) - 1:
        tl.store(control_ptr, 0)
        tl.store(control_ptr + 1, 0)
        tl.store(control_ptr + 2, 0)
        tl.store(control_ptr + 3, 0)


@triton.jit(do_not_specialize=["batch", "t_parts", "d_parts"])
def cutoff_kernel(
    target_ptr,  # (B, K+1, V) raw target logits, last dim contiguous
    draft_ptr,  # (B, K, Vd) raw draft logits (unused without HAS_DRAFT)
    tau_ptr,  # (lines,) float32 out: keep s >= tau (-inf = keep all)
    part_m_ptr,  # (lines, PARTS) float32: the statistics of the whole line (PHASE 1); out for every cut line:
    part_z_ptr,  # the line max and the kept mass in slot 0, -inf and 0 in the line's other parts
    state_ptr,  # (lines, 8) int32 workspace: the search's stage (0 none or ended; select.py), lo, hi, top-k key, bracket, gathered
    state_f_ptr,  # (lines, 2) float32 workspace: line max, then the mass of key >= lo (top-k) or the top-p budget
    progress_ptr,  # (lines,) int32 workspace: search passes of the line published (PASSES once its search ended)
    part_count_ptr,  # (lines, NUM_CHUNKS, BINS + 1) int32 workspace: per-chunk histograms of counts
    part_mass_ptr,  # (lines, NUM_CHUNKS, BINS + 1) int64 workspace: per-chunk histograms of fixed-point masses
    counter_ptr,  # (lines,) int32, 0 between launches: a line's arrived items in the current pass
    control_ptr,  # (4,) int32, 0 between launches: tickets drawn, threshold items finished, programs exited, searches ended
    searching_ptr,  # (1,) int32, 0 on entry (line_stats_kernel): lines listed for the whole-line search
    search_list_ptr,  # (lines,) int32 workspace: the listed lines, slots [0, searching) used (in any order)
    temperature_ptr,  # (B,) float32, 0 = greedy
    top_k_ptr,  # (B,) int64, 0 = off
    top_p_ptr,  # (B,) float32, 1 = off
    num_draft_ptr,  # (B,) int64
    cand_ptr,  # (lines, LINE_SLOTS) float32: the statistics launch's candidates (stats.py)
    cand_count_ptr,  # (lines, PARTS) int32
    cand_floor_ptr,  # (lines, PARTS, 2) int32
    sort_ptr,  # (lines, SORT) int32 workspace: a line's candidates packed for the sort
    hist_ptr,  # (lines, 256) int32: the statistics' first-pass key counts of a histogrammed line (stats.py), left 0
    window_ptr,  # (lines, PARTS, 256) int32: KEY_WINDOW, such a 16-bit line's parts' top-window counts (stats.py)
    top_p_window_ptr,  # (lines, TOP_P_BINS + 4) int32: TOP_P_BINS, a bf16 top-p line's window counts and bounds (stats.py)
    batch,
    K,
    V,
    Vd,
    t_stride_b,
    t_stride_k,
    d_stride_b,
    d_stride_k,
    t_parts,  # statistics partials of a target (draft) line
    d_parts,
    HAS_DRAFT: tl.constexpr,
    PARTS: tl.constexpr,  # statistics partial slots per line
    PP: tl.constexpr,  # next power of two of PARTS
    LINE_SLOTS: tl.constexpr,  # candidate slots per line
    SORT: tl.constexpr,  # candidates sorted per line, at most
    NUM_CHUNKS: tl.constexpr,  # cdiv(V, CHUNK): whole-line search chunks per line
    CHUNK: tl.constexpr,  # values per search item
    TILE: tl.constexpr,  # values per loop step of a search item
    BINS: tl.constexpr,  # histogram bins per pass: the interval narrows BINS-fold
    PASSES: tl.constexpr,  # search passes that end any line (top-k, then top-p)
    GATHER: tl.constexpr,  # key slots of a line's top-k gather (a power of two: sorted whole where ranks are not by byte histograms)
    WINDOW_GATHER: tl.constexpr,  # key slots of a line's top-p window gather (a power of two; twice GATHER where a line's histogram counts hold them)
    HISTOGRAM_TOP_K: tl.constexpr,  # the statistics counted the first top-k pass of lines with top-k above it
    KEY_WINDOW: tl.constexpr,  # and, of such a 16-bit line, the single raw keys of each part's top window
    TOP_P_BINS: tl.constexpr,  # 0, or the bins of a bf16 top-p line's window, which the statistics counted (stats.py)
    TOP_P_STEP: tl.constexpr,  # bins a threshold item scans a step
    SAMPLE_RUNS: tl.constexpr,  # 0, or the runs of a line's sample that places its first gather or raw window (thresholds.py)
    SAMPLE_RUN: tl.constexpr,  # consecutive ids a run
    DIGIT_SELECT: tl.constexpr,  # ranks by byte histograms (a sample's, a top-k gather's: where tl.histogram is shared-memory atomics)
    VECTOR_LINES: tl.constexpr,  # every line holds a multiple of 16 values and starts 16 of them apart (_triton_backend.vector_lines)
):
    cutoff_items(
        target_ptr, draft_ptr, tau_ptr, part_m_ptr, part_z_ptr, state_ptr, state_f_ptr, progress_ptr, part_count_ptr, part_mass_ptr, counter_ptr,
        control_ptr, searching_ptr, search_list_ptr, temperature_ptr, top_k_ptr, top_p_ptr, num_draft_ptr, cand_ptr, cand_count_ptr, cand_floor_ptr,
        sort_ptr, hist_ptr, window_ptr, top_p_window_ptr, batch, K, V, Vd, t_stride_b, t_stride_k, d_stride_b, d_stride_k, t_parts, d_parts,
        HAS_DRAFT, PARTS, PP, LINE_SLOTS, SORT, NUM_CHUNKS, CHUNK, TILE, BINS, PASSES, GATHER, WINDOW_GATHER, HISTOGRAM_TOP_K, KEY_WINDOW, TOP_P_BINS,
        TOP_P_STEP, SAMPLE_RUNS, SAMPLE_RUN, DIGIT_SELECT, VECTOR_LINES,
    )
    cutoff_exit(control_ptr)
