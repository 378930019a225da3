"""Launchers of the Triton tree and block verification kernels (triton_kernels/tree.py).

Built on the chain's launcher (:mod:`specdec_ext._triton_backend`): the same workspace per device
and CUDA stream, the same geometry, and the chain's line statistics launches
(:func:`~specdec_ext._triton_backend.line_templates`), which leave every target and draft line's
statistics partials and cut-off. A tree is read as a chain of K = N positions: its N+1 target
contexts are the chain's K+1 target lines, its first N draft contexts the chain's K draft lines
(context N, the last node's, has no children), and ``num_nodes`` plays ``num_draft_tokens``
(context c < n_b is the only kind that can have children). Then the walk and the race.

What a call costs the device: three launches, with or without top-k / top-p: the line
statistics, the walk, the race with its own finalisation; with top-k / top-p the walk is the
cut-offs launch's last work items (``cut_walk_kernel``: the cut-offs, then each row's walk, in
one launch). No allocation besides the outputs; the partial
results live in the workspace, whose arrival counters the kernels reset themselves (a captured
CUDA graph replays the launches as they are); nothing is read back to the host. A tree's outputs
are (B, N+1) and (B, N), padded with -1 beyond each row's path.

Like the chain's, the plan of a call is a list of templates bound once per call signature
(:class:`Runner`); :func:`launches_for` fills them in without running them, for the compile check
(tests/support/triton_compile_check.py) and the GPU model (bench/gpu_model.py).
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from . import _triton_backend as chain
from ._params import LOGPROBS_NONE, TreeArgs, VerifyArgs

# A tree's walk: warps per program (one program a row: its residual-mass passes over a line are on
# the call's critical path, so a wide program) and ids per step of such a pass (8 per thread; the
# interpreter, which pays per step, takes small vocabularies in one).
WALK_WARPS = 16
WALK_BLOCK = 4096
# A filtered call's walk runs in the cut-offs launch, at its warps: the same 8 ids per thread.
CUT_WALK_BLOCK = WALK_BLOCK * chain.CUTOFF_WARPS // WALK_WARPS
# A block walk sums each position's residual mass S_i in work items, chunks of the vocabulary, about
# WALK_ITEMS_PER_SM items a multiprocessor in all (tree.py's _block_walk_item): the row whose coins
# search furthest down then reads no line after another, and the call's slowest row no longer sets
# its time. Every warp of an item reads the row's statistics and weights, and most items sum
# nothing (their row stops at n): narrow programs, the same 8 ids per thread.
WALK_ITEMS_PER_SM = 4
BLOCK_WALK_WARPS = 4
BLOCK_WALK_BLOCK = WALK_BLOCK * BLOCK_WALK_WARPS // WALK_WARPS
STATE = 8  # floats and ints of row state per row (tree.py's module docstring)

kernels = chain.kernels
is_available = chain.is_available


def _pow2(n: int) -> int:
    return 1 << max(n - 1, 0).bit_length()


def _pad(n: int) -> int:
    return chain._ALIGN * chain._cdiv(n, chain._ALIGN)


class _Call(NamedTuple):
    """One call as every template reads it: the chain's view of it and, for a tree, its parents."""

    chain: VerifyArgs
    parents: torch.Tensor | None


class _Rows(NamedTuple):
    """Workspace views of a tree or block call beyond the chain's line buffers."""

    state_f: torch.Tensor  # (B, STATE) float32 row state
    state_i: torch.Tensor  # (B, STATE) int32
    removed: torch.Tensor  # (B, NP) int32 a tree residual's removed ids
    path: torch.Tensor  # (B, NP) int32 the nodes a tree walk entered
    walk_part: torch.Tensor  # (B, walk items) float32 a block walk's partial sums of S_i


def _chain_view(args: TreeArgs | VerifyArgs) -> VerifyArgs:
    """A tree as the chain's statistics read it (module docstring); a block as it is."""
    if isinstance(args, VerifyArgs):
        return args
    return VerifyArgs(args.target_logits, args.draft_logits, args.draft_tokens, args.temperature, args.top_k, args.top_p, args.num_nodes,
                      args.generator, args.check, args.filtered, args.seeds, args.offsets)


