"""Launchers of the Triton tree and block verification kernels (triton_kernels/tree.py)."""

from __future__ import annotations

import importlib.util
import os
import sys
from functools import cache
from pathlib import Path

import torch

from ._params import TreeArgs, VerifyArgs, inverse_temperature, parameter_problems
from ._philox import key_per_row
from .reference_tree import tree_keys, tree_layout

_GPU_BLOCK = 1024
_INTERPRETER_BLOCK = 4096
# Keys tested per pass of the top-k / top-p cut-off search: 2**32 keys take log_17(2**32) ~ 8 passes.
_SECTIONS = 16


@cache
def kernels():
    """triton_kernels/tree.py: installed as ``specdec_ext.kernels.tree``, or from a source checkout."""
    try:
        from .kernels import tree as module  # installed (pip install .) or editable install

        return module
    except ImportError:
        pass
    path = Path(__file__).resolve().parent.parent / "triton_kernels" / "tree.py"
    spec = importlib.util.spec_from_file_location("specdec_ext._tree_kernels", path)
    if spec is None or spec.loader is None:
        raise ImportError(f"the Triton tree kernels were not found (looked for specdec_ext.kernels.tree and {path})")
    module = importlib.util.module_from_spec(spec)
    sys.modules["specdec_ext._tree_kernels"] = module
    spec.loader.exec_module(module)
    return module


@cache
def is_available() -> bool:
    try:
        import triton  # noqa: F401

        kernels()
    except Exception:  # triton missing or broken: the other backends still work
        return False
    return True


def usable(device: torch.device) -> bool:
    return is_available() and (device.type == "cuda" or (device.type == "cpu" and os.environ.get("TRITON_INTERPRET") == "1"))


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _pow2(n: int) -> int:
    return 1 << max(int(n) - 1, 0).bit_length()


def _launch_options(device: torch.device) -> dict:
    # No FMA contraction: the probability arithmetic rounds like the other backends'.
    return {"enable_fp_fusion": False} if device.type == "cuda" else {}


def _geometry(device: torch.device, batch: int, vocab: int, block: int | None, num_chunks: int | None) -> tuple[int, int, int]:
    """(block, chunk size, chunks): vocabulary chunks per row, enough programs to fill the GPU at batch 1."""
    block = block or (_GPU_BLOCK if device.type == "cuda" else _INTERPRETER_BLOCK)
    if num_chunks is None:
        tiles = _cdiv(vocab, block)
        if device.type == "cuda":
            wanted = 2 * torch.cuda.get_device_properties(device).multi_processor_count
            num_chunks = max(1, min(tiles, _cdiv(wanted, max(batch, 1))))
        else:
            num_chunks = 1  # the interpreter runs programs one after another: fewer is faster
    chunk = block * _cdiv(_cdiv(vocab, num_chunks), block)
    return block, chunk, _cdiv(vocab, chunk)


class _LineStats:
    """m, z, tau, raw argmax, raw log-normaliser and bad flag of every line of a (B, L, Vl) logits tensor."""

    def __init__(self, logits: torch.Tensor, inv_t, greedy, top_k, top_p, filtered: bool, block: int, chunk: int, chunks: int, options: dict):
        k = kernels()
        batch, length, width = logits.shape
        lines = batch * length
        device = logits.device
        size = max(lines, 1)
        partial = [torch.empty((size, chunks), dtype=dt, device=device) for dt in (torch.float32, torch.int64, torch.float32, torch.int32, torch.float32)]
        self.m, self.z, self.tau = (torch.empty(size, dtype=torch.float32, device=device) for _ in range(3))
        self.arg = torch.empty(size, dtype=torch.int64, device=device)
        self.raw_logz = torch.empty(size, dtype=torch.float32, device=device)
        self.bad = torch.empty(size, dtype=torch.int32, device=device)
        if not lines:
            return
        row_chunks = _cdiv(width, chunk)
        k.chunk_stats_kernel[(lines, row_chunks)](logits, inv_t, *partial, length, width, logits.stride(0), logits.stride(1), chunk, row_chunks,
                                                  BLOCK=block, **options)
        k.line_stats_kernel[(lines,)](logits, inv_t, greedy, top_k, top_p, *partial, self.m, self.z, self.tau, self.arg, self.raw_logz, self.bad,
                                      length, width, logits.stride(0), logits.stride(1), row_chunks, CHUNKS_POW2=_pow2(row_chunks),
                                      FILTERED=filtered, BLOCK=block, SECTIONS=_SECTIONS, **options)


def _contiguous_rows(x: torch.Tensor) -> torch.Tensor:
    return x if x.stride(-1) == 1 else x.contiguous()


def _per_row(args) -> tuple:
    inv_t = inverse_temperature(args.temperature).contiguous()
    greedy = (args.temperature == 0).to(torch.int32)
    filtered = bool(((args.top_k > 0) | (args.top_p < 1)).any()) if args.batch else False
    return inv_t, greedy, args.top_k.contiguous(), args.top_p.to(torch.float32).contiguous(), filtered


