"""Argument validation for every entry point: chains (``verify`` of both methods, ``sample``) and trees.

A public call becomes a :class:`VerifyArgs` or a :class:`TreeArgs`: per-row tensors on the logits'
device, so a backend never looks at Python scalars or guesses defaults. One rule for every call:

* **always, before any kernel**: types, shapes, dtypes and devices of the tensors; the Python-scalar
  parameters (checked once per value: the per-row tensors they become are cached);
* **with check=True, before the kernel**: per-row parameter tensors (temperature, top_k, top_p,
  num_draft_tokens / num_nodes), one reduction each;
* **with check=True, after the kernel, only when it blanked a row**: the values a kernel finds
  while it reads its inputs anyway (NaN / +inf / empty logits lines, out-of-range draft ids, a bad
  tree, negative seeds or offsets). :func:`raise_for_bad_rows` then names the argument and the
  first bad row, so a valid call never pays for an extra pass over the logits.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from ._philox import SAMPLE_STREAM, VERIFY_STREAM

LOGIT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
TOKEN_DTYPES = (torch.int32, torch.int64)
BACKENDS = ("auto", "triton", "cpp", "eager")
VERIFY_METHODS = ("token", "block")
#: How the children of one tree context were drawn from the draft's distribution there.
SIBLING_MODES = ("iid", "without_replacement")
LOGPROBS_NONE, LOGPROBS_PROCESSED, LOGPROBS_RAW = 0, 1, 2
_LOGPROBS_MODES = {False: LOGPROBS_NONE, None: LOGPROBS_NONE, "processed": LOGPROBS_PROCESSED, "raw": LOGPROBS_RAW}


class VerifyArgs(NamedTuple):
    """A validated verification call (a chain; ``sample`` is one with K = 0). Tensors live on ``target_logits.device``."""

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


class TreeArgs(NamedTuple):
    """A validated tree verification call. Tensors live on ``target_logits.device``."""

    target_logits: torch.Tensor  # (B, N+1, V): context 0 = the sequence, context i+1 = node i
    draft_logits: torch.Tensor | None  # (B, N+1, Vd), Vd <= V; None = deterministic siblings
    draft_tokens: torch.Tensor  # (B, N) int32 / int64
    parents: torch.Tensor  # (B, N) int64: -1 = the root context, else a node index below the child's
    temperature: torch.Tensor  # (B,) float32; 0 = greedy row
    top_k: torch.Tensor  # (B,) int64; 0 = off
    top_p: torch.Tensor  # (B,) float32; 1 = off
    num_nodes: torch.Tensor  # (B,) int64 in [0, N]: row b uses nodes 0 .. n_b - 1
    siblings: str  # one of SIBLING_MODES
    generator: torch.Generator | None
    check: bool
    seeds: torch.Tensor | None = None  # (B,) int64 per-row Philox keys; None = base_key + row
    offsets: torch.Tensor | None = None  # (B,) int64 absolute position of each row's context 0; None = 0
    filtered: bool = True  # False when top-k and top-p are off for every row (lets backends skip the cut-offs)

    @property
    def batch(self) -> int:
        return self.target_logits.shape[0]

    @property
    def num_tree_nodes(self) -> int:  # N
        return self.draft_tokens.shape[1]

    @property
    def vocab(self) -> int:
        return self.target_logits.shape[2]

    @property
    def draft_vocab(self) -> int:
        return self.draft_logits.shape[2] if self.draft_logits is not None else self.vocab


class Layout(NamedTuple):
    """How a call's tensors are laid out, for the messages: the name of the line count ("K" for a
    chain, "N" for a tree), the target's lines and the draft's lines in that notation."""

    count: str  # "K" / "N"
    target_lines: str  # "K+1" / "N+1"
    draft_lines: str  # "K" / "N+1"


CHAIN = Layout("K", "K+1", "K")
TREE = Layout("N", "N+1", "N+1")


# ---------------------------------------------------------------------------------------------
# Tensors: types, shapes, dtypes, devices (always checked)


def _require_tensor(value, name: str, what: str = "a tensor") -> None:
    if not isinstance(value, torch.Tensor):
        raise ValueError(f"{name} must be {what}, got {type(value).__name__}")


def check_logits_dtype(logits: torch.Tensor, name: str) -> None:
    if logits.dtype not in LOGIT_DTYPES:
        raise ValueError(f"{name} must be float32, bfloat16 or float16, got {logits.dtype}")


def check_target_logits(target_logits, layout: Layout) -> tuple[int, int, int]:
    """(batch, lines, vocab) of (B, lines, V) target logits."""
    _require_tensor(target_logits, "target_logits")
    if target_logits.dim() != 3:
        raise ValueError(f"target_logits must be 3-D (batch, {layout.target_lines}, vocab), got shape {tuple(target_logits.shape)}")
    check_logits_dtype(target_logits, "target_logits")
    batch, lines, vocab = target_logits.shape
    if lines < 1 or vocab < 1:
        raise ValueError(f"target_logits needs at least one line ({layout.target_lines} >= 1) and one vocabulary entry, got shape {tuple(target_logits.shape)}")
    return batch, lines, vocab


def check_ids(ids, name: str, shape: tuple[int, int], device: torch.device, layout: Layout) -> None:
    """``draft_tokens`` / ``parents``: (B, K or N) int32 / int64 on the logits' device."""
    _require_tensor(ids, name)
    if ids.dtype not in TOKEN_DTYPES:
        raise ValueError(f"{name} must be int32 or int64, got {ids.dtype}")
    if ids.shape != shape:
        raise ValueError(f"{name} must have shape (batch, {layout.count}) = {shape} to match target_logits (batch, {layout.target_lines}, vocab), "
                         f"got {tuple(ids.shape)}")
    if ids.device != device:
        raise ValueError(f"{name} is on {ids.device} but target_logits is on {device}")


