"""PaliGemma SFT with images (PaliGemma 2 3B's widths cut to 1 decoder layer and 4 SigLIP layers, 224 and 448 px)
against the trace of TRL's SFTTrainer with its vision collator, transformers' PaliGemmaProcessor and
SiglipImageProcessorPil on real 480×640 images (estimator/traces/vlm-paligemma.jsonl, written by `hpcmem validate trace
--cases estimator/cases/vlm-paligemma.yaml`): full fine-tuning and LoRA all-linear, checkpointing on and off, 896 px, 2 rows ×
2 images, LoRA q_proj/v_proj; the full depth at 224 px (vlm-paligemma-3b.yaml, held out); the batch by hand; what is
refused."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hpcmem.errors import SpecError
from hpcmem.estimate import estimate
from hpcmem.estimate.vision import ACTIVATIONS
from hpcmem.validate.cases import case_job
from tests.helpers.stored_cases import estimated_tensor_peak, largest_component, stored_case_job, trace_records

ROOT = Path(__file__).resolve().parents[2]
RECORDS = trace_records(ROOT, "vlm-paligemma", "vlm-paligemma-3b")
MAX_PCT = 3.0


@pytest.mark.parametrize("case_id", sorted(RECORDS))
def test_estimate_within_3_percent_of_the_trace(case_id):
    traced = RECORDS[case_id]["traced"]
    estimated = estimated_tensor_peak(RECORDS[case_id], ROOT)
    assert abs(estimated - traced) <= MAX_PCT / 100 * traced, (estimated, traced)


def test_the_matrix_is_all_there():
    assert len(RECORDS) == 12 + 2


def test_the_images_by_hand():
    """2 rows × 2 images at 448 px: 4 images of (448 / 14)² = 1,024 patches and tokens; a tower no adapter reaches
    without checkpointing keeps only pixel_values, 4 × 3 · 448² fp32 bytes (no pixel mask, unlike SmolVLM)."""
    job = stored_case_job(RECORDS["pg448-full-nogc-2row-2img"], ROOT, use_peft=True,
                          lora_target_modules=["gate_proj", "up_proj"], gradient_checkpointing=False)
    est = estimate(job)
    assert (est.extra["vision"]["patches_per_micro_batch"], est.extra["vision"]["image_tokens_per_micro_batch"]) == \
        (4 * 1024, 4 * 1024)
    assert largest_component(est, ACTIVATIONS) == 4 * 3 * 448 * 448 * 4


@pytest.mark.parametrize("trainer", ["dpo", "grpo"])
def test_other_trainers_with_images_are_refused(trainer):
    with pytest.raises(SpecError, match=f"with trainer {trainer} on paligemma: hpcmem models paligemma's images for "
                                        "sft only"):
        stored_case_job(RECORDS["pg224-full-gc"], ROOT, trainer=trainer)


def test_a_tower_with_its_pooling_head_is_refused_for_images(tmp_path):
    """A vision_config that omits vision_use_head takes SiglipVisionConfig's True: the head runs on every image."""
    cfg = json.loads((ROOT / RECORDS["pg224-full-gc"]["case"]["model_name_or_path"]).read_text())
    del cfg["vision_config"]["vision_use_head"]
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    with pytest.raises(SpecError, match="vision_use_head true with paligemma images"):
        case_job({**RECORDS["pg224-full-gc"]["case"], "model_name_or_path": str(path)})
