"""The image features a Qwen-tower model keeps as locals of its forward while the language model runs: the merger's
output (split per image into views) and the `torch.cat` copy masked_scatter reads, and Qwen3-VL's deepstack mergers'
outputs with their `torch.cat` copies — alive at the last decoder layer's forward, freed before the backward.

Oracles: the trace of TRL's RLOO trainer on Qwen3-VL without checkpointing (estimator/traces/vlm-qwen3-vl-rloo.jsonl:
its peak is the last decoder layer's forward, where the trace's live tensors hold five [3,136, 4,096] bf16 feature
tensors beside the merger's: 24.5 MiB each), and a hand count of those tensors."""

from __future__ import annotations

from pathlib import Path

from tests.helpers.stored_cases import estimated_tensor_peak, trace_records
from tests.helpers.trace_helpers import assert_within, shipped_case_job

ROOT = Path(__file__).resolve().parents[2]


def test_qwen3_vl_without_checkpointing_within_1_percent_of_its_trace() -> None:
    """-2.13 % before the features were counted."""
    rec = trace_records(ROOT, "vlm-qwen3-vl-rloo")["q3vl-rloo-lora-nogc-896"]
    assert rec["traced_phase"].startswith("step 2 / forward / layer")
    assert_within(estimated_tensor_peak(rec, ROOT), rec["traced"], 0.01)


def test_the_feature_locals_by_hand() -> None:
    from hpcmem.estimate import shared_step
    from hpcmem.estimate.vision import feature_locals, vision_terms

    job = shipped_case_job("vlm-qwen3-vl-rloo.yaml", "q3vl-rloo-lora-nogc-896")
    st = shared_step(job)
    terms = vision_terms(job, st.prec, st.lora)
    v = job.model.vision
    # 4 images of 896 px: 3,136 patches each, merged 2 × 2 → 784 image tokens each; text width 4,096; bf16 weights
    assert terms.image_tokens == 4 * 784 and v.out_hidden_size == 4096 and len(v.deepstack_visual_indexes) == 3
    one = 4 * 784 * 4096 * 2                        # one [3,136, 4,096] bf16 tensor: 24.5 MiB
    assert one == 24.5 * 2**20
    # the merger's output and its cat copy, each deepstack merger's output and its cat copy
    assert feature_locals(v, terms.image_tokens, st.prec) == terms.forward_only == 2 * one + 3 * 2 * one
