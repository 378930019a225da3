"""Triton kernels of specdec_ext (installed as ``specdec_ext.kernels``).

Only ``@triton.jit`` functions live here; launchers are in ``specdec_ext._triton_backend``.
A verify call is two launches without top-k / top-p (``line_stats_kernel``, ``race_kernel``)
and four with them (``candidates_kernel`` and ``threshold_kernel`` first).
"""

from .race import race_kernel
from .stats import line_stats_kernel
from .thresholds import candidates_kernel, threshold_kernel

__all__ = ["candidates_kernel", "line_stats_kernel", "race_kernel", "threshold_kernel"]
