"""Past studies, kept runnable beside the results they wrote (bench/results/README.md), but not
benchmarks to rerun on every change: ``compare_compilers`` (``bench_cpp`` on GCC and clang builds) and
``identity_rate`` (how often two backends give different tokens for the same keys). Run from the
checkout root: ``python -m bench.experiments.<name>``."""