def verify_tree(args: TreeArgs, base_key: int, block: int | None = None, num_chunks: int | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(tokens (B, D+1), num_accepted (B,), accepted_nodes (B, D)) of a validated tree call."""
    k = kernels()
    keys, offsets = tree_keys(args, base_key)
    target = _contiguous_rows(args.target_logits)
    draft = _contiguous_rows(args.draft_logits) if args.draft_logits is not None else None
    device = target.device
    batch, nodes, vocab = args.batch, args.num_tree_nodes, args.vocab
    layout = tree_layout(args)
    depth = layout.max_depth
    width = layout.children.shape[2]
    w_pow2 = max(2, _pow2(width))
    tokens = args.draft_tokens.to(torch.int64).contiguous()
    used = torch.arange(nodes, device=device)[None, :] < args.num_nodes[:, None]
    pre_bad = layout.bad | (((tokens < 0) | (tokens >= args.draft_vocab)) & used).any(1)
    pre_bad |= ~(args.temperature >= 0) | torch.isinf(args.temperature) | (args.top_k < 0) | ~((args.top_p > 0) & (args.top_p <= 1))
    pre_bad |= (keys < 0) | (offsets < 0)
    inv_t, greedy, top_k, top_p, filtered = _per_row(args)
    block, chunk, chunks = _geometry(device, batch, vocab, block, num_chunks)
    options = _launch_options(device)
    out_tokens = torch.full((batch, depth + 1), -1, dtype=torch.int64, device=device)
    out_accepted = torch.zeros(batch, dtype=torch.int64, device=device)
    path = torch.full((batch, max(depth, 1)), -1, dtype=torch.int64, device=device)
    if batch == 0:
        return out_tokens, out_accepted, path[:, :depth]
    t_stats = _LineStats(target, inv_t, greedy, top_k, top_p, filtered, block, chunk, _cdiv(vocab, chunk), options)
    d_stats = _LineStats(draft, inv_t, greedy, top_k, top_p, filtered, block, chunk, _cdiv(draft.shape[2], chunk), options) if draft is not None else t_stats
    draft_or_target = draft if draft is not None else target
    children = layout.children.contiguous()
    keys, offsets = keys.contiguous(), offsets.contiguous()
    state_line, state_depth = (torch.empty(batch, dtype=torch.int64, device=device) for _ in range(2))
    state_c = torch.empty(batch, dtype=torch.float32, device=device)
    state_removed = torch.empty((batch, w_pow2), dtype=torch.int64, device=device)
    state_bad = torch.empty(batch, dtype=torch.int32, device=device)
    k.tree_walk_kernel[(batch,)](
        target, draft_or_target, tokens, children, args.num_nodes.contiguous(), pre_bad.to(torch.int32), inv_t, greedy, keys, offsets,
        t_stats.m, t_stats.z, t_stats.tau, t_stats.arg, t_stats.bad, d_stats.m, d_stats.z, d_stats.tau, d_stats.bad,
        state_line, state_depth, state_c, state_removed, state_bad, path,
        nodes, vocab, args.draft_vocab, width, max(depth, 1), target.stride(0), target.stride(1), draft_or_target.stride(0), draft_or_target.stride(1),
        HAS_DRAFT=draft is not None, WITHOUT_REPLACEMENT=args.siblings == "without_replacement" and draft is not None, CHECK=args.check,
        W_POW2=w_pow2, BLOCK=block, **options,
    )
    state_draft = state_line if draft is not None else torch.full_like(state_line, -1)
    state_a = torch.ones(batch, dtype=torch.float32, device=device)
    state_hot = torch.full_like(state_line, -1)
    race = _race(k, target, draft_or_target, draft is not None, inv_t, keys, offsets, t_stats, d_stats, state_line, state_draft, state_depth,
                 state_a, state_c, state_hot, state_removed, nodes + 1, nodes + 1, args.draft_vocab, w_pow2, block, chunk, chunks, options)
    k.tree_finalize_kernel[(batch,)](
        tokens, greedy, t_stats.arg, state_line, state_depth, state_bad, path, *race, out_tokens, out_accepted,
        nodes, max(depth, 1) if depth else 0, chunks, CHUNKS_POW2=_pow2(chunks), D1_POW2=_pow2(depth + 1), **options,
    )
    return out_tokens, out_accepted, path[:, :depth]


def _race(k, target, draft, has_draft, inv_t, keys, offsets, t_stats, d_stats, state_line, state_draft, state_depth, state_a, state_c, state_hot,
          state_removed, length, draft_length, draft_vocab, w_pow2, block, chunk, chunks, options):
    batch, _, vocab = target.shape
    device = target.device
    race_val = torch.empty((batch, chunks), dtype=torch.float32, device=device)
    race_idx = torch.empty((batch, chunks), dtype=torch.int64, device=device)
    bonus_val = torch.empty_like(race_val)
    bonus_idx = torch.empty_like(race_idx)
    k.race_kernel[(batch, chunks)](
        target, draft, inv_t, keys, offsets, t_stats.m, t_stats.z, t_stats.tau, d_stats.m, d_stats.z, d_stats.tau,
        state_line, state_draft, state_depth, state_a, state_c, state_hot, state_removed, race_val, race_idx, bonus_val, bonus_idx,
        length, draft_length, vocab, draft_vocab, target.stride(0), target.stride(1), draft.stride(0), draft.stride(1), chunk, chunks,
        HAS_DRAFT=has_draft, W_POW2=w_pow2, BLOCK=block, **options,
    )
    return race_val, race_idx, bonus_val, bonus_idx


def verify_block(args: VerifyArgs, base_key: int, block: int | None = None, num_chunks: int | None = None):
    """(tokens (B, K+1), num_accepted (B,), logprobs (B, K+1) or None) of a validated block call."""
    k = kernels()
    target = _contiguous_rows(args.target_logits)
    positions = args.num_positions
    draft = _contiguous_rows(args.draft_logits) if args.draft_logits is not None and positions else None
    device = target.device
    batch, vocab = args.batch, args.vocab
    tokens = args.draft_tokens.to(torch.int64).contiguous()
    keys = key_per_row(args.seeds, base_key, batch, device).contiguous()
    offsets = (args.offsets if args.offsets is not None else torch.zeros(batch, dtype=torch.int64, device=device)).contiguous()
    pre_bad = torch.zeros(batch, dtype=torch.bool, device=device)
    for _, mask, _ in parameter_problems(args):
        pre_bad |= mask
    if positions:
        used = torch.arange(positions, device=device)[None, :] < args.num_draft_tokens[:, None]
        pre_bad |= (((tokens < 0) | (tokens >= args.draft_vocab)) & used).any(1)
    inv_t, greedy, top_k, top_p, filtered = _per_row(args)
    block, chunk, chunks = _geometry(device, batch, vocab, block, num_chunks)
    options = _launch_options(device)
    out_tokens = torch.full((batch, positions + 1), -1, dtype=torch.int64, device=device)
    out_accepted = torch.zeros(batch, dtype=torch.int64, device=device)
    logprobs = torch.full((batch, positions + 1), float("nan"), dtype=torch.float32, device=device) if args.logprobs else None
    if batch == 0:
        return out_tokens, out_accepted, logprobs
    t_stats = _LineStats(target, inv_t, greedy, top_k, top_p, filtered, block, chunk, _cdiv(vocab, chunk), options)
    d_stats = _LineStats(draft, inv_t, greedy, top_k, top_p, filtered, block, chunk, _cdiv(draft.shape[2], chunk), options) if draft is not None else t_stats
    draft_or_target = draft if draft is not None else target
    token_arg = tokens if positions else torch.full((batch, 1), -1, dtype=torch.int64, device=device)
    state = [torch.empty(batch, dtype=dt, device=device) for dt in (torch.int64, torch.int64, torch.int64, torch.float32, torch.float32, torch.int64, torch.int32)]
    state_line, state_draft, state_depth, state_a, state_c, state_hot, state_bad = state
    k.block_walk_kernel[(batch,)](
        target, draft_or_target, token_arg, args.num_draft_tokens.contiguous(), pre_bad.to(torch.int32), inv_t, greedy, keys, offsets,
        t_stats.m, t_stats.z, t_stats.tau, t_stats.arg, t_stats.bad, d_stats.m, d_stats.z, d_stats.tau, d_stats.bad, *state,
        positions, vocab, args.draft_vocab, target.stride(0), target.stride(1), draft_or_target.stride(0), draft_or_target.stride(1),
        HAS_DRAFT=draft is not None, CHECK=args.check, K1_POW2=_pow2(positions + 1), BLOCK=block, **options,
    )
    no_removed = torch.full((batch, 2), -1, dtype=torch.int64, device=device)
    race = _race(k, target, draft_or_target, draft is not None, inv_t, keys, offsets, t_stats, d_stats, state_line, state_draft, state_depth,
                 state_a, state_c, state_hot, no_removed, positions + 1, positions, args.draft_vocab, 2, block, chunk, chunks, options)
    k.block_finalize_kernel[(batch,)](
        target, token_arg, greedy, inv_t, t_stats.m, t_stats.z, t_stats.tau, t_stats.arg, t_stats.raw_logz, state_line, state_depth, state_bad,
        *race, out_tokens, out_accepted, logprobs if logprobs is not None else out_tokens, positions, target.stride(0), target.stride(1), chunks,
        CHUNKS_POW2=_pow2(chunks), K1_POW2=_pow2(positions + 1), LOGPROBS=args.logprobs, **options,
    )
    return out_tokens, out_accepted, logprobs
