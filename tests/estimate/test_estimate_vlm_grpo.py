"""Vision-language GRPO and RLOO (images in the prompt; Qwen2.5-VL and Qwen2-VL at full width cut to 1 decoder layer
and 4 vision blocks, Qwen3-VL cut to 3 decoder layers and 4 vision blocks) against the trace of TRL's
GRPOTrainer/RLOOTrainer with transformers' processor on real images (estimator/traces/vlm-grpo.jsonl, vlm-rloo.jsonl,
vlm-qwen2-vl-grpo.jsonl, vlm-qwen3-vl-grpo.jsonl, written by `hpcmem validate trace --cases
estimator/cases/<name>.yaml`): full fine-tuning and LoRA all-linear, checkpointing on and off, 448 and 896 px, a
reference model (beta > 0), LoRA q_proj/v_proj, two micro-batches per generation. The estimate is scored over the
instants the trace runs (its generation instants left out: the trace replaces generation, hpcmem.trace.rl)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hpcmem.estimate import estimate
from hpcmem.estimate.vision_rl import BUFFERED, NO_GRAD, TOWER_GENERATION
from hpcmem.estimate.workspaces import tensor_bytes
from hpcmem.job.trl_config import read_yaml
from hpcmem.validate.cases import case_job
from hpcmem.validate.random_trace import as_traced

ROOT = Path(__file__).resolve().parents[2]
# and GRPO / RLOO on two learned text parts (Qwen3.5 and EXAONE 4.5, traced once with the estimate untouched)
NAMES = ("vlm-grpo", "vlm-rloo", "vlm-qwen2-vl-grpo", "vlm-qwen3-vl-grpo", "vlm-qwen3-5-grpo", "vlm-qwen3-5-rloo",
         "vlm-exaone4-5-grpo", "vlm-exaone4-5-rloo")
TRACES = [ROOT / "estimator" / "traces" / f"{name}.jsonl" for name in NAMES]
RECORDS = {r["case"]["id"]: r for f in TRACES for r in map(json.loads, f.read_text().splitlines())}
CASES = {c["id"]: {**d.get("defaults", {}), **c} for d in
         (read_yaml(ROOT / "estimator" / "cases" / f"{name}.yaml") for name in NAMES) for c in d["cases"]}
MAX_PCT = 3.0
PATCH_VALUES = 3 * 2 * 14 * 14      # in_channels × temporal_patch_size × patch_size² (Qwen2.5-VL's vision config)


def _job(case_id: str):
    return case_job({**CASES[case_id], "model_name_or_path": str(ROOT / CASES[case_id]["model_name_or_path"])})


def test_every_case_is_traced():
    assert sorted(RECORDS) == sorted(CASES)


def _peak(job) -> int:
    est, _ = as_traced(job)
    return max(tensor_bytes(p) for p in est.phases)


def _components(job, phase: str) -> dict[str, int]:
    return {c.name: c.bytes for p in estimate(job).phases if p.name == phase for c in p.components}


@pytest.mark.parametrize("case_id", sorted(RECORDS))
def test_estimate_within_3_percent_of_the_trace(case_id):
    traced = RECORDS[case_id]["traced"]
    assert abs(_peak(_job(case_id)) - traced) <= MAX_PCT / 100 * traced, (_peak(_job(case_id)), traced)


def test_the_tower_sees_each_image_once_per_completion():
    """4 completions of one prompt with one 448×448 image: the sampler repeats the prompt and its image, so a
    micro-batch of 4 rows is 4 × 32 × 32 = 4,096 patch rows and 4 × 1,024 / 2² = 1,024 image tokens (by hand)."""
    vision = estimate(_job("qvl-grpo-lora-gc-448")).to_json()["vision"]
    assert vision["patches_per_micro_batch"] == 4 * 32 * 32
    assert vision["image_tokens_per_micro_batch"] == 4 * 32 * 32 // 4


def test_the_generation_batch_pixel_values_stay_buffered():
    """The buffered inputs keep every micro-batch's pixel_values (fp32) until the next generation: through the
    optimizer step, 1 micro-batch of 4 × 4,096 patches × 1,176 values × 4 B at 896 px; with 2 micro-batches per
    generation (2 rows each), 2 × 2 × 4,096 × 1,176 × 4 B (by hand)."""
    one = _components(_job("qvl-grpo-lora-gc-896"), "optimizer step")[BUFFERED]
    assert one == 4 * 4096 * PATCH_VALUES * 4
    two = _components(_job("qvl-grpo-lora-ga2-gc-896"), "optimizer step")[BUFFERED]
    assert two == 2 * 2 * 4096 * PATCH_VALUES * 4


def test_generation_runs_the_tower_over_every_generation_row():
    """transformers' generate runs the tower once over all rows of the generation batch: its no-grad instant grows
    with the rows generated at once, not with the micro-batch."""
    one = _components(_job("qvl-grpo-lora-gc-896"), TOWER_GENERATION)[NO_GRAD]
    two = _components(_job("qvl-grpo-lora-ga2-gc-896"), TOWER_GENERATION)[NO_GRAD]
    assert one == two       # 4 × 1 and 2 × 2 generation rows: the same patches at once


def test_peft_reference_pass_runs_the_tower():
    """beta > 0 under LoRA: the reference pass is the policy with its adapters disabled, and its pixel_values go
    through the tower too."""
    ref = _components(_job("qvl-grpo-lora-ref-gc-896"), "reference forward")
    assert ref[NO_GRAD] > 0 and ref["no-grad pass"] > 0


def test_more_pixels_more_memory_in_the_trace_and_the_estimate():
    for prefix in ("qvl-grpo", "qvl-rloo", "q2vl-grpo", "q3vl-grpo"):
        for technique in ("full-gc", "full-nogc", "lora-gc", "lora-nogc"):
            small, large = f"{prefix}-{technique}-448", f"{prefix}-{technique}-896"
            assert RECORDS[large]["traced"] > RECORDS[small]["traced"], (prefix, technique)
            assert _peak(_job(large)) > _peak(_job(small)), (prefix, technique)
