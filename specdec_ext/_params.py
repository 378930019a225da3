"""Argument validation and normalisation shared by every backend.

Each public call is turned into a :class:`VerifyArgs`: per-row tensors on the logits' device, so a
backend never has to look at Python scalars or guess defaults.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from ._philox import VERIFY_STREAM

LOGIT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
TOKEN_DTYPES = (torch.int32, torch.int64)
BACKENDS = ("auto", "triton", "cpp", "eager")
LOGPROBS_NONE, LOGPROBS_PROCESSED, LOGPROBS_RAW = 0, 1, 2
_LOGPROBS_MODES = {False: LOGPROBS_NONE, None: LOGPROBS_NONE, "processed": LOGPROBS_PROCESSED, "raw": LOGPROBS_RAW}


class VerifyArgs(NamedTuple):
    """A validated verification call. Tensors live on ``target_logits.device``."""

    target_logits: torch.Tensor  # (B, K+1, V), float32 / bfloat16 / float16, untouched
    draft_logits: torch.Tensor | None  # (B, K, Vd), Vd <= V; None = one-hot drafts
    draft_tokens: torch.Tensor  # (B, K), int32 / int64
    temperature: torch.Tensor  # (B,) float32; 0 = greedy row
    top_k: torch.Tensor  # (B,) int64; 0 = off
    top_p: torch.Tensor  # (B,) float32; 1 = off
    num_draft_tokens: torch.Tensor  # (B,) int64 in [0, K]
    generator: torch.Generator | None
    check: bool
    filtered: bool = True  # False when top-k and top-p are off for every row (lets backends skip the threshold search)
    seeds: torch.Tensor | None = None  # (B,) int64 per-request Philox keys; None = base_key + row
    offsets: torch.Tensor | None = None  # (B,) int64 per-request positions of draft position 0; None = 0
    stream: int = VERIFY_STREAM  # race stream: VERIFY_STREAM for verify, SAMPLE_STREAM for sample
    logprobs: int = LOGPROBS_NONE  # LOGPROBS_NONE / LOGPROBS_PROCESSED / LOGPROBS_RAW
    accept_probs: bool = False  # also return min(1, p/q) of every examined draft

    @property
    def batch(self) -> int:
        return self.target_logits.shape[0]

    @property
    def num_positions(self) -> int:  # K
        return self.draft_tokens.shape[1]

    @property
    def vocab(self) -> int:  # V
        return self.target_logits.shape[2]

    @property
    def draft_vocab(self) -> int:  # Vd
        return self.draft_logits.shape[2] if self.draft_logits is not None else self.vocab


_CONSTANT_ROWS: dict[tuple, torch.Tensor] = {}
_CONSTANT_ROWS_LIMIT = 64
_SCALAR_ROWS: dict[tuple, tuple] = {}  # (temperature, top_k, top_p, B, K, device) -> per-row tensors and `filtered`
_NUMBER_TYPES = (float, int, type(None))  # bool excluded: it is rejected as a parameter
_INT_TYPES = (int, type(None))


def constant_rows(value, batch: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A (B,) tensor filled with ``value``, shared between calls (the backends only read it).

    Building it costs more than the fused kernel at small shapes (a fill per parameter and call, a
    kernel launch each on CUDA), so it is kept, one per (value, B, dtype, device, CUDA stream, so a
    stream never reads a fill still queued on another). Not while torch.compile traces or a CUDA
    graph is being captured: there a fresh tensor belongs to the graph.
    """
    if torch.compiler.is_compiling() or (device.type == "cuda" and torch.cuda.is_current_stream_capturing()):
        return torch.full((batch,), value, dtype=dtype, device=device)
    stream = torch.cuda.current_stream(device).cuda_stream if device.type == "cuda" else 0
    key = (value, type(value), batch, dtype, device, stream)
    rows = _CONSTANT_ROWS.get(key)
    if rows is None:
        if len(_CONSTANT_ROWS) >= _CONSTANT_ROWS_LIMIT:
            _CONSTANT_ROWS.clear()
        with torch.inference_mode(False):  # a normal tensor, usable in and out of inference mode
            rows = torch.full((batch,), value, dtype=dtype, device=device)
        _CONSTANT_ROWS[key] = rows
    return rows


