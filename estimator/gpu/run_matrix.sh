#!/usr/bin/env bash
# The GPU kit: one short lease, most valuable first — the OOM-boundary sweep sized for this GPU, the cells no GPU has
# measured, a solo-vs-shared check, then the rest of the matrix (every probe also times its steps for the planner),
# several small probes at once when the check agreed (hpcmem/lab/kit.py says how); then the allocator replays.
# Usage (from the project root):
#   estimator/gpu/run_matrix.sh                     # records → estimator/probes/<gpu>.jsonl
#   OUT=/some/dir estimator/gpu/run_matrix.sh       # everything → $OUT (bring it back, then append the records)
#   estimator/gpu/run_matrix.sh --only-steps boundary --budget-s 200     # a step only
#   cp .kitprev/probes.jsonl "$OUT"/ && REPLAY=0 estimator/gpu/run_matrix.sh --skip-done   # a second lease goes on
#     where the first stopped: its records carried along (.kitprev, named in carry), cases with a record skipped
#   KIT_DRY=1 OUT=/tmp/dry estimator/gpu/run_matrix.sh   # no GPU: every step's command lines and files (below)
# On a leased machine with no package registry (the H200 image has torch, transformers, peft and accelerate, not
# trl or datasets, and not the project's versions): fetch the wheels once on a machine with one
# (estimator/gpu/wheels.sh → .whl/, ignored by git, ~16 MB), then carry .whl along; this script installs them into
# /tmp/hpcmem-site first. With this workplace's device tool: run(command="estimator/gpu/run_matrix.sh",
# carry=[".whl"], timeout_s=540) — $OUT is set there, and what lands in it comes back (8 files at most; this kit
# writes 5: kit.log, probes.jsonl, its .summary.json, allocator-cuda-replay.jsonl, peak-blocks.jsonl; 7 with
# REPLAY_TRACE=1).
#
# Time plan (KIT_TOTAL_S, default 420 s = 7 min: a minute short of the 8 the lease's command should take, and run's
# timeout_s of 540 s stops a hang well inside the 10-minute limit): wheels ~10 s, import check ~10 s, GPU detection
# ~10 s, then the probes get what is left after reserving REPLAY_S (default 90 s) for the replays and 15 s for
# detection — about 285 s: the boundary sweep 60 % (5-6 runs of ~32 s), the new cells 35 % (the first two,
# a 30 B MoE load among them), the rest in priority order (the solo-vs-shared check only when all three of its runs fit; in 285 s, one rest
# case) — then the replays, each cut off at the deadline (`timeout`), smallest streams first. --budget-s or BUDGET_S
# overrides the probes' share. Every step writes to $OUT as it ends: each probe its record, the kit its summary after
# each of its steps, the replays one JSON line per stream, kit.log the whole console with each step's time, so a lease
# cut short still brings back what ran. One step failing never stops the next (no `set -e`); the exit status says
# whether any did.
# Afterwards: hpcmem validate boundary --records $OUT/probes.jsonl   (false fits / false refusals)
#
# KIT_DRY=1: no GPU needed. The kit prints its schedule for KIT_DRY_GPU (default H200) and checks every probe's
# command line against today's `hpcmem probe` (python -m hpcmem.lab.kit --dry-run) into $OUT/kit-schedule.json;
# the replays run through estimator/gpu/dry_cuda.py, which stubs torch.cuda alone (their numbers are no GPU's);
# PEAKS=1's step, which trains, is checked for its imports and options only. KIT_DRY=cpu runs the kit's probes for
# real on this CPU with shrunk models instead of printing the schedule (--device cpu --tiny: minutes).
# REPLAY_ONLY=case,… limits the replays to those streams (a quick dry run).
set -uo pipefail
cd "$(dirname "$0")/../.."
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PYTHONUNBUFFERED=1
export TORCH_EXTENSIONS_DIR="${TORCH_EXTENSIONS_DIR:-$PWD/.torch_extensions}"
unset PYTORCH_CUDA_ALLOC_CONF PYTORCH_ALLOC_CONF   # cases that want expandable_segments set it themselves
PY="${PYTHON:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3 )}"
DRY="${KIT_DRY:-0}"
TOTAL_S="${KIT_TOTAL_S:-420}"
REPLAY_S="${REPLAY_S:-90}"
dest="${OUT:-/tmp}"
mkdir -p "$dest"
exec > >(tee -a "$dest/kit.log") 2>&1
start=$SECONDS
failed=()
note() { echo "== kit: $* at $((SECONDS - start)) s" >&2; }
left() { echo $((TOTAL_S - (SECONDS - start))); }
# a step that runs on the GPU: the real python there, the torch.cuda stub in a dry run
if [ "$DRY" = 0 ]; then PYCUDA=("$PY"); else PYCUDA=("$PY" estimator/gpu/dry_cuda.py); fi

