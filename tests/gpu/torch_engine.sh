#!/usr/bin/env bash
# The embedded torch engine on one GPU (see torch_engine.py for what it measures and its RESULT lines).
# Run from the repository root: `bash tests/gpu/torch_engine.sh [OUT_DIR]`. Without a CUDA device it
# prints SKIP and exits 0.
#
# On a machine that has torch with CUDA but not this project's other dependencies, put cp312 wheels of
# them in $GPU_WHEELS (default .gpu/whl; the list is in README's GPU section); they are installed into a
# scratch folder first. verl imports Ray when its algorithms load: Ray must be importable (where its
# wheel cannot travel, a stand-in module on $GPU_EXTRA_PATH can serve for this check only).
set -euo pipefail
PYTHON="${PYTHON:-python3}"
OUT_DIR="${1:-${OUT:-gpu-out}}"
if ! "$PYTHON" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; then
  echo "SKIP: no CUDA device (torch_engine.sh measures the torch engine on a GPU)"
  exit 0
fi
mkdir -p "$OUT_DIR"
WHEELS="${GPU_WHEELS:-.gpu/whl}"
if compgen -G "$WHEELS/*.whl" > /dev/null; then
  "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/swarm-gpu-site \
    "$WHEELS"/*.whl > "$OUT_DIR/pip.log" 2>&1 || { tail -20 "$OUT_DIR/pip.log"; exit 1; }
  export PYTHONPATH="/tmp/swarm-gpu-site:${PYTHONPATH:-}"
fi
export PYTHONPATH="${GPU_EXTRA_PATH:+$GPU_EXTRA_PATH:}$PWD:${PYTHONPATH:-}"
export HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1 MLFLOW_DISABLE_TELEMETRY=true TOKENIZERS_PARALLELISM=false
nvidia-smi --query-gpu=name,memory.total,memory.used --format=csv,noheader || true
timeout "${CHECK_S:-420}" "$PYTHON" tests/gpu/torch_engine.py "$OUT_DIR" ${MODELS:-} 2>&1 | tee "$OUT_DIR/check.log" \
  | grep -v "Loading weights\|Writing model"
