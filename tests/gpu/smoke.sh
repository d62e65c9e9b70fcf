#!/usr/bin/env bash
# GPU smoke test, never part of the default run (pytest does not collect tests/gpu): on a machine with
# CUDA, `swarm serve --engine vllm --trainer verl` trains the letters study for 10 steps on the tiny
# preset and, if given, on a local model folder, and prints one line per model in a fixed format:
#
#   RESULT gpu_steps_per_s=<s> weight_sync_s=<s> logprob_diff_max=<x> model=<name> weight_transfer=<kind> steps=<n> logprob_diff_mean=<x>
#
# Usage: bash tests/gpu/smoke.sh [MODEL_DIR] [-- extra `swarm serve` flags, e.g. --weight-transfer disk]
# Needs .venv (bash .ci/setup) and a GPU vLLM in .venv-vllm:
#   python3 -m venv .venv-vllm && .venv-vllm/bin/pip install 'vllm==0.32.*'
# Without CUDA it prints "SKIP: ..." and exits 0. Details: tests/gpu/smoke_run.py.
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=.venv/bin/python
if ! "$PY" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
  echo "SKIP: no CUDA device visible (tests/gpu/smoke.sh needs a GPU)"
  exit 0
fi
args=()
if [ $# -gt 0 ] && [ "$1" != "--" ]; then
  args+=(--model-dir "$1")
  shift
fi
if [ $# -gt 0 ] && [ "$1" = "--" ]; then
  shift
  for flag in "$@"; do args+=(--serve-flag="$flag"); done
fi
nvidia-smi --query-gpu=index,name,memory.total --format=csv,noheader || true
exec "$PY" tests/gpu/smoke_run.py "${args[@]}"
