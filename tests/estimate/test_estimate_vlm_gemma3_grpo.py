"""Vision-language GRPO and RLOO with Gemma 3's images (gemma-3-4b-it at full width cut to 2 decoder layers and 4
SigLIP layers) against the trace of TRL's GRPOTrainer/RLOOTrainer with transformers' Gemma3Processor
(estimator/traces/vlm-gemma3-grpo.jsonl, vlm-gemma3-rloo.jsonl, written by `hpcmem validate trace --cases
estimator/cases/<name>.yaml`), scored over the instants the trace runs (generation left out: the trace replaces it)."""

from __future__ import annotations

from pathlib import Path

import pytest

from hpcmem.estimate import estimate
from hpcmem.estimate.vision_rl import BUFFERED
from hpcmem.estimate.workspaces import tensor_bytes
from hpcmem.job.shape import micro_batch
from hpcmem.job.trl_config import read_yaml
from hpcmem.validate.cases import case_job
from hpcmem.validate.random_trace import as_traced
from tests.helpers.stored_cases import trace_records

ROOT = Path(__file__).resolve().parents[2]
NAMES = ("vlm-gemma3-grpo", "vlm-gemma3-rloo")
RECORDS = trace_records(ROOT, *NAMES)
CASES = {c["id"]: {**d.get("defaults", {}), **c} for d in
         (read_yaml(ROOT / "estimator" / "cases" / f"{name}.yaml") for name in NAMES) for c in d["cases"]}
MAX_PCT = 3.0


def _job(case_id: str, **kw):
    return case_job({**CASES[case_id], "model_name_or_path": str(ROOT / CASES[case_id]["model_name_or_path"]), **kw})


def test_every_case_is_traced():
    assert sorted(RECORDS) == sorted(CASES)


@pytest.mark.parametrize("case_id", sorted(RECORDS))
def test_estimate_within_3_percent_of_the_trace(case_id):
    est, _ = as_traced(_job(case_id))
    peak, traced = max(tensor_bytes(p) for p in est.phases), RECORDS[case_id]["traced"]
    assert abs(peak - traced) <= MAX_PCT / 100 * traced, (peak, traced)


def test_the_buffered_pixel_values_are_whole_images():
    """Gemma3ImageProcessor hands pixel_values as [images, 3, 896, 896] fp32: the optimizer step holds the generation
    batch's 4 prompts × 2 images of them (by hand: 8 × 3 × 896 × 896 × 4 B)."""
    job = _job("g3-grpo-lora-gc-2img")
    held = {c.name: c.bytes for p in estimate(job).phases if p.name == "optimizer step" for c in p.components}
    assert held[BUFFERED] == 8 * 3 * 896 * 896 * 4


def test_token_type_ids_give_even_one_row_the_image_mask():
    """GRPOTrainer passes the processor's token_type_ids with every forward, so Gemma3Model builds its image mask: one
    row with an image has it. A row of text alone has no image mask, but still a padding mask: GRPO pads its whole
    generation batch (num_generations ≥ 2 rows) as one before it splits it into micro-batches
    (grpo_trainer.py `_generate_and_score_completions`, `_prepare_inputs`)."""
    with_image = micro_batch(_job("g3-grpo-lora-gc-1img", per_device_train_batch_size=1, num_generations=2,
                                  generation_batch_size=2))
    assert with_image.image_mask and with_image.masked
    text = micro_batch(_job("g3-grpo-lora-gc-1img", per_device_train_batch_size=1, num_generations=2,
                            generation_batch_size=2, images_per_example=0, image_height=0, image_width=0))
    assert not text.image_mask and text.rows == 1 and text.masked
