"""End-to-end measurements shared by ``specdec demo`` and ``bench/e2e.py``.

Every function runs one way of decoding the same prompts and returns a :class:`Run`, so the
callers can put target-only decoding, transformers' assisted generation (with and without the
fused hook) and :func:`specdec_ext.generate` side by side from one process.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import time
from dataclasses import dataclass, field

import torch

from . import hf
from .api import verify
from .generate import generate
from .generation.adaptive import expected_speedup
from .generation.cache import new_cache


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


@contextlib.contextmanager
def _counting_forwards(model):
    """Counts the model's forward calls (a forward hook: no measurable cost)."""
    calls = []
    handle = model.register_forward_hook(lambda module, args, output: calls.append(1))
    try:
        yield calls
    finally:
        handle.remove()


@contextlib.contextmanager
def _counting_verifications():
    """Counts accepted / judged drafts of transformers' own sampled verification (wraps its module global)."""
    from transformers.generation import utils

    tally = {"accepted": 0, "judged": 0}
    inner = utils._speculative_sampling

    @functools.wraps(inner)
    def counted(candidate_input_ids, candidate_logits, candidate_length, new_logits, *args, **kwargs):
        tokens, n_matches = inner(candidate_input_ids, candidate_logits, candidate_length, new_logits, *args, **kwargs)
        n, length = int(n_matches), int(candidate_length)
        tally["accepted"] += n
        tally["judged"] += n + (1 if n < length else 0)
        return tokens, n_matches

    utils._speculative_sampling = counted
    try:
        yield tally
    finally:
        utils._speculative_sampling = inner


def target_only(target, input_ids, attention_mask, *, max_new_tokens, sampling, eos_ids, pad_id, seed=0, extra=None) -> Run:
    """Plain ``target.generate``: the baseline every speed-up is measured against. ``extra``: more
    generate() keywords (processors such as repetition_penalty / min_p, stop_strings + tokenizer)."""
    torch.manual_seed(seed)
    _sync(target.device)
    with _counting_forwards(target) as forwards, torch.no_grad():
        start = time.perf_counter()
        out = target.generate(input_ids, attention_mask=attention_mask, max_new_tokens=max_new_tokens, pad_token_id=pad_id,
                              **_hf_sampling(sampling), **(extra or {}))
        _sync(target.device)
        seconds = time.perf_counter() - start
    new = count_new_tokens(out, input_ids.shape[1], eos_ids)
    run = Run("target only", input_ids.shape[0], new, seconds)
    run.details = {"target_forwards": len(forwards), "tokens_per_target_forward": new / input_ids.shape[0] / max(len(forwards), 1)}
    return run


ASSISTED_MODES = {
    "transformers": "assisted (transformers)",
    "verification": "assisted + fused verification",
    "loop": "generate(assistant_model) + hook",
}


@contextlib.contextmanager
def _assistant_settings(draft, **settings):
    """Set fields of the draft's generation config for a call, then restore them."""
    config = draft.generation_config
    saved = {name: getattr(config, name, None) for name in settings}
    for name, value in settings.items():
        setattr(config, name, value)
    try:
        yield
    finally:
        for name, value in saved.items():
            setattr(config, name, value)


def assisted(target, draft, input_ids, attention_mask, *, max_new_tokens, sampling, num_draft_tokens, eos_ids, pad_id, hooked=False,
             seed=0, mode=None, extra=None, lookup_ngram: int | None = None) -> Run:
    """``target.generate(..., assistant_model=draft)``. mode: "transformers" (its own loop, batch 1),
    "verification" (its loop, fused verification) or "loop" (the hook's batched loop, any batch).
    ``num_draft_tokens``: a fixed K for both loops (no confidence threshold), or None for the default
    call (transformers' assistant defaults: 20 drafts cut by its confidence threshold; the hook then
    picks K adaptively);
    ``hooked=True`` is "verification" (older callers). ``draft=None`` with ``lookup_ngram``: prompt
    lookup (``prompt_lookup_num_tokens=num_draft_tokens``) instead of a draft model."""
    mode = mode or ("verification" if hooked else "transformers")
    if mode not in ASSISTED_MODES:
        raise ValueError(f"mode must be one of {list(ASSISTED_MODES)}, got {mode!r}")
    torch.manual_seed(seed)
    context = hf.fused_verification(loop=mode == "loop", num_draft_tokens=num_draft_tokens) if mode != "transformers" else contextlib.nullcontext()
    _sync(target.device)
    if draft is None:
        source = {"prompt_lookup_num_tokens": num_draft_tokens, "max_matching_ngram_size": lookup_ngram or 2}
        fixed_k = contextlib.nullcontext()
    else:
        source = {"assistant_model": draft}
        # transformers reads K from the ASSISTANT's generation config (generate() keywords such as
        # num_assistant_tokens do not reach it); None keeps its defaults, the call users write.
        fixed_k = contextlib.nullcontext() if num_draft_tokens is None else _assistant_settings(
            draft, num_assistant_tokens=num_draft_tokens, num_assistant_tokens_schedule="constant", assistant_confidence_threshold=0.0)
    with context, fixed_k, _counting_forwards(target) as forwards, _counting_verifications() as tally, torch.no_grad():
        start = time.perf_counter()
        out = target.generate(input_ids, attention_mask=attention_mask, max_new_tokens=max_new_tokens, pad_token_id=pad_id,
                              **source, **_hf_sampling(sampling), **(extra or {}))
        _sync(target.device)
        seconds = time.perf_counter() - start
    new = count_new_tokens(out, input_ids.shape[1], eos_ids)
    run = Run(ASSISTED_MODES[mode] if draft is not None else f"prompt lookup ({ASSISTED_MODES[mode]})", input_ids.shape[0], new, seconds)
    if mode == "loop":
        stats = hf.last_stats()
        run.details = {"stats": stats, "target_forwards": stats.target_forwards, "tokens_per_target_forward": stats.tokens_per_target_forward,
                       "acceptance": stats.mean_acceptance}
    else:
        steps = max(len(forwards) - 0, 1)  # assisted generation scores its first candidates with the prompt: every forward is a step
        run.details = {"target_forwards": len(forwards), "tokens_per_target_forward": new / input_ids.shape[0] / steps,
                       "acceptance": tally["accepted"] / tally["judged"] if tally["judged"] else float("nan")}
    return run


