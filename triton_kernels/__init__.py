"""Triton kernels of specdec_ext (installed as ``specdec_ext.kernels``).

Only ``@triton.jit`` functions live here; launchers are in ``specdec_ext._triton_backend``.
A verify call is two launches without top-k / top-p (``line_stats_kernel``, ``race_kernel``)
and with them ``candidates_kernel``, ``threshold_kernel`` and the ``select_kernel`` passes of the
whole-line search come first.
"""

from .race import race_kernel
from .select import select_kernel
from .stats import line_stats_kernel
from .thresholds import candidates_kernel, threshold_kernel

__all__ = ["candidates_kernel", "line_stats_kernel", "race_kernel", "select_kernel", "threshold_kernel"]
