"""Qwen3-VL traced now against its estimate, at a shape the matrix (estimator/cases/vlm-qwen3-vl.yaml) does not hold:
half the 8B widths (tests/fixtures/vlm/qwen3_vl-half-width-L3-D4.json: tower width 576, decoder width 2048, 3 decoder
layers, 4 vision blocks with deepstack mergers after blocks 1 and 3 — the last block's merger beside the main one,
and only two of the three decoder layers' deepstack additions used), one 448×448 image per row, rows of 1,024 tokens:
full fine-tuning without checkpointing (every block's and every deepstack merger's saved tensors alive, the deepstack
mergers' gradients made between the blocks') — the step's peak and the tower's own backward within 3 %. And a tiny
Qwen3-VL run by TRL's SFTTrainer for real on the CPU against the trace of the same job (`--kernels cpu`), the check
that the fake-tensor trace sees what the real step allocates."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("trl")

from hpcmem.job.trl_config import build_job  # noqa: E402
from tests.helpers.trace_helpers import estimate_holds_vision_trace, trace_matches_cpu  # noqa: E402

pytestmark = pytest.mark.torch
FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "vlm"
HALF = FIXTURES / "qwen3_vl-half-width-L3-D4.json"
TINY = FIXTURES / "qwen3_vl-tiny.json"          # width 128, 2 decoder layers, 2 vision blocks of width 64
MAX_PCT = 3.0


def sft_job(config: Path, **kw):
    settings = {"model_name_or_path": str(config), "dtype": "bfloat16", "bf16": True, "per_device_train_batch_size": 1,
                "images_per_example": 1, **kw}
    return build_job("sft", settings)[0]


def test_the_half_width_trace_agrees_with_the_estimate():
    """About 15 s on two shared cores."""
    job = sft_job(HALF, max_length=1024, image_height=448, image_width=448, gradient_checkpointing=False)
    estimate_holds_vision_trace(job, MAX_PCT)


def test_a_real_sft_trainer_runs_qwen3_vl_as_traced():
    """TRL's SFTTrainer for real on the CPU (random weights, two steps, the vision collator and Qwen3VLProcessor on one
    64 px image per row; a few seconds) against `run_trace(kernels="cpu")`: the same peak within 1 % in the same
    phase."""
    trace_matches_cpu(sft_job(TINY, max_length=64, image_height=64, image_width=64), "tiny qwen3_vl sft")