def _node_slots(args: TreeArgs | VerifyArgs) -> int:
    return _pow2(max(args.num_tree_nodes, 1)) if isinstance(args, TreeArgs) else 2


def walk_block(geo: chain.Geometry, filtered: bool) -> int:
    """Ids per step of a block walk's residual-mass chunk (the interpreter's: at most its race block)."""
    block = CUT_WALK_BLOCK if filtered else BLOCK_WALK_BLOCK
    return min(block, geo.race_block) if geo.interpret else block


def walk_chunks(view: VerifyArgs, geo: chain.Geometry) -> int:
    """A block walk's items per position i < K: chunks of whole steps of the vocabulary, about
    WALK_ITEMS_PER_SM items a multiprocessor (the interpreter's: two, where the line has them)."""
    steps = chain._cdiv(view.vocab, walk_block(geo, view.filtered))
    if geo.walk_chunks:
        return max(1, min(geo.walk_chunks, steps))
    if geo.interpret:
        return min(steps, 2)
    return max(1, min(steps, chain._cdiv(WALK_ITEMS_PER_SM * geo.multiprocessors, max(view.batch * max(view.num_positions - 1, 1), 1))))


def _walk_items(view: VerifyArgs, chunks: int) -> int:
    """A block row's walk items (tree.py's _block_walk_item)."""
    return max((view.num_positions - 1) * chunks, 1)


def _row_sizes(batch: int, slots: int, walk_items: int) -> chain.Sizes:
    return chain.Sizes(_pad(batch * STATE) + _pad(batch * walk_items), _pad(batch * STATE) + 2 * _pad(batch * slots), 0)


def _rows(floats: torch.Tensor, ints: torch.Tensor, after: chain.Sizes, batch: int, slots: int, walk_items: int) -> _Rows:
    """The row buffers, carved after the chain's part of the workspace (``after``)."""
    f0, i0 = after.floats, after.ints
    f1 = f0 + _pad(batch * STATE)
    i1 = i0 + _pad(batch * STATE)
    i2 = i1 + _pad(batch * slots)
    return _Rows(floats[f0 : f0 + batch * STATE], ints[i0 : i0 + batch * STATE], ints[i1 : i1 + batch * slots], ints[i2 : i2 + batch * slots],
                 floats[f1 : f1 + batch * walk_items])


