"""Inkling 2 SFT and DPO with images on a learned text part (tests/fixtures/vlm/inkling2-defaults-L2-D2.json: two
inkling2_text layers of the text config class's widths, a sliding-window one and a full-attention one, 384 routed
experts each, their terms from the learned profile in hpcmem/profiles/; Inkling2VisionConfig's tower cut to 2 layers
and its 2 × 2 GELU merger) against the trace of TRL's SFTTrainer and DPOTrainer with their vision collators and
transformers' Inkling2Processor around hpcmem.trace.vision_inkling2's numpy stand-in for its torchvision-only image
processor, on blank 640×640 (16 × 16 cells) and 960×1280 (24 × 32 cells) images (estimator/traces/vlm-inkling2.jsonl,
written once by `hpcmem validate trace --cases estimator/cases/vlm-inkling2.yaml`), and their text-only twins
(estimator/traces/vlm-inkling2-text.jsonl), which isolate the image path. Every case holds within 3 % (estimator/LOG.md);
one term added after the twins were traced, in-sample: layer 0's input gradient terms under LoRA without
checkpointing (hpcmem.estimate.vision_inkling2_text)."""

from __future__ import annotations

from pathlib import Path

import pytest

from hpcmem.errors import SpecError
from hpcmem.estimate import estimate
from hpcmem.validate.cases import case_job
from tests.helpers.stored_cases import assert_learned_case_holds, grpo_with_images_job, largest_component, trace_records

ROOT = Path(__file__).resolve().parents[2]
RECORDS = trace_records(ROOT, "vlm-inkling2")
# the same cells traced without images (estimator/cases/vlm-inkling2-text.yaml): the 384-expert text part holds all but
# 0.1 .. 0.7 % of every image case's peak, so the image path is read as a case's difference from its twin
TWINS = trace_records(ROOT, "vlm-inkling2-text")
CUT = "tests/fixtures/vlm/inkling2-defaults-L2-D2.json"


@pytest.mark.parametrize("case_id", sorted(RECORDS))
def test_estimate_within_3_percent_of_the_trace(case_id):
    assert_learned_case_holds(RECORDS[case_id], ROOT)


def _estimated(record: dict) -> int:
    return estimate(case_job({**record["case"]})).peak_allocated_bytes


def _twin(case_id: str) -> dict:
    return TWINS["inkling2-text-" + case_id.removeprefix("inkling2-").rsplit("-", 1)[0]]


@pytest.mark.parametrize("cell", ["full-gc", "full-nogc", "lora-all-gc", "lora-all-nogc"])
def test_the_image_path_grows_with_the_image_as_traced(cell):
    """From 640×640 (1,024 patches, 256 image tokens) to 960×1280 (3,072 patches, 768 tokens) the traced peak grows by
    what the estimate's grows (51 .. 262 MiB; the text part is the same in both): within 1 %."""
    small, large = RECORDS[f"inkling2-{cell}-640"], RECORDS[f"inkling2-{cell}-960x1280"]
    traced = large["traced"] - small["traced"]
    assert abs(_estimated(large) - _estimated(small) - traced) <= 0.01 * traced


@pytest.mark.parametrize("case_id", sorted(RECORDS))
def test_the_image_path_against_the_text_only_twin(case_id):
    """A case's peak less its text-only twin's, estimated and traced (the tower's saved tensors, gradients and
    optimizer states, pixel_values, the features, and under LoRA without checkpointing layer 0's input gradient
    terms): within 2 %. DPO LoRA without checkpointing, at its reference forward, within 15 %: the estimate is 16 MiB
    under there, with the reference pass's own image features (estimator/LOG.md)."""
    record, twin = RECORDS[case_id], _twin(case_id)
    traced = record["traced"] - twin["traced"]
    tolerance = 0.15 if case_id == "inkling2-dpo-lora-all-nogc-640" else 0.02
    assert abs(_estimated(record) - _estimated(twin) - traced) <= tolerance * traced


