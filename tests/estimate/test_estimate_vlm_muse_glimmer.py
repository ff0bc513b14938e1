"""Muse Glimmer SFT and DPO with images on a learned text part (tests/fixtures/vlm/muse-glimmer-defaults-L2-D2.json:
two muse_glimmer_text layers of the text config class's widths, their terms from the learned profile in
hpcmem/profiles/; MuseGlimmerVisionConfig's tower cut to 2 layers under pixel_shuffle, the vision adapter and
projection) against the trace of TRL's SFTTrainer and DPOTrainer with their vision collators and transformers'
MuseGlimmerProcessor (around hpcmem.trace.vision_muse_glimmer's PIL stand-in) on blank 448×448 and 896×672 images
(estimator/traces/vlm-muse-glimmer.jsonl, written once by `hpcmem validate trace --cases
estimator/cases/vlm-muse-glimmer.yaml --reserved`; the tower's terms changed twice after, in-sample, see
`test_the_tower_s_growth_from_448_to_896_is_the_trace_s`)."""

from __future__ import annotations

from pathlib import Path

import pytest

from hpcmem.errors import SpecError
from hpcmem.estimate import estimate
from hpcmem.estimate.lora import LoraLayout
from hpcmem.estimate.vision_muse_glimmer import merger_saved, muse_glimmer_terms
from hpcmem.job.shape import Precision
from hpcmem.validate.cases import case_job
from tests.helpers.stored_cases import (assert_learned_case_holds, estimated_tensor_peak, grpo_with_images_job,
                                       trace_records)

ROOT = Path(__file__).resolve().parents[2]
RECORDS = trace_records(ROOT, "vlm-muse-glimmer")
CUT = "tests/fixtures/vlm/muse-glimmer-defaults-L2-D2.json"
PREC = Precision(weight=2, act=2, residual=2, autocast=False, amp=True)


@pytest.mark.parametrize("case_id", sorted(RECORDS))
def test_estimate_within_3_percent_of_the_trace(case_id):
    assert_learned_case_holds(RECORDS[case_id], ROOT)


def test_the_matrix_is_all_there():
    assert len(RECORDS) == 8 + 4
    assert {(r["case"]["image_height"], r["case"]["image_width"]) for r in RECORDS.values()} == {(448, 448),
                                                                                               (672, 896)}
    assert {r["cell"] for r in RECORDS.values()} == {f"{t}/{c}" for t in ("sft", "dpo")
                                                     for c in ("full+gc", "full+nogc", "lora+gc", "lora+nogc")}


def test_what_follows_the_layers_by_hand():
    """At 896×672 (3,072 patches, 768 merged rows), frozen: the reverse window gather's and pixel_shuffle's int64
    indices (8 B a patch each), ln_post's fp32 input and fp32 mean and rstd (4 · 1536 + 8 B a patch), both GELUs'
    bf16 inputs [768, 4096] and perception_emb_norm's fp32 copy [768, 6656] with its two fp32 [768, 1] tensors;
    trained, fc1's bf16 input [768, 6144] and fc2's and vision_projection's [768, 4096] inputs besides."""
    job = case_job({**RECORDS["mglim-full-nogc-896"]["case"], "model_name_or_path": str(ROOT / CUT)})
    v, n, rows = job.model.vision, 3072, 768
    frozen = 16 * n + (4 * 1536 + 8) * n + 2 * 2 * 4096 * rows + (4 * 6656 + 8) * rows
    off = LoraLayout(enabled=False)
    assert merger_saved(v, n, PREC, trained=False, adapted=[], lora=off) == frozen
    assert merger_saved(v, n, PREC, trained=True, adapted=[], lora=off) == \
        frozen + 2 * 6144 * rows + 2 * 2 * 4096 * rows


def test_the_checkpointed_layers_keep_an_fp32_residual():
    """ln_pre's output is fp32 under autocast (layer_norm runs in fp32), so under checkpointing each layer keeps an
    fp32 [3072, 1536] input — twice a bf16 stream's."""
    job = case_job({**RECORDS["mglim-full-gc-896"]["case"], "model_name_or_path": str(ROOT / CUT)})
    terms = muse_glimmer_terms(job, PREC, LoraLayout(enabled=False))
    assert terms.blocks_saved == (4 * 1536 * 3072,) * 2
    assert terms.patches == 3072 and terms.image_tokens == 768


@pytest.mark.parametrize("cell", ["full-nogc", "full-gc", "lora-all-nogc", "lora-all-gc"])
def test_the_tower_s_growth_from_448_to_896_is_the_trace_s(cell):
    """2,048 more patches (1,024 → 3,072) leave the text part's 1,536 tokens as they are: the peak grows by what the
    tower keeps for them, held to the traces' own growth within 0.1 MiB. Full fine-tuning without checkpointing is
    the case that found q_proj's, k_proj's and v_proj's own 16-bit casts of norm1's fp32 output (2 · 2 · 1536 bytes a
    patch a layer beyond the one cast counted with the norm: 25,165,824 bytes over the two layers; the estimate was
    that far under before, in-sample after); LoRA the one that found patch_embedding's adapter keeping no dropout
    mask (its input, the pixel rows' copy, requires no grad: 1,176 bytes a patch, 2,408,448 over before)."""
    small, large = RECORDS[f"mglim-{cell}-448"], RECORDS[f"mglim-{cell}-896"]
    traced = large["traced"] - small["traced"]
    estimated = estimated_tensor_peak(large, ROOT) - estimated_tensor_peak(small, ROOT)
    assert abs(estimated - traced) < 2 ** 20


def test_grpo_with_images_is_refused():
    """SFT and DPO with images hold (the stored traces above); GRPO and RLOO with images are not traced: refused."""
    with pytest.raises(SpecError, match="with trainer grpo on muse_glimmer: hpcmem models muse_glimmer's images for "
                                        "sft, dpo only"):
        estimate(grpo_with_images_job(ROOT / CUT, 448, 448))