def speculative(target, draft, input_ids, attention_mask, *, max_new_tokens, sampling, num_draft_tokens, eos_ids, pad_id, seed=0,
                extra=None) -> Run:
    """:func:`specdec_ext.generate`, any batch size."""
    generator = torch.Generator(device=target.device).manual_seed(seed)
    temperature = sampling.get("temperature", 1.0)
    _sync(target.device)
    start = time.perf_counter()
    out = generate(
        target, draft, input_ids, attention_mask, max_new_tokens=max_new_tokens, do_sample=temperature > 0,
        temperature=temperature if temperature > 0 else 1.0, top_k=sampling.get("top_k"), top_p=sampling.get("top_p"),
        num_draft_tokens=num_draft_tokens, generator=generator, eos_token_id=eos_ids or None, pad_token_id=pad_id, **(extra or {}),
    )
    _sync(target.device)
    seconds = time.perf_counter() - start
    run = Run(f"specdec_ext.generate (B={input_ids.shape[0]})", input_ids.shape[0], count_new_tokens(out.sequences, input_ids.shape[1], eos_ids), seconds)
    run.details = {"stats": out.stats, "sequences": out.sequences, "target_forwards": out.stats.target_forwards,
                   "tokens_per_target_forward": out.stats.tokens_per_target_forward, "acceptance": out.stats.mean_acceptance}
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
    # transformers 5.17 takes is_done_candidate (no candidate ended a sequence here); later versions do not.
    ended = {"is_done_candidate": False} if "is_done_candidate" in inspect.signature(original).parameters else {}
    eager = _median_seconds(lambda: original(candidate_ids, draft_logits, k, target_logits, **ended), repeats, device)
    fused = _median_seconds(lambda: verify(target_logits, draft_logits, drafts), repeats, device)
    return {"transformers": eager, "fused": fused}


def forward_seconds(model, input_ids, *, width: int = 1, repeats: int = 10) -> float:
    """Median seconds of one cached forward of ``width`` new tokens after ``input_ids`` (plain DynamicCache,
    no attention mask: the cheapest way to run the model, as target-only decoding does)."""
    # Newer transformers name the cache argument `cache` (`past_key_values` is deprecated there).
    cache_argument = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
    cache = new_cache(model)
    with torch.no_grad():
        model(input_ids, use_cache=True, **{cache_argument: cache})
        tokens = input_ids[:, -1:].repeat(1, width)

        def one():
            model(tokens, use_cache=True, **{cache_argument: cache})
            cache.crop(-width)  # drop the tokens again (a negative count works on every transformers 5.x)

        return _median_seconds(one, repeats, model.device)


def forward_cost_ratio(target, draft, input_ids, *, repeats: int = 10) -> float:
    """c of Leviathan et al.: one cached single-token forward of the draft over one of the target."""
    return forward_seconds(draft, input_ids, repeats=repeats) / forward_seconds(target, input_ids, repeats=repeats)


def predicted_speedup(acceptance: float, cost_ratio: float, num_draft_tokens: int) -> float:
    return expected_speedup(acceptance, cost_ratio, num_draft_tokens)


@contextlib.contextmanager
def _timed(owner, name: str, bucket: dict, key):
    """Adds the wall time of every call of ``owner.name`` to ``bucket[key(args)]`` while active."""
    inner = getattr(owner, name)

    @functools.wraps(inner)
    def timed(*args, **kwargs):
        start = time.perf_counter()
        try:
            return inner(*args, **kwargs)
        finally:
            label = key(args)
            bucket[label] = bucket.get(label, 0.0) + time.perf_counter() - start

    setattr(owner, name, timed)
    try:
        yield
    finally:
        setattr(owner, name, inner)


