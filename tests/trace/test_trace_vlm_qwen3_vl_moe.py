"""Qwen3-VL-MoE traced now against its estimate, at a shape the matrix (estimator/cases/vlm-qwen3-vl-moe.yaml) does
not hold — rows of 1,024 tokens, one 448×448 image, LoRA all-linear with lora_dropout 0 without checkpointing: the
step's peak and the tower's own backward within 3 % — and a tiny
Qwen3-VL-MoE run by TRL's SFTTrainer for real on the CPU against the trace of the same job (`--kernels cpu`): the
check that the fake-tensor trace sees what the real step allocates with the fused experts' grouped matmuls."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("trl")

from hpcmem.job.trl_config import build_job  # noqa: E402
from tests.helpers.trace_helpers import estimate_holds_vision_trace, trace_matches_cpu  # noqa: E402

pytestmark = pytest.mark.torch
FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "vlm"
CUT = FIXTURES / "qwen3_vl_moe-30b-width-L2-D4.json"
TINY = FIXTURES / "qwen3_vl_moe-tiny.json"   # width 128, 2 MoE layers of 8 experts (top 2), 2 vision blocks of width 64
MAX_PCT = 3.0


def sft_job(config: Path, **kw):
    settings = {"model_name_or_path": str(config), "dtype": "bfloat16", "bf16": True, "per_device_train_batch_size": 1,
                "images_per_example": 1, **kw}
    return build_job("sft", settings)[0]


def test_the_cut_trace_agrees_with_the_estimate_off_the_matrix():
    """About 10 s on two shared cores."""
    job = sft_job(CUT, max_length=1024, image_height=448, image_width=448, gradient_checkpointing=False,
                  use_peft=True, lora_target_modules=["all-linear"], lora_dropout=0.0)
    estimate_holds_vision_trace(job, MAX_PCT)


@pytest.mark.parametrize("peft", [False, True])
def test_a_real_sft_trainer_runs_qwen3_vl_moe_as_traced(peft):
    """TRL's SFTTrainer for real on the CPU (random weights, two steps, the vision collator and Qwen3VLProcessor on one
    64 px image per row; a few seconds) against `run_trace(kernels="cpu")`: the same peak within 1 % in the same
    phase; full fine-tuning and LoRA all-linear (the attention and the tower's linears; peft leaves the experts)."""
    extra = {"use_peft": True, "lora_target_modules": ["all-linear"]} if peft else {}
    trace_matches_cpu(sft_job(TINY, max_length=64, image_height=64, image_width=64, **extra),
                      f"tiny qwen3_vl_moe sft{' lora' if peft else ''}")
