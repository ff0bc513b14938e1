"""DeepSeek-VL hybrid SFT and DPO with images (DeepseekVLHybridConfig's class defaults cut to 1 Llama layer, 2 SigLIP
layers and 4 SAM layers, the global one at index 2: tests/fixtures/vlm/deepseek-vl-hybrid-defaults-L1.json at SigLIP
224 / SAM 1024 px and -384-768.json at 384 / 768 px) against the trace of TRL's SFTTrainer and DPOTrainer with their
vision collators and transformers' DeepseekVLHybridProcessor on blank 480×640 images
(estimator/traces/vlm-deepseek-vl-hybrid.jsonl, written once by `hpcmem validate trace --cases
estimator/cases/vlm-deepseek-vl-hybrid.yaml --reserved`)."""

from __future__ import annotations

from pathlib import Path

import pytest

from hpcmem.errors import SpecError
from hpcmem.estimate import estimate
from hpcmem.estimate.workspaces import tensor_bytes
from hpcmem.validate.cases import case_job
from tests.helpers.stored_cases import grpo_with_images_job, largest_component, stored_case_job, trace_records

ROOT = Path(__file__).resolve().parents[2]
RECORDS = trace_records(ROOT, "vlm-deepseek-vl-hybrid")
CUT = "tests/fixtures/vlm/deepseek-vl-hybrid-defaults-L1.json"


@pytest.mark.parametrize("case_id", sorted(RECORDS))
def test_estimate_within_3_percent_of_the_trace(case_id):
    record = RECORDS[case_id]
    est = estimate(stored_case_job(record, ROOT))
    assert abs(max(tensor_bytes(p) for p in est.phases) - record["traced"]) <= 0.03 * record["traced"]


def test_the_matrix_is_all_there():
    assert len(RECORDS) == 8 + 4
    assert {r["case"]["model_name_or_path"] for r in RECORDS.values()} == {
        CUT, "tests/fixtures/vlm/deepseek-vl-hybrid-defaults-L1-384-768.json"}
    assert {r["cell"] for r in RECORDS.values()} == {f"{t}/{c}" for t in ("sft", "dpo")
                                                     for c in ("full+gc", "full+nogc", "lora+gc", "lora+nogc")}


def test_the_global_layer_s_probabilities_are_the_tower_s_widest():
    """modeling_sam.py SamVisionSdpaAttention.forward: the decomposed relative positions are a float mask that
    requires grad, so the trace's CPU takes SDPA's math path, which keeps the fp32 probabilities
    [images, heads, G², G²] of the global layer (12 × 4096² × 4 bytes at 1024 px) and whose softmax backward holds two
    more beside them."""
    from hpcmem.estimate.lora import LoraLayout
    from hpcmem.estimate.vision_deepseek_vl_hybrid import deepseek_vl_hybrid_terms
    from hpcmem.job.shape import precision

    job = case_job({**RECORDS["dsvlh224-full-nogc"]["case"]})
    terms = deepseek_vl_hybrid_terms(job, precision(job), LoraLayout(enabled=False))
    probs = 12 * 4096 ** 2 * 4
    assert len(terms.blocks_saved) == 2 + 4
    assert probs < terms.blocks_saved[2 + 2] < probs + 2 ** 28
    assert terms.blocks_backward[2 + 2] >= 2 * probs - 2 ** 27
    assert terms.image_tokens == 196


def test_images_add_to_the_estimate():
    job = case_job({**RECORDS["dsvlh384-full-nogc"]["case"]})
    assert largest_component(estimate(job), "vision activations") > 0


def test_grpo_with_images_is_refused():
    with pytest.raises(SpecError, match="with trainer grpo on deepseek_vl_hybrid: hpcmem models deepseek_vl_hybrid's "
                                        "images for sft, dpo only"):
        estimate(grpo_with_images_job(ROOT / CUT, 480, 640))
