#!/usr/bin/env bash
# The GPU kit: run the representative probe matrix on one GPU within one short lease (≤ 8 minutes) and write the
# records. Usage (from the project root, with the [train] extras installed):
#   estimator/gpu/run_matrix.sh                     # records → estimator/probes/<gpu>.jsonl
#   OUT=/some/dir estimator/gpu/run_matrix.sh       # records → $OUT/probes.jsonl (bring them back, then append)
#   estimator/gpu/run_matrix.sh --only sft-qwen05-full,dpo-qwen05-lora --budget-s 120
# Every case is one `hpcmem probe` process (random weights from the offline catalog config, no download).
set -euo pipefail
cd "$(dirname "$0")/../.."
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
export TORCH_EXTENSIONS_DIR="${TORCH_EXTENSIONS_DIR:-$PWD/.torch_extensions}"
unset PYTORCH_CUDA_ALLOC_CONF PYTORCH_ALLOC_CONF   # cases that want expandable_segments set it themselves
PY="${PYTHON:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3 )}"
args=(--device "${DEVICE:-cuda}" --budget-s "${BUDGET_S:-480}")
if [ -n "${OUT:-}" ]; then mkdir -p "$OUT"; args+=(--out "$OUT/probes.jsonl"); fi
nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used --format=csv 2>/dev/null || true
exec "$PY" -m hpcmem.probe.matrix "${args[@]}" "$@"
