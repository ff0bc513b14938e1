"""cuBLAS workspaces: the size rule from PyTorch's source, and the H200 probe records that show it.

Known answers: aten/src/ATen/cuda/CublasHandlePool.cpp parseChosenWorkspaceSize() — 4096 KiB × 8 on compute capability
9.0, 4096 KiB × 2 + 16 KiB × 8 elsewhere — times two handles (Python's thread and autograd's device thread).
"""

import json
from pathlib import Path

import pytest

from hpcmem.estimate import estimate
from hpcmem.estimate.names import BLOCK_TAILS as TAILS
from hpcmem.estimate.names import CUBLAS_WORKSPACES as NAME
from hpcmem.estimate.workspaces import tensor_bytes
from hpcmem.gpus.lookup import gpu_spec
from hpcmem.record import Record
from hpcmem.validate.probes import record_job

H200_RECORDS = Path(__file__).resolve().parents[2] / "estimator" / "probes" / "nvidia-h200.jsonl"


def _job(gpu):
    from hpcmem.job.jobspec import JobSpec
    from hpcmem.job.spec import TrainSpec
    from hpcmem.models import resolve_model

    return JobSpec(model=resolve_model("Qwen/Qwen2.5-0.5B"), train=TrainSpec(trainer="sft", max_length=512),
                   gpu=gpu_spec(gpu) if gpu else None)


@pytest.mark.parametrize("gpu, expected", [
    ("H200", 2 * 4096 * 1024 * 8),                              # 64 MiB
    ("H100", 2 * 4096 * 1024 * 8),
    ("A100-80GB", 2 * (4096 * 1024 * 2 + 16 * 1024 * 8)),       # 16.25 MiB
    ("L40S", 2 * (4096 * 1024 * 2 + 16 * 1024 * 8)),
    (None, 2 * 4096 * 1024 * 8),                                # no GPU named: Hopper's, the larger
])
def test_workspace_size_follows_torch_rule(gpu, expected):
    est = estimate(_job(gpu))
    lt = 2 * 1024**2      # Qwen2.5's q/k/v biases: 1 MiB cuBLASLt workspace on the forward's and autograd's thread
    for phase in est.phases:
        ws = [c.bytes for c in phase.components if c.name == NAME]
        assert ws == [expected + lt], (phase.name, ws)
        tails = sum(c.bytes for c in phase.components if c.name == TAILS)
        assert tensor_bytes(phase) == phase.bytes - expected - lt - tails


def _records():
    if not H200_RECORDS.is_file():
        pytest.skip("no H200 probe records")
    return [json.loads(line) for line in H200_RECORDS.read_text().splitlines() if line.strip()]


def _first_lease():
    """The 2026-11-29 runs, on which the optimizer phase's byte tolerances below were set. Later runs (the 2026-12-04
    boundary sweep and new cells: Llama-3.2-1B/3B and Qwen2.5-0.5B near the capacity, SmolLM3 at 16k tokens) are held
    by the percentage targets (`test_h200_records_meet_the_published_targets`); their optimizer-phase gaps, up to
    +36 MiB, are in estimator/LOG.md."""
    return [rec for rec in _records() if rec["created"] < "2026-12"]


def test_h200_optimizer_phase_holds_exactly_the_states_and_two_workspaces():
    """On every H200 run of a bias-free architecture (Llama, Mistral, Phi-3, Qwen3-MoE), the optimizer phase's measured
    max_memory_allocated equals the estimate's optimizer phase (weights + grads + states + 2 workspaces) within 5 MiB
    (0.05 %; largest gap 4.3 MiB, Llama-3.2-1B with selective checkpointing). Without the workspaces it is 64 MiB."""
    checked = 0
    for rec in _first_lease():
        if rec["status"] != "ok" or rec["model_config"]["model_type"] not in ("llama", "mistral", "phi3", "qwen3_moe"):
            continue
        est = estimate(record_job(Record.from_json(rec)))
        phase = next(p for p in est.phases if p.name.startswith("optimizer"))
        measured = rec["measured"]["phases"]["optimizer"]["allocated_bytes"]
        assert abs(measured - phase.bytes) <= 5 * 1024**2, (rec["case"], measured, phase.bytes)
        checked += 1
    assert checked >= 8