def _templates(args: TreeArgs | VerifyArgs, geo: chain.Geometry, layout: dict, bufs: chain.Buffers, rows: _Rows) -> list[chain.Template]:
    """The launches of a call: the chain's line launches, the walk, the race (module docstring)."""
    k = kernels()
    view = _chain_view(args)
    tree = isinstance(args, TreeArgs)
    sh = chain._shape(view, layout)
    b = bufs
    parts = layout["tiles"]
    lines = chain.line_templates(view, geo, bufs, layout)
    found = [chain.Template(t.name, t.kernel, t.grid, lambda c, key, o, _t=t: _t.arguments(c.chain, key, o), t.constexprs, t.num_warps)
             for t in lines[:1]]
    cutoff = lines[1] if view.filtered else None  # the walk joins the cut-offs launch (tree.py)
    batch, positions = view.batch, view.num_positions

    def keys(a: VerifyArgs) -> tuple:
        placeholder = a.temperature  # for the absent optional tensors: never read
        return a.seeds if a.seeds is not None else placeholder, a.offsets if a.offsets is not None else placeholder

    keyed = {"HAS_SEEDS": view.seeds is not None, "HAS_OFFSETS": view.offsets is not None}
    common = {"HAS_DRAFT": sh.has_draft, **keyed, "FILTERED": view.filtered}
    walk = {"PARTS": parts, "PP": _pow2(parts), "HAS_DRAFT": sh.has_draft, **keyed, "BLOCK": WALK_BLOCK}  # an unfiltered call's walk
    tail = (view.vocab, view.draft_vocab, *sh.t_strides, *sh.d_strides, sh.tok_stride)
    logits = chain._logits
    if tree:
        slots = _node_slots(args)
        walk_constexprs = {"NP": slots, "WITHOUT_REPLACEMENT": sh.has_draft and args.siblings == "without_replacement", "CHECK": view.check}
        if cutoff is None:
            found.append(chain.Template(
                "tree_walk", k.tree_walk_kernel, (batch,),
                lambda c, key, o: (*logits(c.chain, sh.has_draft), c.chain.draft_tokens, c.parents, c.chain.temperature, c.chain.top_k, c.chain.top_p,
                                   c.chain.num_draft_tokens, *keys(c.chain), b.tau, b.part_m, b.part_z, b.part_i, rows.state_f, rows.state_i,
                                   rows.removed, rows.path, key, batch, positions, *tail, c.parents.stride(0), sh.t_parts, sh.d_parts),
                {**walk, **walk_constexprs},
                WALK_WARPS,
            ))
        else:
            found.append(chain.Template(
                "tree_cut_walk", k.cut_walk_kernel, cutoff.grid,
                lambda c, key, o: (*cutoff.arguments(c.chain, key, o), c.chain.draft_tokens, c.parents, *keys(c.chain), b.part_i, b.tau, rows.state_f,
                                   rows.state_i, rows.removed, rows.path, rows.state_f, rows.state_i, 1, key, sh.tok_stride, c.parents.stride(0)),
                {**cutoff.constexprs, "TREE": True, "KP": 1, **walk_constexprs, **keyed, "BLOCK": CUT_WALK_BLOCK},
                cutoff.num_warps,
            ))
        found.append(chain.Template(
            "tree_race", k.tree_race_kernel, (batch, layout["chunks"]),
            lambda c, key, o: (*logits(c.chain, sh.has_draft), c.chain.draft_tokens, c.chain.temperature, *keys(c.chain), rows.state_f, rows.state_i,
                               rows.removed, rows.path, b.race_val, b.race_idx, b.counters, o.tokens, o.num_accepted, o.logprobs, key, positions,
                               *tail, layout["tiles_per_chunk"], layout["chunks"]),
            {"NP": slots, "D1P": _pow2(positions + 1), **common, "INTERPRET": geo.interpret, "BLOCK": geo.race_block, "FINAL_BLOCK": chain.FINAL_BLOCK},
            chain.RACE_WARPS if not geo.interpret else 4,
        ))
        return found
    kp = _pow2(positions + 1)
    walk_constexprs = {"KP": kp, "CHECK": view.check}
    chunks = walk_chunks(view, geo)
    walk_counters = b.counters[:batch]  # the race's, free until it starts (the walk leaves them at zero)
    if cutoff is None:
        found.append(chain.Template(
            "block_walk", k.block_walk_kernel, (batch * _walk_items(view, chunks),),
            lambda c, key, o: (*logits(c.chain, sh.has_draft), c.chain.draft_tokens, c.chain.temperature, c.chain.top_k, c.chain.top_p,
                               c.chain.num_draft_tokens, *keys(c.chain), b.tau, b.part_m, b.part_z, b.part_i, b.gathered, rows.state_f, rows.state_i,
                               rows.walk_part, walk_counters, chunks, key, batch, positions, *tail[:-1], sh.tok_stride, sh.t_parts, sh.d_parts),
            {**walk, **walk_constexprs, "BLOCK": walk_block(geo, False)},
            BLOCK_WALK_WARPS,
        ))
    else:
        found.append(chain.Template(
            "block_cut_walk", k.cut_walk_kernel, cutoff.grid,
            lambda c, key, o: (*cutoff.arguments(c.chain, key, o), c.chain.draft_tokens, c.chain.num_draft_tokens, *keys(c.chain), b.part_i,
                               b.gathered, rows.state_f, rows.state_i, rows.state_i, rows.state_i, rows.walk_part, walk_counters, chunks, key,
                               sh.tok_stride, 0),
            {**cutoff.constexprs, "TREE": False, "NP": 1, "WITHOUT_REPLACEMENT": False, **walk_constexprs, **keyed, "BLOCK": walk_block(geo, True)},
            cutoff.num_warps,
        ))
    found.append(chain.Template(
        "block_race", k.block_race_kernel, (batch, layout["chunks"]),
        lambda c, key, o: (*logits(c.chain, sh.has_draft), c.chain.draft_tokens, c.chain.temperature, *keys(c.chain), b.tau, b.part_m, b.part_z,
                           b.part_rm, b.part_rz, b.gathered, rows.state_f, rows.state_i, b.race_val, b.race_idx, b.counters, o.tokens,
                           o.num_accepted, o.logprobs if o.logprobs is not None else b.tau, key, batch, positions, *tail, sh.t_parts,
                           layout["tiles_per_chunk"], layout["chunks"]),
        {"PARTS": parts, "PP": _pow2(parts), "KP": kp, **common, "LOGPROBS": view.logprobs, "INTERPRET": geo.interpret, "BLOCK": geo.race_block,
         "FINAL_BLOCK": chain.FINAL_BLOCK},
        chain.RACE_WARPS if not geo.interpret else 4,
    ))
    return found


