"""Benchmarks of specdec_ext: the microbenchmark grid (``python -m bench``, bench/micro.py), the
pytest-benchmark suite (``pytest bench/``) and the one-call GPU suite (bench/gpu_suite.sh)."""


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``python -m bench`` (argv without the program name); returns the exit status."""
    from .__main__ import main as run_main

    return run_main(argv)
