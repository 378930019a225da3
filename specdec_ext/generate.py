"""Batched speculative generation with any pair of transformers causal LMs sharing a vocabulary.

:func:`generate` checks its arguments, turns the sampling and processing arguments into
transformers' processors (in the order its ``generate`` builds them) and runs the loop of
:mod:`specdec_ext.generation`: a chain of drafts per step (token-wise or block verification) or a draft
tree, with the logits processors on both models' lines, stopping rules that end a row at the exact
token that ends it, and KV caches that never serve a rejected token's entries.
"""

from __future__ import annotations

import math

import torch

from ._params import BACKENDS
from .generation.inputs import check_inputs, check_models, check_sampling, check_seeds, eos_ids, pad_value
from .generation.loop import speculate
from .generation.output import SpeculativeOutput
from .generation.stats import SpeculativeStats
from .processors import LogitsPipeline, PresencePenaltyLogitsProcessor
from .stopping import Stopping

__all__ = ["SpeculativeOutput", "SpeculativeStats", "generate", "processor_list"]


def _named_processors(*, do_sample: bool, temperature: float, top_k: int | None, top_p: float | None, min_p: float | None = None,
                      repetition_penalty: float | None = None, presence_penalty: float | None = None, frequency_penalty: float | None = None,
                      no_repeat_ngram_size: int | None = None, bad_words_ids=None, sequence_bias=None, suppress_tokens=None,
                      min_new_tokens: int | None = None, eos: torch.Tensor | None = None, prompt_width: int = 0,
                      prompt_padding: torch.Tensor | None = None, logits_processor=None) -> list[tuple[str, object]]:
    """(argument, processor) for every processor these arguments make, in the order transformers' generate() builds them."""
    from transformers.generation import logits_process as lp

    processors = []
    if sequence_bias is not None:
        processors.append(("sequence_bias", lp.SequenceBiasLogitsProcessor(sequence_bias=sequence_bias)))
    if repetition_penalty is not None and repetition_penalty != 1.0:
        if isinstance(repetition_penalty, bool) or not isinstance(repetition_penalty, (int, float)) or not repetition_penalty > 0 \
                or not math.isfinite(repetition_penalty):
            raise ValueError(f"repetition_penalty must be a finite number > 0, got {repetition_penalty!r}")
        processor = lp.RepetitionPenaltyLogitsProcessor(float(repetition_penalty))
        # Prompt padding is not context (transformers >= 5.24 ignores it the same way).
        processor.prompt_ignore_length = prompt_padding
        processors.append(("repetition_penalty", processor))
    if presence_penalty or frequency_penalty:
        name = "presence_penalty" if presence_penalty else "frequency_penalty"
        processors.append((name, PresencePenaltyLogitsProcessor(presence_penalty or 0.0, frequency_penalty or 0.0, prompt_length=prompt_width)))
    if no_repeat_ngram_size:
        processors.append(("no_repeat_ngram_size", lp.NoRepeatNGramLogitsProcessor(no_repeat_ngram_size)))
    if bad_words_ids is not None:
        processors.append(("bad_words_ids", lp.NoBadWordsLogitsProcessor(bad_words_ids, eos)))
    if min_new_tokens and eos is not None:
        if isinstance(min_new_tokens, bool) or not isinstance(min_new_tokens, int) or min_new_tokens < 0:
            raise ValueError(f"min_new_tokens must be an integer >= 0, got {min_new_tokens!r}")
        processors.append(("min_new_tokens", lp.MinNewTokensLengthLogitsProcessor(prompt_width, min_new_tokens, eos)))
    if suppress_tokens is not None:
        processors.append(("suppress_tokens", lp.SuppressTokensLogitsProcessor(suppress_tokens)))
    processors += [("logits_processor", processor) for processor in logits_processor or []]
    if do_sample:
        if temperature != 1.0:
            processors.append(("temperature", lp.TemperatureLogitsWarper(temperature)))
        if top_k:
            processors.append(("top_k", lp.TopKLogitsWarper(top_k)))
        if top_p is not None and top_p < 1.0:
            processors.append(("top_p", lp.TopPLogitsWarper(top_p)))
        if min_p is not None:
            if isinstance(min_p, bool) or not isinstance(min_p, (int, float)) or not 0 <= min_p <= 1:
                raise ValueError(f"min_p must be a number in [0, 1], got {min_p!r}")
            processors.append(("min_p", lp.MinPLogitsWarper(float(min_p))))
    return processors


