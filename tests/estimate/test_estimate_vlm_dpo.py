"""Vision-language DPO (Qwen2.5-VL, full width cut to 1 decoder layer and 4 vision blocks; Qwen3-VL, cut to 3 decoder
layers and 4 vision blocks with 3 deepstack mergers) against the trace of TRL's
DPOTrainer with DataCollatorForVisionPreference and transformers' processor on real images
(estimator/traces/vlm-dpo.jsonl and vlm-qwen3-vl-dpo.jsonl, written by `hpcmem validate trace --cases
estimator/cases/vlm-dpo.yaml` and vlm-qwen3-vl-dpo.yaml): full
fine-tuning with a second model as reference, LoRA all-linear and q_proj/v_proj with the adapters disabled as
reference, checkpointing on and off, 448 and 896 px."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hpcmem.estimate import estimate
from hpcmem.estimate.vision import VISION_BACKWARD, WEIGHTS
from hpcmem.estimate.workspaces import tensor_bytes
from hpcmem.validate.cases import case_job

ROOT = Path(__file__).resolve().parents[2]
TRACES = [ROOT / "estimator" / "traces" / f"{name}.jsonl" for name in ("vlm-dpo", "vlm-qwen3-vl-dpo")]
RECORDS = {r["case"]["id"]: r for f in TRACES for r in map(json.loads, f.read_text().splitlines())}
MAX_PCT = 3.0


def _job(case_id: str):
    return case_job({**RECORDS[case_id]["case"],
                     "model_name_or_path": str(ROOT / RECORDS[case_id]["case"]["model_name_or_path"])})


def _peak(job) -> int:
    return max(tensor_bytes(p) for p in estimate(job).phases)


@pytest.mark.parametrize("case_id", sorted(RECORDS))
def test_estimate_within_3_percent_of_the_trace(case_id):
    traced = RECORDS[case_id]["traced"]
    assert abs(_peak(_job(case_id)) - traced) <= MAX_PCT / 100 * traced, (_peak(_job(case_id)), traced)


def test_the_tower_sees_each_image_twice():
    """DataCollatorForVisionPreference repeats each example's images for its chosen and its rejected row: one image of
    448×448 px is 32 × 32 = 1,024 patches of 14 px, so one example puts 2 × 1,024 patch rows through the tower and
    2 × 1,024 / 2² = 512 image tokens into the language model (by hand)."""
    vision = estimate(_job("qvl-dpo-full-gc-448")).to_json()["vision"]
    assert vision["patches_per_micro_batch"] == 2 * 32 * 32
    assert vision["image_tokens_per_micro_batch"] == 2 * 32 * 32 // 4


def test_the_reference_model_holds_the_tower_too():
    """Full fine-tuning: the traced parameters are the policy and the reference, each the whole vision-language
    model; the estimate's language model, tower and reference weights add up to the same bytes but for the trace's
    rounding of each tensor to 512-byte blocks (4,672 B per model here). Without the tower in the reference the gap
    would be the tower's 250 MB."""
    for case_id in ("qvl-dpo-full-gc-448", "qvl-dpo-full-nogc-896"):
        first = estimate(_job(case_id)).phases[0].components
        weights = sum(c.bytes for c in first if c.name in ("weights", WEIGHTS, "reference model"))
        traced = RECORDS[case_id]["traced_components"]["param"]
        assert 0 <= traced - weights <= 2 * 8192, (weights, traced)


def test_a_tower_no_adapter_reaches_builds_no_graph_without_checkpointing():
    """LoRA on q_proj, v_proj leaves the tower without adapters; TRL calls enable_input_require_grads only under
    gradient checkpointing, so without it the tower runs no backward (its phase is absent) and the estimate stays
    within 3 % of the trace (the case above); with checkpointing the tower's backward runs."""
    assert VISION_BACKWARD not in {p.name for p in estimate(_job("qvl-dpo-lora-qv-nogc-896")).phases}
    assert VISION_BACKWARD in {p.name for p in estimate(_job("qvl-dpo-lora-qv-gc-896")).phases}


def test_more_pixels_more_memory_in_the_trace_and_the_estimate():
    for technique in ("full-gc", "full-nogc", "lora-all-gc", "lora-all-nogc"):
        small, large = f"qvl-dpo-{technique}-448", f"qvl-dpo-{technique}-896"
        assert RECORDS[large]["traced"] > RECORDS[small]["traced"], technique
        assert _peak(_job(large)) > _peak(_job(small)), technique


@pytest.mark.torch
@pytest.mark.slow
def test_the_recorded_trace_is_the_trace_of_today():
    """One case traced again (TRL's DPOTrainer, the vision preference collator, transformers' processor; ~20 s on
    two shared cores): the stored record is what the installed libraries trace, to the byte."""
    pytest.importorskip("trl")
    from hpcmem.trace.run import run_trace

    case_id = "qvl-dpo-lora-all-gc-448"
    assert run_trace(_job(case_id)).peak_allocated_bytes == RECORDS[case_id]["traced"]


def test_the_reference_pass_s_own_image_features_by_hand():
    """LoRA all-linear without checkpointing at 448 px: TRL's DPO runs the reference's forward under no_grad after the
    policy's (trl/trainer/dpo_trainer.py `_compute_loss`), and the policy's outputs are the fused head's per-token
    fields alone (trl/trainer/utils.py `add_fused_lm_head`), so of the image path only the reference's own forward
    adds beside the policy's saved tensors: Qwen2_5_VLModel.forward keeps the merger's output (split per image into
    views) and its `torch.cat` cast to the embeddings' dtype while its language model runs. 2 rows × 1,024 patches /
    2² = 512 image tokens of the text width 3,584, bf16 each: 2 · 2 · 3,584 · 512 = 7,340,032 bytes (by hand). The
    reference's tower pass, before its language model, has none of it yet."""
    from hpcmem.estimate.trainers import REFERENCE_FORWARD
    from hpcmem.estimate.vision import REFERENCE_VISION

    phases = {p.name: p for p in estimate(_job("qvl-dpo-lora-all-nogc-448")).phases}
    held = [c.bytes for c in phases[REFERENCE_FORWARD].components if c.name == REFERENCE_VISION]
    assert held == [2 * 2 * 3584 * 512]
    assert all(c.name != REFERENCE_VISION for name, p in phases.items() if name != REFERENCE_FORWARD
               for c in p.components)
