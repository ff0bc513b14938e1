"""PP-Chart2Table SFT with images (PPChart2TableConfig's class defaults cut to 2 Qwen2 layers and a 2-layer
GOT-OCR 2.0 tower, one windowed and one global layer, at image_size 1024 and 768) against the trace of TRL's
SFTTrainer with its vision collator and transformers' PPChart2TableProcessor on blank 480×640 images
(estimator/traces/vlm-pp-chart2table.jsonl, written once by `hpcmem validate trace --cases
estimator/cases/vlm-pp-chart2table.yaml --reserved`, the estimate untouched after); the global layer's eager scores by
hand; what is refused."""

from __future__ import annotations

from pathlib import Path

import pytest

from hpcmem.errors import SpecError
from hpcmem.estimate import estimate, wider_reserved_note
from hpcmem.estimate.vision_got_ocr2 import _scores
from hpcmem.validate.cases import case_job
from tests.helpers.stored_cases import estimated_tensor_peak, grpo_with_images_job, trace_records

ROOT = Path(__file__).resolve().parents[2]
RECORDS = trace_records(ROOT, "vlm-pp-chart2table")
CUT = ROOT / "tests" / "fixtures" / "vlm" / "pp-chart2table-defaults-L2-D2.json"


@pytest.mark.parametrize("case_id", sorted(RECORDS))
def test_estimate_within_3_percent_of_the_trace(case_id):
    traced = RECORDS[case_id]["traced"]
    assert abs(estimated_tensor_peak(RECORDS[case_id], ROOT) - traced) <= 0.03 * traced


def test_the_matrix_is_all_there():
    """12 SFT cases (DPO is refused: TRL's vision preference collator fails on this processor): full and LoRA
    all-linear, checkpointing on and off, at image_size 1024 and 768 and two images a row at 768."""
    assert len(RECORDS) == 12
    assert {r["case"]["model_name_or_path"].rsplit("/", 1)[-1] for r in RECORDS.values()} == {
        "pp-chart2table-defaults-L2-D2.json", "pp-chart2table-defaults-L2-D2-768.json"}
    assert {r["cell"] for r in RECORDS.values()} == {f"sft/{c}" for c in ("full+gc", "full+nogc", "lora+gc",
                                                                          "lora+nogc")}


def test_the_global_layer_s_forward_instant_by_hand():
    """modeling_got_ocr2.py `GotOcr2VisionAttention.forward`, LoRA without checkpointing at 768 px (63.7 M scores):
    at the global layer's softmax the fp32 input copy, the fp32 output, decomposed_rel_pos and the scores' sum (12 bytes
    a score) where the layer's saved tensors count 6; the estimate's forward instant moves by the 6 less what the
    layer keeps after its attention (not yet made then)."""
    from hpcmem.estimate.lora import lora_layout
    from hpcmem.estimate.vision_llava import tower_terms
    from hpcmem.job.shape import precision

    record = RECORDS["ppc2t-lora-all-nogc-768"]
    job = case_job({**record["case"], "model_name_or_path": str(ROOT / record["case"]["model_name_or_path"])})
    terms = tower_terms(job, precision(job), lora_layout(job))
    scores = _scores(job.model.vision, 1, True)
    assert scores == 12 * 2304 * 2304
    assert 5 * scores < terms.block_forward < 6 * scores


def test_the_global_layer_s_scores_by_hand():
    """modeling_got_ocr2.py `GotOcr2VisionAttention.forward` over the whole 64 × 64 grid at a global index: [12, 4096,
    4096] scores per image; on a windowed layer the grid padded to 70 × 70 is 25 windows of [12, 196, 196]."""
    job = case_job({"trainer": "sft", "model_name_or_path": str(CUT), "max_length": 1024, "images_per_example": 1,
                    "image_height": 480, "image_width": 640, "dtype": "bfloat16", "bf16": True})
    v = job.model.vision
    assert _scores(v, 1, True) == 12 * 4096 * 4096
    assert _scores(v, 1, False) == 25 * 12 * 196 * 196


def test_grpo_and_dpo_with_images_are_refused():
    with pytest.raises(SpecError, match="with trainer grpo on pp_chart2table: hpcmem models pp_chart2table's images "
                                        "for sft only"):
        estimate(grpo_with_images_job(CUT, 480, 640))
    with pytest.raises(SpecError, match="PPChart2TableProcessor raises"):
        case_job({"trainer": "dpo", "model_name_or_path": str(CUT), "max_length": 1024, "images_per_example": 1,
                  "image_height": 480, "image_width": 640, "dtype": "bfloat16", "bf16": True})


def test_the_estimate_warns_of_the_reserved_gap():
    job = case_job({**RECORDS["ppc2t-lora-all-gc-768"]["case"],
                    "model_name_or_path": str(ROOT / RECORDS["ppc2t-lora-all-gc-768"]["case"]["model_name_or_path"])})
    assert wider_reserved_note("pp_chart2table") in estimate(job).warnings
