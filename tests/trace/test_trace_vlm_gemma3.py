"""Gemma 3 with images traced now against its estimate, at shapes the matrix (estimator/cases/vlm-gemma3.yaml, cut from
gemma-3-4b-it) does not hold: gemma-3-12b-it's widths (tests/fixtures/vlm/gemma3-12b-width-L1-D3.json: decoder width
3840, one full-attention decoder layer, 3 SigLIP layers), 480×640 images that Gemma3ImageProcessor resizes to 896×896
(4,096 patches, 256 image tokens each): LoRA all-linear with checkpointing and two images per row, full fine-tuning
without checkpointing and three — the step's peak and the tower's own backward within 3 %. And a tiny Gemma 3 run by
TRL's SFTTrainer for real on the CPU against the trace of the same job (`--kernels cpu`), the check that the
fake-tensor trace sees what the real step allocates (Gemma3Processor, token_type_ids and the bidirectional image
mask included)."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("trl")

from hpcmem.job.trl_config import build_job  # noqa: E402
from tests.helpers.trace_helpers import estimate_holds_vision_trace, trace_matches_cpu  # noqa: E402

pytestmark = pytest.mark.torch
FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "vlm"
WIDE = FIXTURES / "gemma3-12b-width-L1-D3.json"
TINY = FIXTURES / "gemma3-tiny.json"        # width 128, 2 decoder layers, 2 SigLIP layers of width 64, 56 px images
MAX_PCT = 3.0


def sft_job(config: Path, **kw):
    settings = {"model_name_or_path": str(config), "dtype": "bfloat16", "bf16": True, "per_device_train_batch_size": 1,
                "image_height": 480, "image_width": 640, **kw}
    return build_job("sft", settings)[0]


def test_the_12b_width_lora_trace_agrees_with_the_estimate():
    """About 20 s on two shared cores."""
    job = sft_job(WIDE, max_length=768, images_per_example=2, use_peft=True, lora_target_modules=["all-linear"],
                  gradient_checkpointing=True)
    estimate_holds_vision_trace(job, MAX_PCT)


def test_the_12b_width_full_trace_agrees_with_the_estimate():
    """About 15 s on two shared cores."""
    job = sft_job(WIDE, max_length=1024, images_per_example=3, gradient_checkpointing=False)
    estimate_holds_vision_trace(job, MAX_PCT)


def test_a_real_sft_trainer_runs_gemma3_as_traced():
    """TRL's SFTTrainer for real on the CPU (random weights, two steps, the vision collator and Gemma3Processor on one
    image per row resized to 56×56; a few seconds) against `run_trace(kernels="cpu")`: the same peak within 1 % in the
    same phase."""
    trace_matches_cpu(sft_job(TINY, max_length=64, images_per_example=1, image_height=64, image_width=64),
                      "tiny gemma3 sft")
