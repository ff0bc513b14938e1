"""The loop adjustment's bytes per logit element are what the tracer counts on the loop's own code, and the adjusted
estimate puts the full-logits loss in place of the fused head."""

from __future__ import annotations

import pytest

from hpcmem.validate.published import LOOP_LOSS_KINDS
from hpcmem.validate.published_loop import LOOP_LOSSES

torch = pytest.importorskip("torch")

N, H, V = 256, 32, 2048


def _peak_per_element(step) -> float:
    from hpcmem.trace.tracker import StorageTracker

    h = torch.randn(N, H, dtype=torch.bfloat16, requires_grad=True)
    w = torch.randn(V, H, dtype=torch.bfloat16, requires_grad=True)
    labels = torch.randint(0, V, (1, N))
    with StorageTracker() as t:
        loss, kept = step(h, w, labels)
        loss.backward()
    # less the gradients of h and w the matmul's backward leaves (not the loss's)
    return (t.peak_bytes - (N * H + V * H) * 2) / (N * V)


def test_the_schema_and_the_table_name_the_same_losses() -> None:
    assert set(LOOP_LOSS_KINDS) == set(LOOP_LOSSES)


def test_transformers_loss_utils_holds_14_bytes_per_logit() -> None:
    from transformers.loss.loss_utils import ForCausalLMLoss

    def step(h, w, labels):
        logits = (h @ w.t()).view(1, N, V)
        return ForCausalLMLoss(logits, labels, V), logits

    assert _peak_per_element(step) == pytest.approx(LOOP_LOSSES["model-loss"][0], abs=0.05)


def test_the_2024_llama_forward_holds_16_bytes_per_logit() -> None:
    def step(h, w, labels):      # transformers 4.36-4.45 LlamaForCausalLM.forward with labels
        logits = (h @ w.t()).view(1, N, V).float()
        shift_logits = logits[..., :-1, :].contiguous()
        shift_labels = labels[..., 1:].contiguous()
        loss = torch.nn.CrossEntropyLoss()(shift_logits.view(-1, V), shift_labels.view(-1))
        return loss, logits

    assert _peak_per_element(step) == pytest.approx(LOOP_LOSSES["model-loss-4.4x"][0], abs=0.1)


def test_the_adjusted_head_phase_holds_the_full_logits_in_place_of_the_fused_head() -> None:
    from hpcmem.estimate import estimate
    from hpcmem.gpus.lookup import gpu_spec
    from hpcmem.job.trl_config import build_job
    from hpcmem.validate.published import load
    from hpcmem.validate.published_loop import HEAD_COMPONENT, HEAD_PHASE, adjusted
    from hpcmem.validate.published_score import job_settings

    row = next(r for r in load().rows if r.id == "pmc-lora-r32-qv")     # Llama-3.2-3B, 4 × 768 tokens, no packing
    job, _ = build_job(row.trainer, job_settings(row), gpu=gpu_spec(row.gpu))
    est = estimate(job)
    head = next(p for p in est.phases if p.name == HEAD_PHASE)
    fused = next(c.bytes for c in head.components if c.name == HEAD_COMPONENT)
    full = 4 * 768 * 128256 * 14                                         # tokens × vocab × 14 B
    adj = adjusted(job, est, "model-loss")
    assert adj.allocated == max(est.peak_allocated_bytes, head.bytes - fused + full)
    assert adj.reserved - adj.allocated == est.reserved_extra_bytes
    assert adj.device - adj.reserved == est.device_extra_bytes
