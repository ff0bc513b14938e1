"""The fused LM head's backward (TRL's chunked_logprob.py ChunkedLogProbFunction.backward) in the estimate, held to
the CUDA-mapped trace of a Qwen3-0.6B cut to 4 layers (fp32 weights, its tied 151,936 × 1,024 head) without gradient
checkpointing, where every layer's saved tensors are alive at the head's backward and it holds the step's peak.

Two things decide that peak: `grad_weight.to(weight.dtype)` allocates nothing for fp32 weights (the estimate counted a
second fp32 [V, H] there: +8.8 to +13.6 %), and the loop's `w_chunk` of the previous vocabulary chunk is alive while
the next is cast (two 32,768 × 1,024 bf16 casts under autocast, seen in the trace's snapshot)."""

from __future__ import annotations

import copy
import json

import pytest

from hpcmem.estimate import estimate
from hpcmem.estimate.workspaces import tensor_bytes
from hpcmem.job.jobspec import JobSpec
from hpcmem.job.spec import TrainSpec
from hpcmem.models import catalog_entry
from hpcmem.models.config import model_spec_from_config

TOLERANCE = 0.005


def qwen3_job(tmp_path, bf16: bool, rows: int, length: int) -> JobSpec:
    cfg = copy.deepcopy(catalog_entry("Qwen/Qwen3-0.6B")["config"])
    cfg["num_hidden_layers"] = 4
    path = tmp_path / "qwen3-4l.json"
    path.write_text(json.dumps(cfg))
    return JobSpec(model=model_spec_from_config(cfg, str(path)),
                   train=TrainSpec(trainer="sft", gradient_checkpointing=False, bf16=bf16, max_length=length,
                                   per_device_train_batch_size=rows))


def test_fp32_gradient_returned_without_a_copy():
    """By hand: Qwen3-0.6B's head gradient is 151,936 × 1,024 fp32 = 622,329,856 B, returned as is for fp32 weights;
    a bf16 weight gets its 311,164,928 B cast on top."""
    from hpcmem.estimate.loss import fp32_grad_returned

    assert fp32_grad_returned(151_936 * 1_024, 4) == 622_329_856
    assert fp32_grad_returned(151_936 * 1_024, 2) == 622_329_856 + 311_164_928


@pytest.mark.torch
@pytest.mark.parametrize("bf16, rows, length", [(True, 1, 2048), (False, 2, 1024)], ids=["bf16-1x2048", "fp32-2x1024"])
def test_head_backward_peak_without_checkpointing_matches_the_trace(tmp_path, bf16, rows, length):
    pytest.importorskip("trl")
    from hpcmem.trace import run_trace

    job = qwen3_job(tmp_path, bf16, rows, length)
    traced = run_trace(job, kernels="cuda")
    assert traced.phase == "step 2 / backward / lm head / loss"
    est = max(tensor_bytes(p) for p in estimate(job).phases)
    assert abs(est - traced.peak_allocated_bytes) <= TOLERANCE * traced.peak_allocated_bytes, (
        est, traced.peak_allocated_bytes)
