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
    from hpcmem.estimate.names import HEAD_BACKWARD
    from hpcmem.validate.published_loop import HEAD_COMPONENT, adjusted
    from hpcmem.validate.published_score import job_settings

    row = next(r for r in load().rows if r.id == "pmc-lora-r32-qv")     # Llama-3.2-3B, 4 × 768 tokens, no packing
    job, _ = build_job(row.trainer, job_settings(row), gpu=gpu_spec(row.gpu))
    est = estimate(job)
    head = next(p for p in est.phases if p.name == HEAD_BACKWARD)
    fused = next(c.bytes for c in head.components if c.name == HEAD_COMPONENT)
    full = 4 * 768 * 128256 * 14                                         # tokens × vocab × 14 B
    adj = adjusted(job, est, "model-loss")
    assert adj.allocated == max(est.peak_allocated_bytes, head.bytes - fused + full)
    assert adj.reserved - adj.allocated == est.reserved_extra_bytes
    assert adj.device - adj.reserved == est.device_extra_bytes


def _answerai(row_id: str):
    from hpcmem.estimate import estimate
    from hpcmem.gpus.lookup import gpu_spec
    from hpcmem.job.trl_config import build_job
    from hpcmem.validate.published import load
    from hpcmem.validate.published_score import job_settings

    row = next(r for r in load().rows if r.id == row_id)
    job, _ = build_job(row.trainer, job_settings(row), gpu=gpu_spec(row.gpu))
    return row, job, estimate(job)


def test_train_py_keeps_the_fp32_logits_through_the_layers_backward() -> None:
    from hpcmem.validate.published_loop import adjusted

    row, job, est = _answerai("aai-3090-7b-lora-b6")      # Llama-2-7B, 6 × 2048 tokens per rank
    assert row.keeps_output and row.loss == "model-loss-4.4x"
    kept = 4 * 6 * 2048 * 32000                            # output.logits: fp32 [6, 2048, 32000]
    layers = max(p.bytes for p in est.phases if p.name.startswith("backward (layer"))
    head = next(p for p in est.phases if p.name == "backward (LM head)")
    fused = next(c.bytes for c in head.components if c.name == "loss / fused LM head")
    with_kept = adjusted(job, est, row.loss, keeps_output=True)
    without = adjusted(job, est, row.loss, keeps_output=False)
    assert with_kept.allocated == max(head.bytes - fused + 16 * 6 * 2048 * 32000, layers + kept)
    assert without.allocated == max(est.peak_allocated_bytes, head.bytes - fused + 16 * 6 * 2048 * 32000)


def test_the_reserved_at_reset_is_a_floor_with_fsdp_stream_pools_beside_it() -> None:
    from hpcmem.validate.published_loop import adjusted

    row, job, est = _answerai("aai-3090-7b-qlora-b1-c512")
    assert row.reserved_at_reset == 3.72                   # the post: "about 3.72GiB (see reserved_after_model_wrap)"
    # by hand, Llama-2-7B on 2 ranks with r 64 on q,k,v,gate,up,down, at the estimate's 16-bit unit count:
    root = 2 * 32000 * 4096 * 2                             # embed_tokens + lm_head, bf16
    lora_layer = 3 * 64 * (4096 + 4096) + 3 * 64 * (4096 + 11008)
    unit = (4 * 4096 * 4096 + 3 * 4096 * 11008 + 2 * 4096 + lora_layer) * 2
    grads = 32 * lora_layer * 2 // 2                        # the rank's sharded LoRA gradients (post-backward stream)
    floor = round(3.72 * 2**30) + root + 2 * unit + grads  # root + running + prefetched unit on the unshard stream
    got = adjusted(job, est, row.loss, row.keeps_output, row.reserved_at_reset_bytes)
    assert got.reserved == max(floor, adjusted(job, est, row.loss, row.keeps_output).reserved)
    assert abs(got.reserved - floor) < 2**20               # the floor binds at batch 1 × 512


@pytest.mark.parametrize("edit, says", [
    (("loss: model-loss", "keeps_output: true"),
     "source: keeps_output True: true or false, and true only with `loss:`"),
    (("measured: 5.0", "measured: 5.0, reserved_at_reset: -1"), "reserved_at_reset -1: a positive number in GiB"),
])
def test_the_loop_fields_refuse_bad_values_in_one_line(tmp_path, edit, says) -> None:
    from hpcmem.validate.published import PublishedError, read_file

    text = """
source: {id: s, citation: {url: "https://example.org/post"}, loop: other, loop_name: a script, peak: reserved,
         unit: GiB, loss: model-loss}
defaults: {trainer: sft, settings: {model_name_or_path: Qwen/Qwen2.5-0.5B}, gpu: H100-80GB}
rows:
  - {id: r1, measured: 5.0, outcome: ran}
"""
    path = tmp_path / "s.yaml"
    path.write_text(text.replace(*edit))
    with pytest.raises(PublishedError) as info:
        read_file(path)
    assert says in str(info.value) and "\n" not in str(info.value)
