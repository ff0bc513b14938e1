"""FSDP under gradient accumulation reduce-scatters once a window (the Trainer's no_sync), every micro-step with
accelerator_config's sync_each_batch; ZeRO-3 and ZeRO-2 every micro-step, ZeRO-1 once a step. Checked by hand on the
throughput model's bytes."""

from __future__ import annotations

import pytest

from hpcmem.cli.options import job_from_cli
from hpcmem.plan.speed import job_throughput

SETTINGS = {"model_name_or_path": "Qwen/Qwen2.5-7B", "gpu": "H100-80GB", "num_processes": 8,
            "gradient_accumulation_steps": 4, "gradient_checkpointing": True}


def _comm_s(accel: str, **extra):
    job, _ = job_from_cli("sft", {**SETTINGS, "accelerate_config": accel, **extra})
    return job_throughput(job, job.gpu).comm_s, job


def test_fsdp_scatters_once_a_window_unless_sync_each_batch():
    window, job = _comm_s("fsdp2")
    each, _ = _comm_s("fsdp2", accelerator_config={"gradient_accumulation_kwargs": {"sync_each_batch": True}})
    # three more reduce-scatters of the bf16 gradients (2 B × Ψ each, ring (n−1)/n), over the same link at the same
    # overlap: their share of the per-step bytes, by hand
    psi, accum = job.model.num_params, 4
    gathers = 2 * (2 * psi) * accum
    assert each / window == pytest.approx((gathers + 2 * psi * accum) / (gathers + 2 * psi), rel=1e-9)


def test_zero3_scatters_every_micro_step():
    z3, _ = _comm_s("zero3")
    each, _ = _comm_s("fsdp2", accelerator_config={"gradient_accumulation_kwargs": {"sync_each_batch": True}})
    assert z3 == each


def test_zero2_reduces_every_micro_step_and_zero1_once_a_step():
    """DeepSpeed 0.19 engine `allreduce_gradients`: stage ≥ 2 reduces on every backward, stage 1 at the boundary.
    Per step ZeRO-1 moves 2 × 2Ψ (reduce + gather), ZeRO-2 2Ψ × accum + 2Ψ: a ratio of (accum + 1) / 2, by hand."""
    one, _ = _comm_s("zero1")
    two, _ = _comm_s("zero2")
    assert two / one == pytest.approx((4 + 1) / 2, rel=1e-9)
    one1, _ = _comm_s("zero1", gradient_accumulation_steps=1)
    two1, _ = _comm_s("zero2", gradient_accumulation_steps=1)
    assert one1 == two1
