"""MiniCPM-OCR SFT and DPO with images on a learned text part (tests/fixtures/vlm/minicpm-ocr-defaults-L2-D2.json:
two Qwen3.5 layers of the text config class's widths, head tied, their terms from the learned profile in
hpcmem/profiles/; MiniCPMOcrVisionConfig's tower cut to 2 layers at downsample_mode "4x": the window merger idle, the
MLP merger over each 2 × 2 block; hpcmem.models.minicpm_ocr) against the trace of TRL's SFTTrainer and DPOTrainer
with their vision collators and transformers' MiniCPMOcrProcessor on blank 448×448 and 896×672 images
(estimator/traces/vlm-minicpm-ocr.jsonl, written once by `hpcmem validate trace --cases
estimator/cases/vlm-minicpm-ocr.yaml`)."""

from __future__ import annotations

from pathlib import Path

import pytest

from hpcmem.errors import SpecError
from hpcmem.estimate import estimate
from hpcmem.validate.cases import case_job
from tests.helpers.stored_cases import assert_learned_case_holds, grpo_with_images_job, trace_records

ROOT = Path(__file__).resolve().parents[2]
RECORDS = trace_records(ROOT, "vlm-minicpm-ocr")
CUT = "tests/fixtures/vlm/minicpm-ocr-defaults-L2-D2.json"


@pytest.mark.parametrize("case_id", sorted(RECORDS))
def test_estimate_within_3_percent_of_the_trace(case_id):
    assert_learned_case_holds(RECORDS[case_id], ROOT)


def test_the_matrix_is_all_there():
    assert len(RECORDS) == 8 + 4
    assert {(r["case"]["image_height"], r["case"]["image_width"]) for r in RECORDS.values()} == {(448, 448),
                                                                                               (672, 896)}
    assert {r["cell"] for r in RECORDS.values()} == {f"{t}/{c}" for t in ("sft", "dpo")
                                                     for c in ("full+gc", "full+nogc", "lora+gc", "lora+nogc")}


def test_every_layer_runs_all_the_patches_and_the_window_merger_trains_nothing():
    """modular_minicpmv4_6.py `MiniCPMV4_6VisionModel.forward` with use_vit_merger False (downsample_mode "4x"):
    under checkpointing each layer keeps its input over all 3,840 patches at 896×672 (bf16, width 768), the merger
    makes 3,840 / 4 = 960 image tokens, and full fine-tuning's tower gradients leave the window merger out: its
    LayerNorms over 768 and 4 · 768 and its q/k/v/out (768 → 768, biased), linear_1 (3072 → 12,288) and linear_2
    (12,288 → 768) — 2·768 + 2·3072 + 4·(768·768 + 768) + (3072·12,288 + 12,288) + (12,288·768 + 768) parameters —
    at 2 bytes (bf16 weights) each."""
    from hpcmem.estimate.lora import LoraLayout
    from hpcmem.estimate.vision_minicpmv4_6 import minicpmv4_6_terms
    from hpcmem.job.shape import precision

    job = case_job({**RECORDS["mocr-full-gc-896"]["case"]})
    v = job.model.vision
    terms = minicpmv4_6_terms(job, precision(job), LoraLayout(enabled=False))
    assert terms.blocks_saved == (2 * 768 * 3840, 2 * 768 * 3840)
    assert terms.image_tokens == 960
    idle = 2 * 768 + 2 * 3072 + 4 * (768 * 768 + 768) + (3072 * 12288 + 12288) + (12288 * 768 + 768)
    assert v.idle_params == idle
    assert terms.gradients == 2 * (v.num_params - idle)


def test_grpo_with_images_is_refused():
    """SFT and DPO with images hold (the stored traces above); GRPO and RLOO with images are not traced: refused."""
    with pytest.raises(SpecError, match="with trainer grpo on minicpm_ocr: hpcmem models minicpm_ocr's images for "
                                        "sft, dpo only"):
        estimate(grpo_with_images_job(ROOT / CUT, 448, 448))
