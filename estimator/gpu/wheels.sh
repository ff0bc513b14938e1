#!/usr/bin/env bash
# The wheels the GPU kit carries to a machine with no package registry (estimator/gpu/run_matrix.sh installs them
# from .whl/). The H200 image (Python 3.12) holds torch, transformers, peft, accelerate, pyarrow, pandas, xxhash,
# huggingface-hub and tokenizers, but not TRL or datasets, nor datasets' dill and multiprocess; transformers and
# peft are carried at CI's versions so that only torch differs from the CPU runs (as on the 2026-11-29 lease).
# Run once where pip reaches an index, from the project root: estimator/gpu/wheels.sh [DEST, default .whl]
set -euo pipefail
cd "$(dirname "$0")/../.."
dest="${1:-.whl}"
WHEELS=(transformers==5.24.0 trl==1.16.0 peft==0.21.2 datasets==5.2.0 dill==0.4.1 multiprocess==0.70.19)
mkdir -p "$dest"
"${PYTHON:-python3}" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  -d "$dest" "${WHEELS[@]}"
ls -la "$dest"
du -sh "$dest"
