"""Vision-language GRPO with Gemma 3's images (pixel_values [images, 3, side, side], token_type_ids with every
forward) run by TRL 1.16's own GRPOTrainer: a real CPU run of a tiny Gemma 3 against its trace."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("trl")

from hpcmem.job.trl_config import build_job  # noqa: E402
from tests.helpers.trace_helpers import assert_within, trace_matches_cpu  # noqa: E402

pytestmark = pytest.mark.torch

TINY = Path(__file__).resolve().parents[1] / "fixtures" / "vlm" / "gemma3-tiny.json"     # 56 px images, 4 tokens


def test_a_real_grpo_trainer_runs_gemma3_images_as_traced():
    """TRL's GRPOTrainer for real on the CPU (random weights, two steps; Gemma3Processor on 2 images of 64 px per
    prompt, resized to 56 px; the reference model's pass with pixel_values and token_type_ids) against
    `run_trace(kernels="cpu")`: the same peak within 1 % in the same phase (measured: to the byte, 12,667,026 B)."""
    job = build_job("grpo", {"model_name_or_path": str(TINY), "dtype": "bfloat16", "bf16": True,
                             "per_device_train_batch_size": 2, "num_generations": 2, "images_per_example": 2,
                             "image_height": 64, "image_width": 64, "max_prompt_length": 32,
                             "max_completion_length": 8, "beta": 0.04})[0]
    trace_matches_cpu(job, "tiny gemma3 grpo")


def test_shrunken_rloo_scoring_passes_against_the_trace():
    """A shape the matrices (estimator/cases/vlm-gemma3-grpo.yaml, vlm-gemma3-rloo.yaml) do not hold: RLOO (the
    old-policy pass with the adapters on and the reference pass with them off both run the SigLIP tower under no_grad)
    on gemma-3-4b-it's widths cut to 2 decoder layers and 4 SigLIP layers, 2 prompts of two 896 px images, 600 + 64
    tokens, LoRA all-linear with checkpointing. The higher of the estimate's scoring passes within 3 % of the trace's
    scoring phase, and its step peak within 3 % of the trace's. Measured: scoring 3,054,992,384 B, estimate −1.0 %;
    peak 4,017,594,880 B (the tower's backward), estimate −2.2 %."""
    from hpcmem.estimate.workspaces import tensor_bytes
    from hpcmem.trace import run_trace
    from hpcmem.validate.random_trace import as_traced

    wide = TINY.parent / "gemma3-4b-width-L2-D4.json"
    job = build_job("rloo", {"model_name_or_path": str(wide), "dtype": "bfloat16", "bf16": True,
                             "per_device_train_batch_size": 2, "num_generations": 2, "images_per_example": 2,
                             "image_height": 896, "image_width": 896, "max_prompt_length": 600,
                             "max_completion_length": 64, "use_peft": True, "lora_target_modules": "all-linear",
                             "gradient_checkpointing": True})[0]
    traced = run_trace(job, timeline=True)
    est, _ = as_traced(job)
    scoring = max(p.current_bytes for p in traced.timeline if p.phase.startswith("step 2 / scoring"))
    # the trace's scoring phase holds both passes; the old-policy pass, with the adapters' fp32 copies, is the higher
    phase = max(tensor_bytes(p) for p in est.phases if p.name in ("reference forward", "old log-prob pass"))
    assert abs(phase - scoring) <= 0.03 * scoring, (phase, scoring)
    peak = max(tensor_bytes(p) for p in est.phases)
    assert_within(peak, traced.peak_allocated_bytes, 0.03)
