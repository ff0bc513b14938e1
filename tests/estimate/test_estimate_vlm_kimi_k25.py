"""Kimi K2.5 SFT and DPO with images on a learned text part (tests/fixtures/vlm/kimi-k25-defaults-L2-D2.json: two
DeepSeek-V3 layers of the text config class's widths, both dense under first_k_dense_replace 3, their terms from the
learned profile in hpcmem/profiles/; Kimi_K25VisionConfig's tower cut to 2 layers, then Kimi_K25MultimodalProjection)
against the trace of TRL's SFTTrainer and DPOTrainer with their vision collators and transformers' Kimi_K25Processor
on blank 448×448 and 896×672 images (estimator/traces/vlm-kimi-k25.jsonl, written once by
`hpcmem validate trace --cases estimator/cases/vlm-kimi-k25.yaml`; the LoRA estimate changed after, in-sample).

Every case holds within 3 % (estimator/LOG.md). The LoRA all-linear cases were 6-10 % under, for two reasons in the
learned estimate (hpcmem.estimate.learned), both tested in tests/estimate/test_estimate_learned_reference_adapters.py:
the profile's LoRA cells were traced on the text cut as deepseek_v3, where peft's MoE conversion leaves gate_proj /
up_proj / down_proj unadapted under all-linear, and the estimate counted those adapters in the reference anyway
(`traced_leaves`); and Kimi K2.5 itself (model_type kimi_k25, which peft does not convert) adapts the MLP, whose
instant at down_proj's adapter no cell traced (`untraced_mlp_instant`)."""

from __future__ import annotations

from pathlib import Path

import pytest

from hpcmem.errors import SpecError
from hpcmem.estimate import estimate
from hpcmem.validate.cases import case_job
from tests.helpers.stored_cases import assert_learned_case_holds, grpo_with_images_job, largest_component, trace_records

ROOT = Path(__file__).resolve().parents[2]
RECORDS = trace_records(ROOT, "vlm-kimi-k25")
CUT = "tests/fixtures/vlm/kimi-k25-defaults-L2-D2.json"


@pytest.mark.parametrize("case_id", sorted(RECORDS))
def test_estimate_within_3_percent_of_the_trace(case_id):
    assert_learned_case_holds(RECORDS[case_id], ROOT)


def test_the_matrix_is_all_there():
    assert len(RECORDS) == 8 + 4
    assert {(r["case"]["image_height"], r["case"]["image_width"]) for r in RECORDS.values()} == {(448, 448),
                                                                                               (672, 896)}
    assert {r["cell"] for r in RECORDS.values()} == {f"{t}/{c}" for t in ("sft", "dpo")
                                                     for c in ("full+gc", "full+nogc", "lora+gc", "lora+nogc")}


def test_checkpointed_layers_keep_their_input_alone():
    """modeling_kimi_k25.py `Kimi_K25VisionEncoderLayer` is a GradientCheckpointingLayer: under checkpointing each of
    the two layers keeps its bf16 input [3,072 patches at 896×672, width 1152]; 768 image tokens (3,072 / 4,
    `Kimi_K25Processor.replace_image_token`)."""
    from hpcmem.estimate.lora import LoraLayout
    from hpcmem.estimate.vision_kimi_k25 import kimi_k25_terms
    from hpcmem.job.shape import precision

    job = case_job({**RECORDS["kimi-full-gc-896"]["case"]})
    terms = kimi_k25_terms(job, precision(job), LoraLayout(enabled=False))
    assert terms.blocks_saved == (2 * 1152 * 3072,) * 2
    assert terms.image_tokens == 768 and terms.patches == 3072


def test_images_add_to_the_estimate():
    job = case_job({**RECORDS["kimi-full-nogc-896"]["case"]})
    assert largest_component(estimate(job), "vision activations") > 0


def test_grpo_with_images_is_refused():
    """SFT and DPO with images are traced (above); GRPO and RLOO with images are not: refused."""
    with pytest.raises(SpecError, match="with trainer grpo on kimi_k25: hpcmem models kimi_k25's images for "
                                        "sft, dpo only"):
        estimate(grpo_with_images_job(ROOT / CUT, 448, 448))
