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
    for needle in ("target only (B=1)", "assisted + fused hook (B=1)", "specdec_ext.generate (B=2)", "acceptance per draft position", "predicted speedup"):
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