def test_h200_optimizer_phase_with_block_tails_and_cublaslt():
    """Qwen2.5 (0.5B, 7B) and Gemma-3-1B hold 10–50 MiB more than their tensors and cuBLAS workspaces in the optimizer
    phase: the allocator's whole blocks around weights and AdamW states (hpcmem.estimate.tails) and, with biased
    linears, cuBLASLt's 1 MiB workspaces. Counted, every LoRA run and every bf16 SFT run matches within 3 MiB (largest
    2.8 MiB, Qwen2.5-0.5B full SFT: its gradients' tails are not counted); without them Qwen2.5 and Gemma-3 are 9 MiB
    or more off — the test can fail either way."""
    checked = 0
    for rec in _first_lease():
        job = record_job(Record.from_json(rec))
        lora = job.train.use_peft
        if rec["status"] != "ok" or not (lora or (job.train.trainer == "sft" and job.train.dtype == "bfloat16")):
            continue
        phase = next(p for p in estimate(job).phases if p.name.startswith("optimizer"))
        measured = rec["measured"]["phases"]["optimizer"]["allocated_bytes"]
        assert abs(measured - phase.bytes) <= 3 * 1024**2, (rec["case"], measured, phase.bytes)
        extra = phase.bytes - tensor_bytes(phase) - 2 * 32 * 1024**2
        if rec["model_config"]["model_type"] in ("qwen2", "gemma3_text"):
            assert measured - (phase.bytes - extra) >= 9 * 1024**2, rec["case"]
        checked += 1
    assert checked >= 14


def test_h200_records_meet_the_published_targets():
    """Targets against GPU probes: median |err| ≤ 3 % on every peak, reserved p95 ≤ 8 %, device ≤ 5 %. Held here: the
    medians, allocated p95 ≤ 2 %, reserved p95 ≤ 5 % and device p95 ≤ 4.5 % (4.74 % and 4.20 % with the allocator
    slack from its mechanics, estimator/LOG.md; the slack coefficients were fitted to the allocator model over the
    trace matrix, not to these records, but the records chose which terms it has: in-sample). The thresholds only
    tighten; this holds the estimator to the committed records and calibration."""
    from hpcmem.validate.probes import load
    from hpcmem.validate.table import median, quantile

    _records()
    loaded = load([H200_RECORDS])
    for peak, p95_max in (("allocated", 2.0), ("reserved", 5.0), ("device", 4.5)):
        errs = [abs(p.err_pct) for p in loaded.points if p.peak == peak and not p.censored]
        assert len(errs) >= 20, peak
        assert median(errs) <= 3.0, (peak, median(errs))
        assert quantile(errs, 0.95) <= p95_max, (peak, quantile(errs, 0.95))


def test_h200_calibration_context_is_the_records_median():
    """The committed calibration's context is the median of device − reserved over its training records (recomputed
    here from the raw measurements), and an H200 estimate applies it."""
    from hpcmem.gpus.calibration import load_calibration
    from hpcmem.validate.calibration import held_out

    cal = load_calibration("H200")
    assert cal is not None
    gaps = sorted(r["measured"]["device_peak_bytes"] - r["measured"]["peak_reserved_bytes"] for r in _records()
                  if r["status"] == "ok" and not held_out(r["id"]) and not r.get("excluded"))
    n = len(gaps)
    mid = gaps[n // 2] if n % 2 else (gaps[n // 2 - 1] + gaps[n // 2]) / 2
    assert cal["context_bytes"] == int(mid)
    est = estimate(_job("H200"))
    assert est.calibrated and est.device_extra_bytes == cal["context_bytes"]
