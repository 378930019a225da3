"""The documentation holds: README.md stays a short reference, every ```python block of README.md and
docs/*.md runs as written, and every relative link points to a file (and heading) that exists.

A block that cannot run here (it needs a GPU, vLLM or a download) is preceded by a marker line
``<!-- not-run: <reason> -->``; the markers are counted so that they stay rare.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
DOCUMENTS = [README, *sorted((ROOT / "docs").glob("*.md"))]
README_MAX_LINES = 380
MAX_NOT_RUN = 3  # blocks that may carry a not-run marker, over all documents

_FENCE = re.compile(r"^```(\S*)\n(.*?)^```[ \t]*$", re.S | re.M)
_NOT_RUN = re.compile(r"<!--\s*not-run:\s*(.+?)\s*-->\s*$")
_LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")


def _name(path: Path) -> str:
    return str(path.relative_to(ROOT))


def python_blocks(path: Path) -> list[tuple[int, str, str | None]]:
    """(line, code, not-run reason or None) of every ```python block of a Markdown file."""
    text = path.read_text()
    blocks = []
    for match in _FENCE.finditer(text):
        if match.group(1) != "python":
            continue
        line = text.count("\n", 0, match.start()) + 1
        before = text[: match.start()].rstrip("\n").rsplit("\n", 1)[-1]
        reason = _NOT_RUN.search(before)
        blocks.append((line, match.group(2), reason.group(1) if reason else None))
    return blocks


BLOCKS = [(path, line, code, reason) for path in DOCUMENTS for line, code, reason in python_blocks(path)]


def test_readme_is_a_short_reference():
    lines = len(README.read_text().splitlines())
    assert lines <= README_MAX_LINES, f"README.md has {lines} lines (at most {README_MAX_LINES}): move details to docs/"


def test_examples_are_found_and_not_run_markers_stay_rare():
    assert len([b for b in BLOCKS if b[0] == README]) >= 4, "README.md lost its examples"
    skipped = [f"{_name(path)}:{line} ({reason})" for path, line, _, reason in BLOCKS if reason is not None]
    assert len(skipped) <= MAX_NOT_RUN, f"too many examples marked not-run: {skipped}"


_PAIRS: dict = {}


@pytest.fixture
def cached_demo_pair(monkeypatch):
    """The examples call load_pair() as written; the embedded pair is loaded once for all of them."""
    from specdec_ext.demo import assets

    load = assets.load_pair

    def load_pair(*args, **kwargs):
        key = repr((args, sorted(kwargs.items())))
        if key not in _PAIRS:
            _PAIRS[key] = load(*args, **kwargs)
        return _PAIRS[key]

    monkeypatch.setattr(assets, "load_pair", load_pair)


@pytest.mark.parametrize(("path", "line", "code", "reason"), BLOCKS, ids=[f"{_name(p)}:{line}" for p, line, _, _ in BLOCKS])
def test_example_runs(path, line, code, reason, cached_demo_pair):
    if reason is not None:
        pytest.skip(f"marked not-run: {reason}")
    if "load_pair" in code:
        pytest.importorskip("transformers")
    try:
        exec(compile(code, f"{_name(path)}:{line}", "exec"), {"__name__": "__example__"})
    finally:
        if "specdec_ext.hf" in code:
            import specdec_ext.hf

            specdec_ext.hf.uninstall()


def _slug(heading: str) -> str:
    """GitHub's anchor of a Markdown heading."""
    text = re.sub(r"[`*_]", "", heading.strip().lower())
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    text = _FENCE.sub("", path.read_text())
    return {_slug(match.group(1)) for match in re.finditer(r"^#{1,6}\s+(.+?)\s*$", text, re.M)}


LINKS = list(dict.fromkeys((path, target) for path in DOCUMENTS for target in _LINK.findall(_FENCE.sub("", path.read_text()))
                           if not re.match(r"^[a-z][a-z0-9+.-]*:", target)))


def test_documents_have_relative_links():
    assert len(LINKS) >= 10


@pytest.mark.parametrize(("path", "target"), LINKS, ids=[f"{_name(p)}->{t}" for p, t in LINKS])
def test_relative_link_resolves(path, target):
    file_part, _, anchor = target.partition("#")
    resolved = (path.parent / file_part).resolve() if file_part else path
    assert resolved.exists(), f"{_name(path)} links to {target}, which does not exist"
    assert resolved.is_relative_to(ROOT), f"{_name(path)} links outside the repository: {target}"
    if anchor and resolved.suffix == ".md":
        assert anchor in _anchors(resolved), f"{_name(path)} links to {target}: no such heading in {_name(resolved)}"