def _per_row(value, name: str, batch: int, device: torch.device, dtype: torch.dtype, default) -> tuple[torch.Tensor, bool]:
    """Broadcast a scalar or (B,) tensor argument to a (B,) tensor; report whether it was a tensor."""
    if value is None:
        value = default
    if isinstance(value, torch.Tensor):
        if value.dim() == 0:
            value = value.reshape(1).expand(batch)
        if value.dim() != 1 or value.shape[0] != batch:
            raise ValueError(f"{name} must be a scalar or a ({batch},) tensor, got shape {tuple(value.shape)}")
        if value.is_complex() or value.dtype == torch.bool or (value.is_floating_point() and not dtype.is_floating_point):
            raise ValueError(f"{name} must hold {'real numbers' if dtype.is_floating_point else 'integers'}, got {value.dtype}")
        return value.to(device=device, dtype=dtype, non_blocking=True), True
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{name} must be a number or a tensor, got {type(value).__name__}")
    if not dtype.is_floating_point and not isinstance(value, int):
        raise ValueError(f"{name} must be an integer, got {value!r}")
    return constant_rows(value, batch, dtype, device), False


def _check_scalar_params(temperature, top_k, top_p) -> None:
    if isinstance(temperature, (int, float)) and not isinstance(temperature, bool):
        if not (temperature >= 0 and temperature != float("inf")):
            raise ValueError(f"temperature must be a finite number >= 0 (0 = greedy), got {temperature!r}")
    if isinstance(top_k, int) and not isinstance(top_k, bool) and top_k < 0:
        raise ValueError(f"top_k must be >= 0 (0 or None = off), got {top_k!r}")
    if isinstance(top_p, (int, float)) and not isinstance(top_p, bool) and not (0.0 < top_p <= 1.0):
        raise ValueError(f"top_p must lie in (0, 1] (1 or None = off), got {top_p!r}")


def _first_bad_row(bad: torch.Tensor) -> int | None:
    """Index of the first True entry of a (B,) mask, or None (one host sync)."""
    rows = bad.nonzero()
    return int(rows[0, 0]) if rows.numel() else None


def _row_vector(value, name: str, batch: int, device: torch.device) -> torch.Tensor | None:
    """``seeds`` / ``offsets``: None or a (B,) int64 tensor on the logits' device (values are
    checked with the logits, after the kernel: a negative entry blanks or raises for its row)."""
    if value is None:
        return None
    if not isinstance(value, torch.Tensor):
        raise ValueError(f"{name} must be None or a ({batch},) int64 tensor, got {type(value).__name__}")
    if value.dtype != torch.int64:
        raise ValueError(f"{name} must be an int64 tensor, got {value.dtype}")
    if value.dim() != 1 or value.shape[0] != batch:
        raise ValueError(f"{name} must have shape ({batch},) to match the batch, got {tuple(value.shape)}")
    if value.device != device:
        raise ValueError(f"{name} is on {value.device} but the logits are on {device}")
    return value


def logprobs_mode(return_logprobs) -> int:
    """LOGPROBS_* code of ``return_logprobs`` (False / None, "processed" or "raw")."""
    if isinstance(return_logprobs, str) or return_logprobs in (False, None):
        mode = _LOGPROBS_MODES.get(return_logprobs)
        if mode is not None:
            return mode
    raise ValueError(f"return_logprobs must be False, 'processed' or 'raw', got {return_logprobs!r}")


