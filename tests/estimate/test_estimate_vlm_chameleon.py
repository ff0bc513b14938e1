"""Chameleon SFT and DPO with images on a learned text part (tests/fixtures/vlm/chameleon-defaults-L2-D2.json: two
decoder layers of ChameleonConfig's widths, their terms from the learned chameleon_text profile in hpcmem/profiles/;
the VQ-VAE whole) against the trace of TRL's SFTTrainer and DPOTrainer with their vision collators and transformers'
ChameleonProcessor on blank images (estimator/traces/vlm-chameleon.jsonl, written by `hpcmem validate trace --cases
estimator/cases/vlm-chameleon.yaml`, with the VQ-VAE's GroupNorms and softmax in fp32 as CUDA autocast runs
them, hpcmem.trace.kernels_autocast `vq_tokenizer_fp32`)."""

from __future__ import annotations

from pathlib import Path

import pytest

from hpcmem.errors import SpecError
from hpcmem.estimate import estimate
from hpcmem.validate.cases import case_job
from tests.helpers.stored_cases import assert_learned_case_holds, grpo_with_images_job, largest_component, trace_records

ROOT = Path(__file__).resolve().parents[2]
RECORDS = trace_records(ROOT, "vlm-chameleon")
CUT = "tests/fixtures/vlm/chameleon-defaults-L2-D2.json"
MIB = 2**20


@pytest.mark.parametrize("case_id", sorted(RECORDS))
def test_estimate_within_3_percent_of_the_trace(case_id):
    assert_learned_case_holds(RECORDS[case_id], ROOT, max_pct=3.0)


def test_the_matrix_is_all_there():
    assert len(RECORDS) == 8 + 4
    assert {r["case"].get("images_per_example", 1) for r in RECORDS.values()} == {1, 2}
    assert {r["cell"] for r in RECORDS.values()} == {f"{t}/{c}" for t in ("sft", "dpo")
                                                     for c in ("full+gc", "full+nogc", "lora+gc", "lora+nogc")}


def _terms(case_id: str):
    from hpcmem.estimate.lora import lora_layout
    from hpcmem.estimate.vision_chameleon import chameleon_terms
    from hpcmem.job.shape import precision

    job = case_job({**RECORDS[case_id]["case"]})
    return chameleon_terms(job, precision(job), lora_layout(job))


def test_a_resnet_block_s_recorded_forward_by_hand():
    """Level 0 (128 channels at 512 × 512, 262,144 positions) under bf16 autocast, per GroupNorm → x·sigmoid(x) →
    conv: the fp32 input copy (128 MiB), sigmoid's fp32 output (128 MiB), the in-place product's copy of its left
    factor (128 MiB), the conv's bf16 input cast (64 MiB), and 32 fp32 means and rstds (256 bytes): 448 MiB + 256,
    twice a block."""
    from hpcmem.estimate.vision_chameleon import _resnet_saved
    from hpcmem.job.shape import precision

    job = case_job({**RECORDS["chameleon-full-nogc-1img"]["case"]})
    assert _resnet_saved(128, 128, 512 * 512, precision(job)) == 2 * (448 * MIB + 256)


def test_nothing_in_the_vq_vae_trains():
    """Its codes are integers: no gradient, no optimizer state, no adapter, full fine-tuning or LoRA."""
    for case_id in ("chameleon-full-nogc-1img", "chameleon-lora-all-nogc-1img"):
        terms = _terms(case_id)
        assert terms.gradients == terms.optimizer == 0 and terms.blocks_saved == ()


def test_the_no_grad_forward_s_widest_instant_by_hand():
    """LoRA (no graph): at level 0's second ResnetBlock the encoder's list holds conv_in's and block 0's bf16 outputs
    (2 × 64 MiB); its second GroupNorm holds conv1's bf16 output (64 MiB), the fp32 input copy and the fp32 output
    (2 × 128 MiB): 448 MiB an image, and 1,024 image tokens."""
    terms = _terms("chameleon-lora-all-nogc-1img")
    assert terms.connector_forward == 448 * MIB
    assert terms.image_tokens == terms.patches == 1024


def test_full_fine_tuning_adds_a_second_embedding_gradient():
    """The image codes' own embed_tokens call: a second dense [65,536, 4,096] bf16 gradient (512 MiB) at the
    backward's end; none under LoRA (the embeddings frozen)."""
    assert _terms("chameleon-full-gc-1img").embedding_backward == 65536 * 4096 * 2
    assert _terms("chameleon-lora-all-gc-1img").embedding_backward == 0


def test_images_add_to_the_estimate():
    job = case_job({**RECORDS["chameleon-full-nogc-1img"]["case"]})
    assert largest_component(estimate(job), "vision outputs (forward only)") > 0


def test_grpo_with_images_is_refused():
    """SFT and DPO with images hold (the stored traces above); GRPO and RLOO with images are not traced: refused."""
    with pytest.raises(SpecError, match="with trainer grpo on chameleon: hpcmem models chameleon's images for sft, "
                                        "dpo only"):
        estimate(grpo_with_images_job(ROOT / CUT, 480, 640))
