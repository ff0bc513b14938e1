"""LFM3-VL SFT and DPO with images on a learned text part (tests/fixtures/vlm/lfm3-vl-defaults-L2-D2.json: two LFM3
layers of the text config class's widths, one conv and one full attention, their terms from the learned profile in
hpcmem/profiles/; Lfm3VlVisionConfig's tower cut to 2 layers, one conv and one full attention, under the LayerNorm/GELU
projector) against the trace of TRL's SFTTrainer and DPOTrainer with their vision collators and transformers'
Lfm3VlProcessor on blank 448×448 and 896×672 images (estimator/traces/vlm-lfm3-vl.jsonl, written once by
`hpcmem validate trace --cases estimator/cases/vlm-lfm3-vl.yaml`, the estimate untouched after)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from hpcmem.errors import SpecError
from hpcmem.estimate import estimate
from hpcmem.job.shape import Precision
from hpcmem.validate.cases import case_job
from tests.helpers.stored_cases import assert_learned_case_holds, grpo_with_images_job, largest_component, trace_records

ROOT = Path(__file__).resolve().parents[2]
RECORDS = trace_records(ROOT, "vlm-lfm3-vl")
CUT = "tests/fixtures/vlm/lfm3-vl-defaults-L2-D2.json"


@pytest.mark.parametrize("case_id", sorted(RECORDS))
def test_estimate_within_3_percent_of_the_trace(case_id):
    assert_learned_case_holds(RECORDS[case_id], ROOT)


def test_the_matrix_is_all_there():
    assert len(RECORDS) == 8 + 4
    assert {(r["case"]["image_height"], r["case"]["image_width"]) for r in RECORDS.values()} == {(448, 448),
                                                                                               (672, 896)}
    assert {r["cell"] for r in RECORDS.values()} == {f"{t}/{c}" for t in ("sft", "dpo")
                                                     for c in ("full+gc", "full+nogc", "lora+gc", "lora+nogc")}


def test_a_conv_layer_keeps_its_operator_s_tensors():
    """modular_lfm3_vl.py `Lfm3VlVisionShortConv.forward`, trained, no checkpointing: in_proj's output [N, 3 · 1024],
    the Conv2d's input copy, the concatenated conv output the output gate's product keeps and out_proj's input, each
    [N, 1024] in bf16, beyond what an attention layer keeps in its place: the tower's held activations at 2,352
    patches move by the difference when the conv layer is made an attention layer."""
    from hpcmem.estimate.vision_lfm3_vl import _conv_operator_saved

    job = case_job({**RECORDS["lfm3vl-full-nogc-896"]["case"], "model_name_or_path": str(ROOT / CUT)})
    v = job.model.vision
    assert v.layer_types == ("conv", "full_attention")
    n, prec = 2352, Precision(weight=2, act=2, residual=2, autocast=False, amp=True)
    assert _conv_operator_saved(v, n, prec, trained=True) == 2 * 1024 * n * 6
    assert _conv_operator_saved(v, n, prec, trained=False) == 2 * 1024 * n * 5
    attention_only = dataclasses.replace(job, model=dataclasses.replace(
        job.model, vision=dataclasses.replace(v, layer_types=("full_attention", "full_attention"))))
    assert largest_component(estimate(job), "vision activations") != \
        largest_component(estimate(attention_only), "vision activations")


def test_grpo_with_images_is_refused():
    """SFT and DPO with images hold (the stored traces above); GRPO and RLOO with images are not traced: refused."""
    with pytest.raises(SpecError, match="with trainer grpo on lfm3_vl: hpcmem models lfm3_vl's images for sft, dpo "
                                        "only"):
        estimate(grpo_with_images_job(ROOT / CUT, 448, 448))
