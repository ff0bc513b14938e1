#!/usr/bin/env bash
# The GPU kit: one short lease (≤ 8 minutes: 7 for the probes, ~1 for the allocator replay; PEAKS=1 adds ~1 for the
# peak blocks when the lease has room), most valuable first — the OOM-boundary sweep sized for this GPU, the cells no
# GPU has measured, a solo-vs-shared check, then the rest of the matrix, several small probes at once when the check
# agreed (hpcmem/probe/kit.py says how). Usage (from the project root, with the [train] extras installed):
#   estimator/gpu/run_matrix.sh                     # records → estimator/probes/<gpu>.jsonl
#   OUT=/some/dir estimator/gpu/run_matrix.sh       # records → $OUT/probes.jsonl (bring them back, then append)
#   estimator/gpu/run_matrix.sh --only-steps boundary --budget-s 200     # a step only; --skip-done continues a lease
#   .venv/bin/python -m hpcmem.probe.kit --dry-run --gpu H100-80GB       # the schedule, without a GPU
# Every case is one `hpcmem probe` process (random weights from the offline catalog config, no download).
# Afterwards: hpcmem validate --against boundary --records $OUT/probes.jsonl   (false fits / false refusals)
set -euo pipefail
cd "$(dirname "$0")/../.."
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
export TORCH_EXTENSIONS_DIR="${TORCH_EXTENSIONS_DIR:-$PWD/.torch_extensions}"
unset PYTORCH_CUDA_ALLOC_CONF PYTORCH_ALLOC_CONF   # cases that want expandable_segments set it themselves
PY="${PYTHON:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3 )}"
args=(--device "${DEVICE:-cuda}" --budget-s "${BUDGET_S:-420}")
if [ -n "${OUT:-}" ]; then mkdir -p "$OUT"; args+=(--out "$OUT/probes.jsonl"); fi
nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used --format=csv 2>/dev/null || true
"$PY" -m hpcmem.probe.kit "${args[@]}" "$@"
# Then (~1 min, REPLAY=0 skips it): the caching-allocator model against the real allocator on the very streams it
# was scored with — each stored H200 record's traced device stream (estimator/allocator/nvidia-h200/) re-issued with
# torch.empty on this GPU, default and expandable_segments, torch's peaks printed next to the model's, one JSON line
# per stream (hpcmem.bench.allocator_records --cuda-replay). Then the full fine-tuning streams once more in each
# mode, with one 2 MiB or 8 MiB tensor before the weights (--perturb; "perturb_bytes" in each line): in the model
# that moves their reserved peak by up to ±6 % under the default allocator (whether step 2 maps the LM head's [V, H]
# gradient again, the estimate's reserved spread) and by at most 18 MiB under expandable segments; the GPU's peaks
# on the same streams say whether the real allocator behaves alike.
# Read them back: python -m hpcmem.bench.allocator_records --read $OUT/allocator-cuda-replay.jsonl
# REPLAY_TRACE=1 also traces one case here and replays it (hpcmem.bench.allocator_sim), the older check.
FULL_STREAMS=sft-qwen05-full,sft-qwen05-full-fp32load,sft-qwen05-pack-bfd,sft-llama1b-sac
FULL_STREAMS+=,sft-llama1b-expandable,dpo-qwen05-full,grpo-qwen05-full,sft-llama8b-full
if [ "${REPLAY:-1}" = 1 ] && [ "${DEVICE:-cuda}" = cuda ]; then
  out="${OUT:-/tmp}/allocator-cuda-replay.jsonl"
  { "$PY" -m hpcmem.bench.allocator_records --cuda-replay
    PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True "$PY" -m hpcmem.bench.allocator_records --cuda-replay
    "$PY" -m hpcmem.bench.allocator_records --cuda-replay --perturb 2097152,8388608 --only "$FULL_STREAMS"
    PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True \
      "$PY" -m hpcmem.bench.allocator_records --cuda-replay --perturb 2097152,8388608 --only "$FULL_STREAMS"
  } | tee "$out"
fi
# Then, with PEAKS=1 (~1 min; off by default: it explains 3.5–14 MiB, the replays above a ±6 % question): what the
# GPU holds at its allocated peak that the CPU trace does not — the DPO, GRPO and RLOO Qwen2.5-0.5B LoRA records hold one bf16 [rows × seq, H] more at the backward peak than their traced
# streams (13.8 / 5.2 / 3.5 MiB), SFT on the same model none. Each job runs once more with torch's allocation history
# on; the blocks live at the peak, with the trl/peft/transformers/torch frames that allocated them, one JSON line per
# case (hpcmem.bench.peak_blocks). Read them back: python -m hpcmem.bench.peak_blocks --read $OUT/peak-blocks.jsonl
if [ "${PEAKS:-0}" = 1 ] && [ "${DEVICE:-cuda}" = cuda ]; then
  "$PY" -m hpcmem.bench.peak_blocks --out "${OUT:-/tmp}/peak-blocks.jsonl" > /dev/null || true
fi
if [ "${REPLAY_TRACE:-0}" = 1 ] && [ "${DEVICE:-cuda}" = cuda ]; then
  events="${OUT:-/tmp}/allocator-events.json"
  "$PY" -m hpcmem.bench.allocator_sim --ids "${REPLAY_CASE:-qwen05-bf16-gc-2k}" --dump "$events"
  { "$PY" -m hpcmem.bench.allocator_sim --replay "$events"
    PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True "$PY" -m hpcmem.bench.allocator_sim --replay "$events"
  } | tee "${OUT:-/tmp}/allocator-replay.txt"
fi