note "start (plan: ${TOTAL_S} s in all, ${REPLAY_S} s of it for the replays; dry=${DRY})"
if compgen -G ".whl/*.whl" > /dev/null; then
  site="${KIT_SITE:-/tmp/hpcmem-site}"
  pip=("$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$site")
  if [ "$DRY" != 0 ]; then   # a dry run checks that the set installs on the image's Python, and uses its own
    if "${pip[@]}" --only-binary=:all: --python-version 3.12 .whl/*.whl; then note "wheels install (Python 3.12)"
    else failed+=(wheels); note "wheels: the set does not install on Python 3.12"; fi
  elif "${pip[@]}" .whl/*.whl; then export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"; note "wheels installed"
  else failed+=(wheels); note "wheels: install failed (the import check says what is missing)"; fi
fi
nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used --format=csv 2>/dev/null || true
"$PY" -c "import importlib.metadata as m; print(' '.join(p + ' ' + m.version(p) for p in
  ('torch', 'transformers', 'trl', 'peft', 'accelerate', 'datasets')))" || true

# 1. the probes: the boundary sweep, the new cells, the solo-vs-shared check, the rest (hpcmem.lab.kit)
args=(--device "${DEVICE:-cuda}")
[ -n "${OUT:-}" ] && args+=(--out "$OUT/probes.jsonl")
[ "$DRY" = cpu ] && args=(--device cpu --tiny ${OUT:+--out "$OUT/probes.jsonl"})
stack=ok
"$PY" -c "import torch, transformers, trl, peft, accelerate, datasets, hpcmem.lab.kit" || stack=missing
if [ "$DRY" = 1 ]; then
  [ "$stack" = ok ] || failed+=(imports)
  "$PY" -m hpcmem.lab.kit --dry-run --gpu "${KIT_DRY_GPU:-H200}" "$@" > "$dest/kit-schedule.json" \
    || failed+=(probes)
  note "probes: schedule and command lines → $dest/kit-schedule.json"
elif [ "$stack" != ok ]; then
  failed+=(probes)
  note "probes skipped: TRL's stack does not import here (carry .whl: estimator/gpu/wheels.sh)"
else
  reserve=$([ "${REPLAY:-1}" = 1 ] && echo "$REPLAY_S" || echo 0)
  budget="${BUDGET_S:-$(( $(left) - reserve - 15 ))}"   # 15 s: the kit's GPU detection, before its clock starts
  note "probes: budget ${budget} s (a --budget-s given here overrides it)"
  "$PY" -m hpcmem.lab.kit "${args[@]}" --budget-s "$budget" "$@" || failed+=(probes)
fi
note "probes done"

# 2. (~1 min, REPLAY=0 skips it): the caching-allocator model against the real allocator on the very streams it was
# scored with — each stored H200 record's traced device stream (estimator/allocator/nvidia-h200/) re-issued with
# torch.empty on this GPU, default and expandable_segments, torch's peaks per step, one JSON line per stream
# (hpcmem.lab.allocator_records --cuda-replay --gpu-only: the model's side of each line, ~40 % of a pass's time, is
# replayed here when the lines are read back, not on the lease). After each plain pass, the full fine-tuning streams
# once more in that mode, with one 2 MiB or 8 MiB tensor before the weights (--perturb; "perturb_bytes" in each line):
# in the model that moves their reserved peak by up to ±6 % under the default allocator (whether step 2 maps the LM
# head's [V, H] gradient again, the estimate's reserved spread) and by at most 18 MiB under expandable segments; the
# GPU's peaks on the same streams say whether the real allocator behaves alike. Each run stops at the kit's deadline.
# Read them back: python -m hpcmem.lab.allocator_records --read $OUT/allocator-cuda-replay.jsonl
# REPLAY_TRACE=1 also traces one case here and replays it (hpcmem.lab.allocator_sim), the older check.
FULL_STREAMS=sft-qwen05-full,sft-qwen05-full-fp32load,sft-qwen05-pack-bfd,sft-llama1b-sac
FULL_STREAMS+=,sft-llama1b-expandable,dpo-qwen05-full,grpo-qwen05-full,sft-llama8b-full
bounded() {   # bounded NAME CMD…: run CMD until the deadline; a step with under 10 s left is skipped
  local name=$1 t; shift
  t=$(left)
  if [ "$t" -lt 10 ]; then note "$name skipped: ${t} s left"; failed+=("$name"); return; fi
  if timeout -k 5 "$t" "$@"; then note "$name done"; else note "$name: exit $?"; failed+=("$name"); fi
}
if [ "${REPLAY:-1}" = 1 ] && [ "${DEVICE:-cuda}" = cuda ]; then
  out="$dest/allocator-cuda-replay.jsonl"
  plain=(--cuda-replay --gpu-only ${REPLAY_ONLY:+--only "$REPLAY_ONLY"})
  perturb=(--cuda-replay --gpu-only --perturb 2097152,8388608 --only "${REPLAY_ONLY:-$FULL_STREAMS}")
  # the default allocator first: its ±6 % question is the one the estimate's spread rests on
  bounded replay-default "${PYCUDA[@]}" -m hpcmem.lab.allocator_records "${plain[@]}" >> "$out"
  bounded perturb-default "${PYCUDA[@]}" -m hpcmem.lab.allocator_records "${perturb[@]}" >> "$out"
  PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True \
    bounded replay-expandable "${PYCUDA[@]}" -m hpcmem.lab.allocator_records "${plain[@]}" >> "$out"
  PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True \
    bounded perturb-expandable "${PYCUDA[@]}" -m hpcmem.lab.allocator_records "${perturb[@]}" >> "$out"
  note "replays: $(wc -l < "$out") lines → $out"
fi
# 3. With PEAKS=1 (~1 min; off by default — raise KIT_TOTAL_S or lower BUDGET_S to make room: it explains 3.5–14
# MiB, the replays above a ±6 % question): what the GPU holds at its allocated peak that the CPU trace does not — the
# DPO, GRPO and RLOO Qwen2.5-0.5B LoRA records hold one bf16 [rows × seq, H] more at the backward peak than their
# traced streams (13.8 / 5.2 / 3.5 MiB), SFT on the same model none. Each job runs once more with torch's allocation
# history on; the blocks live at the peak, with the trl/peft/transformers/torch frames that allocated them, one JSON
# line per case (hpcmem.lab.peak_blocks). Read them back: python -m hpcmem.lab.peak_blocks --read
# $OUT/peak-blocks.jsonl. A dry run cannot stub a training run at the torch.cuda boundary: it checks the options.
if [ "${PEAKS:-0}" = 1 ] && [ "${DEVICE:-cuda}" = cuda ]; then
  if [ "$DRY" = 0 ]; then
    bounded peaks "$PY" -m hpcmem.lab.peak_blocks --out "$dest/peak-blocks.jsonl" > /dev/null
  else
    bounded peaks "$PY" -m hpcmem.lab.peak_blocks --help > /dev/null
  fi
fi
if [ "${REPLAY_TRACE:-0}" = 1 ] && [ "${DEVICE:-cuda}" = cuda ]; then
  events="$dest/allocator-events.json"
  bounded trace "$PY" -m hpcmem.lab.allocator_sim --ids "${REPLAY_CASE:-qwen05-bf16-gc-2k}" --dump "$events"
  { bounded trace-replay "${PYCUDA[@]}" -m hpcmem.lab.allocator_sim --replay "$events"
    PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True \
      bounded trace-replay-expandable "${PYCUDA[@]}" -m hpcmem.lab.allocator_sim --replay "$events"
  } > "$dest/allocator-replay.txt"
fi
note "end; failed steps: ${failed[*]:-none}"
[ ${#failed[@]} -eq 0 ]