def _plan(args: TreeArgs | VerifyArgs, geo: chain.Geometry, floats: torch.Tensor | None = None, ints: torch.Tensor | None = None,
          counters: torch.Tensor | None = None) -> list[chain.Template]:
    """The templates of a call over the workspace of its device (or buffers like the given ones)."""
    view = _chain_view(args)
    layout = chain._layout(view, geo, whole_lines=False)  # (the chains' plan of whole lines is theirs alone)
    slots = _node_slots(args)
    walk_items = 1 if isinstance(args, TreeArgs) else _walk_items(view, walk_chunks(view, geo))
    extra = _row_sizes(view.batch, slots, walk_items)
    sizes = layout["sizes"]
    total = chain.Sizes(sizes.floats + extra.floats, sizes.ints + extra.ints, sizes.counters + extra.counters)
    if floats is None:
        ws = chain.workspace(view.target_logits.device)
        ws.reserve(total)
        floats, ints, counters = ws.floats, ws.ints, ws.counters
    else:
        floats, ints, counters = (torch.empty(n, dtype=t.dtype, device=t.device) for n, t in zip(total, (floats, ints, counters), strict=True))
    bufs = chain.buffers(floats, ints, counters, layout, view.batch, geo.line_slots, geo.sort)
    rows = _rows(floats, ints, sizes, view.batch, slots, walk_items)
    return _templates(args, geo, layout, bufs, rows)


def _prepare(args: TreeArgs | VerifyArgs) -> TreeArgs | VerifyArgs:
    """Inputs as the kernels read them: last dimensions contiguous."""
    fixed = chain.prepare(_chain_view(args))
    if isinstance(args, VerifyArgs):
        return fixed
    return args._replace(target_logits=fixed.target_logits, draft_logits=fixed.draft_logits, draft_tokens=fixed.draft_tokens,
                         seeds=fixed.seeds, offsets=fixed.offsets, parents=chain._last_dim_contiguous(args.parents))


def _outputs(batch: int, width: int, tree: bool, logprobs: bool, device: torch.device) -> chain.Outputs:
    """The outputs of a call, sized by its shapes alone: tokens (B, width+1), num_accepted (B,), and a
    tree's accepted_nodes (B, width) in the chain outputs' logprobs slot, or a block's logprobs (B, width+1)."""
    return chain.Outputs(
        torch.empty(batch, width + 1, dtype=torch.int64, device=device),
        torch.empty(batch, dtype=torch.int64, device=device),
        torch.empty(batch, width, dtype=torch.int64, device=device) if tree else
        torch.empty(batch, width + 1, dtype=torch.float32, device=device) if logprobs else None,
        None,
    )


