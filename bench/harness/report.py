"""Result files: the header every benchmark writes, file names, JSON and tables.

Every result starts with the same fields (bench/results/README.md): ``kind`` (what was measured, or
that it is an estimate), ``date`` (UTC), ``device``, ``device_type``, ``machine``, ``versions`` and
``load_average`` at the start and the end. Files are named ``<what>-<device>-<date>[-<tag>].json``,
the parts a benchmark has no use for left out.
"""

from __future__ import annotations

import datetime
import json
from pathlib import Path

from . import env

RESULTS_DIR = Path(__file__).resolve().parents[1] / "results"


def now() -> str:
    """The UTC time, to the second, ISO 8601."""
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def header(kind: str, device: str = "cpu", load_start: list[float] | None = None, date: str | None = None) -> dict:
    """The fields every result starts with; ``load_start`` is :func:`env.load_average` taken when the run began."""
    return {
        "kind": kind,
        "date": date or now(),
        "device": env.device_name(device),
        "device_type": device,
        "machine": env.machine(),
        "versions": env.versions(),
        "load_average": {"start": load_start, "end": env.load_average()},
    }


def result_path(out_dir: Path | str, what: str | None, date: str, device: str | None = None, tag: str | None = None, suffix: str = ".json") -> Path:
    """``<out_dir>/<what>-<device>-<date>[-<tag>]<suffix>`` (``date`` cut to the day; empty parts left out)."""
    stem = "-".join(part for part in (what, device, date[:10], tag) if part)
    return Path(out_dir) / f"{stem}{suffix}"


def write_json(doc: dict, path: Path | str) -> Path:
    """Writes ``doc`` (the folder made if needed); values JSON lacks (paths, dtypes) as text."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=1, default=str) + "\n")
    return path


def fmt(value, spec: str, missing: str = "-") -> str:
    """``value`` formatted, or ``missing`` for None and NaN (a figure that was not measured)."""
    if value is None or (isinstance(value, float) and value != value):
        return missing
    return format(value, spec)


def markdown_table(head: list[str], rows: list[list[str]]) -> str:
    """A Markdown table (the README's figures are pasted from these)."""
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)
