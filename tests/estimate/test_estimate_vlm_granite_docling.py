"""Granite-Docling SFT and DPO with images on a learned text part
(tests/fixtures/vlm/granite-docling-defaults-L2-D2.json: two Granite layers of GraniteDoclingTextConfig's widths, their terms from the learned profile in hpcmem/profiles/;
Idefics3's tower at GraniteDoclingVisionConfig's defaults cut to 2 layers, both tapped for the deepstack mergers, and
Granite-Docling's connector) against the trace of TRL's SFTTrainer and DPOTrainer with their vision collators and
transformers' GraniteDoclingProcessor on blank 448×448 (one tile) and 896×672 (12 tiles and a thumbnail) images
(estimator/traces/vlm-granite-docling.jsonl, written once by `hpcmem validate trace --cases
estimator/cases/vlm-granite-docling.yaml`; the estimate changed once after, for the deepstack taps' waiting gradients,
a mechanism of the transformers code: estimator/LOG.md)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from hpcmem.errors import SpecError
from hpcmem.estimate import estimate
from hpcmem.estimate.vision import vision_adapters
from hpcmem.validate.cases import case_job
from tests.helpers.stored_cases import assert_learned_case_holds, grpo_with_images_job, largest_component, trace_records

ROOT = Path(__file__).resolve().parents[2]
RECORDS = trace_records(ROOT, "vlm-granite-docling")
CUT = "tests/fixtures/vlm/granite-docling-defaults-L2-D2.json"


@pytest.mark.parametrize("case_id", sorted(RECORDS))
def test_estimate_within_3_percent_of_the_trace(case_id):
    assert_learned_case_holds(RECORDS[case_id], ROOT)


def test_the_matrix_is_all_there():
    assert len(RECORDS) == 8 + 4
    assert {(r["case"]["image_height"], r["case"]["image_width"]) for r in RECORDS.values()} == {(448, 448),
                                                                                               (672, 896)}
    assert {r["cell"] for r in RECORDS.values()} == {f"{t}/{c}" for t in ("sft", "dpo")
                                                     for c in ("full+gc", "full+nogc", "lora+gc", "lora+nogc")}


def test_a_tap_below_the_last_layer_keeps_its_gradient_waiting():
    """modular_granite_docling.py `GraniteDoclingVisionModel.encode` taps layer 0's output (the cut's
    deepstack_visual_indexes [0, 1]): its merger's gradient, [13,312 patches, 768] in bf16, waits beside layer 1's
    backward; a tap at the last layer only waits for post_layernorm's."""
    job = case_job({**RECORDS["gdoc-lora-all-gc-896"]["case"]})
    last_only = dataclasses.replace(job, model=dataclasses.replace(
        job.model, vision=dataclasses.replace(job.model.vision, deepstack_layers=(1,))))
    both, one = (largest_component(estimate(j), "vision backward temporaries") for j in (job, last_only))
    assert both - one == 2 * 768 * 13312


def test_the_idle_fine_path_is_weights_only():
    """The fine connector path (use_fine_route True) never runs in a training step: its parameters are loaded, take
    no gradient and no optimizer state."""
    job = case_job({**RECORDS["gdoc-full-gc-448"]["case"]})
    v = job.model.vision
    est = estimate(job)
    assert largest_component(est, "vision tower weights") == 2 * v.num_params
    assert largest_component(est, "vision tower gradients") == 2 * (v.tower_params + v.merger_params)
    assert v.idle_params == 11_550_720


def test_all_linear_adapts_the_fine_path_too():
    """peft's all-linear takes every nn.Linear but the output embedding (peft/tuners/tuners_utils.py
    `_maybe_include_all_linear_layers`): the idle fine path's projection and mergers among them."""
    job = case_job({**RECORDS["gdoc-lora-all-gc-896"]["case"]})
    idle = sorted(x.name for x in vision_adapters(job, job.model.vision) if x.part == "idle")
    assert idle == ["connector.fine.deepstack_mergers.linear_1", "connector.fine.deepstack_mergers.linear_2",
                    "connector.fine.projection"]


def test_grpo_with_images_is_refused():
    """SFT and DPO with images hold (the stored traces above); GRPO and RLOO with images are not traced: refused."""
    with pytest.raises(SpecError, match="with trainer grpo on granite_docling: hpcmem models "
                                        "granite_docling's images for sft, dpo only"):
        estimate(grpo_with_images_job(ROOT / CUT, 448, 448))


def test_min_pixels_is_refused():
    with pytest.raises(SpecError, match="GraniteDoclingImageProcessor has no such setting"):
        case_job({"trainer": "sft", "model_name_or_path": CUT, "dtype": "bfloat16", "images_per_example": 1,
                  "image_height": 448, "image_width": 448, "max_length": 1536, "min_pixels": 3136})


def test_a_strip_takes_at_most_16_tiles_a_side():
    """GraniteDoclingImageProcessorPil's canvas (image_processing_pil_granite_docling.py
    `get_all_supported_aspect_ratios`: each side stops at 16) for a 100 × 6400 strip: 16 × 1 tiles and a thumbnail, 17 · 64 image tokens (what the
    processor makes of it, tests/models/test_granite_docling_params.py)."""
    job = case_job({"trainer": "sft", "model_name_or_path": CUT, "dtype": "bfloat16", "images_per_example": 1,
                    "image_height": 100, "image_width": 6400, "max_length": 2048})
    assert job.model.vision.tiles(100, 6400) == (17, 16, 1)


def test_kto_with_images_is_refused():
    with pytest.raises(SpecError, match="image"):
        case_job({"trainer": "kto", "model_name_or_path": CUT, "dtype": "bfloat16", "images_per_example": 1,
                  "image_height": 448, "image_width": 448, "max_length": 1536})
