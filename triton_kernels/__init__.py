"""Triton kernels of specdec_ext (installed as ``specdec_ext.kernels``).

Only ``@triton.jit`` functions live here; launchers are in ``specdec_ext._triton_backend``.
"""

from .thresholds import candidates_kernel, threshold_kernel
from .verify import finalize_kernel, line_stats_kernel, race_kernel

__all__ = ["candidates_kernel", "finalize_kernel", "line_stats_kernel", "race_kernel", "threshold_kernel"]
