"""Benchmarks of specdec_ext, run from a source checkout (bench/ is not installed).

* ``python -m bench`` (bench/micro.py, micro_report.py): the verification / sampling microbenchmark
  grid; ``pytest bench/``: the same calls under pytest-benchmark; bench/gpu_suite.sh: the one-call
  GPU suite;
* ``python -m bench.<name>``: ``bench_cpp`` (the C++ kernel), ``host_overhead`` (host time per call),
  ``e2e`` / ``e2e_runs`` / ``e2e_tree`` (end to end), ``vllm_e2e`` (vLLM with the plugin),
  ``gpu_model`` (an H200 estimate from compiled code);
* bench/harness/: what they share (timing, baselines, environment, result files);
* bench/experiments/: past studies, kept with the results they wrote.
"""


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``python -m bench`` (argv without the program name); returns the exit status."""
    from .__main__ import main as run_main

    return run_main(argv)
