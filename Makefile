# Two commands for a fresh machine:  `make demo` (set up, then run the demo) and `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# The CPU wheel of torch: a bare `torch` requirement would pull a multi-GB CUDA build.
TORCH_SPEC ?= torch==2.13.0
# Root installs packages directly; anyone else through sudo (CI images run as root).
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
# The vLLM plugin's tests run in an environment of their own: vllm==0.33.0 pins the CUDA build of torch 2.14
# (about 10 GB; it imports and its sampler classes run on CPU), which must never reach .venv.
VLLM_VENV := .venv-vllm
VLLM_SPEC ?= vllm==0.33.0
# The torch, torchvision and torchaudio that vllm==0.33.0 requires (its metadata's Requires-Dist).
VLLM_TORCH_SPEC ?= torch==2.14.0 torchvision==0.29.0 torchaudio==2.11.0
VLLM_BIN := $(VLLM_VENV)/bin
# The package is installed there from a copy of the sources, so the C++ extension is compiled against that
# torch in a build folder of its own (the source tree keeps .venv's library).
VLLM_SRC := build/vllm-src
# The C++ tests of the extension, run again on the clang build (test-clang): chains, sampling, the
# op, keys, penalties, and trees and blocks (the same extension).
CPP_TESTS := tests/cpp/test_cpp_backend.py tests/cpp/test_cpp_runtime.py tests/cpp/test_ops.py tests/exactness/test_request_keys.py tests/cpp/test_penalties_cpp.py \
	tests/cpp/test_cpp_tree_block.py tests/triton/test_tree_backends.py tests/api/test_tree_api.py tests/api/test_block_api.py

# The oldest Triton and transformers the package supports (pyproject.toml: triton>=3.6, transformers>=5.17; the
# GPU image's versions) beside .venv's torch wheel (its CPU build requires no Triton); the source tree and .venv's
# C++ extension (the same torch) are tested there as they are.
OLDEST_VENV := .venv-oldest
OLDEST_SPEC ?= triton==3.6.0 transformers==5.17.0

# The suites run on every core, four workers at most (pytest-xdist; `make test WORKERS="-n 0"` runs them in one process).
WORKERS ?= -n auto --maxprocesses 4

