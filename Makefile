# cpkv: every target sets up what it needs (.venv, Python deps, the maturin build).
.DEFAULT_GOAL := help
SHELL := /bin/bash

VENV    := .venv
PY      := $(VENV)/bin/python
DEPS    := $(VENV)/.deps-installed
BUILT   := $(VENV)/.cpkv-built
RUST_SRC := $(shell find crates -name '*.rs' -o -name Cargo.toml) Cargo.toml pyproject.toml

# Every virtualenv is filled by uv (installed into .venv by pip) from one cache inside the
# repository, hard-linked: the three virtualenvs share one copy of the torch and CUDA libraries
# they have in common (all three about 14 GB on disk instead of 25). A cache on another file
# system (UV_CACHE_DIR set by the caller) still works; uv then copies.
UV_VERSION := 0.13.9
UV         := $(VENV)/bin/uv
export UV_CACHE_DIR ?= $(abspath .uv-cache)
export UV_LINK_MODE ?= hardlink
export UV_SYSTEM_CERTS ?= 1
ifdef PIP_FIND_LINKS
export UV_FIND_LINKS ?= $(PIP_FIND_LINKS)
endif

# The vLLM integration's own virtualenv (vLLM pins its own torch; about 9.5 GB, built once).
VLLM_VENV  := .venv-vllm
VLLM_PY    := $(VLLM_VENV)/bin/python
VLLM_DEPS  := $(VLLM_VENV)/.deps-installed
VLLM_BUILT := $(VLLM_VENV)/.cpkv-built

# The SGLang integration's own virtualenv (SGLang pins its own torch; about 11 GB, built once).
SGLANG_VENV  := .venv-sglang
SGLANG_PY    := $(SGLANG_VENV)/bin/python
SGLANG_DEPS  := $(SGLANG_VENV)/.deps-installed
SGLANG_BUILT := $(SGLANG_VENV)/.cpkv-built

.PHONY: help
help: ## Show this help
	@grep -hE '^[a-zA-Z_-]+:.*## ' $(MAKEFILE_LIST) | \
		awk 'BEGIN {FS = ":.*## "}; {printf "  \033[36m%-12s\033[0m %s\n", $$1, $$2}'

$(UV):
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install --quiet uv==$(UV_VERSION)

# Mooncake's transfer engine (the cluster tier) loads libibverbs.so.1 even over TCP: on Debian,
# installed quietly with apt-get when missing (CI runs as root on a clean machine).
.PHONY: system-deps
system-deps: ## Debian's libibverbs1 for the cluster tier (apt-get, only when missing)
	@ldconfig -p | grep -q 'libibverbs\.so\.1 ' || { \
		test "$$(id -u)" = 0 || { echo "make: libibverbs1 is missing: apt-get install libibverbs1 (as root)" >&2; exit 1; }; \
		DEBIAN_FRONTEND=noninteractive apt-get update -qq >/dev/null && \
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends libibverbs1 >/dev/null; }

$(DEPS): requirements-dev.txt constraints-dev.txt | $(UV) system-deps
	$(UV) pip install --quiet --python $(PY) -r requirements-dev.txt -c constraints-dev.txt
	touch $@

$(BUILT): $(DEPS) $(RUST_SRC)
	rm -f python/cpkv/_cpkv.cpython-*.so  # a version-specific build would shadow the abi3 one
	VIRTUAL_ENV=$(abspath $(VENV)) PATH=$(abspath $(VENV))/bin:$$PATH \
		maturin develop --release --quiet
	touch $@

$(VLLM_DEPS): requirements-vllm.txt constraints-vllm.txt | $(UV) system-deps
	test -x $(VLLM_PY) || python3 -m venv $(VLLM_VENV)
	$(UV) pip install --quiet --python $(VLLM_PY) -r requirements-vllm.txt -c constraints-vllm.txt
	touch $@

$(VLLM_BUILT): $(VLLM_DEPS) $(RUST_SRC)
	VIRTUAL_ENV=$(abspath $(VLLM_VENV)) PATH=$(abspath $(VLLM_VENV))/bin:$$PATH \
		maturin develop --release --quiet
	touch $@

$(SGLANG_DEPS): requirements-sglang.txt constraints-sglang.txt | $(UV) system-deps
	test -x $(SGLANG_PY) || python3 -m venv $(SGLANG_VENV)
	$(UV) pip install --quiet --python $(SGLANG_PY) -r requirements-sglang.txt -c constraints-sglang.txt
	touch $@

$(SGLANG_BUILT): $(SGLANG_DEPS) $(RUST_SRC)
	VIRTUAL_ENV=$(abspath $(SGLANG_VENV)) PATH=$(abspath $(SGLANG_VENV))/bin:$$PATH \
		maturin develop --release --quiet
	touch $@

.PHONY: venv
venv: $(DEPS) ## Create .venv with the Python dependencies

