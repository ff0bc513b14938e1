"""Vision-language GRPO with Gemma 3's images (pixel_values [images, 3, side, side], token_type_ids with every
forward) run by TRL 1.16's own GRPOTrainer: a real CPU run of a tiny Gemma 3 against its trace."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("trl")

from hpcmem.job.trl_config import build_job  # noqa: E402
from tests.helpers.trace_helpers import trace_matches_cpu  # noqa: E402

pytestmark = pytest.mark.torch

TINY = Path(__file__).resolve().parents[1] / "fixtures" / "vlm" / "gemma3-tiny.json"     # 56 px images, 4 tokens


def test_a_real_grpo_trainer_runs_gemma3_images_as_traced():
    """TRL's GRPOTrainer for real on the CPU (random weights, two steps; Gemma3Processor on 2 images of 64 px per
    prompt, resized to 56 px; the reference model's pass with pixel_values and token_type_ids) against
    `run_trace(kernels="cpu")`: the same peak within 1 % in the same phase."""
    job = build_job("grpo", {"model_name_or_path": str(TINY), "dtype": "bfloat16", "bf16": True,
                             "per_device_train_batch_size": 2, "num_generations": 2, "images_per_example": 2,
                             "image_height": 64, "image_width": 64, "max_prompt_length": 32,
                             "max_completion_length": 8, "beta": 0.04})[0]
    trace_matches_cpu(job, "tiny gemma3 grpo")