.PHONY: setup demo test test-slow bench lint ci-tools test-kernels test-clang test-vllm test-oldest

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml setup.py $(wildcard csrc/*.cpp csrc/*.h)
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip setuptools wheel ninja
	$(BIN)/pip install --quiet "$(TORCH_SPEC)"
	# --no-build-isolation: the C++ extension is compiled against the torch installed just above.
	$(BIN)/pip install --quiet --no-build-isolation -e ".[test]"
	touch $@

demo: setup
	$(BIN)/specdec demo

test: setup
	$(BIN)/python -m pytest -q $(WORKERS) -m "not slow" --durations=15 tests

# Long statistical runs that repeat the default suite's checks on more shapes and settings (CI runs them).
test-slow: setup
	$(BIN)/python -m pytest -q $(WORKERS) -m slow --durations=10 tests

bench: setup
	$(BIN)/python -m bench

lint: setup
	$(BIN)/ruff check specdec_ext triton_kernels tests bench

# Debian / Ubuntu packages for the compiler checks: clang, the aarch64 cross compiler and qemu-user.
ci-tools:
	$(SUDO) apt-get update -qq
	$(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
		g++ clang g++-aarch64-linux-gnu libc6-dev-arm64-cross qemu-user binutils >/dev/null

# The kernel loops without torch (csrc/tests): GCC and clang natively (AVX-512 also on scalar
# stand-ins of its intrinsics), and the aarch64 cross build under qemu-user, checked for NEON code.
test-kernels:
	csrc/tests/run_kernel_tests.sh g++ build/kernel-tests/gcc
	csrc/tests/run_kernel_tests.sh clang++ build/kernel-tests/clang
	csrc/tests/run_kernel_tests.sh aarch64-linux-gnu-g++ build/kernel-tests/aarch64 qemu-aarch64 -L /usr/aarch64-linux-gnu

# The extension built with clang (one OpenMP runtime: torch's), then its tests; the GCC build is
# put back afterwards.
test-clang: setup
	mkdir -p build/gcc-so && cp specdec_ext/_C.*.so build/gcc-so/
	CC=clang CXX=clang++ LDSHARED="clang++ -shared" $(BIN)/python setup.py -q build_ext --inplace -b build/clang -t build/clang/tmp
	$(BIN)/python -c "import torch; from specdec_ext import _cpp_backend as c; assert c.is_available(), c.unavailable_reason(); \
		assert c._C.compiler().startswith('clang'), c._C.compiler(); assert c._C.openmp_linked(); \
		cpu = torch.backends.cpu.get_cpu_capability(); assert c.isa() != 'base' or cpu not in ('AVX2', 'AVX512'), (c.isa(), cpu); \
		print('clang build:', c._C.compiler(), c.isa(), 'on a', cpu, 'CPU')"
	! readelf -d specdec_ext/_C.*.so | grep -E 'NEEDED.*lib(omp|iomp5)\.'
	$(BIN)/python -m pytest -q $(CPP_TESTS) -k "not triton"; status=$$?; cp build/gcc-so/_C.*.so specdec_ext/; exit $$status

# vLLM's environment, then this package built and installed into it, then tests/vllm/ on CPU tensors.
# Installed in two steps with no pip cache: the wheels one pip command downloads stay on disk until it ends, so
# torch and its CUDA libraries (vllm's pins) go first and their wheels are gone before vllm's own arrive.
$(VLLM_VENV)/.vllm-installed:
	$(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_BIN)/pip install --quiet --no-cache-dir --upgrade pip setuptools wheel ninja
	$(VLLM_BIN)/pip install --quiet --no-cache-dir $(VLLM_TORCH_SPEC)
	$(VLLM_BIN)/pip install --quiet --no-cache-dir "$(VLLM_SPEC)" "pytest>=8" "scipy>=1.11" "hypothesis>=6.100" "matplotlib>=3.8"
	touch $@

$(VLLM_VENV)/.installed: $(VLLM_VENV)/.vllm-installed pyproject.toml setup.py README.md $(wildcard csrc/*.cpp csrc/*.h specdec_ext/*.py specdec_ext/*/*.py specdec_ext/*/*/*.py triton_kernels/*.py)
	rm -rf $(VLLM_SRC) && mkdir -p $(VLLM_SRC)
	cp -r pyproject.toml setup.py README.md csrc specdec_ext triton_kernels $(VLLM_SRC)/
	find $(VLLM_SRC) \( -name '*.so' -o -name __pycache__ \) -prune -exec rm -rf {} +
	$(VLLM_BIN)/pip install --quiet --no-build-isolation --no-deps --force-reinstall $(VLLM_SRC)
	touch $@

# The pytest script (not `python -m pytest`) keeps the repository root off sys.path: the installed copy is tested.
# Then every Triton kernel variant compiled for sm_90 by the Triton that torch 2.14 installs there (3.8: the key
# windows on, as with 3.9), its loops checked against the GPU model (the source tree's, C++ kernel unused).
test-vllm: $(VLLM_VENV)/.installed
	$(VLLM_BIN)/pytest -q -p no:cacheprovider --durations=10 tests/vllm
	TRITON_INTERPRET=0 $(VLLM_BIN)/python tests/support/triton_compile_check.py

$(OLDEST_VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(OLDEST_VENV)
	$(OLDEST_VENV)/bin/pip install --quiet --upgrade pip
	$(OLDEST_VENV)/bin/pip install --quiet "$(TORCH_SPEC)" $(OLDEST_SPEC) "tokenizers>=0.21" "safetensors>=0.4" "tqdm>=4.66" "numpy>=1.26" \
		"matplotlib>=3.8" "pytest>=8" "pytest-benchmark>=4" "pytest-xdist>=3.5" "scipy>=1.11" "hypothesis>=6.100"
	touch $@

# The default suite again on the oldest supported Triton and transformers, then every kernel variant compiled for
# sm_90 by Triton 3.6 (the GPU image's: no key windows there) and its loops checked against the GPU model.
test-oldest: setup $(OLDEST_VENV)/.installed
	PYTHONPATH=$(CURDIR) $(OLDEST_VENV)/bin/python -m pytest -q $(WORKERS) -p no:cacheprovider -m "not slow" tests
	TRITON_INTERPRET=0 PYTHONPATH=$(CURDIR) $(OLDEST_VENV)/bin/python tests/support/triton_compile_check.py
