"""End-to-end measurements shared by ``specdec demo`` and ``bench/e2e.py``.

Every function runs one way of decoding the same prompts and returns a :class:`Run`, so the
callers can put target-only decoding, transformers' assisted generation (with and without the
fused hook) and :func:`specdec_ext.generate` side by side from one process.
"""

from __future__ import annotations

import contextlib
import inspect
import time
from dataclasses import dataclass, field

import torch

from . import hf
from .api import verify
from .generate import expected_speedup, generate, new_cache


@dataclass
class Run:
    """One decoding method on one batch: new tokens (up to EOS) and wall time."""

    method: str
    batch: int
    new_tokens: int
    seconds: float
    details: dict = field(default_factory=dict)

    @property
    def tokens_per_second(self) -> float:
        return self.new_tokens / self.seconds if self.seconds > 0 else float("nan")


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def count_new_tokens(sequences: torch.Tensor, prompt_width: int, eos_ids: list[int]) -> int:
    """New tokens per row up to and including the first EOS, summed over rows."""
    new = sequences[:, prompt_width:]
    if not eos_ids or new.numel() == 0:
        return new.numel()
    is_eos = torch.isin(new, torch.tensor(eos_ids, device=new.device))
    seen = is_eos.long().cumsum(1)
    keep = (seen == 0) | (is_eos & (seen == 1))
    return int(keep.sum())


def _hf_sampling(sampling: dict) -> dict:
    """transformers' generate() keywords for our sampling dict (explicit: its default top_k is 50)."""
    if sampling.get("temperature", 1.0) == 0:
        return {"do_sample": False}
    return {
        "do_sample": True,
        "temperature": sampling.get("temperature", 1.0),
        "top_k": sampling.get("top_k") or 0,
        "top_p": sampling.get("top_p") or 1.0,
    }


def target_only(target, input_ids, attention_mask, *, max_new_tokens, sampling, eos_ids, pad_id, seed=0) -> Run:
    """Plain ``target.generate``: the baseline every speed-up is measured against."""
    torch.manual_seed(seed)
    _sync(target.device)
    start = time.perf_counter()
    with torch.no_grad():
        out = target.generate(input_ids, attention_mask=attention_mask, max_new_tokens=max_new_tokens, pad_token_id=pad_id, **_hf_sampling(sampling))
    _sync(target.device)
    seconds = time.perf_counter() - start
    return Run("target only", input_ids.shape[0], count_new_tokens(out, input_ids.shape[1], eos_ids), seconds)


def assisted(target, draft, input_ids, attention_mask, *, max_new_tokens, sampling, num_draft_tokens, eos_ids, pad_id, hooked, seed=0) -> Run:
    """transformers' assisted generation (batch 1 only), with eager or fused verification."""
    torch.manual_seed(seed)
    context = hf.fused_verification() if hooked else contextlib.nullcontext()
    _sync(target.device)
    start = time.perf_counter()
    with context, torch.no_grad():
        out = target.generate(
            input_ids, attention_mask=attention_mask, assistant_model=draft, max_new_tokens=max_new_tokens, pad_token_id=pad_id,
            num_assistant_tokens=num_draft_tokens, num_assistant_tokens_schedule="constant", assistant_confidence_threshold=0.0,
            **_hf_sampling(sampling),
        )
    _sync(target.device)
    seconds = time.perf_counter() - start
    name = "assisted + fused hook" if hooked else "assisted (transformers)"
    return Run(name, input_ids.shape[0], count_new_tokens(out, input_ids.shape[1], eos_ids), seconds)


def speculative(target, draft, input_ids, attention_mask, *, max_new_tokens, sampling, num_draft_tokens, eos_ids, pad_id, seed=0) -> Run:
    """:func:`specdec_ext.generate`, any batch size."""
    generator = torch.Generator(device=target.device).manual_seed(seed)
    temperature = sampling.get("temperature", 1.0)
    _sync(target.device)
    start = time.perf_counter()
    out = generate(
        target, draft, input_ids, attention_mask, max_new_tokens=max_new_tokens, do_sample=temperature > 0,
        temperature=temperature if temperature > 0 else 1.0, top_k=sampling.get("top_k"), top_p=sampling.get("top_p"),
        num_draft_tokens=num_draft_tokens, generator=generator, eos_token_id=eos_ids or None, pad_token_id=pad_id,
    )
    _sync(target.device)
    seconds = time.perf_counter() - start
    run = Run(f"specdec_ext.generate (B={input_ids.shape[0]})", input_ids.shape[0], count_new_tokens(out.sequences, input_ids.shape[1], eos_ids), seconds)
    run.details = {"stats": out.stats, "sequences": out.sequences}
    return run


def _median_seconds(fn, repeats: int, device: torch.device) -> float:
    fn()  # warm-up (kernel compilation, allocator)
    times = []
    for _ in range(repeats):
        _sync(device)
        start = time.perf_counter()
        fn()
        _sync(device)
        times.append(time.perf_counter() - start)
    return sorted(times)[len(times) // 2]


def verification_latency(vocab: int, num_draft_tokens: int, *, device="cpu", repeats: int = 30, seed: int = 0) -> dict[str, float]:
    """Median seconds of one batch-1 verification of K drafts: transformers' eager function against
    ``specdec_ext.verify`` (default backend) on the same, already processed, float32 logits."""
    from transformers.generation import utils as generation_utils

    device = torch.device(device)
    g = torch.Generator().manual_seed(seed)
    k = num_draft_tokens
    target_logits = torch.randn(1, k + 1, vocab, generator=g).to(device)
    draft_logits = (target_logits[:, :k] + 0.5 * torch.randn(1, k, vocab, generator=g).to(device)).contiguous()
    drafts = torch.multinomial(draft_logits[0].softmax(-1), 1).reshape(1, k)
    candidate_ids = torch.cat([torch.zeros(1, 4, dtype=torch.long, device=device), drafts], dim=1)
    original = hf._original or generation_utils._speculative_sampling  # never time our own hook
    eager = _median_seconds(lambda: original(candidate_ids, draft_logits, k, target_logits), repeats, device)
    fused = _median_seconds(lambda: verify(target_logits, draft_logits, drafts), repeats, device)
    return {"transformers": eager, "fused": fused}


def forward_cost_ratio(target, draft, input_ids, *, repeats: int = 10) -> float:
    """c of Leviathan et al.: one cached single-token forward of the draft over one of the target."""

    def step_seconds(model) -> float:
        # Newer transformers name the cache argument `cache` (`past_key_values` is deprecated there).
        cache_argument = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
        cache = new_cache(model)
        with torch.no_grad():
            model(input_ids, use_cache=True, **{cache_argument: cache})
            token = input_ids[:, -1:]

            def one():
                model(token, use_cache=True, **{cache_argument: cache})
                cache.crop(-1)  # drop the token again (a negative count works on every transformers 5.x)

            return _median_seconds(one, repeats, target.device)

    return step_seconds(draft) / step_seconds(target)


def predicted_speedup(acceptance: float, cost_ratio: float, num_draft_tokens: int) -> float:
    return expected_speedup(acceptance, cost_ratio, num_draft_tokens)
