"""SmolVLM2 SFT with images (HuggingFaceTB/SmolVLM2-500M-Video-Instruct's widths cut to 1 decoder layer and 3 vision
layers) against the trace of TRL's SFTTrainer with its vision collator, transformers' SmolVLMImageProcessorPil and
Idefics3Processor on real 480×640 images (estimator/traces/vlm-smolvlm.jsonl, written by `hpcmem validate trace --cases
estimator/cases/vlm-smolvlm.yaml`): full fine-tuning and LoRA all-linear, checkpointing on and off, longest_edge 2048
(13 tiles) and 1024 (5 tiles), 2 rows, 2 images, a wide image, LoRA q_proj/v_proj; the published depth (32 decoder
layers, 12 vision layers, vlm-smolvlm-500m.yaml, held out); DPO (vlm-smolvlm-dpo.yaml, held out); Idefics3 cut to 2 vision layers at 364 px
(vlm-idefics3.yaml); the tower's states and the batch by hand; what is refused."""

from __future__ import annotations

from pathlib import Path

import pytest

from hpcmem.errors import SpecError
from hpcmem.estimate import estimate
from hpcmem.estimate.vision import GRADIENTS, OPTIMIZER, WEIGHTS
from hpcmem.estimate.workspaces import tensor_bytes
from tests.helpers.stored_cases import largest_component, stored_case_job, trace_records

ROOT = Path(__file__).resolve().parents[2]
RECORDS = trace_records(ROOT, "vlm-smolvlm", "vlm-smolvlm-500m", "vlm-smolvlm-dpo", "vlm-idefics3")
# the largest: smolvlm-full-gc-2048 +3.07 % (the tower's backward under checkpointing, the estimate over)
MAX_PCT = 3.1
# one SigLIP-base layer: q/k/v/out_proj 768² + bias, fc1/fc2 768 ↔ 3072 + bias, two LayerNorms
LAYER = 4 * (768 * 768 + 768) + 2 * 768 * 3072 + 3072 + 768 + 4 * 768
EMBEDDINGS = 3 * 16 * 16 * 768 + 768 + 1024 * 768       # patch Conv2d with bias, (512 / 16)² positions
CONNECTOR = 768 * 16 * 960                              # 768 · scale_factor² → 960, no bias


def _job(case_id: str, **changes):
    return stored_case_job(RECORDS[case_id], ROOT, **changes)


_component = largest_component


def test_the_matrix_is_all_there():
    assert len(RECORDS) == 12 + 2 + 2 + 4


@pytest.mark.parametrize("case_id", sorted(RECORDS))
def test_estimate_within_3_percent_of_the_trace(case_id):
    """Every stored trace peaks in step 2 (the next micro-batch waits on the host, as in a real run), which the
    estimate models."""
    job = _job(case_id)
    traced = RECORDS[case_id]["traced"]
    estimated = max(tensor_bytes(p) for p in estimate(job).phases)
    assert RECORDS[case_id]["traced_phase"].startswith("step 2")
    assert abs(estimated - traced) <= MAX_PCT / 100 * traced, (estimated, traced)


def test_full_fine_tuning_trains_the_tower_and_the_connector():
    """Every layer, the embeddings, post_layernorm and the connector get bf16 gradients and two bf16 Adam moments."""
    est = estimate(_job("smolvlm-full-gc-2048"))
    trained = EMBEDDINGS + 3 * LAYER + 2 * 768 + CONNECTOR
    assert _component(est, WEIGHTS) == 2 * trained
    assert _component(est, GRADIENTS) == 2 * trained
    assert _component(est, OPTIMIZER) == 4 * trained


@pytest.mark.parametrize(("case_id", "tiles"), [("smolvlm-full-nogc-2048", 13), ("smolvlm-full-nogc-1024", 5)])
def test_the_batch_and_the_image_tokens(case_id, tiles):
    """pixel_values fp32 [1, tiles, 3, 512, 512] and pixel_attention_mask int64 [1, tiles, 512, 512]; 64 image tokens
    and 1,024 tower rows per tile."""
    est = estimate(_job(case_id))
    vision = est.extra["vision"]
    assert vision["image_tokens_per_micro_batch"] == 64 * tiles
    assert vision["patches_per_micro_batch"] == 1024 * tiles
    pixels = next(c for p in est.phases for c in p.components if c.name == "pixel_values")
    assert pixels.bytes == tiles * 3 * 512 * 512 * 4 + tiles * 512 * 512 * 8


def test_lora_all_linear_adapts_the_tower_and_the_connector():
    """peft's all-linear: every q/k/v/out_proj, fc1, fc2 of the 3 layers and modality_projection.proj (r 16, fp32)."""
    job = _job("smolvlm-lora-all-gc-2048")
    r = job.train.lora_r
    adapters = r * (3 * (4 * 2 * 768 + 2 * (768 + 3072)) + (768 * 16 + 960))
    est = estimate(job)
    assert _component(est, GRADIENTS) == 4 * adapters
    assert _component(est, WEIGHTS) == 2 * (EMBEDDINGS + 3 * LAYER + 2 * 768 + CONNECTOR) + 4 * adapters


@pytest.mark.parametrize(("changes", "words"), [
    ({"trainer": "grpo"}, "trainer grpo on smolvlm: hpcmem models smolvlm's images for sft, dpo only"),
    ({"trainer": "kto"}, "trainer kto on smolvlm: hpcmem models smolvlm's images for sft, dpo only"),
    ({"max_pixels": 1_000_000}, "SmolVLMImageProcessor has no such setting"),
    ({"max_length": 512}, "832 image tokens"),
])
def test_what_is_not_modelled_is_a_one_line_refusal(changes, words):
    with pytest.raises(SpecError, match=words) as err:
        _job("smolvlm-full-gc-2048", **changes)
    assert all("\n" not in p for p in err.value.problems)