def validate_verify(
    target_logits, draft_logits, draft_tokens, *, temperature, top_k, top_p, num_draft_tokens, generator, check,
    seeds=None, offsets=None, stream: int = VERIFY_STREAM, return_logprobs=False, return_accept_probs: bool = False,
) -> VerifyArgs:
    """Check shapes, dtypes and devices (always) and values (when ``check``); normalise the parameters."""
    if not isinstance(target_logits, torch.Tensor):
        raise ValueError(f"target_logits must be a tensor, got {type(target_logits).__name__}")
    if target_logits.dim() != 3:
        raise ValueError(f"target_logits must be 3-D (batch, K+1, vocab), got shape {tuple(target_logits.shape)}")
    if target_logits.dtype not in LOGIT_DTYPES:
        raise ValueError(f"target_logits must be float32, bfloat16 or float16, got {target_logits.dtype}")
    batch, k_plus_1, vocab = target_logits.shape
    if k_plus_1 < 1 or vocab < 1:
        raise ValueError(f"target_logits needs at least one position and one vocabulary entry, got shape {tuple(target_logits.shape)}")
    device = target_logits.device
    num_positions = k_plus_1 - 1

    if not isinstance(draft_tokens, torch.Tensor):
        raise ValueError(f"draft_tokens must be a tensor, got {type(draft_tokens).__name__}")
    if draft_tokens.dtype not in TOKEN_DTYPES:
        raise ValueError(f"draft_tokens must be int32 or int64, got {draft_tokens.dtype}")
    if draft_tokens.dim() != 2 or draft_tokens.shape != (batch, num_positions):
        raise ValueError(f"draft_tokens must have shape (batch, K) = ({batch}, {num_positions}) to match target_logits (batch, K+1, vocab), got {tuple(draft_tokens.shape)}")
    if draft_tokens.device != device:
        raise ValueError(f"draft_tokens is on {draft_tokens.device} but target_logits is on {device}")

    if draft_logits is not None:
        if not isinstance(draft_logits, torch.Tensor):
            raise ValueError(f"draft_logits must be a tensor or None, got {type(draft_logits).__name__}")
        if draft_logits.dim() != 3:
            raise ValueError(f"draft_logits must be 3-D (batch, K, draft_vocab), got shape {tuple(draft_logits.shape)}")
        if draft_logits.dtype not in LOGIT_DTYPES:
            raise ValueError(f"draft_logits must be float32, bfloat16 or float16, got {draft_logits.dtype}")
        if draft_logits.shape[:2] != (batch, num_positions):
            raise ValueError(f"draft_logits must have shape (batch, K, draft_vocab) with (batch, K) = ({batch}, {num_positions}), got {tuple(draft_logits.shape)}")
        if not 1 <= draft_logits.shape[2] <= vocab:
            raise ValueError(f"draft_logits vocabulary ({draft_logits.shape[2]}) must be between 1 and the target's ({vocab})")
        if draft_logits.device != device:
            raise ValueError(f"draft_logits is on {draft_logits.device} but target_logits is on {device}")

    if generator is not None and not isinstance(generator, torch.Generator):
        raise ValueError(f"generator must be a torch.Generator or None, got {type(generator).__name__}")
    if not isinstance(return_accept_probs, bool):
        raise ValueError(f"return_accept_probs must be a bool, got {type(return_accept_probs).__name__}")
    outputs = dict(
        seeds=_row_vector(seeds, "seeds", batch, device), offsets=_row_vector(offsets, "offsets", batch, device), stream=stream,
        logprobs=logprobs_mode(return_logprobs), accept_probs=return_accept_probs,
    )

    if num_draft_tokens is None and device.type == "cpu" and type(temperature) in _NUMBER_TYPES and type(top_k) in _INT_TYPES and type(top_p) in _NUMBER_TYPES:
        # The common call (scalar parameters) in one lookup: validation costs more than the kernel
        # at small shapes. Values are checked once, when the key is first seen.
        key = (temperature, top_k, top_p, batch, num_positions, device)
        rows = _SCALAR_ROWS.get(key)
        if rows is None or torch.compiler.is_compiling():
            _check_scalar_params(temperature, top_k, top_p)
            rows = (
                constant_rows(1.0 if temperature is None else float(temperature), batch, torch.float32, device), constant_rows(top_k or 0, batch, torch.int64, device),
                constant_rows(1.0 if top_p is None else float(top_p), batch, torch.float32, device), constant_rows(num_positions, batch, torch.int64, device),
                bool(top_k) or (top_p is not None and top_p < 1),
            )
            if len(_SCALAR_ROWS) >= _CONSTANT_ROWS_LIMIT:
                _SCALAR_ROWS.clear()
            if not torch.compiler.is_compiling():
                _SCALAR_ROWS[key] = rows
        return VerifyArgs(target_logits, draft_logits, draft_tokens, *rows[:4], generator, check, rows[4], **outputs)

    _check_scalar_params(temperature, top_k, top_p)
    temperature_t, temperature_is_tensor = _per_row(temperature, "temperature", batch, device, torch.float32, 1.0)
    top_k_t, top_k_is_tensor = _per_row(top_k, "top_k", batch, device, torch.int64, 0)
    top_p_t, top_p_is_tensor = _per_row(top_p, "top_p", batch, device, torch.float32, 1.0)
    if num_draft_tokens is None:
        num_draft_t = constant_rows(num_positions, batch, torch.int64, device)
        num_draft_is_tensor = False
    else:
        if isinstance(num_draft_tokens, (list, tuple)):
            num_draft_tokens = torch.tensor(num_draft_tokens, dtype=torch.int64)
        if not isinstance(num_draft_tokens, torch.Tensor) or num_draft_tokens.is_floating_point():
            raise ValueError("num_draft_tokens must be None or a (batch,) integer tensor")
        num_draft_t, num_draft_is_tensor = _per_row(num_draft_tokens, "num_draft_tokens", batch, device, torch.int64, num_positions)

    filtered = top_k_is_tensor or top_p_is_tensor or bool(top_k) or (top_p is not None and top_p < 1)
    args = VerifyArgs(target_logits, draft_logits, draft_tokens, temperature_t, top_k_t, top_p_t, num_draft_t, generator, check, filtered, **outputs)
    if check:
        _check_values(args, temperature_is_tensor, top_k_is_tensor, top_p_is_tensor, num_draft_is_tensor)
    return args


