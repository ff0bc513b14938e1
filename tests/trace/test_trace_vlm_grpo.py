"""Vision-language GRPO/RLOO run by TRL 1.16's own trainers with images in the prompt: the trace of a shrunken
Qwen2.5-VL against the estimate, a real CPU run of a tiny one (2 images per prompt) against its trace, and what TRL
refuses that hpcmem refuses."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("trl")

from hpcmem.errors import SpecError  # noqa: E402
from hpcmem.job.trl_config import build_job  # noqa: E402
from tests.helpers.trace_helpers import assert_within, trace_matches_cpu  # noqa: E402

pytestmark = pytest.mark.torch

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "vlm"
WIDE = FIXTURES / "qwen2_5_vl-7b-width-L1-D4.json"     # 7B width, 1 decoder layer, 4 vision blocks
TINY = FIXTURES / "qwen2_5_vl-tiny.json"               # width 128, 1 decoder layer, 2 vision blocks of width 64


def rl_job(trainer: str, config: Path, **kw):
    settings = {"model_name_or_path": str(config), "dtype": "bfloat16", "bf16": True, "per_device_train_batch_size": 2,
                "num_generations": 2, "images_per_example": 1, **kw}
    return build_job(trainer, settings)[0]


def test_shrunken_trace_against_the_estimate():
    """A shape the matrices (estimator/cases/vlm-grpo.yaml, vlm-rloo.yaml) do not hold: RLOO (the old-policy pass and
    the reference pass with the adapters disabled both run the tower), 2 prompts of one 224 px image and 128 tokens,
    completions of 64, LoRA all-linear with checkpointing (~35 s on two shared cores). The estimate's step peak over
    the phases the trace runs (generation left out: the trace replaces it) within 3 % of the trace, and its scoring
    passes (the tower and the language model under no_grad, both pixel_values batches) within 3 % of the trace's
    scoring phase. Measured: peak 3,158,982,144 B, estimate +0.3 %; scoring 2,905 MiB, estimate −1.1 %."""
    from hpcmem.trace import run_trace
    from hpcmem.validate.random_trace import as_traced
    from hpcmem.estimate.workspaces import tensor_bytes

    job = rl_job("rloo", WIDE, max_prompt_length=128, max_completion_length=64, image_height=224, image_width=224,
                 use_peft=True, lora_target_modules="all-linear")
    traced = run_trace(job, timeline=True)
    est, left = as_traced(job)
    estimated = max(tensor_bytes(p) for p in est.phases)
    scoring = max(p.current_bytes for p in traced.timeline if p.phase.startswith("step 2 / scoring"))
    for name in ("reference forward", "old log-prob pass"):
        phase = tensor_bytes(next(p for p in est.phases if p.name == name))
        assert abs(phase - scoring) <= 0.03 * scoring, (name, phase, scoring)
    assert_within(estimated, traced.peak_allocated_bytes, 0.03)
    assert "vision: generation (prefill)" in left
    assert traced.batch["shape"] == [2, 128 + 64]


def test_a_real_grpo_trainer_runs_two_images_per_prompt_as_traced():
    """TRL's GRPOTrainer for real on the CPU (random weights, two steps; the processor on 2 images of 56 px per prompt,
    the reference model's pass with pixel_values; ~50 s) against `run_trace(kernels="cpu")`: the same peak within 1 %
    (measured: to the byte) in the same phase."""
    trace_matches_cpu(rl_job("grpo", TINY, images_per_example=2, image_height=56, image_width=56,
                             max_prompt_length=48, max_completion_length=16, beta=0.04), "tiny vlm grpo")


def test_generation_runs_the_tower_as_estimated():
    """transformers' generate run as TRL calls it, with the processor's pixel_values and image_grid_thw, on fake
    tensors (2 prompts of one 448 px image, LoRA all-linear; ~45 s): the largest live bytes while the tower runs in
    step 2's generation against the estimate's instant "vision: generation (prefill)" — within 3 %
    (measured: 3,069,352,960 B, estimate +0.14 %)."""
    from hpcmem.estimate import estimate
    from hpcmem.estimate.vision_rl import TOWER_GENERATION
    from hpcmem.estimate.workspaces import tensor_bytes
    from hpcmem.trace import run_trace

    job = rl_job("grpo", WIDE, image_height=448, image_width=448, max_prompt_length=300, max_completion_length=4,
                 use_peft=True, lora_target_modules="all-linear")
    traced = run_trace(job, timeline=True, generation=True)
    tower = max(p.current_bytes for p in traced.timeline
                if p.phase.startswith("step 2") and "generation / vision block" in p.phase)
    est = tensor_bytes(next(p for p in estimate(job).phases if p.name == TOWER_GENERATION))
    assert abs(est - tower) <= 0.03 * tower, (est, tower)


def test_what_is_refused_in_one_line():
    """Prompts too short for their images (max_prompt_length counts image tokens): one line naming the field;
    transformers' continuous batching, which TRL refuses for a processor (grpo_trainer.py __init__), stays refused by
    hpcmem."""
    from trl import GRPOConfig, GRPOTrainer

    from hpcmem.trace import vision
    from hpcmem.trace.trainer import build_model
    from hpcmem.trace.vision_rl import make_image_prompt_dataset

    base = dict(image_height=448, image_width=448, max_completion_length=16)
    with pytest.raises(SpecError, match="max_prompt_length 200 with images_per_example 1") as err:
        rl_job("grpo", WIDE, max_prompt_length=200, **base)
    assert "\n" not in str(err.value)
    with pytest.raises(SpecError, match="use_transformers_continuous_batching"):
        rl_job("grpo", TINY, max_prompt_length=48, image_height=56, image_width=56,
               use_transformers_continuous_batching=True)
    job = rl_job("grpo", TINY, max_prompt_length=48, image_height=56, image_width=56, max_completion_length=8)
    args = GRPOConfig(output_dir="/tmp/hpcmem-test-vlm-grpo", use_cpu=True, report_to="none", num_generations=2,
                      per_device_train_batch_size=2, use_transformers_continuous_batching=True)
    with pytest.raises(ValueError, match="does not support multimodal models"):
        GRPOTrainer(model=build_model(job), reward_funcs=lambda completions, **k: [0.0] * len(completions), args=args,
                    train_dataset=make_image_prompt_dataset(job, 2), processing_class=vision.processor(job))
