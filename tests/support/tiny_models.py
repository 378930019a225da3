"""Tiny random causal LMs built from configs (nothing is downloaded).

Random initialisation with the usual ``initializer_range`` gives near-uniform next-token laws, under
which a wrong sampler is statistically invisible. ``logit_scale`` multiplies the output head so the
laws are peaked and a target and a draft built from different seeds disagree clearly.
"""

from __future__ import annotations

import copy

import torch
from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM


def _finish(model, seed: int, logit_scale: float, eos_token_id, pad_token_id):
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for parameter in model.parameters():
            if parameter.dim() >= 2:
                parameter.copy_(torch.randn(parameter.shape, generator=generator) * 0.2)
        model.get_output_embeddings().weight.mul_(logit_scale)
    model.generation_config.eos_token_id = eos_token_id
    model.generation_config.pad_token_id = pad_token_id
    model.generation_config.bos_token_id = None
    return model.eval()


def tiny_llama(vocab_size: int = 16, *, seed: int = 0, hidden: int = 32, layers: int = 2, heads: int = 4, logit_scale: float = 2.0,
               eos_token_id: int | None = None, pad_token_id: int | None = None, attn_implementation: str = "sdpa") -> LlamaForCausalLM:
    """A random 1-2 layer Llama (RoPE positions, grouped-query attention)."""
    config = LlamaConfig(
        vocab_size=vocab_size, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
        num_attention_heads=heads, num_key_value_heads=max(1, heads // 2), max_position_embeddings=256,
        tie_word_embeddings=False, bos_token_id=None, eos_token_id=eos_token_id, pad_token_id=pad_token_id,
        attn_implementation=attn_implementation,
    )
    torch.manual_seed(seed)
    return _finish(LlamaForCausalLM(config), seed, logit_scale, eos_token_id, pad_token_id)


def tiny_gpt2(vocab_size: int = 16, *, seed: int = 1, hidden: int = 32, layers: int = 1, heads: int = 4, logit_scale: float = 2.0,
              eos_token_id: int | None = None, pad_token_id: int | None = None, attn_implementation: str = "sdpa") -> GPT2LMHeadModel:
    """A random GPT-2 (learned absolute positions, so wrong position ids change its outputs)."""
    config = GPT2Config(
        vocab_size=vocab_size, n_embd=hidden, n_layer=layers, n_head=heads, n_positions=256, tie_word_embeddings=False,
        bos_token_id=None, eos_token_id=eos_token_id, pad_token_id=pad_token_id, attn_implementation=attn_implementation,
    )
    torch.manual_seed(seed)
    return _finish(GPT2LMHeadModel(config), seed, logit_scale, eos_token_id, pad_token_id)


def left_pad(prompts: list[list[int]], pad_token_id: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """(input_ids, attention_mask) for token lists of different lengths, padded on the left."""
    width = max(len(p) for p in prompts)
    input_ids = torch.full((len(prompts), width), pad_token_id, dtype=torch.long)
    attention_mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for row, prompt in enumerate(prompts):
        input_ids[row, width - len(prompt):] = torch.tensor(prompt)
        attention_mask[row, width - len(prompt):] = 1
    return input_ids, attention_mask


def perturbed_copy(model, noise: float = 0.05, seed: int = 123):
    """A draft close to ``model``: the same weights plus Gaussian noise (high, but not full, acceptance)."""
    draft = copy.deepcopy(model)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for parameter in draft.parameters():
            parameter.add_(torch.randn(parameter.shape, generator=generator) * noise)
    return draft
