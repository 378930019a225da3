"""The random stream shared by every backend (stream v2).

Every random number used by :func:`specdec_ext.verify` and :func:`specdec_ext.sample` comes from
Philox4x32-10, exactly as ``triton.language.philox`` computes it, so the eager reference, the C++
kernel and the Triton kernels draw the same numbers for the same keys.

* **Key, per request.** Row b is keyed by a non-negative int64 ``key_b``: ``seeds[b]`` when the
  caller passes ``seeds``, else ``base_key + b`` with ``base_key`` one integer in [0, 2**62) drawn
  per call from the caller's generator (:func:`draw_base_key`). ``k0`` is the key's low 32-bit
  word and ``k1`` its high word.
* **Position, per request.** The k-th verify position of row b (k = 0..K) sits at the absolute
  position ``P = offsets[b] + k`` (``offsets`` defaults to 0); counters carry ``P`` as two words,
  ``p_lo = P mod 2**32`` and ``p_hi = P >> 32``. A request that advances its offset by the number of
  tokens it emitted never reuses a number that decided an emitted token.
* **Counters** ``(c0, c1, c2, c3)`` and the output word used:

  ========================================  ==========================  ======
  draw                                      counter                     word
  ========================================  ==========================  ======
  acceptance coin at position k             (0, p_lo, p_hi, 0)          0
  tree: coin of the sibling of rank r       (r, p_lo, p_hi, 0)          0
  race exponential of vocabulary id v       (v >> 2, p_lo, p_hi, S)     v & 3
  ========================================  ==========================  ======

  ``S`` is :data:`VERIFY_STREAM` (1) for the corrected / bonus draw of ``verify`` and
  :data:`SAMPLE_STREAM` (2) for ``sample``, so drafts drawn with ``sample`` and verified with the
  same keys and offsets never share noise with the verification. One Philox evaluation serves four
  consecutive vocabulary ids. Distinct draws never share a (counter, word): the stream word c3
  separates coins from races, and inside a race ``v -> (v >> 2, v & 3)`` is one-to-one.
* **Uniforms** lie in the *open* interval (0, 1): ``u = ((x >> 9) + 0.5) * 2**-23`` (exact in
  float32; never 0, so a token with p = 0 is never accepted and ``E = -log(u)`` is finite).
"""

from __future__ import annotations

import threading

import torch

ACCEPT_STREAM = 0
VERIFY_STREAM = 1
SAMPLE_STREAM = 2

PHILOX_KEY_A = 0x9E3779B9
PHILOX_KEY_B = 0xBB67AE85
PHILOX_ROUND_A = 0xD2511F53
PHILOX_ROUND_B = 0xCD9E8D57
PHILOX_ROUNDS = 10

_MASK32 = 0xFFFFFFFF
# Keys drawn from a generator lie below this bound, so base_key + row stays a non-negative int64.
KEY_BOUND = 2**62


_KEY_BUFFERS = threading.local()
_CPU = torch.device("cpu")
# The C++ extension's draw of the same value (generator -> key, or None for a generator it does not
# take), set by specdec_ext._cpp_backend when the extension loads: no tensor, no dispatcher call.
FAST_DRAW = None


def draw_base_key(generator: torch.Generator | None) -> int:
    """One per-call key base in [0, 2**62) from a CPU generator (torch's default one for None).

    The value ``torch.randint(0, 2**62, (1,), generator=generator)`` gives (randint is ``random_``
    on a fresh tensor): drawn by the C++ extension where it is loaded (``random64() % 2**62`` under
    the generator's lock, as ``random_`` computes it), else into a one-element buffer kept per
    thread (allocating a tensor per call costs about as much as the draw itself).
    """
    if FAST_DRAW is not None:
        key = FAST_DRAW(generator)
        if key is not None:
            return key
    try:
        buffer = _KEY_BUFFERS.buffer
    except AttributeError:
        with torch.inference_mode(False):  # a normal tensor: written in and out of inference mode
            buffer = _KEY_BUFFERS.buffer = torch.empty(1, dtype=torch.int64)
    return (buffer.random_(0, KEY_BOUND) if generator is None else buffer.random_(0, KEY_BOUND, generator=generator)).item()


def draw_row_keys(generator: torch.Generator | None, batch: int, device: torch.device) -> torch.Tensor:
    """(B,) int64 keys ``base + row`` with the base drawn as a tensor, without a host sync (CUDA
    generators, graph capture, torch.compile tracing: there a host integer would be frozen into
    the graph). With a CPU generator the keys equal those of :func:`draw_base_key`; without one,
    CUDA tensors draw from the device's default generator (graph-safe: a fresh key per replay)."""
    gen_device = generator.device if generator is not None else device
    base = torch.randint(0, KEY_BOUND, (1,), generator=generator, device=gen_device, dtype=torch.int64)
    return base.to(device, non_blocking=True) + torch.arange(batch, dtype=torch.int64, device=device)


