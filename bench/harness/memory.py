"""Peak memory one call allocates beyond what was live before it."""

from __future__ import annotations

import ctypes
import sys
from pathlib import Path


class PeakMemory:
    """Peak bytes allocated inside the ``with`` block beyond what was live when it began.

    CUDA: the caching allocator's peak counter. CPU: the process's peak resident set (VmHWM, reset
    through /proc/self/clear_refs) after ``malloc_trim`` returned free heap pages, so memory the
    call reuses from earlier calls counts as well. It sees every allocation, the C++ backend's own
    buffers included. ``bytes`` stays None where neither mechanism exists.
    """

    _libc = None

    def __init__(self, device: str | None):
        self.device = device  # None: measure nothing (lets callers keep one code path)
        self.bytes: int | None = None

    @classmethod
    def supported(cls, device: str) -> bool:
        if device == "cuda":
            return True
        if not sys.platform.startswith("linux"):
            return False
        try:
            cls._libc = cls._libc or ctypes.CDLL("libc.so.6")
            with open("/proc/self/clear_refs", "w") as fh:
                fh.write("5")
            return "VmHWM" in Path("/proc/self/status").read_text()
        except OSError:
            return False

    @staticmethod
    def _status(field: str) -> int:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
        raise OSError(field)

    def __enter__(self):
        import torch

        if self.device is None:
            self._base = None
        elif self.device == "cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            self._base = torch.cuda.memory_allocated()
        elif self.supported("cpu"):
            self._libc.malloc_trim(0)
            with open("/proc/self/clear_refs", "w") as fh:
                fh.write("5")  # reset VmHWM to the current resident set
            self._base = self._status("VmRSS")
        else:
            self._base = None
        return self

    def __exit__(self, *exc):
        if self._base is None or exc[0] is not None:
            return False
        if self.device == "cuda":
            import torch

            torch.cuda.synchronize()
            self.bytes = torch.cuda.max_memory_allocated() - self._base
        else:
            self.bytes = max(0, self._status("VmHWM") - self._base)
        return False
