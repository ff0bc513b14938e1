"""Qwen2.5-VL-7B-Instruct with images on an H200 (estimator/probes/nvidia-h200.jsonl, the 2026-12-04 lease: the
probe's real TRL trainers at full size): SFT with LoRA + checkpointing (2 rows, one 1024 × 768 image each) and full
fine-tuning without checkpointing (1 row, two 896 × 672 images), DPO with LoRA (1 pair, 1024 × 768) and GRPO with LoRA
(4 generations, 448 × 448). The estimate was committed before the runs (out of sample); the image
tokens are the processor's, so the run and the estimate see the same sequence."""

from __future__ import annotations

from pathlib import Path

import pytest

from hpcmem.estimate import estimate
from hpcmem.record import read_records
from hpcmem.validate.probes import record_job

ROOT = Path(__file__).resolve().parents[2]
CASES = ("sft-qwen25vl7b-lora-img", "sft-qwen25vl7b-full-img-nogc", "dpo-qwen25vl7b-lora-img",
         "grpo-qwen25vl7b-lora-img")
RECORDS = {r.case: r for r in read_records(ROOT / "estimator" / "probes" / "nvidia-h200.jsonl") if r.case in CASES}


@pytest.mark.parametrize("case", CASES)
def test_qwen25_vl_7b_with_images_on_an_h200(case):
    rec = RECORDS[case]
    assert rec.status == "ok" and rec.job["train"]["images_per_example"] >= 1
    est = estimate(record_job(rec))
    assert est.to_json()["vision"]                                 # the tower is its own part of the estimate
    for peak, predicted, tol in (("allocated", est.peak_allocated_bytes, 1.0), ("reserved", est.peak_reserved_bytes,
                                                                                 1.5), ("device", est.device_peak_bytes,
                                                                                        1.5)):
        measured = rec.measured.peak(peak)
        assert abs(predicted / measured - 1) * 100 <= tol, (peak, predicted, measured)
