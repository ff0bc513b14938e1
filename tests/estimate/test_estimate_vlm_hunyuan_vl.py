"""HunYuanVL SFT and DPO with images on a learned text part (tests/fixtures/vlm/hunyuan-vl-defaults-L2-D2.json: two
hunyuan_vl_text layers of the text config class's widths, head_dim and M-RoPE as tencent/HunyuanOCR's config.json sets
them, their terms from the learned profile in hpcmem/profiles/; HunYuanVLVisionConfig's tower cut to 2 layers under the
convolution patch merger) against the trace of TRL's SFTTrainer and DPOTrainer with their vision collators and
transformers' HunYuanVLProcessor on blank 512×512 and 896×672 images (estimator/traces/vlm-hunyuan-vl.jsonl, written
once by `hpcmem validate trace --cases estimator/cases/vlm-hunyuan-vl.yaml --reserved --workers 1`)."""

from __future__ import annotations

from pathlib import Path

import pytest

from hpcmem.errors import SpecError
from hpcmem.estimate import estimate
from hpcmem.estimate.lora import lora_layout
from hpcmem.estimate.vision_hunyuan_vl import first_block_difference, first_layer_input, merger_saved
from hpcmem.job.shape import Precision, precision
from hpcmem.validate.cases import case_job
from tests.helpers.stored_cases import assert_learned_case_holds, grpo_with_images_job, trace_records

ROOT = Path(__file__).resolve().parents[2]
RECORDS = trace_records(ROOT, "vlm-hunyuan-vl")
CUT = "tests/fixtures/vlm/hunyuan-vl-defaults-L2-D2.json"


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


def test_the_merger_by_hand():
    """modeling_hunyuan_vl.py `HunYuanVLVisionPatchMerger.forward` on one 896×672 image (56 × 42 patches, N = 2,352;
    28 × 22 = 616 merged rows with their newline column, 618 image tokens): before_rms's fp32 input and rsqrt
    (4 · 1152 + 4 bytes a patch row), proj_conv's 16-bit input copy (2 · 1152), gelu's input and proj_out's input
    (2 · 2304 bytes each on N / 4 rows), after_rms's fp32 input and rsqrt (4 · 4096 + 4 a token) — the convolutions keep
    their inputs frozen or not; trained, before_rms's and after_rms's 16-bit normalised rows and mlp's input
    [616, 4608] besides."""
    job = _job("hyvl-full-nogc-896")
    v, n = job.model.vision, 2352
    prec = Precision(weight=2, act=2, residual=2, autocast=False, amp=True)
    frozen = (4 * 1152 + 4) * n + 2 * 1152 * n + 2 * (2 * 2304 * 588) + (4 * 4096 + 4) * 618
    off = lora_layout(job)
    assert merger_saved(v, n, 1, 618, prec, trained=False, adapted=[], lora=off) == frozen
    assert merger_saved(v, n, 1, 618, prec, trained=True, adapted=[], lora=off) == \
        frozen + 2 * 1152 * n + 2 * 4608 * 616 + 2 * 4096 * 618


def test_layer_0_and_block_0_under_lora_without_checkpointing():
    """LoRA all-linear without checkpointing at 512×512 (SFT, lora_dropout 0.05): the image rows make decoder layer
    0's input require grad, so its input_layernorm keeps its fp32 input and rsqrt (4 · 4096 + 4 bytes a token) and
    the dropouts before q/k/v_proj's adapters their masks (3 · 4096), over 1,536 tokens: 44,046,336 bytes (the trace
    of this job with images held 24 MiB + 18 MiB + 6 KiB more at layer 0 than without: the profile has none of it);
    the tower's block 0 keeps less than block 1 by layer_norm1's fp32 input and statistics (4 · 1152 + 8) and
    three masks (3 · 1152) on its 1,024 rows: 8,265,728 bytes."""
    job = _job("hyvl-lora-all-nogc-512")
    prec, lora = precision(job), lora_layout(job)
    adapted = job.model.vision.linears()
    assert first_layer_input(job, prec, lora, adapted) == 1536 * (4 * 4096 + 4 + 3 * 4096) == 44_046_336
    assert first_block_difference(job.model.vision, 1024, prec, lora, adapted, gc=False) == \
        1024 * (4 * 1152 + 8 + 3 * 1152) == 8_265_728
    gc = _job("hyvl-lora-all-gc-512")
    assert first_layer_input(gc, precision(gc), lora_layout(gc), adapted) == 0


def test_grpo_with_images_is_refused():
    """SFT and DPO with images hold (the stored traces above); GRPO and RLOO with images are not traced: refused."""
    with pytest.raises(SpecError, match="with trainer grpo on hunyuan_vl: hpcmem models hunyuan_vl's images for "
                                        "sft, dpo only"):
        estimate(grpo_with_images_job(ROOT / CUT, 512, 512))
