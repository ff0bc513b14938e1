"""Fuyu SFT and DPO with images on a learned text part (tests/fixtures/vlm/fuyu-defaults-L2.json: two Persimmon
layers of the text config class's widths, their terms from the learned profile in hpcmem/profiles/; no tower, the
vision_embed_tokens patch Linear) against the trace of TRL's SFTTrainer and DPOTrainer with their vision collators and
transformers' FuyuProcessor on blank 448×448 and 896×672 images (estimator/traces/vlm-fuyu.jsonl, written once by
`hpcmem validate trace --cases estimator/cases/vlm-fuyu.yaml`; after it, two mechanisms added: layer 0's input
requiring grad under LoRA without checkpointing, hpcmem.estimate.vision_fuyu `first_layer_input`, and the text part's
profile learned with its LayerNorms in fp32 under autocast, as the image jobs' trace runs them)."""

from __future__ import annotations

from pathlib import Path

import pytest

from hpcmem.errors import SpecError
from hpcmem.estimate import estimate
from hpcmem.validate.cases import case_job
from tests.helpers.stored_cases import assert_learned_case_holds, grpo_with_images_job, largest_component, trace_records

ROOT = Path(__file__).resolve().parents[2]
RECORDS = trace_records(ROOT, "vlm-fuyu")
CUT = "tests/fixtures/vlm/fuyu-defaults-L2.json"
MIB = 2**20


@pytest.mark.parametrize("case_id", sorted(RECORDS))
def test_estimate_within_3_percent_of_the_trace(case_id):
    assert_learned_case_holds(RECORDS[case_id], ROOT, max_pct=3.0)


def test_the_text_part_is_learned_with_fp32_layer_norms():
    """The image jobs' trace runs Persimmon's nn.LayerNorms in fp32 under autocast (hpcmem.trace.kernels_autocast
    `layer_norm_fp32`), so its profile's cells are traced so too. Layer 0 of the LoRA (r 16, all-linear, dropout 0.05)
    cell without checkpointing at 2 rows × 1536 tokens (T = 3072, width 4096, 64 heads of 64), what it leaves when layer 1
    starts: the learner's job traced with the mapping off left 541.64 MiB (a trace, 16-bit layer norms); with it,
    q_layernorm and k_layernorm keep fp32 copies of their [T, 64, 64] inputs (the 16-bit ones were views of the
    query_key_value output, kept anyway), post_attention_layernorm keeps an fp32 copy of its [T, 4096] input in place
    of the bf16 residual sum it kept, and the two per-head norms' mean and rstd ([T · 64] each) are fp32 instead of
    bf16 (input_layernorm keeps nothing: layer 0's input needs no grad text-only). The Fuyu trace of the same rows
    (images_per_example 0) left 663.18 MiB."""
    from hpcmem.models.profile import load_profile

    profile = load_profile(ROOT / "hpcmem/profiles/persimmon-485d1bd432d14546.json")
    assert profile.provenance.get("layer_norm_fp32") is True
    t, width, head_rows = 2 * 1536, 4096, 2 * 1536 * 64
    more = 3 * t * width * 4 - t * width * 2 + 2 * 2 * head_rows * (4 - 2)
    layer0 = profile.cell("w2a2", "lora", False).fwd[0].at(t, 2 * 1536 * 1536)
    assert layer0 == pytest.approx(541.64 * MIB + more, rel=1e-3)
    assert layer0 == pytest.approx(663.18 * MIB, rel=1e-3)


def test_the_matrix_is_all_there():
    assert len(RECORDS) == 8 + 4
    assert {(r["case"]["image_height"], r["case"]["image_width"]) for r in RECORDS.values()} == {(448, 448),
                                                                                               (672, 896)}
    assert {r["cell"] for r in RECORDS.values()} == {f"{t}/{c}" for t in ("sft", "dpo")
                                                     for c in ("full+gc", "full+nogc", "lora+gc", "lora+nogc")}


def test_the_patches_are_the_image_tokens():
    """FuyuProcessor at 896×672: 23 × 30 patches of 30 px (690×900 after rounding up), one |SPEAKER| token each; the
    full fine-tuning step keeps vision_embed_tokens' bf16 input copy [690, 2700]."""
    from hpcmem.estimate.lora import LoraLayout
    from hpcmem.estimate.vision_fuyu import fuyu_terms
    from hpcmem.job.shape import precision

    job = case_job({**RECORDS["fuyu-full-nogc-896"]["case"]})
    terms = fuyu_terms(job, precision(job), LoraLayout(enabled=False))
    assert terms.patches == terms.image_tokens == 690
    assert terms.pixels == 690 * 2700 * 4
    assert terms.saved >= 690 * 2700 * 2


def test_images_add_to_the_estimate():
    job = case_job({**RECORDS["fuyu-full-nogc-896"]["case"]})
    assert largest_component(estimate(job), "vision activations") > 0


def test_grpo_with_images_is_refused():
    """SFT and DPO with images hold (the stored traces above); GRPO and RLOO with images are not traced: refused."""
    with pytest.raises(SpecError, match="with trainer grpo on fuyu: hpcmem models fuyu's images for sft, dpo only"):
        estimate(grpo_with_images_job(ROOT / CUT, 448, 448))
