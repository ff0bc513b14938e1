"""dots3 Note SFT and DPO with images on a learned text part (tests/fixtures/vlm/dots3_note-defaults-L2-D2.json: one
sparse-indexed MLA layer over a dense MLP and one sliding-window MLA layer over 256 routed experts and a shared one, of
the text config class's widths, their terms from the learned profile in hpcmem/profiles/; the tower cut to its first 2
(dense) blocks; the audio encoder at its defaults, idle) against the trace of TRL's trainers with their vision
collators and transformers' Dots3NoteProcessor on blank 448×448 and 560×560 images, LoRA also at 1120×1120
(estimator/traces/vlm-dots3-note.jsonl, written by `hpcmem validate trace --cases estimator/cases/vlm-dots3-note.yaml
--reserved`); the tower's terms outside its blocks by hand; what is refused."""

from __future__ import annotations

from pathlib import Path

import pytest

from hpcmem.errors import SpecError
from hpcmem.estimate import estimate
from hpcmem.estimate.lora import lora_layout
from hpcmem.estimate.vision_llava import tower_terms
from hpcmem.job.shape import precision
from hpcmem.validate.cases import case_job
from tests.helpers.stored_cases import assert_learned_case_holds, assert_matrix, grpo_with_images_job, trace_records

ROOT = Path(__file__).resolve().parents[2]
RECORDS = trace_records(ROOT, "vlm-dots3-note")
CUT = "tests/fixtures/vlm/dots3_note-defaults-L2-D2.json"


@pytest.mark.parametrize("case_id", sorted(RECORDS))
def test_estimate_within_3_percent_of_the_trace(case_id):
    assert_learned_case_holds(RECORDS[case_id], ROOT)


def test_the_matrix_is_all_there():
    """The 12 cases at 448 and 560 px, and two LoRA cases at 1120 px (scaled to 980 px) where the tower's
    activations are a visible share of the peak."""
    assert_matrix(RECORDS, 14, {(448, 448), (560, 560), (1120, 1120)}, (0, 0),
                  {f"{t}/{c}" for t in ("sft", "dpo") for c in ("full+gc", "full+nogc", "lora+gc", "lora+nogc")})
    assert sorted(r["case"]["trainer"] for r in RECORDS.values()) == ["dpo"] * 4 + ["sft"] * 10


def _job(trainer="sft", **kw):
    return case_job({"trainer": trainer, "model_name_or_path": str(ROOT / CUT), "max_length": 768,
                     "images_per_example": 1, "image_height": 560, "image_width": 560, "dtype": "bfloat16",
                     "bf16": True, "per_device_train_batch_size": 1, **kw})


def test_the_parts_after_the_blocks_keep_by_hand():
    """Full fine-tuning, one 560×560 image: 40 × 40 = 1,600 tower rows of width 1536, bf16 weights under autocast,
    400 merged rows of 6144. After the blocks: the final Dots3NoteRMSNorm keeps its fp32 upcast (4 · 1536 bytes a
    row) and, its weight training, the bf16 normalised tensor and its fp32 product's cast (2 · 1536 + 2 · 1536);
    the merger's ln_q (a torch LayerNorm: fp32 input, fp32 mean and rstd, the bf16 output mlp.0 reads:
    4 · 1536 + 8 + 2 · 1536); mlp.0's output (GELU's input) and GELU's output (mlp.2's input), the bytes of two
    [1600, 1536] bf16 tensors."""
    job = _job(gradient_checkpointing=True)
    terms = tower_terms(job, precision(job), lora_layout(job))
    n, h = 1600, 1536
    final_norm = n * (4 * h + 2 * h + 2 * h)
    ln_q = n * (4 * h + 8 + 2 * h)
    assert terms.merger_saved == final_norm + ln_q + 2 * (2 * h * n)
    assert terms.image_tokens == 400 and terms.patches == n


def test_the_tower_trains_whole_the_audio_encoder_never():
    """Full fine-tuning: bf16 gradients of every tower and merger parameter, none of the audio encoder's (no image
    runs it). LoRA all-linear: the adapters of the tower's and merger's linears get gradients, the audio encoder's
    load (their weights counted) and get none."""
    full = _job(gradient_checkpointing=False)
    v = full.model.vision
    terms = tower_terms(full, precision(full), lora_layout(full))
    assert terms.gradients == 2 * (v.tower_params + v.merger_params)
    assert terms.weights == 2 * v.num_params + v.audio.buffer_bytes
    lora = _job(gradient_checkpointing=False, use_peft=True, lora_target_modules="all-linear")
    image = sum(16 * (x.in_features + x.out_features) * x.count for x in v.linears() if x.part != "audio")
    assert tower_terms(lora, precision(lora), lora_layout(lora)).gradients == image * lora_layout(lora).adapter_bytes


def test_grpo_with_images_is_refused():
    """SFT and DPO with images are traced (above); GRPO and RLOO with images are not: refused."""
    with pytest.raises(SpecError, match="with trainer grpo on dots3_note: hpcmem models dots3_note's images "
                                        "for sft, dpo only"):
        estimate(grpo_with_images_job(ROOT / CUT, 448, 448))