def check_draft_logits(draft_logits, batch: int, lines: int, vocab: int, device: torch.device, layout: Layout) -> None:
    """(B, lines, Vd) draft logits, 1 <= Vd <= V, on the logits' device (None: no draft distribution)."""
    if draft_logits is None:
        return
    _require_tensor(draft_logits, "draft_logits", "a tensor or None")
    if draft_logits.dim() != 3:
        raise ValueError(f"draft_logits must be 3-D (batch, {layout.draft_lines}, draft_vocab), got shape {tuple(draft_logits.shape)}")
    check_logits_dtype(draft_logits, "draft_logits")
    if draft_logits.shape[:2] != (batch, lines):
        raise ValueError(f"draft_logits must have shape (batch, {layout.draft_lines}, draft_vocab) with (batch, {layout.draft_lines}) = ({batch}, {lines}), "
                         f"got {tuple(draft_logits.shape)}")
    if not 1 <= draft_logits.shape[2] <= vocab:
        raise ValueError(f"draft_logits vocabulary ({draft_logits.shape[2]}) must be between 1 and the target's ({vocab})")
    if draft_logits.device != device:
        raise ValueError(f"draft_logits is on {draft_logits.device} but target_logits is on {device}")


def check_generator(generator) -> None:
    if generator is not None and not isinstance(generator, torch.Generator):
        raise ValueError(f"generator must be a torch.Generator or None, got {type(generator).__name__}")


def is_row_vector(value, rows: torch.Size, device: torch.device) -> bool:
    """Whether ``value`` is a (B,) int64 tensor on ``device`` (``rows``: torch.Size((B,))), as
    ``seeds`` and ``offsets`` must be: a prepared call takes it at a glance (:func:`row_vector` says
    what is wrong with anything else)."""
    return type(value) is torch.Tensor and value.dtype is torch.int64 and value.shape == rows and value.device == device


def row_vector(value, name: str, batch: int, device: torch.device) -> torch.Tensor | None:
    """``seeds`` / ``offsets``: None or a (B,) int64 tensor on the logits' device, returned
    contiguous (the kernels read row b's entry at offset b). Their values are checked after the
    kernel (a negative entry blanks its row, then raises with check=True)."""
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
    return value.contiguous()


def logprobs_mode(return_logprobs) -> int:
    """LOGPROBS_* code of ``return_logprobs`` (False / None, "processed" or "raw")."""
    if isinstance(return_logprobs, str) or return_logprobs in (False, None):
        mode = _LOGPROBS_MODES.get(return_logprobs)
        if mode is not None:
            return mode
    raise ValueError(f"return_logprobs must be False, 'processed' or 'raw', got {return_logprobs!r}")


def check_method(method, return_accept_probs: bool) -> None:
    if method not in VERIFY_METHODS:
        raise ValueError(f"method must be one of {VERIFY_METHODS}, got {method!r}")
    if method == "block" and return_accept_probs:
        raise ValueError("return_accept_probs is defined for token-wise verification only (method='token'): block verification "
                         "decides on the whole block, not on per-draft ratios")


def check_backend(backend) -> None:
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")