def _check_values(args: VerifyArgs, temperature_is_tensor: bool, top_k_is_tensor: bool, top_p_is_tensor: bool, num_draft_is_tensor: bool) -> None:
    """Raise ValueError naming the parameter and the first bad row (per-row tensors only; cheap)."""
    if temperature_is_tensor:
        row = _first_bad_row(~(args.temperature >= 0) | torch.isinf(args.temperature))
        if row is not None:
            raise ValueError(f"temperature must be finite and >= 0 (0 = greedy); row {row} has {args.temperature[row].item()}")
    if top_k_is_tensor:
        row = _first_bad_row(args.top_k < 0)
        if row is not None:
            raise ValueError(f"top_k must be >= 0 (0 = off); row {row} has {args.top_k[row].item()}")
    if top_p_is_tensor:
        row = _first_bad_row(~((args.top_p > 0) & (args.top_p <= 1)))
        if row is not None:
            raise ValueError(f"top_p must lie in (0, 1]; row {row} has {args.top_p[row].item()}")
    if num_draft_is_tensor:
        row = _first_bad_row((args.num_draft_tokens < 0) | (args.num_draft_tokens > args.num_positions))
        if row is not None:
            raise ValueError(f"num_draft_tokens must lie in [0, K={args.num_positions}]; row {row} has {args.num_draft_tokens[row].item()}")


def raise_for_bad_rows(args: VerifyArgs, blanked: torch.Tensor) -> None:
    """Raise ValueError naming the argument and the first bad row.

    Called only when a backend blanked a row (``blanked``: (B,) bool), so valid calls never pay for
    this extra pass over the logits: the kernels find bad rows while they read the logits anyway.
    """
    for name, bad, what in parameter_problems(args) + row_problems(args):
        row = _first_bad_row(bad)
        if row is not None:
            raise ValueError(f"{name}: row {row} {what}")
    row = _first_bad_row(blanked)
    raise ValueError(f"target_logits: row {row} could not be verified (non-finite values after temperature and filtering)")


def inverse_temperature(temperature: torch.Tensor) -> torch.Tensor:
    """(B,) float32 1 / T by IEEE float32 division (1 for greedy rows): every backend scales logits
    by this one rounded product, so their processed logits agree bit for bit."""
    scale = torch.where(temperature > 0, temperature, torch.ones_like(temperature))
    return 1.0 / scale


