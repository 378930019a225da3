"""Builds the optional C++ CPU kernel (csrc/) next to the pure-Python package.

Metadata lives in pyproject.toml. The extension is optional: when it cannot be built (no compiler,
no torch at build time) the package still installs and falls back to the eager backend.

It is compiled against the torch installed in the environment it is installed into (a C++
extension only loads beside the torch it was built with). Install with
``pip install --no-build-isolation .`` (what ``make setup`` does); a plain ``pip install .``
builds in an isolated environment without torch, and this script then finds the installed torch
through the interpreter pip runs (pyproject.toml's build requirements deliberately leave torch out,
so pip never downloads a second one for the build). The built library records that torch's version;
specdec_ext refuses to use it beside another one and says how to rebuild.

Compilers: GCC or clang (CXX=clang++ LDSHARED="clang++ -shared"). The AVX2 / AVX-512 files carry
their own per-function target attributes; csrc/kernel_base.cpp, the portable fallback, is compiled
on its own for the baseline target (-march=x86-64 or -march=armv8-a), whatever CFLAGS say. Parallel
regions run on the OpenMP runtime libtorch itself loaded (found below and linked), never a second one.
"""

from __future__ import annotations

import os
import platform
import re
import shlex
import subprocess
import sys
import sysconfig
import warnings
from pathlib import Path

from setuptools import setup

HERE = Path(__file__).resolve().parent
# One extension: the bindings, the drivers (chain, block, tree) on the shared layers (arguments,
# passes, line statistics and filter, scheduler), the CPU dispatch and the per-ISA kernel loops.
SOURCES = [
    "csrc/bindings.cpp", "csrc/chain.cpp", "csrc/block.cpp", "csrc/tree.cpp", "csrc/passes.cpp", "csrc/filter.cpp", "csrc/arguments.cpp",
    "csrc/dispatch.cpp", "csrc/scheduler.cpp", "csrc/penalties.cpp", "csrc/kernel_avx512.cpp", "csrc/kernel_avx2.cpp",
]
BASELINE_SOURCE = "csrc/kernel_base.cpp"
# -O3; no implicit floating-point contraction (the kernels fuse multiply-adds explicitly, so the
# AVX2 and AVX-512 variants round identically); -fno-trapping-math lets the compiler if-convert the
# selects in the exp / probability loops so they vectorise (it changes no result); -g0 keeps the
# library small (Python's CFLAGS ask for -g).
COMMON_FLAGS = ["-O3", "-g0", "-ffp-contract=off", "-fno-trapping-math", "-fno-math-errno"]
OPENMP_LIBRARIES = ("libgomp", "libomp", "libiomp5")


def _warn(message: str) -> None:
    # setuptools hides most output of a pip build; a warning on stderr survives `pip install -v`
    # and the module records the reason at import time (specdec_ext._cpp_backend.unavailable_reason()).
    warnings.warn(f"specdec_ext: {message}; the C++ CPU kernel is skipped and the eager backend will be used", stacklevel=2)
    print(f"WARNING: specdec_ext: {message}", file=sys.stderr)


def installed_torch_site(env: dict[str, str] | None = None) -> str | None:
    """The site-packages folder holding the torch of the environment pip installs into, seen from
    an isolated build: the same interpreter, started without pip's isolation variables (pip hides
    the environment's site-packages through PYTHONPATH / PYTHONNOUSERSITE and a sitecustomize)."""
    env = dict(os.environ if env is None else env)
    for name in ("PYTHONPATH", "PYTHONNOUSERSITE", "PYTHONHOME", "PYTHONSAFEPATH"):
        env.pop(name, None)
    code = "import os, torch; print(os.path.dirname(os.path.dirname(os.path.abspath(torch.__file__))))"
    try:
        found = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300, cwd=os.path.expanduser("~"))
    except (OSError, subprocess.TimeoutExpired):
        return None
    lines = found.stdout.strip().splitlines()
    return lines[-1] if found.returncode == 0 and lines else None