# ---------------------------------------------------------------------------------------------
# Per-row parameters


_CONSTANT_ROWS: dict[tuple, torch.Tensor] = {}
_SCALAR_ROWS: dict[tuple, tuple] = {}  # (temperature, top_k, top_p, their types, B, device) -> (temperature, top_k, top_p, filtered)
_CACHE_LIMIT = 64


def building_a_graph(device: torch.device) -> bool:
    """torch.compile tracing or CUDA graph capture: a tensor made now belongs to the graph, not to a cache."""
    return torch.compiler.is_compiling() or (device.type == "cuda" and torch.cuda.is_current_stream_capturing())


def constant_rows(value, batch: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A (B,) tensor filled with ``value``, shared between calls (the backends only read it).

    Building it costs more than the fused kernel at small shapes (a fill per parameter and call, a
    kernel launch each on CUDA), so it is kept, one per (value, B, dtype, device). On CUDA the fill
    is waited for once, when it is made, so that every stream may read it. Not while a graph is
    being built (torch.compile, CUDA graph capture): there a fresh tensor belongs to the graph.
    """
    if building_a_graph(device):
        return torch.full((batch,), value, dtype=dtype, device=device)
    key = (value, type(value), batch, dtype, device)
    rows = _CONSTANT_ROWS.get(key)
    if rows is None:
        if len(_CONSTANT_ROWS) >= _CACHE_LIMIT:
            _CONSTANT_ROWS.clear()
        with torch.inference_mode(False):  # a normal tensor, usable in and out of inference mode
            rows = torch.full((batch,), value, dtype=dtype, device=device)
        if device.type == "cuda":
            torch.cuda.current_stream(device).synchronize()
        _CONSTANT_ROWS[key] = rows
    return rows


def _check_scalar_params(temperature, top_k, top_p) -> None:
    """Value checks of the Python-number parameters (tensors are checked per row, see :func:`row_parameters`)."""
    if isinstance(temperature, (int, float)) and not isinstance(temperature, bool):
        if not (temperature >= 0 and temperature != float("inf")):
            raise ValueError(f"temperature must be a finite number >= 0 (0 = greedy), got {temperature!r}")
    if isinstance(top_k, int) and not isinstance(top_k, bool) and top_k < 0:
        raise ValueError(f"top_k must be >= 0 (0 or None = off), got {top_k!r}")
    if isinstance(top_p, (int, float)) and not isinstance(top_p, bool) and not (0.0 < top_p <= 1.0):
        raise ValueError(f"top_p must lie in (0, 1] (1 or None = off), got {top_p!r}")


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
        # Contiguous: the kernels read row b's value at offset b (a broadcast 0-d tensor or a
        # strided view would hand them other rows' memory).
        return value.to(device=device, dtype=dtype, non_blocking=True).contiguous(), True
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{name} must be a number or a tensor, got {type(value).__name__}")
    if not dtype.is_floating_point and not isinstance(value, int):
        raise ValueError(f"{name} must be an integer, got {value!r}")
    return constant_rows(value, batch, dtype, device), False


_NUMBER_TYPES = (float, int, type(None))  # bool excluded: it is rejected as a parameter
_INT_TYPES = (int, type(None))


def scalar_parameters(temperature, top_k, top_p) -> bool:
    """Whether the three parameters are Python numbers (or None): the cacheable common call."""
    return type(temperature) in _NUMBER_TYPES and type(top_k) in _INT_TYPES and type(top_p) in _NUMBER_TYPES


def row_parameters(temperature, top_k, top_p, batch: int, device: torch.device, check: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, bool]:
    """(temperature (B,) float32, top_k (B,) int64, top_p (B,) float32, filtered) of a call.

    Python numbers are checked once per value and become cached constant rows; (B,) tensors are
    converted, and with ``check`` their values are checked (ValueError naming the first bad row).
    ``filtered`` is False when top-k and top-p are off for every row.
    """
    if scalar_parameters(temperature, top_k, top_p):
        key = (temperature, type(temperature), top_k, type(top_k), top_p, type(top_p), batch, device)
        rows = _SCALAR_ROWS.get(key)
        if rows is None:
            _check_scalar_params(temperature, top_k, top_p)
            rows = (
                constant_rows(1.0 if temperature is None else float(temperature), batch, torch.float32, device),
                constant_rows(top_k or 0, batch, torch.int64, device),
                constant_rows(1.0 if top_p is None else float(top_p), batch, torch.float32, device),
                bool(top_k) or (top_p is not None and top_p < 1),
            )
            if not building_a_graph(device):
                if len(_SCALAR_ROWS) >= _CACHE_LIMIT:
                    _SCALAR_ROWS.clear()
                _SCALAR_ROWS[key] = rows
        return rows
    _check_scalar_params(temperature, top_k, top_p)
    temperature_t, temperature_is_tensor = _per_row(temperature, "temperature", batch, device, torch.float32, 1.0)
    top_k_t, top_k_is_tensor = _per_row(top_k, "top_k", batch, device, torch.int64, 0)
    top_p_t, top_p_is_tensor = _per_row(top_p, "top_p", batch, device, torch.float32, 1.0)
    if check:
        if temperature_is_tensor:
            _require_rows("temperature", ~(temperature_t >= 0) | torch.isinf(temperature_t), temperature_t, "must be finite and >= 0 (0 = greedy)")
        if top_k_is_tensor:
            _require_rows("top_k", top_k_t < 0, top_k_t, "must be >= 0 (0 = off)")
        if top_p_is_tensor:
            _require_rows("top_p", ~((top_p_t > 0) & (top_p_t <= 1)), top_p_t, "must lie in (0, 1]")
    filtered = top_k_is_tensor or top_p_is_tensor or bool(top_k) or (top_p is not None and top_p < 1)
    return temperature_t, top_k_t, top_p_t, filtered


def row_counts(value, name: str, batch: int, limit: int, device: torch.device, check: bool, layout: Layout) -> torch.Tensor:
    """``num_draft_tokens`` / ``num_nodes``: (B,) int64 in [0, limit], ``limit`` (cached) when None."""
    if value is None:
        return constant_rows(limit, batch, torch.int64, device)
    if isinstance(value, (list, tuple)):
        value = torch.tensor(value, dtype=torch.int64)
    if not isinstance(value, torch.Tensor) or value.is_floating_point() or value.dtype == torch.bool:
        raise ValueError(f"{name} must be None or a (batch,) integer tensor")
    counts, _ = _per_row(value, name, batch, device, torch.int64, limit)
    if check:
        _require_rows(name, (counts < 0) | (counts > limit), counts, f"must lie in [0, {layout.count}={limit}]")
    return counts


COMPILED_CHECK_HINT = (
    "inside torch.compile the argument and row cannot be named: run the call outside torch.compile to see them, "
    "or pass check=False to get such rows blanked (tokens -1) instead"
)


def _first_bad_row(bad: torch.Tensor) -> int | None:
    """Index of the first True entry of a (B,) mask, or None (one host sync)."""
    rows = bad.nonzero()
    return int(rows[0, 0]) if rows.numel() else None


def _require_rows(name: str, bad: torch.Tensor, values: torch.Tensor, what: str) -> None:
    """Raise ValueError("{name} {what}; row r has v") for the first bad row of the (B,) mask. Inside
    torch.compile on CPU (where reading the mask would break the graph) the check becomes an
    assertion inside the graph that raises RuntimeError with the rule and a hint."""
    if torch.compiler.is_compiling() and bad.device.type == "cpu":
        torch._assert_async(~bad.any(), f"{name} {what} ({COMPILED_CHECK_HINT})")
        return
    row = _first_bad_row(bad)
    if row is not None:
        raise ValueError(f"{name} {what}; row {row} has {values[row].item()}")


# ---------------------------------------------------------------------------------------------
# The calls


def validate_verify(
    target_logits, draft_logits, draft_tokens, *, temperature, top_k, top_p, num_draft_tokens, generator, check,
    seeds=None, offsets=None, stream: int = VERIFY_STREAM, return_logprobs=False, return_accept_probs: bool = False,
) -> VerifyArgs:
    """A chain call: check shapes, dtypes and devices (always) and parameter values; normalise the parameters."""
    batch, lines, vocab = check_target_logits(target_logits, CHAIN)
    device = target_logits.device
    num_positions = lines - 1
    check_ids(draft_tokens, "draft_tokens", (batch, num_positions), device, CHAIN)
    check_draft_logits(draft_logits, batch, num_positions, vocab, device, CHAIN)
    check_generator(generator)
    if not isinstance(return_accept_probs, bool):
        raise ValueError(f"return_accept_probs must be a bool, got {type(return_accept_probs).__name__}")
    outputs = dict(
        seeds=row_vector(seeds, "seeds", batch, device), offsets=row_vector(offsets, "offsets", batch, device), stream=stream,
        logprobs=logprobs_mode(return_logprobs), accept_probs=return_accept_probs,
    )
    temperature_t, top_k_t, top_p_t, filtered = row_parameters(temperature, top_k, top_p, batch, device, check)
    num_draft_t = row_counts(num_draft_tokens, "num_draft_tokens", batch, num_positions, device, check, CHAIN)
    return VerifyArgs(target_logits, draft_logits, draft_tokens, temperature_t, top_k_t, top_p_t, num_draft_t, generator, check, filtered, **outputs)


_NO_DRAFTS: dict[tuple, torch.Tensor] = {}


def no_drafts(batch: int, device: torch.device) -> torch.Tensor:
    """The (B, 0) int64 draft tokens of a call with K = 0 (``sample``), shared between calls."""
    if building_a_graph(device):
        return torch.empty((batch, 0), dtype=torch.int64, device=device)
    key = (batch, device)
    found = _NO_DRAFTS.get(key)
    if found is None:
        if len(_NO_DRAFTS) >= _CACHE_LIMIT:
            _NO_DRAFTS.clear()
        with torch.inference_mode(False):
            found = _NO_DRAFTS[key] = torch.empty((batch, 0), dtype=torch.int64, device=device)
    return found


def validate_sample(logits, *, temperature, top_k, top_p, generator, check, seeds=None, offsets=None) -> VerifyArgs:
    """``sample``'s call: the verification of (B, 1, V) logits with K = 0 on the sample stream; the
    messages name ``logits``."""
    _require_tensor(logits, "logits", "a 2-D (batch, vocab) tensor")
    if logits.dim() != 2:
        raise ValueError(f"logits must be a 2-D (batch, vocab) tensor, got {tuple(logits.shape)}")
    check_logits_dtype(logits, "logits")
    batch, vocab = logits.shape
    if vocab < 1:
        raise ValueError(f"logits needs at least one vocabulary entry, got shape {tuple(logits.shape)}")
    device = logits.device
    check_generator(generator)
    temperature_t, top_k_t, top_p_t, filtered = row_parameters(temperature, top_k, top_p, batch, device, check)
    return VerifyArgs(
        logits.unsqueeze(1), None, no_drafts(batch, device), temperature_t, top_k_t, top_p_t, constant_rows(0, batch, torch.int64, device),
        generator, check, filtered, row_vector(seeds, "seeds", batch, device), row_vector(offsets, "offsets", batch, device), SAMPLE_STREAM,
    )


def validate_tree(target_logits, draft_logits, draft_tokens, parents, *, temperature, top_k, top_p, num_nodes, siblings,
                  generator, seeds, offsets, check) -> TreeArgs:
    """A tree call: check shapes, dtypes and devices (always) and parameter values; normalise the parameters.
    The tree itself (parents) and the values are checked after the kernel, as for a chain."""
    batch, contexts, vocab = check_target_logits(target_logits, TREE)
    device = target_logits.device
    nodes = contexts - 1
    check_ids(draft_tokens, "draft_tokens", (batch, nodes), device, TREE)
    check_ids(parents, "parents", (batch, nodes), device, TREE)
    check_draft_logits(draft_logits, batch, contexts, vocab, device, TREE)
    if siblings not in SIBLING_MODES:
        raise ValueError(f"siblings must be one of {SIBLING_MODES}, got {siblings!r}")
    check_generator(generator)
    seeds = row_vector(seeds, "seeds", batch, device)
    offsets = row_vector(offsets, "offsets", batch, device)
    temperature_t, top_k_t, top_p_t, filtered = row_parameters(temperature, top_k, top_p, batch, device, check)
    num_nodes_t = row_counts(num_nodes, "num_nodes", batch, nodes, device, check, TREE)
    return TreeArgs(target_logits, draft_logits, draft_tokens, parents.long(), temperature_t, top_k_t, top_p_t, num_nodes_t,
                    siblings, generator, check, seeds, offsets, filtered)


# ---------------------------------------------------------------------------------------------
# Values: what a blanked row had wrong


def inverse_temperature(temperature: torch.Tensor) -> torch.Tensor:
    """(B,) float32 1 / T by IEEE float32 division (1 for greedy rows): every backend scales logits
    by this one rounded product, so their processed logits agree bit for bit."""
    scale = torch.where(temperature > 0, temperature, torch.ones_like(temperature))
    return 1.0 / scale


def parameter_problems(args: VerifyArgs | TreeArgs) -> list[tuple[str, torch.Tensor, str]]:
    """(argument, (B,) bad-row mask, description) of every per-row parameter, key and offset out of range."""
    if isinstance(args, TreeArgs):
        count, count_name, limit, letter = args.num_nodes, "num_nodes", args.num_tree_nodes, TREE.count
    else:
        count, count_name, limit, letter = args.num_draft_tokens, "num_draft_tokens", args.num_positions, CHAIN.count
    t = args.temperature
    problems = [
        ("temperature", ~(t >= 0) | torch.isinf(t), "must be finite and >= 0 (0 = greedy)"),
        ("top_k", args.top_k < 0, "must be >= 0 (0 = off)"),
        ("top_p", ~((args.top_p > 0) & (args.top_p <= 1)), "must lie in (0, 1]"),
        (count_name, (count < 0) | (count > limit), f"must lie in [0, {letter}={limit}]"),
    ]
    if args.seeds is not None:
        problems.append(("seeds", args.seeds < 0, "is negative (seeds must be >= 0)"))
    if args.offsets is not None:
        problems.append(("offsets", args.offsets < 0, "is negative (offsets must be >= 0)"))
    return problems


def row_problems(args: VerifyArgs, reached: torch.Tensor | None = None, logits_name: str = "target_logits") -> list[tuple[str, torch.Tensor, str]]:
    """(argument, (B,) bad-row mask, description) for every value problem of a chain, at the positions a row uses.

    Used by the check (to raise) and by the eager backend with ``check=False`` (to blank the row).
    One max per logits line finds all of NaN (max is NaN), +inf (max is +inf) and an empty line
    (max is -inf); scaling that max by 1 / T finds a temperature so small that the processed
    logits are no longer finite (the line's maximum overflows).

    ``reached``: (B,) position j where each row's acceptance walk stopped (its first rejection, or
    n_b). Given, only the lines the verification reads count: target and draft lines at positions
    <= j, and no draft line of a greedy row. Draft ids are checked at every position < n_b either way.
    ``logits_name``: what the caller called the target logits (``sample`` takes ``logits``).
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
        (logits_name, nan_t, "contains NaN or +inf"),
        (logits_name, empty_t, "has a position whose processed distribution is empty (every logit is -inf)"),
        ("temperature", overflow_t, f"is so small that {logits_name} / temperature is not finite (use temperature 0 for greedy decoding)"),
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
    """(B,) bool: rows of a chain that ``check=True`` would reject (or bad parameter values); with
    ``reached``, only bad values in the lines the verification reads count (see :func:`row_problems`)."""
    bad = torch.zeros(args.batch, dtype=torch.bool, device=args.target_logits.device)
    for _, mask, _ in parameter_problems(args) + row_problems(args, reached):
        bad |= mask
    return bad


def bad_parents(args: TreeArgs) -> torch.Tensor:
    """(B, N) bool: used nodes whose parent is neither -1 nor a node index below their own.

    Parents below their child make every tree acyclic and give a topological order for free.
    """
    node = torch.arange(args.num_tree_nodes, device=args.parents.device)
    used = node[None, :] < args.num_nodes[:, None]
    return used & ((args.parents < -1) | (args.parents >= node[None, :]))


def raise_for_bad_parents(args: TreeArgs) -> None:
    """ValueError naming ``parents`` with the first bad row and node, if a used node has a bad parent."""
    bad = bad_parents(args)
    row = _first_bad_row(bad.any(1))
    if row is not None:
        node = int(bad[row].nonzero()[0, 0])
        parent = int(args.parents[row, node])
        raise ValueError(f"parents: row {row} node {node} has parent {parent}; a parent must be -1 (the root) or a node index "
                         f"below its child's (which also rules out cycles), in [-1, {node})")


def raise_for_bad_rows(problems: list[tuple[str, torch.Tensor, str]], blanked: torch.Tensor, logits_name: str = "target_logits") -> None:
    """Raise ValueError("argument: row r what") for the first problem with a bad row, else for the
    first blanked row (``blanked``: (B,) bool). Called only when a kernel blanked a row, so valid
    calls never pay for this extra pass over the logits. ``logits_name``: what the caller called the
    target logits (``sample`` takes ``logits``), as in the problems' names."""
    for name, bad, what in problems:
        row = _first_bad_row(bad)
        if row is not None:
            raise ValueError(f"{name}: row {row} {what}")
    row = _first_bad_row(blanked)
    raise ValueError(f"{logits_name}: row {row} could not be verified (non-finite values after temperature and filtering)")
