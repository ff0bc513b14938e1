"""Qwen2.5-Omni's thinker SFT and DPO with images (tests/fixtures/vlm/qwen2_5_omni_thinker-defaults-L2-D2.json: two
Qwen2 decoder layers at Qwen2_5OmniTextConfig's widths, Qwen2.5-VL's tower with three q/k/v Linears cut to 2 blocks,
the audio tower cut to 2 layers) against the trace of TRL's SFTTrainer and DPOTrainer with their vision collators and
transformers' Qwen2_5OmniProcessor on blank 448×448 and 896×672 images
(estimator/traces/vlm-qwen2-5-omni-thinker.jsonl, written once by `hpcmem validate trace --cases
estimator/cases/vlm-qwen2-5-omni-thinker.yaml`, the estimate untouched after); GRPO and RLOO with an image per prompt
against TRL's GRPOTrainer/RLOOTrainer (vlm-qwen2-5-omni-thinker-grpo.jsonl, -rloo.jsonl, traced once likewise; scored
over the instants the trace runs, its generation replaced, hpcmem.trace.rl)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from hpcmem.errors import SpecError
from hpcmem.estimate import estimate
from hpcmem.estimate.workspaces import tensor_bytes
from hpcmem.validate.cases import case_job
from hpcmem.validate.random_trace import as_traced
from tests.helpers.stored_cases import largest_component, stored_case_job, trace_records

ROOT = Path(__file__).resolve().parents[2]
RECORDS = trace_records(ROOT, "vlm-qwen2-5-omni-thinker")
RL_RECORDS = trace_records(ROOT, "vlm-qwen2-5-omni-thinker-grpo", "vlm-qwen2-5-omni-thinker-rloo")
CUT = "tests/fixtures/vlm/qwen2_5_omni_thinker-defaults-L2-D2.json"


def _without_audio(job):
    return dataclasses.replace(job, model=dataclasses.replace(
        job.model, vision=dataclasses.replace(job.model.vision, audio=None)))


@pytest.mark.parametrize("case_id", sorted(RECORDS))
def test_estimate_within_3_percent_of_the_trace(case_id):
    record = RECORDS[case_id]
    est = estimate(stored_case_job(record, ROOT))
    assert est.made == "derived"
    assert abs(max(tensor_bytes(p) for p in est.phases) - record["traced"]) <= 0.03 * record["traced"]


def test_the_matrix_is_all_there():
    assert len(RECORDS) == 8 + 4
    assert {(r["case"]["image_height"], r["case"]["image_width"]) for r in RECORDS.values()} == {(448, 448),
                                                                                               (672, 896)}
    assert {r["cell"] for r in RECORDS.values()} == {f"{t}/{c}" for t in ("sft", "dpo")
                                                     for c in ("full+gc", "full+nogc", "lora+gc", "lora+nogc")}


def test_the_traced_audio_tower_gets_no_gradient_and_no_optimizer_state():
    """The trace itself: full fine-tuning's gradients are the 16-bit bytes of every parameter but the audio tower's
    (2,042,981,744 in all, 49,362,432 of them the audio tower's: tests/models/test_qwen2_5_omni_thinker_params.py),
    within the few bytes of 0-d tensors beside them; the parameters' bytes hold the audio tower's and its fp32
    sinusoid buffer (1500 · 1280 · 4) as well."""
    full = RECORDS["q25o-full-gc-448"]["traced_components"]
    assert 0 <= full["grad"] - 2 * (2_042_981_744 - 49_362_432) < 4096
    assert 0 <= full["param"] - (2 * 2_042_981_744 + 1500 * 1280 * 4) < 4096


def test_the_idle_audio_tower_is_weights_only():
    """modeling_qwen2_5_omni.py `Qwen2_5OmniThinkerModel.forward` runs the audio tower on input_features only: with
    images alone it adds its 49,362,432 bf16 parameters and its fp32 sinusoid buffer to the weights (98,724,864 +
    7,680,000 bytes) and nothing to the gradients or the optimizer states."""
    job = stored_case_job(RECORDS["q25o-full-nogc-896"], ROOT)
    with_audio, bare = estimate(job), estimate(_without_audio(job))
    assert largest_component(with_audio, "vision tower weights") - largest_component(
        bare, "vision tower weights") == 2 * 49_362_432 + 1500 * 1280 * 4 == 106_404_864
    for name in ("vision tower gradients", "vision tower optimizer states"):
        assert largest_component(with_audio, name) == largest_component(bare, name)


def test_all_linear_adapters_of_the_audio_tower_get_no_optimizer_state():
    """peft wraps the audio tower's linears under all-linear: r · (in + out) fp32 adapter parameters each, 16 · (2 · 4 ·
    2560 + 2 · 2 · 6400 + 4864) = 815,104 (q/k/v/out_proj 1280 → 1280 and fc1/fc2 1280 ↔ 5120 in 2 layers, proj
    1280 → 3584), loaded (3,260,416 bytes) and never trained."""
    job = stored_case_job(RECORDS["q25o-lora-all-gc-896"], ROOT)
    with_audio, bare = estimate(job), estimate(_without_audio(job))
    audio_adapters = 16 * (2 * 4 * 2560 + 2 * 2 * 6400 + 4864)
    assert audio_adapters == 815_104
    assert largest_component(with_audio, "vision tower weights") - largest_component(
        bare, "vision tower weights") == 2 * 49_362_432 + 1500 * 1280 * 4 + 4 * audio_adapters
    assert largest_component(with_audio, "vision tower optimizer states") == largest_component(
        bare, "vision tower optimizer states")


def test_three_qkv_linears_keep_no_fused_storage():
    """Qwen2_5OmniVisionAttention's q, k and v are three Linears: SDPA's saved v is its own [N, 3584] tensor, where
    Qwen2.5-VL's fused qkv output [N, 3 · 3584], of which v is a view, stays whole. Trained, without checkpointing,
    at 896×672 (3,072 patches) in 2 blocks: 2 · 3584 · 2 bf16 bytes less per patch and block, 88,080,384 in all."""
    job = stored_case_job(RECORDS["q25o-full-nogc-896"], ROOT)
    fused = dataclasses.replace(job, model=dataclasses.replace(
        job.model, vision=dataclasses.replace(job.model.vision, family="qwen")))
    assert largest_component(estimate(fused), "vision activations") - largest_component(
        estimate(job), "vision activations") == 2 * (2 * 3584) * 3072 * 2 == 88_080_384


@pytest.mark.parametrize("case_id", sorted(RL_RECORDS))
def test_grpo_and_rloo_within_3_percent_of_the_trace(case_id):
    record = RL_RECORDS[case_id]
    est, _ = as_traced(stored_case_job(record, ROOT))
    assert abs(max(tensor_bytes(p) for p in est.phases) - record["traced"]) <= 0.03 * record["traced"]


def test_the_rl_matrix_is_all_there():
    """Full fine-tuning without checkpointing at 448×448 and LoRA all-linear with it at 896×672, for each trainer."""
    assert {r["cell"]: (r["case"]["image_height"], r["case"]["image_width"]) for r in RL_RECORDS.values()} == {
        "grpo/full+nogc": (448, 448), "grpo/lora+gc": (672, 896), "rloo/full+nogc": (448, 448),
        "rloo/lora+gc": (672, 896)}


def test_kto_with_images_is_refused():
    with pytest.raises(SpecError, match="image"):
        case_job({"trainer": "kto", "model_name_or_path": CUT, "dtype": "bfloat16", "images_per_example": 1,
                  "image_height": 448, "image_width": 448, "max_length": 1536})
