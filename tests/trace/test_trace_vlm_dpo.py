"""Vision-language DPO run by TRL 1.16's own DPOTrainer: the trace of a shrunken Qwen2.5-VL against the estimate, a
real CPU run of a tiny one (2 images per example) against its trace, and what TRL refuses that hpcmem refuses."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("trl")

from hpcmem.errors import SpecError  # noqa: E402
from hpcmem.job.trl_config import build_job  # noqa: E402
from tests.helpers.trace_helpers import trace_matches_cpu  # noqa: E402

pytestmark = pytest.mark.torch

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "vlm"
WIDE = FIXTURES / "qwen2_5_vl-7b-width-L1-D4.json"     # 7B width, 1 decoder layer, 4 vision blocks
TINY = FIXTURES / "qwen2_5_vl-tiny.json"               # width 128, 1 decoder layer, 2 vision blocks of width 64


def dpo_job(config: Path, **kw):
    settings = {"model_name_or_path": str(config), "dtype": "bfloat16", "bf16": True, "per_device_train_batch_size": 1,
                "images_per_example": 2, **kw}
    return build_job("dpo", settings)[0]


def test_shrunken_trace_against_the_estimate():
    """A shape the matrix (estimator/cases/vlm-dpo.yaml) does not hold: 2 images of 224 px per example, rows of 512
    tokens, LoRA all-linear with checkpointing (~20 s on two shared cores). Measured: trace 3,397,009,920 B,
    estimate +0.64 %."""
    from hpcmem.estimate import estimate
    from hpcmem.estimate.workspaces import tensor_bytes
    from hpcmem.trace import run_trace

    job = dpo_job(WIDE, max_length=512, image_height=224, image_width=224, use_peft=True,
                  lora_target_modules="all-linear")
    traced = run_trace(job)
    estimated = max(tensor_bytes(p) for p in estimate(job).phases)
    assert abs(estimated - traced.peak_allocated_bytes) <= 0.03 * traced.peak_allocated_bytes
    assert traced.batch["shape"] == [2, 512]


def test_a_real_dpo_trainer_runs_two_images_as_traced():
    """TRL's DPOTrainer for real on the CPU (random weights, two steps, the vision preference collator and the
    processor on 2 images of 56 px per example; ~10 s) against `run_trace(kernels="cpu")`: the same peak within 1 %
    (measured: 512 B apart) in the same phase."""
    trace_matches_cpu(dpo_job(TINY, max_length=64, image_height=56, image_width=56), "tiny vlm dpo")


def test_trl_refuses_what_hpcmem_refuses():
    """precompute_ref_log_probs with a vision dataset: DPOTrainer.__init__ raises; pad_to_multiple_of: the vision
    preference collator raises. hpcmem says both in one line each."""
    from trl import DPOConfig, DPOTrainer
    from trl.trainer.dpo_trainer import DataCollatorForVisionPreference

    from hpcmem.trace import vision
    from hpcmem.trace.data import design_preference
    from hpcmem.trace.trainer import build_model
    from hpcmem.trace.vision_pref import make_vision_preference_dataset

    base = dict(max_length=64, image_height=56, image_width=56)
    for bad, match in (({"precompute_ref_log_probs": True}, "precompute_ref_log_probs with images"),
                       ({"pad_to_multiple_of": 8}, "pad_to_multiple_of 8 with images")):
        with pytest.raises(SpecError, match=match):
            dpo_job(TINY, **base, **bad)
    job = dpo_job(TINY, **base)
    dataset = make_vision_preference_dataset(job, design_preference(job), 1)
    args = DPOConfig(output_dir="/tmp/hpcmem-test-vlm-dpo", precompute_ref_log_probs=True, use_cpu=True,
                     report_to="none", max_length=64)
    with pytest.raises(ValueError, match="not supported for vision datasets"):
        DPOTrainer(model=build_model(job), args=args, train_dataset=dataset, processing_class=vision.processor(job))
    collator = DataCollatorForVisionPreference(processor=vision.processor(job), max_length=64, pad_to_multiple_of=8)
    with pytest.raises(NotImplementedError, match="Padding to a multiple"):
        collator([dict(dataset[0])])
