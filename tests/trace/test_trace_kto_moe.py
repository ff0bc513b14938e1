"""KTO's reference forward on an MoE model, full fine-tuning without checkpointing: it runs after the policy's forward
and before its backward (trl/trainer/kto_trainer.py `_compute_loss`), so the policy's saved tensors — an MoE layer's
routed hidden copy and experts' output among them — and, from the second micro-batch of gradient accumulation on,
the accumulated gradients sit beside the reference model's routed experts. The estimate's reference-forward instant
against the trace (a depth-cut Qwen3-30B-A3B, fp32, where that instant is the step's peak)."""

from __future__ import annotations

import os
from dataclasses import replace

import pytest

pytestmark = pytest.mark.torch
os.environ.setdefault("HF_HUB_OFFLINE", "1")
pytest.importorskip("trl")

from hpcmem.estimate import estimate  # noqa: E402
from hpcmem.estimate.workspaces import tensor_bytes  # noqa: E402
from hpcmem.job.jobspec import JobSpec  # noqa: E402
from hpcmem.job.spec import TrainSpec  # noqa: E402
from hpcmem.models import resolve_model  # noqa: E402
from hpcmem.trace import run_trace  # noqa: E402


def test_reference_forward_of_an_moe_model_within_3_percent_of_the_trace():
    spec = replace(resolve_model("Qwen/Qwen3-30B-A3B"), num_hidden_layers=1)
    job = JobSpec(model=spec, train=TrainSpec(trainer="kto", dtype="float32", bf16=False, gradient_checkpointing=False,
                                              per_device_train_batch_size=4, max_length=2048,
                                              gradient_accumulation_steps=2))
    traced = run_trace(job, kernels="cuda")
    assert traced.phase.startswith("step 2 / forward / reference forward")
    reference = {p.name: p for p in estimate(job).phases}["reference forward"]
    est = tensor_bytes(reference)
    assert abs(est - traced.peak_allocated_bytes) / traced.peak_allocated_bytes <= 0.03, \
        (est, traced.peak_allocated_bytes)
