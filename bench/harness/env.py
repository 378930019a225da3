"""What a measurement ran on: device, machine, versions and load.

CPU timings on a shared machine are only as good as its load, so every result keeps the load
average from its start and its end.
"""

from __future__ import annotations

import os
import platform
import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def device_name(device: str) -> str:
    """The GPU's name, or the CPU's model name."""
    if device == "cuda":
        import torch

        return torch.cuda.get_device_name(0)
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "cpu"


def device_slug(device: str) -> str:
    """A file-name slug of the device: ``nvidia-h200``, or ``cpu-<model>`` for CPU runs."""
    name = re.sub(r"\(r\)|\(tm\)|@.*$|\bcpu\b|\bprocessor\b", " ", device_name(device).lower())
    slug = re.sub(r"[^a-z0-9]+", "-", name).strip("-") or device
    return slug if device == "cuda" else f"cpu-{slug}"


def load_average() -> list[float] | None:
    """The 1-, 5- and 15-minute load averages (None where the platform has none)."""
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except (OSError, AttributeError):
        return None


def machine() -> dict:
    """The host: CPU model, CPU count, torch's intra-op threads, platform."""
    import torch

    return {"cpu": device_name("cpu"), "cpu_count": os.cpu_count(), "torch_threads": torch.get_num_threads(), "platform": platform.platform()}


def _version(name: str) -> str | None:
    try:
        return __import__(name).__version__
    except Exception:  # absent, or broken on this machine: recorded as missing
        return None


def git_commit() -> str | None:
    """The checkout's commit, ``+dirty`` with local changes to tracked files."""
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True, timeout=5).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT, capture_output=True, text=True, timeout=5).stdout.strip()
        return (commit + ("+dirty" if dirty else "")) or None
    except (OSError, subprocess.SubprocessError):
        return None


def versions() -> dict[str, str | None]:
    """python, torch, triton, transformers, specdec_ext, CUDA and the git commit."""
    import torch

    found: dict[str, str | None] = {"python": platform.python_version(), "torch": torch.__version__, "specdec_ext": _version("specdec_ext")}
    for name in ("triton", "transformers"):
        found[name] = _version(name)
    found["cuda"] = torch.version.cuda
    found["git"] = git_commit()
    return found