def draw_keys(seeds: torch.Tensor | None, generator: torch.Generator | None, batch: int, device: torch.device) -> tuple[torch.Tensor | None, int]:
    """The randomness of one call, for every entry point: ``(seeds, base_key)``.

    Row b is keyed ``seeds[b]`` when ``seeds`` is given (base_key is then 0), else ``base_key + b``
    with one base drawn per call from ``generator`` (a host integer, handed to a kernel as a
    scalar). Where a host integer would be frozen into a compiled graph or a CUDA graph, or reading
    a CUDA generator's draw would sync, the keys are drawn on the device instead (returned as seeds).
    """
    if seeds is not None:
        return seeds, 0
    if torch.compiler.is_compiling():
        return draw_row_keys(generator, batch, device), 0
    return draw_keys_eager(None, generator, batch, device)


def draw_keys_eager(seeds: torch.Tensor | None, generator: torch.Generator | None, batch: int, device: torch.device) -> tuple[torch.Tensor | None, int]:
    """:func:`draw_keys` for a caller that knows it is not being traced by torch.compile."""
    if seeds is not None:
        return seeds, 0
    if (generator is not None and generator.device.type != "cpu") or (device != _CPU and device.type == "cuda" and torch.cuda.is_current_stream_capturing()):
        return draw_row_keys(generator, batch, device), 0  # (device.type builds a string: CPU first)
    return None, draw_base_key(generator)


def key_per_row(seeds: torch.Tensor | None, base_key: int, batch: int, device: torch.device) -> torch.Tensor:
    """(B,) int64 key of every row as a tensor (for the eager reference): ``seeds``, else ``base_key + row``."""
    if seeds is not None:
        return seeds.to(torch.int64)
    return base_key + torch.arange(batch, dtype=torch.int64, device=device)


def _mul_hi_lo(a: torch.Tensor, b: int) -> tuple[torch.Tensor, torch.Tensor]:
    """High and low 32-bit words of a * b for uint32 values held in int64, without overflow."""
    a_hi = a >> 16
    a_lo = a & 0xFFFF
    hi_part = a_hi * b  # < 2**48
    lo_part = a_lo * b  # < 2**48
    hi = (hi_part + (lo_part >> 16)) >> 16
    lo = (((hi_part & 0xFFFF) << 16) + lo_part) & _MASK32
    return hi, lo


def philox4(key: torch.Tensor, c0, c1, c2, c3) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The four output words of Philox4x32-10 (uint32 values held in int64 tensors).

    ``key`` and the counter words are broadcastable int64 tensors (or ints); key words are
    ``key mod 2**32`` and ``(key >> 32) mod 2**32``.
    """
    key = torch.as_tensor(key, dtype=torch.int64)
    device = key.device
    k0 = key & _MASK32
    k1 = (key >> 32) & _MASK32
    k0, k1, c0, c1, c2, c3 = torch.broadcast_tensors(k0, k1, *(torch.as_tensor(c, dtype=torch.int64, device=device) & _MASK32 for c in (c0, c1, c2, c3)))
    for _ in range(PHILOX_ROUNDS):
        hi_b, lo_b = _mul_hi_lo(c2, PHILOX_ROUND_B)
        hi_a, lo_a = _mul_hi_lo(c0, PHILOX_ROUND_A)
        c0, c1, c2, c3 = hi_b ^ c1 ^ k0, lo_b, hi_a ^ c3 ^ k1, lo_a
        k0 = (k0 + PHILOX_KEY_A) & _MASK32
        k1 = (k1 + PHILOX_KEY_B) & _MASK32
    return c0, c1, c2, c3


def philox(key: torch.Tensor, c0, c1, c2, c3) -> torch.Tensor:
    """Word 0 of Philox4x32-10 (see :func:`philox4`)."""
    return philox4(key, c0, c1, c2, c3)[0]


def uint32_to_open_uniform(x: torch.Tensor) -> torch.Tensor:
    """Map uint32 values (in int64) to float32 uniforms in (0, 1), exactly as the kernels do."""
    return ((x >> 9).to(torch.float32) + 0.5) * (2.0**-23)


def _position_words(position: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return position & _MASK32, position >> 32


def coin_uniforms(keys: torch.Tensor, positions: torch.Tensor, rank=0) -> torch.Tensor:
    """Acceptance coins: counter (rank, p_lo, p_hi, ACCEPT_STREAM), word 0.

    ``keys`` (B,) and ``positions`` (B, ...) absolute positions; ``rank`` the sibling rank (0 for
    a chain; broadcastable to ``positions``).
    """
    p_lo, p_hi = _position_words(positions)
    key = keys.reshape(keys.shape + (1,) * (positions.dim() - 1))
    return uint32_to_open_uniform(philox(key, rank, p_lo, p_hi, ACCEPT_STREAM))


def race_uniforms(keys: torch.Tensor, positions: torch.Tensor, vocab: int, stream: int) -> torch.Tensor:
    """(B, V) race uniforms of ids 0..V-1 at one absolute position per row: id v takes word v & 3
    of counter (v >> 2, p_lo, p_hi, stream). ``keys`` and ``positions`` are (B,)."""
    groups = (vocab + 3) // 4
    p_lo, p_hi = _position_words(positions[:, None])
    ids = torch.arange(groups, dtype=torch.int64, device=keys.device)[None, :]
    words = torch.stack(philox4(keys[:, None], ids, p_lo, p_hi, stream), dim=2)  # (B, groups, 4): id 4g + w
    return uint32_to_open_uniform(words.reshape(keys.shape[0], groups * 4)[:, :vocab])