def import_torch():
    """torch for the build: importable here, or the installed one found by installed_torch_site()."""
    try:
        import torch

        return torch
    except ImportError:
        pass
    site = installed_torch_site()
    if site is None:
        return None
    sys.path.append(site)  # after the build environment's own packages
    try:
        import torch

        print(f"specdec_ext: building against the installed torch in {site}", file=sys.stderr)
        return torch
    except ImportError:
        return None


def torch_openmp_library(torch) -> str | None:
    """Path of the OpenMP runtime libtorch loaded (libgomp, libomp or libiomp5), or None."""
    maps = Path("/proc/self/maps")
    if maps.exists():
        for line in maps.read_text().splitlines():
            path = line.split()[-1] if line.split() else ""
            if any(Path(path).name.startswith(name) for name in OPENMP_LIBRARIES):
                return path
        return None
    lib = Path(torch.__file__).parent / "lib"  # macOS wheels ship libomp.dylib beside libtorch
    for name in ("libomp.dylib", "libiomp5.dylib"):
        if (lib / name).exists():
            return str(lib / name)
    return None


def baseline_flags(machine: str | None = None) -> list[str]:
    """-march of the portable fallback (csrc/kernel_base.cpp) for this machine."""
    machine = (machine or platform.machine()).lower()
    if machine in ("x86_64", "amd64"):
        return ["-march=x86-64", "-mtune=generic"]
    if machine in ("aarch64", "arm64"):
        return ["-march=armv8-a"]
    return []


def cxx_command() -> list[str]:
    """The C++ compiler torch's BuildExtension uses (CXX, else Python's configured one)."""
    return shlex.split(os.environ.get("CXX") or sysconfig.get_config_var("CXX") or "c++")


def compile_baseline_object(output: Path, cxx: list[str] | None = None, extra_flags: tuple[str, ...] = ()) -> Path:
    """Compiles csrc/kernel_base.cpp for the baseline target, ignoring CFLAGS / CXXFLAGS."""
    output.parent.mkdir(parents=True, exist_ok=True)
    command = [
        *(cxx or cxx_command()), "-std=c++17", "-fPIC", *COMMON_FLAGS, *extra_flags, *baseline_flags(), f"-I{HERE / 'csrc'}",
        "-c", str(HERE / BASELINE_SOURCE), "-o", str(output),
    ]
    subprocess.run(command, check=True)
    return output


def _extension_setup() -> dict:
    if os.environ.get("SPECDEC_NO_EXTENSION") == "1":
        return {}
    torch = import_torch()
    if torch is None:
        _warn("torch is not importable at build time (install torch first, then `pip install --no-build-isolation .`)")
        return {}
    try:
        from torch.utils.cpp_extension import BuildExtension, CppExtension
    except Exception as exc:
        _warn(f"cannot import torch.utils.cpp_extension ({exc})")
        return {}

    version = re.sub(r"[^0-9A-Za-z.+_-]", "", torch.__version__)
    compile_args = [*COMMON_FLAGS, f"-DSPECDEC_TORCH_VERSION={version}"]
    link_args = []
    runtime = torch_openmp_library(torch)
    if runtime is not None:
        compile_args.append("-DSPECDEC_OPENMP_RUNTIME=1")
        link_args += [runtime, f"-Wl,-rpath,{Path(runtime).parent}"]
    else:
        _warn("no OpenMP runtime found in torch: the kernel spreads work with its thread pool only")

    class OptionalBuildExtension(BuildExtension):
        """build_ext that turns a failed compile into a warning instead of a failed install."""

        def run(self):
            try:
                super().run()
            except Exception as exc:
                _warn(f"building the C++ extension failed ({exc})")

        def build_extension(self, ext):
            try:
                baseline = compile_baseline_object(Path(self.build_temp) / "kernel_base.o")
                ext.extra_objects = [*(ext.extra_objects or []), str(baseline)]
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
        depends=[str(p) for p in sorted((HERE / "csrc").glob("*.h"))] + [str(HERE / BASELINE_SOURCE)],
    )
    return {"ext_modules": [extension], "cmdclass": {"build_ext": OptionalBuildExtension}}


if __name__ == "__main__":
    setup(**_extension_setup())
