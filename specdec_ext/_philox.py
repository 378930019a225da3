"""The random stream shared by every backend.

Every random number used by :func:`specdec_ext.verify` and :func:`specdec_ext.sample` comes from
Philox4x32-10, exactly as ``triton.language.philox`` computes it, so the eager reference, the C++
kernel and the Triton kernels draw the same numbers for the same seed.

* Key: one 64-bit seed per call, drawn from the caller's ``torch.Generator`` (:func:`draw_seed`);
  ``k0`` is its low word and ``k1`` its high word.
* Counter ``(c0, c1, c2, c3) = (vocabulary index, draft position, batch row, stream)``.
  Stream :data:`ACCEPT_STREAM` (``c0 = 0``) gives the acceptance coin of each draft position;
  stream :data:`SAMPLE_STREAM` gives one exponential per vocabulary entry for the residual or bonus
  draw. Distinct counters never collide, so acceptance and sampling noise are independent.
* Only output word 0 is used. It becomes a uniform in the *open* interval (0, 1):
  ``u = ((x >> 9) + 0.5) * 2**-23`` (exact in float32; never 0, so a token with p = 0 is never
  accepted and ``-log(u)`` is finite).
"""

from __future__ import annotations

import torch

ACCEPT_STREAM = 0
SAMPLE_STREAM = 1

PHILOX_KEY_A = 0x9E3779B9
PHILOX_KEY_B = 0xBB67AE85
PHILOX_ROUND_A = 0xD2511F53
PHILOX_ROUND_B = 0xCD9E8D57
PHILOX_ROUNDS = 10

_MASK32 = 0xFFFFFFFF
# The largest seed drawn: keeps the key a non-negative int64 on every backend.
_SEED_BOUND = 2**62


def draw_seed(generator: torch.Generator | None, device: torch.device) -> torch.Tensor:
    """Draw the per-call Philox key as a (1,) int64 tensor on ``device``, without a host sync."""
    gen_device = generator.device if generator is not None else device
    seed = torch.randint(0, _SEED_BOUND, (1,), generator=generator, device=gen_device, dtype=torch.int64)
    return seed if gen_device == device else seed.to(device, non_blocking=True)


def _mul_hi_lo(a: torch.Tensor, b: int) -> tuple[torch.Tensor, torch.Tensor]:
    """High and low 32-bit words of a * b for uint32 values held in int64, without overflow."""
    a_hi = a >> 16
    a_lo = a & 0xFFFF
    hi_part = a_hi * b  # < 2**48
    lo_part = a_lo * b  # < 2**48
    hi = (hi_part + (lo_part >> 16)) >> 16
    lo = (((hi_part & 0xFFFF) << 16) + lo_part) & _MASK32
    return hi, lo


def philox(seed: torch.Tensor, c0, c1, c2, c3) -> torch.Tensor:
    """Word 0 of Philox4x32-10 for counters ``(c0, c1, c2, c3)`` (broadcastable int64 tensors).

    ``seed`` is a (1,) or scalar int64 tensor. Returns uint32 values held in an int64 tensor.
    """
    seed = seed.reshape(())
    k0 = seed & _MASK32
    k1 = (seed >> 32) & _MASK32
    c0, c1, c2, c3 = torch.broadcast_tensors(*(torch.as_tensor(c, dtype=torch.int64, device=seed.device) for c in (c0, c1, c2, c3)))
    for _ in range(PHILOX_ROUNDS):
        hi_b, lo_b = _mul_hi_lo(c2, PHILOX_ROUND_B)
        hi_a, lo_a = _mul_hi_lo(c0, PHILOX_ROUND_A)
        c0, c1, c2, c3 = hi_b ^ c1 ^ k0, lo_b, hi_a ^ c3 ^ k1, lo_a
        k0 = (k0 + PHILOX_KEY_A) & _MASK32
        k1 = (k1 + PHILOX_KEY_B) & _MASK32
    return c0


def uint32_to_open_uniform(x: torch.Tensor) -> torch.Tensor:
    """Map uint32 values (in int64) to float32 uniforms in (0, 1), exactly as the kernels do."""
    return ((x >> 9).to(torch.float32) + 0.5) * (2.0**-23)


def uniforms(seed: torch.Tensor, vocab_index, position, row, stream: int) -> torch.Tensor:
    """Open-interval float32 uniforms for the given counters (see the module docstring)."""
    return uint32_to_open_uniform(philox(seed, vocab_index, position, row, stream))
