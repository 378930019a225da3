"""Triton kernels of specdec_ext (installed as ``specdec_ext.kernels``).

Only ``@triton.jit`` functions live here; launchers are in ``specdec_ext._triton_backend``.
A verify call is two launches without top-k / top-p (``line_stats_kernel``, ``race_kernel``)
and with top-k / top-p ``candidates_kernel`` and ``cutoff_kernel`` (the cut-offs: from the
candidates, or by the whole-line search in the same launch) come first: four.
"""

from .cutoffs import cutoff_kernel
from .race import race_kernel
from .stats import line_stats_kernel
from .thresholds import candidates_kernel

__all__ = ["candidates_kernel", "cutoff_kernel", "line_stats_kernel", "race_kernel"]
