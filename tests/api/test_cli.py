"""The `specdec` command end to end on the embedded pair (reduced settings), and its errors."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from specdec_ext import cli
from specdec_ext.demo.assets import PAIR_DIR, load_pair


def test_embedded_pair_loads_offline_and_tokenizer_round_trips(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    target, draft, tokenizer = load_pair()
    assert target.config.vocab_size == draft.config.vocab_size == len(tokenizer)
    assert sum(p.numel() for p in draft.parameters()) * 4 < sum(p.numel() for p in target.parameters())
    text = "Quarterly results: Acme Corp (ACME) beat estimates; EPS $1.23 vs $1.10 — shares +4.5%.\n"
    ids = tokenizer(text)["input_ids"]
    assert tokenizer.decode(ids, skip_special_tokens=True) == text


def test_demo_runs_end_to_end(tmp_path, capsys):
    report_path = tmp_path / "demo.json"
    assert cli.main(["demo", "--quick", "--max-new-tokens", "8", "--json", str(report_path)]) == 0
    out = capsys.readouterr().out
    for needle in ("target only (B=1)", "assisted (transformers) (B=1)", "generate(assistant_model) + hook (B=1)", "generate(assistant_model) + hook (B=2)",
                   "specdec_ext.generate (B=2)", "acceptance per draft position", "predicted speedup"):
        assert needle in out
    report = json.loads(report_path.read_text())
    assert {r["method"] for r in report["runs"]} >= {"target only (B=1)", "specdec_ext.generate (B=1)"}
    assert 0 <= report["mean_acceptance"] <= 1 and report["tokens_per_target_forward"] >= 1
    assert all(r["new_tokens"] > 0 for r in report["runs"])


def test_generate_command(tmp_path, capsys):
    assert cli.main(["generate", "--prompt", "Market wrap:", "--max-new-tokens", "8", "--temperature", "0.7", "--top-p", "0.9"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("Market wrap:") and "acceptance" in out
    batch = tmp_path / "prompts.txt"
    batch.write_text("Quarterly results:\nRates outlook:\n")
    assert cli.main(["generate", "--batch-file", str(batch), "--max-new-tokens", "6", "--temperature", "0", "--num-draft-tokens", "auto"]) == 0
    out = capsys.readouterr().out
    assert "Quarterly results:" in out and "Rates outlook:" in out


def test_generate_command_processors_stops_and_prompt_lookup(capsys):
    from specdec_ext.demo.assets import load_pair

    # A stop string the free text produces: the printed text ends right where it completes.
    assert cli.main(["generate", "--prompt", "Market wrap:", "--max-new-tokens", "24", "--temperature", "0"]) == 0
    free = capsys.readouterr().out.split("\n")[0]
    stop = free[len("Market wrap:") + 6: len("Market wrap:") + 9]
    assert cli.main(["generate", "--prompt", "Market wrap:", "--max-new-tokens", "24", "--temperature", "0", "--stop", stop]) == 0
    stopped = capsys.readouterr().out.split("\n")[0]
    # (the completing token may overhang the string, as transformers' StopStringCriteria allows)
    assert stop in stopped and len(stopped) < len(free) and free.startswith(stopped)

    # Processors change greedy text exactly as transformers' own greedy decoding with them.
    target, _, tokenizer = load_pair()
    ids = tokenizer(["Market wrap:"], return_tensors="pt")["input_ids"]
    expected = tokenizer.decode(target.generate(ids, do_sample=False, max_new_tokens=16, repetition_penalty=1.5,
                                                pad_token_id=tokenizer.pad_token_id)[0], skip_special_tokens=True)
    for source in ([], ["--prompt-lookup", "2"]):
        assert cli.main(["generate", "--prompt", "Market wrap:", "--max-new-tokens", "16", "--temperature", "0", "--repetition-penalty", "1.5",
                         *source]) == 0
        assert capsys.readouterr().out.split("\n")[0] == expected.split("\n")[0]
    assert cli.main(["generate", "--prompt", "Market wrap:", "--max-new-tokens", "8", "--min-p", "0.05", "--temperature", "0.8"]) == 0
    assert "acceptance" in capsys.readouterr().out
    with pytest.raises(SystemExit, match="min_p"):
        cli.main(["generate", "--prompt", "x", "--max-new-tokens", "2", "--min-p", "1.5"])


def test_cli_errors_are_clear(tmp_path):
    with pytest.raises(SystemExit, match="is not a model directory"):
        cli.main(["generate", "--target", str(tmp_path / "missing"), "--prompt", "x"])
    with pytest.raises(SystemExit, match="--batch-file .* does not exist"):
        cli.main(["generate", "--batch-file", str(tmp_path / "none.txt")])
    if not torch.cuda.is_available():
        with pytest.raises(SystemExit, match="no CUDA device"):
            cli.main(["generate", "--prompt", "x", "--device", "cuda"])


def test_unrelated_vocabularies_are_refused(tmp_path):
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    draft_dir = tmp_path / "draft"
    shutil.copytree(PAIR_DIR / "draft", draft_dir)
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        (draft_dir / name).unlink(missing_ok=True)
    other = PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.WordLevel({"buy": 0, "sell": 1, "[UNK]": 2}, unk_token="[UNK]")), unk_token="[UNK]")
    other.save_pretrained(draft_dir)
    with pytest.raises(SystemExit, match="unrelated vocabularies"):
        cli.main(["generate", "--draft", str(draft_dir), "--prompt", "Market wrap:", "--max-new-tokens", "2"])


def test_benchmarks_are_not_a_subcommand(capsys):
    """The installed command never reaches into the source-only bench/ folder: `python -m bench` runs them."""
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["bench"])
    assert exit_info.value.code == 2 and "invalid choice: 'bench'" in capsys.readouterr().err