def parameter_problems(args: VerifyArgs) -> list[tuple[str, torch.Tensor, str]]:
    """(argument, (B,) bad-row mask, description) of every per-row parameter out of range."""
    t = args.temperature
    problems = [
        ("temperature", ~(t >= 0) | torch.isinf(t), "must be finite and >= 0 (0 = greedy)"),
        ("top_k", args.top_k < 0, "must be >= 0 (0 = off)"),
        ("top_p", ~((args.top_p > 0) & (args.top_p <= 1)), "must lie in (0, 1]"),
        ("num_draft_tokens", (args.num_draft_tokens < 0) | (args.num_draft_tokens > args.num_positions), f"must lie in [0, K={args.num_positions}]"),
    ]
    if args.seeds is not None:
        problems.append(("seeds", args.seeds < 0, "is negative (seeds must be >= 0)"))
    if args.offsets is not None:
        problems.append(("offsets", args.offsets < 0, "is negative (offsets must be >= 0)"))
    return problems


def row_problems(args: VerifyArgs, reached: torch.Tensor | None = None) -> list[tuple[str, torch.Tensor, str]]:
    """(argument, (B,) bad-row mask, description) for every value problem, at the positions a row uses.

    Used by the check (to raise) and by the eager backend with ``check=False`` (to blank the row).
    One max per logits line finds all of NaN (max is NaN), +inf (max is +inf) and an empty line
    (max is -inf); scaling that max by 1 / T finds a temperature so small that the processed
    logits are no longer finite (the line's maximum overflows).

    ``reached``: (B,) position j where each row's acceptance walk stopped (its first rejection, or
    n_b). Given, only the lines the verification reads count: target and draft lines at positions
    <= j, and no draft line of a greedy row. Draft ids are checked at every position < n_b either way.
    """
    num_positions = args.num_positions
    positions = torch.arange(num_positions + 1, device=args.target_logits.device)
    target_used = positions[None, :] <= args.num_draft_tokens[:, None]  # (B, K+1)
    token_used = target_used[:, 1:] if num_positions else target_used[:, :0]  # position k < n_b
    draft_used = token_used
    if reached is not None:
        target_used = target_used & (positions[None, :] <= reached[:, None])
        draft_used = target_used[:, :-1] & token_used & (args.temperature > 0)[:, None]
    inv_t = inverse_temperature(args.temperature)[:, None]
    sampled = (args.temperature > 0)[:, None]

    def line_problems(logits: torch.Tensor, used: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        line_max = logits.amax(dim=2).float()  # (B, L)
        nan_or_inf = (torch.isnan(line_max) | torch.isposinf(line_max)) & used
        empty = torch.isneginf(line_max) & used
        overflow = torch.isfinite(line_max) & ~torch.isfinite(line_max * inv_t) & sampled & used
        return nan_or_inf.any(1), empty.any(1), overflow.any(1)

    problems = []
    nan_t, empty_t, overflow_t = line_problems(args.target_logits, target_used)
    problems += [
        ("target_logits", nan_t, "contains NaN or +inf"),
        ("target_logits", empty_t, "has a position whose processed distribution is empty (every logit is -inf)"),
        ("temperature", overflow_t, "is so small that target_logits / temperature is not finite (use temperature 0 for greedy decoding)"),
    ]
    if args.draft_logits is not None and num_positions:
        nan_d, empty_d, overflow_d = line_problems(args.draft_logits, draft_used)
        problems += [
            ("draft_logits", nan_d, "contains NaN or +inf"),
            ("draft_logits", empty_d, "has a position whose processed distribution is empty (every logit is -inf)"),
            ("temperature", overflow_d, "is so small that draft_logits / temperature is not finite (use temperature 0 for greedy decoding)"),
        ]
    if num_positions:
        tokens = args.draft_tokens
        out_of_range = ((tokens < 0) | (tokens >= args.draft_vocab)) & token_used
        problems.append(("draft_tokens", out_of_range.any(1), f"holds an id outside [0, {args.draft_vocab})"))
    return problems


def invalid_rows(args: VerifyArgs, reached: torch.Tensor | None = None) -> torch.Tensor:
    """(B,) bool: rows that ``check=True`` would reject (or bad parameter values); with ``reached``,
    only bad values in the lines the verification reads count (see :func:`row_problems`)."""
    bad = torch.zeros(args.batch, dtype=torch.bool, device=args.target_logits.device)
    for _, mask, _ in parameter_problems(args) + row_problems(args, reached):
        bad |= mask
    return bad