class Runner:
    """The launches of one tree or block call signature, bound once: a call allocates the outputs
    and launches, nothing else (module docstring)."""

    def __init__(self, args: TreeArgs | VerifyArgs, found: list[chain.Template]):
        self.tree = isinstance(args, TreeArgs)
        self.device = args.target_logits.device
        self.width = args.num_tree_nodes if self.tree else args.num_positions
        self.logprobs = not self.tree and args.logprobs != LOGPROBS_NONE
        self.launches = [(t.kernel, t.arguments, chain._run_options(t.grid, t.constexprs, t.num_warps)) for t in found]

    def __call__(self, args: TreeArgs | VerifyArgs, base_key: int) -> tuple:
        call = _Call(_chain_view(args), args.parents if self.tree else None)
        out = _outputs(args.batch, self.width, self.tree, self.logprobs, self.device)
        if args.batch:
            for kernel, arguments, options in self.launches:
                kernel.run(*arguments(call, base_key, out), **options)
        return out.tokens, out.num_accepted, out.logprobs


_RUNNERS: dict[tuple, tuple] = {}


def _signature(args: TreeArgs | VerifyArgs, device: torch.device, overrides: dict) -> tuple:
    target, draft, tokens = args.target_logits, args.draft_logits, args.draft_tokens
    tree = isinstance(args, TreeArgs)
    return (
        tree, device, chain._stream_id(device), target.shape, target.stride(), target.dtype,
        None if draft is None else (draft.shape, draft.stride(), draft.dtype), tokens.shape, tokens.stride(), tokens.dtype,
        args.parents.stride() if tree else None, args.siblings if tree else args.logprobs, args.filtered, args.check, args.seeds is None,
        args.offsets is None, tuple(sorted(overrides.items())) if overrides else (),
    )


def _runner(args: TreeArgs | VerifyArgs, overrides: dict) -> Runner:
    """The runner of a call, cached per signature (and rebuilt when the workspace has grown)."""
    device = args.target_logits.device
    key = _signature(args, device, overrides)
    found = _RUNNERS.get(key)
    ws = chain.workspace(device)
    if found is not None and found[0] is ws.counters and found[1] is ws.floats and found[2] is ws.ints:
        return found[3]
    run = Runner(args, _plan(args, chain.geometry(device, **overrides, line_dtypes=chain.line_dtypes(args))))
    if len(_RUNNERS) > 256:
        _RUNNERS.clear()
    _RUNNERS[key] = (ws.counters, ws.floats, ws.ints, run)
    return run


def verify_tree(args: TreeArgs, base_key: int, **overrides) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(tokens (B, N+1), num_accepted (B,), accepted_nodes (B, N)) of a validated tree call.
    ``overrides``: the chain's geometry overrides (race_chunks, race_block, stats_tile, ...)."""
    args = _prepare(args)
    return _runner(args, overrides)(args, base_key)


def verify_block(args: VerifyArgs, base_key: int, **overrides) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """(tokens (B, K+1), num_accepted (B,), logprobs (B, K+1) or None) of a validated block call."""
    args = _prepare(args)
    return _runner(args, overrides)(args, base_key)


def launches_for(args: TreeArgs | VerifyArgs, base_key: int = 0, **geometry_overrides) -> list[chain.Launch]:
    """The launches a tree or block call would make, without running them (any device, ``meta`` included)."""
    args = _prepare(args)
    device = args.target_logits.device
    geo = chain.geometry(device, **geometry_overrides, line_dtypes=chain.line_dtypes(args))
    if device.type == "meta":
        found = _plan(args, geo, torch.empty(0, device=device), torch.empty(0, dtype=torch.int32, device=device),
                      torch.empty(0, dtype=torch.int32, device=device))
    else:
        found = _plan(args, geo)
    tree = isinstance(args, TreeArgs)
    width = args.num_tree_nodes if tree else args.num_positions
    call = _Call(_chain_view(args), args.parents if tree else None)
    out = _outputs(args.batch, width, tree, not tree and args.logprobs != LOGPROBS_NONE, device)
    return [chain.Launch(t.name, t.kernel, t.grid, t.arguments(call, base_key, out), t.constexprs, t.num_warps) for t in found]


__all__ = ["Runner", "is_available", "kernels", "launches_for", "verify_block", "verify_tree"]
