"""Launchers for the fused Triton verification kernels (triton_kernels/, installed as specdec_ext.kernels)."""

from __future__ import annotations

import importlib.util
import sys
from functools import cache
from pathlib import Path

import torch

from ._params import VerifyArgs

# One tile of the vocabulary per loop step. Interpreted programs pay per step, not per lane.
_GPU_BLOCK = 1024
_INTERPRETER_BLOCK = 8192
# Top-k / top-p candidates (triton_kernels/thresholds.py): a chunk of the line per program, held in
# registers, keeps its CANDIDATES largest values (1/64 of the line: a small fraction of the logits).
_GPU_CANDIDATE_CHUNK = 4096
_INTERPRETER_CANDIDATE_CHUNK = 8192
_CANDIDATES = 64


@cache
def kernels():
    """The kernel module: the installed ``specdec_ext.kernels``, or triton_kernels/ of a source checkout."""
    try:
        from . import kernels as module  # installed (pip install .) or editable install

        return module
    except ImportError:
        pass
    folder = Path(__file__).resolve().parent.parent / "triton_kernels"
    spec = importlib.util.spec_from_file_location("specdec_ext.kernels", folder / "__init__.py", submodule_search_locations=[str(folder)])
    if spec is None or spec.loader is None:
        raise ImportError(f"the Triton kernels were not found (looked for specdec_ext.kernels and {folder})")
    module = importlib.util.module_from_spec(spec)
    sys.modules["specdec_ext.kernels"] = module
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


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _num_chunks(device: torch.device, batch: int, vocab: int, block: int) -> int:
    """Vocabulary chunks per row: enough programs to fill the GPU even at batch 1."""
    tiles = _cdiv(vocab, block)
    if device.type != "cuda":
        return 1  # the interpreter runs programs one after another: fewer is faster
    programs_wanted = 2 * torch.cuda.get_device_properties(device).multi_processor_count
    return max(1, min(tiles, _cdiv(programs_wanted, max(batch, 1))))


def _last_dim_contiguous(x: torch.Tensor) -> torch.Tensor:
    return x if x.stride(-1) == 1 else x.contiguous()


def thresholds(args: VerifyArgs, logits: torch.Tensor, length: int, used_shift: int, width: int, block: int, candidate_chunk: int | None = None) -> torch.Tensor:
    """(B * length,) float32 top-k / top-p cut-offs of the lines of (B, length, width) logits (keep
    s >= tau; -inf where nothing is cut, and for greedy or unused lines): candidates, then the search."""
    import triton

    k = kernels()
    device = logits.device
    lines = args.batch * length
    tau = torch.full((max(lines, 1),), float("-inf"), dtype=torch.float32, device=device)
    if not lines:
        return tau
    chunk = candidate_chunk or (_GPU_CANDIDATE_CHUNK if device.type == "cuda" else _INTERPRETER_CANDIDATE_CHUNK)
    chunks = _cdiv(width, chunk)
    candidates = torch.empty((lines, chunks, _CANDIDATES), dtype=torch.float32, device=device)
    count, floor = (torch.empty((lines, chunks), dtype=torch.int32, device=device) for _ in range(2))
    chunk_max, chunk_sum = (torch.empty((lines, chunks), dtype=torch.float32, device=device) for _ in range(2))
    per_row = (args.temperature, args.top_k, args.top_p, args.num_draft_tokens)
    k.candidates_kernel[(lines, chunks)](
        logits, *per_row, candidates, count, floor, chunk_max, chunk_sum,
        length, width, logits.stride(0), logits.stride(1), chunks, USED_SHIFT=used_shift, CHUNK=chunk, CAND=_CANDIDATES,
    )
    k.threshold_kernel[(lines,)](
        logits, tau, *per_row, candidates, count, floor, chunk_max, chunk_sum,
        length, width, logits.stride(0), logits.stride(1), chunks,
        USED_SHIFT=used_shift, CHUNKS_POW2=triton.next_power_of_2(chunks), CAND=_CANDIDATES,
        CANDS_POW2=triton.next_power_of_2(chunks * _CANDIDATES), BLOCK=block,
    )
    return tau


