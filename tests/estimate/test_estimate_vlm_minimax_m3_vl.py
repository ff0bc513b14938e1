"""MiniMax M3 VL SFT and DPO with images on a learned text part (tests/fixtures/vlm/minimax-m3-vl-defaults-L2-D2.json:
two minimax_m3_vl_text layers of the text config class's widths — 64 heads, 4 kv heads, 128 routed experts of 3072 and
a shared one — their terms from the learned profile in hpcmem/profiles/; MiniMaxM3VLVisionConfig's tower cut to 2
layers under its two-stage merging projector) against the trace of TRL's SFTTrainer and DPOTrainer with their vision
collators and transformers' MiniMaxM3VLProcessor (a PIL stand-in for its torchvision-only image processor) on blank
448×448 and 672×560 images, then three LoRA cases of four and two images a row added after those twelve were traced
(estimator/traces/vlm-minimax-m3-vl.jsonl, written by `hpcmem validate trace --cases
estimator/cases/vlm-minimax-m3-vl.yaml --reserved --workers 1`; the estimate untouched after either)."""

from __future__ import annotations

from pathlib import Path

import pytest

from hpcmem.errors import SpecError
from hpcmem.estimate import estimate
from hpcmem.estimate.lora import LoraLayout
from hpcmem.estimate.vision_minimax_m3_vl import minimax_m3_terms
from hpcmem.job.shape import precision
from hpcmem.validate.cases import case_job
from tests.helpers.stored_cases import (assert_learned_case_holds, assert_matrix, grpo_with_images_job,
                                        largest_component, trace_records)

ROOT = Path(__file__).resolve().parents[2]
RECORDS = trace_records(ROOT, "vlm-minimax-m3-vl")
CUT = "tests/fixtures/vlm/minimax-m3-vl-defaults-L2-D2.json"


@pytest.mark.parametrize("case_id", sorted(RECORDS))
def test_estimate_within_3_percent_of_the_trace(case_id):
    assert_learned_case_holds(RECORDS[case_id], ROOT)


def test_the_matrix_is_all_there():
    assert_matrix(RECORDS, 12 + 3, {(448, 448), (672, 560)}, (0, 0),
                  {f"{t}/{c}" for t in ("sft", "dpo") for c in ("full+gc", "full+nogc", "lora+gc", "lora+nogc")})
    for c in ("full+gc", "full+nogc", "lora+gc", "lora+nogc"):
        sizes = {r["case"]["image_height"] for r in RECORDS.values() if r["cell"] == f"sft/{c}"}
        assert sizes == {448, 672}, (c, sizes)


def test_the_tower_at_448_by_hand():
    """448×448 stays 448×448 (smart_resize at 28 px within 3,136 … 451,584 pixels): 32 × 32 = 1,024 patches of
    3 · 2 · 14² = 1,176 fp32 values, 256 image tokens. Under checkpointing each of the two CLIPEncoderLayers
    (GradientCheckpointingLayers) keeps its input [1,024, 1280] alone, fp32: pre_layrnorm's output under autocast
    (layer_norm's fp32 policy) is the residual stream the layers add their bf16 outputs to. Full fine-tuning trains the Conv3d
    (1176 · 1280, no bias), pre_layrnorm, both layers (q/k/v/out_proj 1280² with biases, fc1/fc2 1280 ↔ 5120 with
    biases, two LayerNorms) and the projector (1280 → 6144, 6144 → 6144, 24576 → 6144, 6144 → 6144, biases): AdamW's
    two bf16 states, 4 bytes a parameter. The projector keeps linear_1's bf16 input [1024, 1280], both GELUs' inputs
    and outputs ([1024, 6144] and [256, 6144], bf16), merge_linear_1's input [256, 24576]; pre_layrnorm its fp32 input
    and fp32 mean and rstd per row."""
    job = case_job({**RECORDS["mm3-full-gc-448"]["case"], "model_name_or_path": str(ROOT / CUT)})
    terms = minimax_m3_terms(job, precision(job), LoraLayout(enabled=False))
    n, m, h, i, p, o = 32 * 32, 256, 1280, 5120, 6144, 6144
    assert (terms.patches, terms.image_tokens) == (n, m)
    assert terms.blocks_saved == (4 * h * n,) * 2
    assert terms.pixels == n * 1176 * 4
    layer = 4 * (h * h + h) + (h * i + i) + (i * h + h) + 4 * h
    projector = (h * p + p) + (p * o + o) + (4 * o * p + p) + (p * o + o)
    trainable = 1176 * h + 2 * h + 2 * layer + projector
    assert terms.optimizer == trainable * 4
    gelus = 2 * 2 * p * (n + m)
    assert terms.merger_saved == gelus + 2 * (h * n + 4 * o * m) + (4 * h + 8) * n


def test_images_add_to_the_estimate():
    job = case_job({**RECORDS["mm3-full-nogc-672"]["case"], "model_name_or_path": str(ROOT / CUT)})
    assert largest_component(estimate(job), "vision activations") > 0


def test_grpo_with_images_is_refused():
    """SFT and DPO with images are traced (above); GRPO and RLOO with images are not: refused."""
    with pytest.raises(SpecError, match="with trainer grpo on minimax_m3_vl: hpcmem models minimax_m3_vl's images "
                                        "for sft, dpo only"):
        estimate(grpo_with_images_job(ROOT / CUT, 448, 448))
