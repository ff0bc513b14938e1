"""Apertus 1.5 SFT and DPO with images on a learned text part (tests/fixtures/vlm/apertus1p5-defaults-L2-D2.json: two
apertus1p5_text layers of the text config class's widths, their terms from the learned profile in hpcmem/profiles/;
Apertus1p5VisionTokenizerConfig's VQ encoder cut to 2 ResNet blocks a stage) against the trace of TRL's SFTTrainer
and DPOTrainer with their vision collators and transformers' Apertus1p5Processor on blank 512×512 and 896×672 images
(estimator/traces/vlm-apertus1p5.jsonl, written by `hpcmem validate trace --cases estimator/cases/vlm-apertus1p5.yaml
--reserved --workers 1`)."""

from __future__ import annotations

from pathlib import Path

import pytest

from hpcmem.errors import SpecError
from hpcmem.estimate import estimate
from hpcmem.estimate.lora import lora_layout
from hpcmem.estimate.vision_apertus1p5 import (attn_saved, embedding_backward, graph_instant, graphless_instant,
                                               resnet_saved)
from hpcmem.job.shape import precision
from hpcmem.validate.cases import case_job
from tests.helpers.stored_cases import assert_learned_case_holds, grpo_with_images_job, trace_records

ROOT = Path(__file__).resolve().parents[2]
RECORDS = trace_records(ROOT, "vlm-apertus1p5")
CUT = "tests/fixtures/vlm/apertus1p5-defaults-L2-D2.json"


def _job(case_id: str):
    return case_job({**RECORDS[case_id]["case"], "model_name_or_path": str(ROOT / CUT)})


@pytest.mark.parametrize("case_id", sorted(RECORDS))
def test_estimate_within_3_percent_of_the_trace(case_id):
    assert_learned_case_holds(RECORDS[case_id], ROOT)


def test_the_matrix_is_all_there():
    assert len(RECORDS) == 8 + 4
    assert {(r["case"]["image_height"], r["case"]["image_width"]) for r in RECORDS.values()} == {(512, 512),
                                                                                               (672, 896)}
    assert {r["cell"] for r in RECORDS.values()} == {f"{t}/{c}" for t in ("sft", "dpo")
                                                     for c in ("full+gc", "full+nogc", "lora+gc", "lora+nogc")}


def test_the_blocks_by_hand():
    """With grad, bf16 autocast (2 bytes) and fp32 GroupNorms (4): a ResNet block of 256 channels on 64 × 64 cells keeps
    norm1's fp32 input, the sigmoid's fp32 output, the in-place multiply's fp32 copy and conv1's bf16 input, then the
    same four for norm2 / conv2: 2 · (3 · 4 + 2) · 256 · 4096 = 29,360,128 bytes; widening 256 → 512 adds the block
    input for nin_shortcut (2 · 256 · 4096) and takes the second half at 512 channels; an attention block of 1,024
    channels on 32 × 32 = 1,024 cells: the norm's fp32 input, q/k/v's three cast inputs and their outputs and
    proj_out's input (4 + 7 · 2 = 18 bytes a channel-cell) and the [1024, 1024] softmax output fp32 plus its bf16 cast."""
    assert resnet_saved(256, 256, 4096, 2) == 2 * (3 * 4 + 2) * 256 * 4096 == 29_360_128
    assert resnet_saved(256, 512, 4096, 2) == (14 * 256 + 14 * 512 + 2 * 256) * 4096
    assert attn_saved(1024, 1024, 2) == 18 * 1024 * 1024 + 6 * 1024 * 1024


def test_the_tokenizer_instants_by_hand():
    """512 × 512, the cut (2 blocks a stage): without a graph the widest instant is stage 0's second block at norm2 —
    the stage's input, the block's input, conv1's output (bf16) and the norm's fp32 copy and output: (3 · 2 + 2 · 4) ·
    256 · 512² = 939,524,096 bytes, above the quantizer's 1,024 × 131,072 bf16 logits with the adapter's scaled output
    and sum (3 · 268,435,456 = 805,306,368, plus its 1,024 × 256 input, dropout output (bf16) and mask). Full
    fine-tuning's graph at the logits is the sum of every op's saved tensors (test_the_blocks_by_hand's terms over the
    five stages, the downsamples' padded inputs, the middle and the head)."""
    job = _job("ap15-lora-all-gc-512")
    v, lora = job.model.vision, lora_layout(job)
    assert graphless_instant(v, 512, 512, 2, lora, True) == 14 * 256 * 512 * 512 == 939_524_096
    quant = 2 * 256 * 1024 + 3 * 1024 * 131072 * 2 + 1024 * 256 * (2 + 1)
    assert quant < 939_524_096
    stage0 = 2 * resnet_saved(256, 256, 512 * 512, 2)
    assert graph_instant(v, 512, 512, 2) > stage0 + 2 * 3 * 512 * 512


def test_the_second_embedding_gradient():
    """Full fine-tuning embeds the text ids and the image codes with the same table: the second dense gradient,
    266,752 × 4,096 bf16 = 2,185,232,384 bytes (the trace's "backward / embeddings" temporary at 512 × 512 under
    checkpointing: 2,210,400,768 with the rest of that instant); LoRA leaves the table frozen."""
    job = _job("ap15-full-gc-512")
    assert embedding_backward(job, precision(job), True) == 266752 * 4096 * 2 == 2_185_232_384
    assert embedding_backward(job, precision(job), False) == 0
    assert estimate(job).peak_phase.name == "backward (image token embedding)"


def test_grpo_with_images_is_refused():
    """SFT and DPO with images hold (the stored traces above); GRPO and RLOO with images are not traced: refused."""
    with pytest.raises(SpecError, match="with trainer grpo on apertus1p5: hpcmem models apertus1p5's images for "
                                        "sft, dpo only"):
        estimate(grpo_with_images_job(ROOT / CUT, 512, 512))
