"""PaliGemma traced now against its estimate: TRL's SFTTrainer with its vision collator and transformers'
PaliGemmaProcessor on real 480×640 images resized to 448 px, PaliGemma 2 3B's widths cut to 1 decoder layer and 4
SigLIP layers (estimator/cases/vlm-paligemma.yaml), full fine-tuning without checkpointing: the step's peak and the
tower's own backward within 3 %. And what TRL's collator hands the model: every image's 1,024 tokens, one bos, the
words, and token_type_ids all 0 (no suffix: PaliGemmaModel's mask makes the whole row one bidirectional prefix)."""

from __future__ import annotations

import pytest

pytest.importorskip("trl")

from tests.helpers.trace_helpers import collated_image_row, estimate_holds_vision_trace, shipped_case_job  # noqa: E402

pytestmark = pytest.mark.torch


def _job(case_id: str):
    return shipped_case_job("vlm-paligemma.yaml", case_id)


def test_the_trace_of_today_agrees_with_the_estimate():
    estimate_holds_vision_trace(_job("pg448-full-nogc"), 3.0)


def test_the_collator_fills_the_row_and_marks_it_all_prefix():
    job = _job("pg448-full-nogc")
    proc, batch = collated_image_row(job, 2560)
    ids = batch["input_ids"][0]
    assert ids.shape == (2560,)
    assert int((ids == proc.image_token_id).sum()) == (448 // 14) ** 2
    assert int((ids == proc.tokenizer.bos_token_id).sum()) == 1
    assert int(batch["token_type_ids"].sum()) == 0
    assert tuple(batch["pixel_values"].shape) == (1, 3, 448, 448)


def test_dpo_fails_in_trl_as_hpcmem_says():
    """TRL 1.16's DPO vision collator runs PaliGemmaProcessor on the completions without images, which raises; hpcmem
    refuses DPO with paligemma images naming that message."""
    from PIL import Image
    from trl.trainer.dpo_trainer import DataCollatorForVisionPreference

    from hpcmem.errors import SpecError
    from hpcmem.job.image_rules import PALIGEMMA_NEEDS_IMAGES
    from hpcmem.trace.vision import processor

    job = _job("pg224-full-gc")
    example = {"images": [Image.new("RGB", (64, 48))], "prompt": [{"role": "user", "content": "t3"}],
               "chosen": [{"role": "assistant", "content": "t3"}], "rejected": [{"role": "assistant", "content": "t3"}]}
    with pytest.raises(ValueError, match=PALIGEMMA_NEEDS_IMAGES.replace("`", ".")):
        DataCollatorForVisionPreference(processor=processor(job))([example])
    with pytest.raises(SpecError, match="PaliGemmaProcessor raises"):
        shipped_case_job("vlm-paligemma.yaml", "pg224-full-gc", trainer="dpo")
