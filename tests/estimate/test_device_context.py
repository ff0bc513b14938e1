"""The CUDA context a GPU without its own calibration borrows, and the board reserve a whole-GPU reading adds.

Expected values come from the H200 probe records (NVML readings: device used before the process made its CUDA
context, and device used and torch's reserved at the peak) and from the catalog's sources (NVML's total and torch's
total per GPU), not from hpcmem.estimate.device."""

from __future__ import annotations

import json
from pathlib import Path
from statistics import median

from hpcmem.estimate.device import DEFAULT_CONTEXT_BYTES, board_reserve_seen_by_nvml
from hpcmem.gpus.lookup import gpu_spec

ROOT = Path(__file__).resolve().parents[2]
MIB = 2**20
GIB = 2**30


def _h200_records() -> list[dict]:
    lines = (ROOT / "estimator" / "probes" / "nvidia-h200.jsonl").read_text().splitlines()
    out = []
    for line in lines:
        m = json.loads(line).get("measured") or {}
        if m.get("device_peak_bytes") and m.get("peak_reserved_bytes") and m.get("totals", {}).get("nvml") == "nvml":
            out.append(m)
    return out


def test_the_borrowed_context_is_the_h200_process_own_part():
    records = _h200_records()
    assert len(records) >= 20
    # NVML device used − reserved at the peak, less NVML's device used before the process created its context
    own = [m["device_peak_bytes"] - m["peak_reserved_bytes"] - m["totals"]["device_baseline_bytes"] for m in records]
    assert abs(median(own) - DEFAULT_CONTEXT_BYTES) < MIB
    whole = median(m["device_peak_bytes"] - m["peak_reserved_bytes"] for m in records)
    assert round(whole / MIB) == 1382          # the H200's calibrated context, which keeps the board's reserve


def test_the_h200_baseline_is_what_torch_total_leaves_out():
    # NVML's total of the H200 that made the records (gpus.json memory_bytes) − torch's total (the records'
    # device_info.memory_bytes) is the memory the driver holds before any process: NVML's used at the start
    baseline = {m["totals"]["device_baseline_bytes"] for m in _h200_records()}
    torch_total = {m["device_info"]["memory_bytes"] for m in _h200_records()}
    assert len(baseline) == 1 and torch_total == {150_109_880_320}
    nvml_total = gpu_spec("H200").memory_bytes
    assert abs((nvml_total - torch_total.pop()) - baseline.pop()) < 4 * MIB


def test_a_whole_gpu_reading_adds_the_board_reserve_of_an_uncalibrated_gpu():
    # RTX 4090: nvidia-smi's total 24,564 MiB; torch's total 23.52 GiB in the OOM message kept by gpus.json (the
    # lower end of the 0.01 GiB rounding, to the MiB): 24,564 MiB − 23.515 GiB ≈ 485 MiB
    reserve = board_reserve_seen_by_nvml(gpu_spec("RTX-4090"))
    assert abs(reserve - (24_564 * MIB - 23.515 * GIB)) < 2 * MIB
    # the calibrated H200's context was measured with NVML and already holds its board's reserve
    assert board_reserve_seen_by_nvml(gpu_spec("H200")) == 0
    assert board_reserve_seen_by_nvml(None) == 0


DEVICE_ROW = """
source: {id: s, citation: {url: "https://example.org/post"}, loop: trl, loop_name: SFTTrainer, peak: device, unit: GiB}
defaults: {trainer: sft, settings: {model_name_or_path: Qwen/Qwen2.5-0.5B, max_length: 512}, gpu: H100-80GB}
rows:
  - {id: r1, where: "a whole-GPU reading", measured: 10.0, outcome: ran}
  - {id: r2, where: "the longest length that ran", outcome: ran}
"""


def test_a_published_whole_gpu_reading_is_scored_with_the_board_reserve(tmp_path):
    from hpcmem.estimate import estimate
    from hpcmem.job.trl_config import build_job
    from hpcmem.validate.published import read_file
    from hpcmem.validate.published_score import job_settings, score

    path = tmp_path / "d.yaml"
    path.write_text(DEVICE_ROW)
    reading, outcome = read_file(path)
    job, _ = build_job(reading.trainer, job_settings(reading), gpu=gpu_spec(reading.gpu))
    device = estimate(job).device_peak_bytes
    # H100 80GB: nvidia-smi's total 81,559 MiB; torch's 79.11 GiB in an OOM message, whose 0.01 GiB rounding
    # gpus.json takes at its lower end (79.105 GiB = 81,003.5 MiB, rounded down to the MiB)
    reserve = (81_559 - 81_003) * MIB
    assert abs(score(reading).estimated_gib * GIB - (device + reserve)) < 2 * MIB
    # an outcome row has no reading: held against torch's capacity as the verdict holds it
    assert abs(score(outcome).estimated_gib * GIB - device) < MIB
