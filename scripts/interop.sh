#!/usr/bin/env bash
# `make interop`: serve our exported EAGLE-3 drafter with a real engine (vLLM, CPU build) and
# check it against our own numbers. vLLM is installed in .venv beside specdraft (`make venv`).
#
#   scripts/interop.sh                      # build an untrained drafter, run all checks
#   scripts/interop.sh --drafter DIR -k 3   # any arguments go to benchmarks/interop_vllm.py
#
# Steps: (1) build a drafter if none is given, and measure OUR acceptance length with in-process
# greedy chain speculation; (2) in child processes: plain / n-gram / eagle3 in vLLM, greedy
# equality, vLLM's acceptance counters. Result: benchmarks/results/interop_vllm.json.
set -euo pipefail
cd "$(dirname "$0")/.."

VENV=${VENV:-.venv}
test -x "$VENV/bin/python" || { echo "interop: $VENV missing; run 'make venv' first" >&2; exit 2; }
"$VENV/bin/python" -c "import vllm" 2>/dev/null || { echo "interop: vLLM is not installed in $VENV; run 'make venv'" >&2; exit 2; }
exec "$VENV/bin/python" benchmarks/interop_vllm.py --vllm-python "$VENV/bin/python" "$@"
