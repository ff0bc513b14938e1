"""Aria SFT and DPO with images on a learned text part (tests/fixtures/vlm/aria-defaults-L2-D2.json: two AriaTextConfig
MoE layers, their terms from the learned profile in hpcmem/profiles/; Idefics3's tower cut to 2 layers with Aria's
14 px patches and 980 px images, and the AriaProjector) against the trace of TRL's SFTTrainer and DPOTrainer with
their vision collators and transformers' AriaProcessor on blank 448×448 (unpadded) and 896×672 (padded to
980 × 980) images (estimator/traces/vlm-aria.jsonl, written once by `hpcmem validate trace --cases
estimator/cases/vlm-aria.yaml`; estimator/LOG.md)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hpcmem.errors import SpecError
from hpcmem.estimate import estimate
from hpcmem.validate.cases import case_job
from tests.helpers.stored_cases import assert_learned_case_holds, grpo_with_images_job, largest_component, trace_records

ROOT = Path(__file__).resolve().parents[2]
RECORDS = trace_records(ROOT, "vlm-aria")
CUT = "tests/fixtures/vlm/aria-defaults-L2-D2.json"


@pytest.mark.parametrize("case_id", sorted(RECORDS))
def test_estimate_within_3_percent_of_the_trace(case_id):
    assert_learned_case_holds(RECORDS[case_id], ROOT)


def test_the_matrix_is_all_there():
    assert len(RECORDS) == 8 + 4
    assert {(r["case"]["image_height"], r["case"]["image_width"]) for r in RECORDS.values()} == {(448, 448),
                                                                                               (672, 896)}
    assert {r["cell"] for r in RECORDS.values()} == {f"{t}/{c}" for t in ("sft", "dpo")
                                                     for c in ("full+gc", "full+nogc", "lora+gc", "lora+nogc")}


def test_every_image_is_one_padded_square_of_256_tokens():
    """AriaImageProcessor (modular_aria.py `_preprocess`, split_image False): the longest side to 980, the other
    int(side · 980 / longest) and at least 336, padded to 980 × 980: 4,900 patches, patch_to_query[4900] = 256 tokens
    at any size; 896 × 672 keeps 735 rows (53 of 70 patch rows real)."""
    job = case_job({**RECORDS["aria-full-gc-896"]["case"]})
    v = job.model.vision
    assert v.resized(672, 896) == (735, 980) and v.real_patches(672, 896) == 53 * 70
    assert v.resized(448, 448) == (980, 980) and v.real_patches(448, 448) == v.patches == 4900
    assert v.resized(100, 6400) == (336, 980) and v.tokens_per_tile == 256


def test_full_fine_tuning_trains_the_projector():
    job = case_job({**RECORDS["aria-full-gc-448"]["case"]})
    v = job.model.vision
    assert largest_component(estimate(job), "vision tower gradients") == 2 * (v.tower_params + v.merger_params)


def test_patches_outside_the_query_table_are_refused(tmp_path):
    """AriaProjector.forward raises KeyError for a patch count projector_patch_to_query_dict lacks (the class
    default 32 px patches: 900 patches a 980 px image)."""
    cfg = json.loads((ROOT / CUT).read_text())
    cfg["vision_config"]["patch_size"] = 32
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(SpecError, match="projector_patch_to_query_dict"):
        case_job({"trainer": "sft", "model_name_or_path": str(tmp_path), "dtype": "bfloat16",
                  "images_per_example": 1, "image_height": 448, "image_width": 448, "max_length": 1536})


def test_grpo_with_images_is_refused():
    """SFT and DPO with images hold (the stored traces above); GRPO and RLOO with images are not traced: refused."""
    with pytest.raises(SpecError, match="with trainer grpo on aria: hpcmem models aria's images for sft, dpo only"):
        estimate(grpo_with_images_job(ROOT / CUT, 448, 448))


def test_min_pixels_is_refused():
    with pytest.raises(SpecError, match="AriaImageProcessor has no such setting"):
        case_job({"trainer": "sft", "model_name_or_path": CUT, "dtype": "bfloat16", "images_per_example": 1,
                  "image_height": 448, "image_width": 448, "max_length": 1536, "min_pixels": 3136})
