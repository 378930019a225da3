"""The ``specdec`` command: ``demo`` on the embedded model pair, ``generate`` on any local pair.

Benchmarks are not part of the installed package: they run from a source checkout as ``python -m bench``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

DEMO_TEMPERATURE = 0.7


def _device(name: str):
    import torch

    if name.startswith("cuda") and not torch.cuda.is_available():
        raise SystemExit(f"specdec: --device {name} was asked for, but this machine has no CUDA device (use --device cpu)")
    return torch.device(name)


def _load_models(target_dir: Path, draft_dir: Path, device):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    for label, path in (("--target", target_dir), ("--draft", draft_dir)):
        if not (path / "config.json").is_file():
            raise SystemExit(f"specdec: {label} {path} is not a model directory (no config.json there)")
    tokenizer_dir = target_dir if (target_dir / "tokenizer_config.json").is_file() else target_dir.parent / "tokenizer"
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir, local_files_only=True)
    if (draft_dir / "tokenizer_config.json").is_file():
        draft_vocab = AutoTokenizer.from_pretrained(draft_dir, local_files_only=True).get_vocab()
        if draft_vocab != tokenizer.get_vocab():
            raise SystemExit(f"specdec: the target ({target_dir}) and the draft ({draft_dir}) use unrelated vocabularies; speculative decoding needs a shared one")
    target = AutoModelForCausalLM.from_pretrained(target_dir, local_files_only=True).to(device).eval()
    draft = AutoModelForCausalLM.from_pretrained(draft_dir, local_files_only=True).to(device).eval()
    return target, draft, tokenizer


def _encode(tokenizer, prompts: list[str], device):
    tokenizer.padding_side = "left"  # speculative generation takes left-padded batches
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    batch = tokenizer(prompts, return_tensors="pt", padding=True)
    return batch["input_ids"].to(device), batch["attention_mask"].to(device)


def _eos_ids(tokenizer) -> list[int]:
    return [tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else []


def cmd_generate(args) -> int:
    import torch

    from .demo.assets import PAIR_DIR
    from .generate import generate

    device = _device(args.device)
    target_dir = Path(args.target or PAIR_DIR / "target")
    draft_dir = Path(args.draft or PAIR_DIR / "draft")
    target, draft, tokenizer = _load_models(target_dir, draft_dir, device)
    if args.batch_file:
        path = Path(args.batch_file)
        if not path.is_file():
            raise SystemExit(f"specdec: --batch-file {path} does not exist")
        prompts = [line.rstrip("\n") for line in path.read_text().splitlines() if line.strip()]
    else:
        prompts = [args.prompt]
    input_ids, attention_mask = _encode(tokenizer, prompts, device)
    generator = torch.Generator(device=device).manual_seed(args.seed)
    lookup = args.prompt_lookup is not None
    try:
        out = generate(
            target, None if lookup else draft, input_ids, attention_mask, max_new_tokens=args.max_new_tokens, do_sample=args.temperature > 0,
            temperature=args.temperature if args.temperature > 0 else 1.0, top_k=args.top_k, top_p=args.top_p, min_p=args.min_p,
            repetition_penalty=args.repetition_penalty, presence_penalty=args.presence_penalty,
            no_repeat_ngram_size=args.no_repeat_ngram_size, stop_strings=args.stop or None, tokenizer=tokenizer,
            num_draft_tokens=args.num_draft_tokens if args.num_draft_tokens == "auto" else int(args.num_draft_tokens),
            draft="prompt_lookup" if lookup else "model", ngram=args.prompt_lookup if lookup else 3,
            generator=generator, pad_token_id=tokenizer.pad_token_id,
        )
    except ValueError as error:
        raise SystemExit(f"specdec: {error}") from None
    for text in tokenizer.batch_decode(out.sequences, skip_special_tokens=True):
        print(text)
        print("-" * 60)
    stats = out.stats
    per_position = " ".join(f"{a:.2f}" for a in stats.acceptance_per_position)
    print(f"acceptance {stats.mean_acceptance:.3f} (per position: {per_position}); tokens per target forward {stats.tokens_per_target_forward:.2f}")
    return 0


def _quiet_transformers() -> None:
    """Keep the demo's output readable: transformers' deprecation notices are not for its users."""
    import warnings

    from transformers.utils import logging

    logging.set_verbosity_error()
    logging.disable_progress_bar()
    warnings.filterwarnings("ignore", category=FutureWarning)


def cmd_demo(args) -> int:
    from .demo.run import run_demo

    _quiet_transformers()

    report = run_demo(quick=args.quick, max_new_tokens=args.max_new_tokens, temperature=args.temperature, num_draft_tokens=args.num_draft_tokens,
                      seed=args.seed, repetition_penalty=args.repetition_penalty, min_p=args.min_p, stop=args.stop or None,
                      prompt_lookup=args.prompt_lookup)
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2))
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="specdec", description="Fast, exact speculative decoding for Hugging Face transformers.")
    sub = parser.add_subparsers(dest="command", required=True)

    demo = sub.add_parser("demo", help="generate with the embedded model pair and measure every decoding method side by side")
    demo.add_argument("--quick", action="store_true", help="one prompt, few tokens (a smoke run)")
    demo.add_argument("--max-new-tokens", type=int, default=None)
    demo.add_argument("--temperature", type=float, default=DEMO_TEMPERATURE)
    demo.add_argument("--num-draft-tokens", type=int, default=4)
    demo.add_argument("--seed", type=int, default=0)
    demo.add_argument("--repetition-penalty", type=float, default=None, help="applied by every method (transformers' processor)")
    demo.add_argument("--min-p", type=float, default=None, help="min-p filter, applied by every method")
    demo.add_argument("--stop", action="append", default=[], help="stop string (repeatable), applied by every method")
    demo.add_argument("--prompt-lookup", type=int, default=None, metavar="N", help="also measure prompt-lookup drafting (n-grams up to N)")
    demo.add_argument("--json", help="also write the measurements to this JSON file")
    demo.set_defaults(func=cmd_demo)

    gen = sub.add_parser("generate", help="speculative generation with local transformers model directories")
    gen.add_argument("--target", help="target model directory (default: the embedded demo target)")
    gen.add_argument("--draft", help="draft model directory (default: the embedded demo draft)")
    source = gen.add_mutually_exclusive_group(required=True)
    source.add_argument("--prompt", help="the prompt text")
    source.add_argument("--batch-file", help="a text file with one prompt per line, generated as one batch")
    gen.add_argument("--max-new-tokens", type=int, default=64)
    gen.add_argument("--temperature", type=float, default=1.0, help="0 = greedy")
    gen.add_argument("--top-k", type=int, default=None)
    gen.add_argument("--top-p", type=float, default=None)
    gen.add_argument("--num-draft-tokens", default="4", help='drafts per step, or "auto"')
    gen.add_argument("--min-p", type=float, default=None, help="min-p filter (after temperature / top-k, as transformers)")
    gen.add_argument("--repetition-penalty", type=float, default=None, help="transformers' repetition penalty (1 = off)")
    gen.add_argument("--presence-penalty", type=float, default=None, help="additive penalty on tokens already generated")
    gen.add_argument("--no-repeat-ngram-size", type=int, default=None, help="never repeat an n-gram of this size")
    gen.add_argument("--stop", action="append", default=[], help="stop string (repeatable): a row ends where its text completes it")
    gen.add_argument("--prompt-lookup", type=int, default=None, metavar="N",
                     help="draft by prompt lookup (n-gram matching in the row's own text, n <= N) instead of the draft model")
    gen.add_argument("--seed", type=int, default=0)
    gen.add_argument("--device", default="cpu")
    gen.set_defaults(func=cmd_generate)

    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
