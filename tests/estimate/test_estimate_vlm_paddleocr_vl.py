"""PaddleOCR-VL (paddleocr_vl) SFT and DPO with images (tests/fixtures/vlm/paddleocr-vl-L2-D2.json: the config
classes' defaults, the 0.9B model, cut to 2 text layers and 2 vision layers; the text part a learned ERNIE-4.5 profile)
against the traces of TRL's SFTTrainer / DPOTrainer with their vision collators and PaddleOCRVLProcessor
(estimator/traces/vlm-paddleocr-vl.jsonl, written by `hpcmem validate trace --cases
estimator/cases/vlm-paddleocr-vl.yaml` before the estimate was compared with it; one case, LoRA without checkpointing
at 1024×768, read +3.40 % then and led to the towers' first-block and last-block-forward terms: estimator/LOG.md);
what is refused."""

from __future__ import annotations

from pathlib import Path

import pytest

from hpcmem.errors import SpecError
from hpcmem.estimate import estimate
from tests.helpers.stored_cases import (SIX_CELLS, assert_matrix, estimated_tensor_peak, grpo_with_images_job,
                                       sft_with_images_job, trace_records)

ROOT = Path(__file__).resolve().parents[2]
RECORDS = trace_records(ROOT, "vlm-paddleocr-vl")
CUT = ROOT / "tests" / "fixtures" / "vlm" / "paddleocr-vl-L2-D2.json"


@pytest.mark.parametrize("case_id", sorted(RECORDS))
def test_estimate_within_3_percent_of_the_trace(case_id):
    record = RECORDS[case_id]
    assert abs(estimated_tensor_peak(record, ROOT) - record["traced"]) <= 0.03 * record["traced"]


def test_the_matrix_spans_two_resolutions_and_both_trainers():
    assert_matrix(RECORDS, 10, {(512, 512), (768, 1024)}, (512, 512), SIX_CELLS)


def test_the_estimate_names_the_tower_the_image_tokens_and_the_learned_text_part():
    e = estimate(sft_with_images_job(CUT, 768, 1024))
    names = {c.name for p in e.phases for c in p.components}
    assert {"vision tower weights", "vision activations"} <= names
    # 1,024×768 → smart_resize 1,036×756 (multiples of 14 · 2): 74 × 54 patches, 2 × 2 of them a token
    assert "3,996 patches, 999 image tokens" in e.summary
    assert any("learned profile" in c.note for p in e.phases for c in p.components if c.name == "activations")


def test_the_class_pixel_bounds_resize_a_small_image_up():
    """PaddleOCRVLImageProcessorPil's class `size` (384² … 1536² pixels, not Qwen2-VL's 56² … 28²·1280): a 224×224
    image is resized up to 392×392 (smart_resize's ceil to multiples of 28 past 384²), 28 × 28 patches."""
    from hpcmem.job.images import image_geometry
    from hpcmem.validate.cases import case_job

    job = case_job({"trainer": "sft", "model_name_or_path": str(CUT), "images_per_example": 1,
                    "image_height": 224, "image_width": 224})
    g = image_geometry(job.train, job.model.vision)
    assert (g.resized, g.patches, g.tokens) == ((392, 392), 28 * 28, 14 * 14)


def test_grpo_with_images_is_refused():
    """SFT and DPO with images hold (the stored traces); GRPO and RLOO with images are not traced: refused."""
    with pytest.raises(SpecError, match="sft, dpo only"):
        estimate(grpo_with_images_job(CUT, 512, 512))


@pytest.mark.parametrize("given,default", [({"min_pixels": 3_000_000}, "max_pixels"), ({"max_pixels": 1000}, "min_pixels")])
def test_one_pixel_bound_past_the_processors_other_default_is_refused_naming_it(given, default):
    """min_pixels above the processor's default max_pixels (or max_pixels below its default min_pixels): the default is
    PaddleOCR-VL's own (PaddleOCRVLImageProcessorPil.size, read from transformers here), not Qwen2-VL's."""
    pytest.importorskip("transformers")
    from transformers.models.paddleocr_vl.image_processing_pil_paddleocr_vl import PaddleOCRVLImageProcessorPil

    from hpcmem.validate.cases import case_job

    size = PaddleOCRVLImageProcessorPil.size
    lo, hi = given.get("min_pixels", size["shortest_edge"]), given.get("max_pixels", size["longest_edge"])
    with pytest.raises(SpecError, match=f"min_pixels {lo} must be ≤ max_pixels {hi} \\({default} is paddleocr_vl's"):
        estimate(case_job({"trainer": "sft", "model_name_or_path": str(CUT), "images_per_example": 1,
                           "image_height": 768, "image_width": 1024, **given}))