def processor_list(**arguments) -> list:
    """transformers' processor objects for these arguments (those of :func:`generate`), in the order its generate() builds them."""
    return [processor for _, processor in _named_processors(**arguments)]


def generate(
    target_model,
    draft_model,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor | None = None,
    *,
    max_new_tokens: int,
    do_sample: bool = True,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    min_p: float | None = None,
    repetition_penalty: float | None = None,
    presence_penalty: float | None = None,
    frequency_penalty: float | None = None,
    no_repeat_ngram_size: int | None = None,
    bad_words_ids: list[list[int]] | None = None,
    sequence_bias: list | dict | None = None,
    suppress_tokens: list[int] | None = None,
    min_new_tokens: int | None = None,
    logits_processor=None,
    stopping_criteria=None,
    stop_strings: str | list[str] | None = None,
    tokenizer=None,
    max_time: float | None = None,
    streamer=None,
    output_scores: bool = False,
    output_logits: bool = False,
    num_draft_tokens: int | str | None = None,
    draft: str = "model",
    ngram: int = 3,
    generator: torch.Generator | None = None,
    seeds: torch.Tensor | list[int] | None = None,
    eos_token_id: int | list[int] | None = None,
    pad_token_id: int | None = None,
    backend: str = "auto",
    tree=None,
    method: str = "token",
    siblings: str | None = None,
) -> SpeculativeOutput:
    """Speculative generation for a batch of left-padded prompts; exactly the target's sampling law.

    Each step the draft proposes a chain of K tokens (or a tree), the target scores them in one
    forward and verification keeps an accepted prefix (path) plus one corrected or bonus token.

    Args:
        target_model, draft_model: transformers causal LMs sharing a vocabulary: the draft's may be
            smaller (a target padded with extra ids), never larger (ValueError). ``draft_model`` may
            be None with ``draft="prompt_lookup"``.
        input_ids: (B, L_in) prompts, left-padded. attention_mask: (B, L_in), 0 on padding; None = all ones.
        max_new_tokens: new tokens per row.
        do_sample: False = greedy (the argmax of the processed scores; warpers ignored).
        temperature, top_k, top_p, min_p: transformers' warpers, in its order (temperature, top-k,
            top-p, min-p; None = off). With ``do_sample=True`` the temperature must be > 0:
            ``temperature=0.0`` raises transformers' own warper error (ValueError), as transformers'
            ``generate`` does; greedy decoding is ``do_sample=False``. (``specdec_ext.verify`` and
            ``sample`` take temperature 0 as greedy: that rule is theirs, not this function's.)
        repetition_penalty: transformers' ``RepetitionPenaltyLogitsProcessor`` over each row's
            context (prompt padding excluded). presence_penalty / frequency_penalty: additive
            penalties on generated tokens (:class:`specdec_ext.processors.PresencePenaltyLogitsProcessor`).
        no_repeat_ngram_size, bad_words_ids, sequence_bias, suppress_tokens, min_new_tokens: as in
            transformers' ``generate``.
        logits_processor: more ``LogitsProcessor`` objects, applied after the ones above and before
            the warpers (where transformers puts a user's list), to both models' logits at every
            position with that position's input_ids.
        stopping_criteria, stop_strings (needs ``tokenizer``), max_time: end rows as transformers
            does; a row ends at the exact token that ends it, and nothing after it is emitted.
        streamer: a transformers streamer (batch size 1); it receives the tokens of each step as
            they are accepted.
        output_scores, output_logits: also return the processed scores / raw logits of every new token.
        num_draft_tokens: drafts per step K of a chain (default 4), or "auto": each step takes the K in
            [1, 8] that maximises Leviathan et al.'s expected speedup (1 - a^(K+1)) / ((1 - a)(K c + 1)),
            with a the running per-token acceptance rate and c the measured cost of a draft forward
            over a target forward (K = 4 until both are measured). Rows near ``max_new_tokens`` verify
            fewer drafts; every step drafts at least one. Not with a ``tree`` (the tree fixes it).
        draft: "model" (the draft model proposes) or "prompt_lookup" (each row proposes the tokens
            that followed an earlier occurrence of its last ``ngram`` .. 1 tokens; one-hot q).
        generator: torch.Generator for every random draw (None = the default one). Unused with ``seeds``.
        seeds: per-row random keys, (B,) integers >= 0: row b's draws depend only on its seed and
            its own tokens (each draft and each verification at the row's absolute position, i.e. the
            tokens it has generated so far), so with a fixed ``num_draft_tokens`` a row gives the same
            tokens in any batch, alone or with other rows (K decides which positions are bonus draws,
            so "auto" can differ). Chains, token-wise or block; not trees.
        eos_token_id: an id or ids ending a row; None = the target's ``generation_config``; [] = none.
        pad_token_id: fills rows after their end; None = the ``generation_config``'s, else the first EOS.
        backend: the backend of every verify() / sample() / verify_tree() call ("auto", "triton", "cpp", "eager").
        tree: None (a chain of drafts), children per node at each depth (e.g. (2, 2, 1): 2 + 4 + 4 = 10
            nodes), or "auto" (a tree of at most 8 nodes chosen each step from the running acceptance
            and measured costs): the draft expands the tree level by level, the target scores every
            node in one forward with a tree attention mask, :func:`specdec_ext.verify_tree` walks it
            (needs sdpa or eager attention and a draft model). Trees take the logits processors that
            read a line alone (``min_p``, ``suppress_tokens``, single-token ``bad_words_ids`` /
            ``sequence_bias``, warpers in ``logits_processor``); the per-prefix ones
            (``repetition_penalty``, ``presence_penalty``, ``frequency_penalty``,
            ``no_repeat_ngram_size``, ``min_new_tokens``, multi-token bad words or biases, other
            ``logits_processor`` entries), ``seeds``, ``draft="prompt_lookup"`` and
            ``num_draft_tokens`` raise a ValueError naming the argument.
        method: "token" or "block": block verification of the chain (Sun et al.), which accepts at
            least as many drafts in expectation; it takes every argument a token-wise chain takes
            (``tree`` may be None or all ones).
        siblings: how a tree node's sampled children are drawn: "without_replacement" (distinct
            children, the default) or "iid". Trees only.

    Drafts are drawn from the processed draft law with ``sample`` for chains, token-wise or block (at
    each row's position with ``seeds``); trees draw a node's children by one exponential race per
    level on ``generator``. Every way keeps the output exact.

    Returns:
        :class:`SpeculativeOutput` (sequences (B, L_in + max_new_tokens), stats, new_tokens, scores,
        logits) for chains, trees and blocks alike; ``stats.trees`` holds each step's branching.

    Example:
        >>> out = specdec_ext.generate(target, draft, ids, mask, max_new_tokens=64, temperature=0.7)  # doctest: +SKIP
        >>> out.sequences.shape, out.stats.tokens_per_target_forward  # doctest: +SKIP
        >>> specdec_ext.generate(target, draft, ids, mask, max_new_tokens=64, tree=(2, 1, 1))  # doctest: +SKIP
    """
    if draft not in ("model", "prompt_lookup"):
        raise ValueError(f"draft must be 'model' or 'prompt_lookup', got {draft!r}")
    if draft == "model" and draft_model is None:
        raise ValueError("draft_model is None: pass a draft model, or draft='prompt_lookup'")
    if draft == "prompt_lookup":
        if isinstance(ngram, bool) or not isinstance(ngram, int) or ngram < 1:
            raise ValueError(f"ngram must be an integer >= 1, got {ngram!r}")
        draft_model = None
    if method not in ("token", "block"):
        raise ValueError(f"method must be 'token' or 'block', got {method!r}")
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    is_tree = tree is not None and method == "token"
    if siblings is not None:
        if siblings not in ("iid", "without_replacement"):
            raise ValueError(f"siblings must be 'iid' or 'without_replacement', got {siblings!r}")
        if not is_tree:
            raise ValueError("siblings applies to trees (tree=..., method='token'); a chain has one draft per position")
    if tree is not None and num_draft_tokens is not None:
        raise ValueError(f"num_draft_tokens: the tree fixes the drafts per step (tree={tree!r}); give one or the other")
    if is_tree:
        # A tree draws its siblings by a race on the generator, and proposes from a model.
        if seeds is not None:
            raise ValueError("seeds: not available with a tree (tree drafts are drawn from generator; per-row keys cover chains)")
        if draft != "model":
            raise ValueError("draft: not available with a tree (prompt lookup proposes one chain: use tree=None)")
    check_models(target_model, draft_model)
    device = target_model.device
    input_ids, attention_mask = check_inputs(input_ids, attention_mask, device)
    sampling = check_sampling(do_sample, temperature, top_k, top_p)
    eos = eos_ids(target_model, eos_token_id, device)
    padding = (attention_mask == 0).sum(1)
    named = _named_processors(
        do_sample=do_sample, temperature=sampling["temperature"], top_k=sampling["top_k"], top_p=sampling["top_p"], min_p=min_p,
        repetition_penalty=repetition_penalty, presence_penalty=presence_penalty, frequency_penalty=frequency_penalty,
        no_repeat_ngram_size=no_repeat_ngram_size, bad_words_ids=bad_words_ids, sequence_bias=sequence_bias,
        suppress_tokens=suppress_tokens, min_new_tokens=min_new_tokens, eos=eos, prompt_width=input_ids.shape[1],
        prompt_padding=padding if bool(padding.any()) else None, logits_processor=logits_processor,
    )
    if is_tree:
        for name, processor in named:
            if LogitsPipeline([processor], do_sample=do_sample).needs_prefixes:
                raise ValueError(f"{name}: not available with a tree ({type(processor).__name__} reads each position's prefix, and a "
                                 "tree node's prefix is its own path); use a chain (tree=None, method='token' or 'block')")
    criteria = list(stopping_criteria or [])
    if stop_strings is not None:
        if tokenizer is None:
            raise ValueError("stop_strings needs the tokenizer: pass tokenizer=...")
        from transformers.generation.stopping_criteria import StopStringCriteria

        criteria.append(StopStringCriteria(tokenizer=tokenizer, stop_strings=stop_strings))
    if max_time is not None and (isinstance(max_time, bool) or not isinstance(max_time, (int, float)) or max_time <= 0):
        raise ValueError(f"max_time must be a number of seconds > 0, got {max_time!r}")
    seeds = check_seeds(seeds, input_ids.shape[0], device)
    return speculate(
        target_model, draft_model, input_ids, attention_mask, pipeline=LogitsPipeline([p for _, p in named], do_sample=do_sample), seeds=seeds,
        backend=backend, stopping=Stopping(criteria, max_time=max_time), max_new_tokens=max_new_tokens,
        num_draft_tokens=4 if num_draft_tokens is None else num_draft_tokens, ngram=ngram if draft == "prompt_lookup" else 0,
        generator=generator, eos=eos, pad=pad_value(target_model, pad_token_id, eos), streamer=streamer, output_scores=output_scores,
        output_logits=output_logits, tree=tree, method=method, siblings=siblings or "without_replacement",
    )
