"""HyperCLOVAX Vision V2 SFT and DPO with images on a learned text part
(tests/fixtures/vlm/hyperclovax-vision-v2-defaults-L2-D2.json: two HyperCLOVAX layers of the text config class's widths,
their terms from the learned profile in hpcmem/profiles/; Qwen2.5-VL's tower at its class defaults cut to 2 blocks,
then the projector Linear(3584 → 4096) after the merger) against the trace of TRL's SFTTrainer and DPOTrainer with
their vision collators and transformers' HyperCLOVAXVisionV2Processor on blank 448×448 and 896×672 images
(estimator/traces/vlm-hyperclovax-vision-v2.jsonl, written once by `hpcmem validate trace --cases
estimator/cases/vlm-hyperclovax-vision-v2.yaml`, the estimate untouched after)."""

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
RECORDS = trace_records(ROOT, "vlm-hyperclovax-vision-v2")
CUT = "tests/fixtures/vlm/hyperclovax-vision-v2-defaults-L2-D2.json"


@pytest.mark.parametrize("case_id", sorted(RECORDS))
def test_estimate_within_3_percent_of_the_trace(case_id):
    assert_learned_case_holds(RECORDS[case_id], ROOT)


def test_the_matrix_is_all_there():
    assert len(RECORDS) == 8 + 4
    assert {(r["case"]["image_height"], r["case"]["image_width"]) for r in RECORDS.values()} == {(448, 448),
                                                                                               (672, 896)}
    assert {r["cell"] for r in RECORDS.values()} == {f"{t}/{c}" for t in ("sft", "dpo")
                                                     for c in ("full+gc", "full+nogc", "lora+gc", "lora+nogc")}


def test_a_trained_projector_keeps_the_merger_s_output():
    """modular_hyperclovax_vision_v2.py `HyperCLOVAXVisionV2Model.get_image_features`: `projector(pooler_output)`;
    trained, the projector keeps its input, the merger's output [768 image tokens, 3584] in bf16, for its weight
    gradient: the tower's held activations are that much more than the same job without a projector."""
    job = case_job({**RECORDS["hcx2-full-nogc-896"]["case"]})
    bare = dataclasses.replace(job, model=dataclasses.replace(
        job.model, vision=dataclasses.replace(job.model.vision, projector_width=0)))
    with_projector, without = (largest_component(estimate(j), "vision activations") for j in (job, bare))
    assert with_projector - without == 2 * 3584 * 768


def test_all_linear_adapts_the_projector():
    """peft's all-linear takes every nn.Linear but the output embedding (peft/tuners/tuners_utils.py
    `_maybe_include_all_linear_layers`): `model.projector` among them."""
    job = case_job({**RECORDS["hcx2-lora-all-gc-896"]["case"]})
    projector = [x for x in vision_adapters(job, job.model.vision) if x.name == "projector"]
    assert [(x.in_features, x.out_features, x.part) for x in projector] == [(3584, 4096, "merger")]


def test_grpo_with_images_is_refused():
    """SFT and DPO with images hold (the stored traces above); GRPO and RLOO with images are not traced: refused."""
    with pytest.raises(SpecError, match="with trainer grpo on hyperclovax_vision_v2: hpcmem models "
                                        "hyperclovax_vision_v2's images for sft, dpo only"):
        estimate(grpo_with_images_job(ROOT / CUT, 448, 448))


def test_kto_with_images_is_refused():
    with pytest.raises(SpecError, match="image"):
        case_job({"trainer": "kto", "model_name_or_path": CUT, "dtype": "bfloat16", "images_per_example": 1,
                  "image_height": 448, "image_width": 448, "max_length": 1536})
