# Two commands for a fresh machine:  `make demo` (set up, then run the demo) and `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# The CPU wheel of torch: a bare `torch` requirement would pull a multi-GB CUDA build.
TORCH_SPEC ?= torch==2.13.0

.PHONY: setup demo test bench lint

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml setup.py $(wildcard csrc/*.cpp csrc/*.h)
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip setuptools wheel ninja
	$(BIN)/pip install --quiet "$(TORCH_SPEC)"
	$(BIN)/pip install --quiet --no-build-isolation -e ".[test]"
	touch $@

demo: setup
	$(BIN)/specdec demo

test: setup
	$(BIN)/python -m pytest -q tests

bench: setup
	$(BIN)/python -m bench

lint: setup
	$(BIN)/ruff check specdec_ext triton_kernels tests bench
