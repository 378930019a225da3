"""Triton kernels of specdec_ext (installed as ``specdec_ext.kernels``).

Only ``@triton.jit`` functions live here; launchers are in ``specdec_ext._triton_backend``.
A verify call is two launches without top-k / top-p (``line_stats_kernel``, ``race_kernel``).
With top-k / top-p it is three: ``line_stats_kernel`` (the statistics of every line and each
line's candidates), ``cutoff_kernel`` (the cut-offs: from the candidates, or by the whole-line
search in the same launch, with the cut lines' statistics) and ``race_kernel``. Trees and blocks
run the same statistics launch, then a walk (``tree_walk_kernel`` / ``block_walk_kernel``) and a
race (``tree_race_kernel`` / ``block_race_kernel``); with top-k / top-p the walk runs in the
cut-offs launch, after its items (``cut_walk_kernel``).
"""

from .cutoffs import cutoff_kernel
from .race import race_kernel
from .stats import line_stats_kernel
from .tree import block_race_kernel, block_walk_kernel, cut_walk_kernel, tree_race_kernel, tree_walk_kernel

__all__ = [
    "block_race_kernel", "block_walk_kernel", "cut_walk_kernel", "cutoff_kernel", "line_stats_kernel", "race_kernel", "tree_race_kernel", "tree_walk_kernel",
]