def step_breakdown(target, draft, input_ids, attention_mask, *, max_new_tokens: int, num_draft_tokens: int, sampling: dict,
                   extra: dict | None = None, repeats: int = 3, seed: int = 0, method: str = "token") -> dict:
    """Where a speculative step's time goes, against what Leviathan et al.'s prediction assumes.

    Runs :func:`specdec_ext.generate` (a chain of ``num_draft_tokens``, verified by ``method``: "token"
    or "block") with each phase timed (wall clock; CPU, so there are no asynchronous kernels to wait
    for) and measures the model forwards the prediction is built on: K single-token draft forwards
    plus one single-token target forward per step. Returns milliseconds per step: each phase as run,
    the same forwards run plainly, and the gaps between them.
    """
    from .generation import chain_steps, draws, loop
    from .generation.cache import ModelCache

    k = num_draft_tokens
    plain_target_1 = forward_seconds(target, input_ids, width=1, repeats=20)
    plain_target_block = forward_seconds(target, input_ids, width=k + 1, repeats=20)
    plain_draft_1 = forward_seconds(draft, input_ids, width=1, repeats=20)
    verify_label = "verify (+ processors, EOS, write)"
    best = None
    for _ in range(repeats):
        bucket: dict = {}
        generator = torch.Generator().manual_seed(seed)
        state = {"in_step": False}

        def which(args, state=state):
            if not state["in_step"]:
                return "prefill"
            return "draft forwards" if args[0].model is draft else "target forward"

        inner_step = loop._step

        def step(*args, state=state, inner=inner_step):
            state["in_step"] = True
            try:
                return inner(*args)
            finally:
                state["in_step"] = False

        with contextlib.ExitStack() as stack:
            stack.enter_context(_timed(ModelCache, "forward", bucket, which))
            stack.enter_context(_timed(draws, "draw_draft", bucket, lambda args: "draft sampling"))
            stack.enter_context(_timed(chain_steps.ChainSteps, "verify", bucket, lambda args: verify_label))
            stack.enter_context(_timed(loop, "_write", bucket, lambda args: verify_label))
            stack.enter_context(_timed(loop, "_commit", bucket, lambda args: "cache bookkeeping (settle, crop, rows)"))
            loop._step = step
            stack.callback(setattr, loop, "_step", inner_step)
            stack.enter_context(_timed(loop, "_step", bucket, lambda args: "step total"))
            temperature = sampling.get("temperature", 1.0)
            out = generate(target, draft, input_ids, attention_mask, max_new_tokens=max_new_tokens, do_sample=temperature > 0,
                           temperature=temperature if temperature > 0 else 1.0, num_draft_tokens=k, method=method, generator=generator,
                           eos_token_id=[], **(extra or {}))
        steps = len(out.stats.draft_lengths)
        if best is None or bucket["step total"] < best[0]["step total"]:
            best = (bucket, steps, out.stats)
    bucket, steps, stats = best
    per_step = {name: 1000 * seconds / steps for name, seconds in bucket.items() if name != "prefill"}
    inside = sum(v for name, v in per_step.items() if name != "step total")
    per_step["loop Python (sync, tallies, stops)"] = per_step["step total"] - inside
    predicted_step = 1000 * (k * plain_draft_1 + plain_target_1)
    expected_tokens = expected_speedup(stats.mean_acceptance, 0.0, k)  # (1 - a^(K+1)) / (1 - a): tokens per step the formula counts
    return {
        "method": method, "num_draft_tokens": k, "steps": steps, "tokens_per_step": stats.tokens_per_target_forward,
        "acceptance": stats.mean_acceptance, "ms_per_step": per_step,
        "plain_forwards_ms": {"target, 1 token": 1000 * plain_target_1, f"target, {k + 1} tokens": 1000 * plain_target_block,
                              "draft, 1 token": 1000 * plain_draft_1},
        "predicted_step_ms": predicted_step,
        "expected_tokens_per_step": expected_tokens,
        # The formula with the measured cost of the (K+1)-token target forward instead of one token's.
        "predicted_speedup_plain_forwards": expected_tokens / (k * plain_draft_1 / plain_target_1 + 1),
        "predicted_speedup_with_block_cost": expected_tokens / ((k * plain_draft_1 + plain_target_block) / plain_target_1),
        "loop_speedup_over_plain_decoding": stats.tokens_per_target_forward * 1000 * plain_target_1 / per_step["step total"],
        "gaps_ms_per_step": {
            f"target block of {k + 1} tokens over 1 token": 1000 * (plain_target_block - plain_target_1),
            "target forward as run over plain": per_step.get("target forward", 0.0) - 1000 * plain_target_block,
            "draft forwards as run over plain": per_step.get("draft forwards", 0.0) - 1000 * k * plain_draft_1,
            "draft sampling": per_step.get("draft sampling", 0.0),
            verify_label: per_step.get(verify_label, 0.0),
            "cache bookkeeping": per_step.get("cache bookkeeping (settle, crop, rows)", 0.0),
            "loop Python": per_step["loop Python (sync, tallies, stops)"],
        },
    }