def test_the_first_text_layer_s_input_gradient_terms_by_hand():
    """SFT LoRA all-linear without checkpointing, rows of 2,048 tokens, width 4608, lora_dropout 0.05: layer 0's
    input_layernorm keeps the fp32 copy of its bf16 input (4 · 4608 bytes a token) and the fp32 rsqrt (4), and six
    adapted Linears read its output (q/k/v_proj.linear, relative_position_bias.linear, sink_proj, o_proj.gate_proj),
    each dropout a bool mask (4608): 2048 · (18,432 + 4 + 27,648) = 94,380,032 bytes. With checkpointing: none."""
    from hpcmem.estimate.lora import lora_layout
    from hpcmem.estimate.vision_inkling2_text import first_layer_input
    from hpcmem.job.shape import precision

    job = case_job({**RECORDS["inkling2-lora-all-nogc-640"]["case"]})
    assert first_layer_input(job, precision(job), lora_layout(job), ("adapted",)) == 94_380_032
    gc = case_job({**RECORDS["inkling2-lora-all-gc-640"]["case"]})
    assert first_layer_input(gc, precision(gc), lora_layout(gc), ("adapted",)) == 0


def test_a_full_attention_first_text_layer_is_refused_under_lora_without_checkpointing():
    """A config whose layer_types[0] is "hybrid" (three input norms, dynamic convolutions: not what
    hpcmem.estimate.vision_inkling2_text counts) is refused for LoRA without checkpointing, kept with it."""
    from dataclasses import replace

    from hpcmem.job.image_rules import image_job_problems

    def hybrid(case_id: str):
        job = case_job({**RECORDS[case_id]["case"]})
        assert not [p for p in image_job_problems(job) if "layer_types[0]" in p]
        return replace(job, model=replace(job.model, vision=replace(job.model.vision, text_first_layer="hybrid")))

    with pytest.raises(SpecError, match=r"layer_types\[0\] 'hybrid' on inkling2 with images under LoRA without"):
        hybrid("inkling2-lora-all-nogc-640")
    assert not [p for p in image_job_problems(hybrid("inkling2-lora-all-gc-640")) if "layer_types[0]" in p]


def test_the_matrix_is_all_there():
    assert len(RECORDS) == 8 + 4
    assert {(r["case"]["image_height"], r["case"]["image_width"]) for r in RECORDS.values()} == {(640, 640),
                                                                                               (960, 1280)}
    assert {r["cell"] for r in RECORDS.values()} == {f"{t}/{c}" for t in ("sft", "dpo")
                                                     for c in ("full+gc", "full+nogc", "lora+gc", "lora+nogc")}
    assert len(TWINS) == 8 and all(r["case"]["images_per_example"] == 0 for r in TWINS.values())


def test_checkpointed_layers_keep_their_fp32_input_alone():
    """modeling_inkling2.py `Inkling2VisionEncoderLayer` is a GradientCheckpointingLayer: under checkpointing each of
    the two layers keeps its input, the residual stream after `pre_layernorm` — fp32 under autocast (layer_norm's
    output), whatever the bf16 weights — 4 · 1024 bytes a row. At 960×1280: ⌈960 / 40⌉ · ⌈1280 / 40⌉ = 24 · 32 = 768
    cells (image tokens), 4 patches each = 3,072 patches, and the image's class token: 3,073 rows."""
    from hpcmem.estimate.lora import LoraLayout
    from hpcmem.estimate.vision_inkling2 import inkling2_terms
    from hpcmem.job.shape import precision

    job = case_job({**RECORDS["inkling2-full-gc-960x1280"]["case"]})
    terms = inkling2_terms(job, precision(job), LoraLayout(enabled=False))
    assert terms.blocks_saved == (4 * 1024 * 3073,) * 2
    assert terms.image_tokens == 768 and terms.patches == 3072


def test_the_interpolation_transient_by_hand():
    """The interpolated position embeddings at 640×640 (1,024 patches): the lookup [1024, 4, 1024] in bf16 (8 MiB)
    and its product with the fp32 weights, fp32 [1024, 4, 1024] (16 MiB), plus the int64 indices and fp32 weights
    [1024, 4] (48 KiB): 25,214,976 bytes."""
    from hpcmem.estimate.vision_inkling2 import embedding_instant
    from hpcmem.job.shape import precision

    job = case_job({**RECORDS["inkling2-full-nogc-640"]["case"]})
    assert embedding_instant(job.model.vision, 1024, precision(job)) == 8 * 2**20 + 16 * 2**20 + 1024 * 4 * 12


def test_images_add_to_the_estimate():
    job = case_job({**RECORDS["inkling2-full-nogc-960x1280"]["case"]})
    assert largest_component(estimate(job), "vision activations") > 0


def test_grpo_with_images_is_refused():
    """SFT and DPO with images are traced (above); GRPO and RLOO with images are not: refused."""
    with pytest.raises(SpecError, match="with trainer grpo on inkling2: hpcmem models inkling2's images for "
                                        "sft, dpo only"):
        estimate(grpo_with_images_job(ROOT / CUT, 640, 640))
