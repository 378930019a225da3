"""Builds the optional C++ CPU kernel (csrc/) next to the pure-Python package.

Metadata lives in pyproject.toml. The extension is optional: when it cannot be built (no compiler,
no torch at build time) the package still installs and falls back to the eager backend.
"""

from __future__ import annotations

import os
import sys
import warnings
from pathlib import Path

from setuptools import setup

HERE = Path(__file__).resolve().parent
SOURCES = ["csrc/verify.cpp", "csrc/kernel_avx512.cpp", "csrc/kernel_avx2.cpp", "csrc/kernel_base.cpp"]


def _warn(message: str) -> None:
    # setuptools hides most output of a pip build; a warning on stderr survives `pip install -v`
    # and the module records the reason at import time (specdec_ext._cpp_backend.unavailable_reason()).
    warnings.warn(f"specdec_ext: {message}; the C++ CPU kernel is skipped and the eager backend will be used", stacklevel=2)
    print(f"WARNING: specdec_ext: {message}", file=sys.stderr)


def _extension_setup() -> dict:
    if os.environ.get("SPECDEC_NO_EXTENSION") == "1":
        return {}
    try:
        from torch.utils.cpp_extension import BuildExtension, CppExtension
    except Exception as exc:  # torch missing at build time (e.g. an isolated build without it)
        _warn(f"cannot import torch.utils.cpp_extension ({exc})")
        return {}

    # -O3; no implicit floating-point contraction (the kernels fuse multiply-adds explicitly, so the
    # AVX2 and AVX-512 variants round identically); -fno-trapping-math lets GCC if-convert the
    # selects in the exp / probability loops so they vectorise (it changes no result); -g0 keeps
    # the library small (Python's CFLAGS ask for -g).
    compile_args = ["-O3", "-g0", "-ffp-contract=off", "-fno-trapping-math", "-fno-math-errno"]
    link_args = []
    if sys.platform.startswith("linux"):
        # at::parallel_for expands to `#pragma omp parallel` in the extension itself; libtorch
        # already loaded libgomp, so this links against the same OpenMP runtime.
        compile_args.append("-fopenmp")
        link_args.append("-fopenmp")

    class OptionalBuildExtension(BuildExtension):
        """build_ext that turns a failed compile into a warning instead of a failed install."""

        def run(self):
            try:
                super().run()
            except Exception as exc:
                _warn(f"building the C++ extension failed ({exc})")

        def build_extension(self, ext):
            try:
                super().build_extension(ext)
            except Exception as exc:
                _warn(f"building {ext.name} failed ({exc})")

        def copy_extensions_to_source(self):
            # Editable installs copy the built library into the source tree; skip what did not build.
            try:
                super().copy_extensions_to_source()
            except Exception as exc:
                _warn(f"installing the C++ extension failed ({exc})")

    extension = CppExtension(
        name="specdec_ext._C",
        sources=SOURCES,
        include_dirs=[str(HERE / "csrc")],
        extra_compile_args=compile_args,
        extra_link_args=link_args,
    )
    # Tree and block verification: a module of its own, so it builds and loads independently.
    tree_extension = CppExtension(
        name="specdec_ext._C_tree",
        sources=["csrc/tree.cpp"],
        extra_compile_args=compile_args,
        extra_link_args=link_args,
    )
    return {"ext_modules": [extension, tree_extension], "cmdclass": {"build_ext": OptionalBuildExtension}}


setup(**_extension_setup())