def verify(
    args: VerifyArgs, seed: torch.Tensor, num_chunks: int | None = None, block: int | None = None, candidate_chunk: int | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Run the fused kernels; returns (tokens (B, K+1) int64, num_accepted (B,) int64). No host sync.

    ``num_chunks``, ``block`` and ``candidate_chunk`` (a power of two) override the launch
    heuristics (tests use them to cover several chunks per row, ragged last tiles and the
    top-k / top-p candidate search on small vocabularies).
    """
    import triton

    k = kernels()
    target = _last_dim_contiguous(args.target_logits)
    draft = _last_dim_contiguous(args.draft_logits) if args.draft_logits is not None else None
    tokens = _last_dim_contiguous(args.draft_tokens)
    device = target.device
    batch, num_positions, vocab = args.batch, args.num_positions, args.vocab
    has_draft = draft is not None and num_positions > 0
    draft_vocab = args.draft_vocab
    if block is None:
        block = _GPU_BLOCK if device.type == "cuda" else _INTERPRETER_BLOCK
    if block & (block - 1):
        raise ValueError(f"block must be a power of two, got {block}")
    if num_chunks is None:
        num_chunks = _num_chunks(device, batch, vocab, block)
    chunk_size = block * _cdiv(_cdiv(vocab, num_chunks), block)  # whole tiles per chunk
    num_chunks = _cdiv(vocab, chunk_size)
    chunks_pow2 = triton.next_power_of_2(num_chunks)

    def stats(logits: torch.Tensor, length: int, used_shift: int, width: int):
        lines = batch * length
        # Without filters the kernels never read tau (FILTERED=False): no buffer to fill.
        tau = thresholds(args, logits, length, used_shift, width, block, candidate_chunk) if args.filtered else args.temperature
        part = [torch.empty((max(lines, 1), num_chunks), dtype=dt, device=device) for dt in (torch.float32, torch.float32, torch.float32, torch.int32, torch.int32)]
        if lines:
            k.line_stats_kernel[(lines, num_chunks)](
                logits, tau, args.temperature, args.num_draft_tokens, *part,
                length, width, logits.stride(0), logits.stride(1), chunk_size, num_chunks,
                USED_SHIFT=used_shift, FILTERED=args.filtered, BLOCK=block,
            )
        return tau, part

    tau_t, (t_max, t_sum, t_argval, t_arg, t_bad) = stats(target, num_positions + 1, 0, vocab)
    if has_draft:
        tau_d, (d_max, d_sum, _, _, d_bad) = stats(draft, num_positions, 1, draft_vocab)
        d_strides = (draft.stride(0), draft.stride(1))
    else:  # placeholders, never read
        draft, tau_d, d_max, d_sum, d_bad = target, tau_t, t_max, t_sum, t_bad
        d_strides = (0, 0)

    race_val = torch.empty((batch, num_chunks), dtype=torch.float32, device=device)
    race_idx = torch.empty((batch, num_chunks), dtype=torch.int32, device=device)
    bonus_val = torch.empty_like(race_val)
    bonus_idx = torch.empty_like(race_idx)
    num_accepted = torch.empty((batch,), dtype=torch.int64, device=device)
    invalid = torch.empty((batch,), dtype=torch.int32, device=device)
    out = torch.empty((batch, num_positions + 1), dtype=torch.int64, device=device)
    if batch == 0:
        return out, num_accepted
    tok_stride = tokens.stride(0) if num_positions else 0
    k.race_kernel[(batch, num_chunks)](
        target, draft, tokens, seed, args.temperature, args.num_draft_tokens, tau_t, tau_d,
        t_max, t_sum, t_argval, t_arg, t_bad, d_max, d_sum, d_bad,
        race_val, race_idx, bonus_val, bonus_idx, num_accepted, invalid,
        num_positions, vocab, draft_vocab, target.stride(0), target.stride(1), *d_strides, tok_stride,
        chunk_size, num_chunks, HAS_DRAFT=has_draft, CHECK_ALL_LINES=args.check, FILTERED=args.filtered, CHUNKS_POW2=chunks_pow2, BLOCK=block,
    )
    k.finalize_kernel[(batch,)](
        tokens, args.num_draft_tokens, args.temperature, t_argval, t_arg,
        race_val, race_idx, bonus_val, bonus_idx, num_accepted, invalid, out,
        num_positions, vocab, tok_stride, num_chunks,
        CHUNKS_POW2=chunks_pow2, K1_POW2=triton.next_power_of_2(num_positions + 1),
    )
    return out, num_accepted