.PHONY: venv-vllm
venv-vllm: $(VLLM_BUILT) ## Create .venv-vllm (vllm==0.33.0) with cpkv built into it

.PHONY: venv-sglang
venv-sglang: $(SGLANG_BUILT) ## Create .venv-sglang (sglang==0.5.23) with cpkv built into it

.PHONY: develop
develop: $(BUILT) ## Build the extension (release) into .venv

.PHONY: run
run: $(BUILT) ## The main job on built-in defaults: cpkv replay
	$(PY) -m cpkv replay

.PHONY: test
test: test-rust test-python test-wheel test-vllm test-sglang ## Every test: cargo (all crates), pytest, the wheel's smoke test, the vLLM and SGLang integrations

.PHONY: test-rust
test-rust: ## cargo tests of every crate
	cargo test --workspace --release

.PHONY: test-python
test-python: $(BUILT) ## pytest
	$(PY) -m pytest -q

WHEEL_DIR  := target/wheels-abi3
WHEEL_VENV := target/wheel-venv

.PHONY: test-wheel
test-wheel: $(DEPS) ## Build the abi3 wheel, install it into a fresh virtualenv, run its smoke test
	rm -rf $(WHEEL_DIR) $(WHEEL_VENV)
	$(VENV)/bin/maturin build --release --quiet -o $(WHEEL_DIR)
	@ls -l $(WHEEL_DIR)/*.whl
	$$($(PY) -c 'import sys; print(sys._base_executable)') -m venv $(WHEEL_VENV)
	@# torch and numpy from the dev venv's site-packages through a .pth (no multi-GB install);
	@# cpkv itself only from the wheel (the smoke test checks where every module comes from).
	$(PY) -c 'import os, numpy, torch; print(os.path.dirname(os.path.dirname(torch.__file__))); \
		print(os.path.dirname(os.path.dirname(numpy.__file__)))' \
		> $$(echo $(WHEEL_VENV)/lib/python3*/site-packages)/dev-deps.pth
	@# What site-packages holds before the install: the smoke test checks that only cpkv was added.
	ls -A $$(echo $(WHEEL_VENV)/lib/python3*/site-packages) > $(WHEEL_VENV)/site-packages-before.txt
	$(WHEEL_VENV)/bin/python -m pip install --quiet --no-index --no-deps $(WHEEL_DIR)/*.whl
	cd $(WHEEL_VENV) && env -u PYTHONPATH bin/python $(abspath tests/wheel_smoke.py) site-packages-before.txt

.PHONY: test-vllm
test-vllm: $(VLLM_BUILT) ## The vLLM integration tests, in .venv-vllm
	$(VLLM_PY) -m pytest -q tests_vllm

.PHONY: test-sglang
test-sglang: $(SGLANG_BUILT) ## The SGLang HiCache integration tests, in .venv-sglang
	PATH=$(abspath $(SGLANG_VENV))/bin:$$PATH $(SGLANG_PY) -m pytest -q tests_sglang

.PHONY: bench
bench: $(BUILT) ## Every Python benchmark (cpkv against its baseline)
	$(PY) -m cpkv bench allocator
	$(PY) -m cpkv bench evict
	$(PY) -m cpkv bench compose
	$(PY) -m cpkv bench tree-memory
	$(PY) -m cpkv bench tier

.PHONY: gpu-check
gpu-check: $(BUILT) ## On a GPU machine: every CUDA test and GPU bench, one verdict table (< 10 min; says so without a GPU)
	$(PY) -m cpkv.gpu_check

.PHONY: bench-rust
bench-rust: ## criterion benches of every crate
	cargo bench --workspace

.PHONY: lint
lint: $(DEPS) ## cargo fmt and clippy, ruff and mypy: all clean
	cargo fmt --all --check
	cargo clippy --workspace --all-targets -- -D warnings
	$(VENV)/bin/ruff check python tests tests_vllm tests_sglang kernels
	$(PY) -m mypy

# Not part of lint: vLLM 0.33.0's own types find 12 errors in integrations/vllm/manager.py (keys typed
# bytes where vLLM declares OffloadKey), and SGLang 0.5.23 ships no py.typed, so its names stay Any.
.PHONY: typecheck-engines
typecheck-engines: $(DEPS) $(VLLM_BUILT) $(SGLANG_BUILT) ## mypy over each engine adapter against its engine's installed code
	status=0; \
	$(PY) -m mypy --python-executable $(VLLM_PY) --cache-dir .mypy_cache/vllm python/cpkv/integrations/vllm || status=1; \
	$(PY) -m mypy --python-executable $(SGLANG_PY) --cache-dir .mypy_cache/sglang python/cpkv/integrations/sglang || status=1; \
	exit $$status

.PHONY: clean
clean: ## Remove build outputs, the virtualenvs and uv's cache
	rm -rf target $(VENV) $(VLLM_VENV) $(SGLANG_VENV) .uv-cache
