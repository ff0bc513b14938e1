"""Video-LLaVA SFT and DPO with images (LanguageBind/Video-LLaVA-7B-hf's widths cut to 1 decoder layer and 4 CLIP
layers per tower) against the trace of TRL's SFTTrainer / DPOTrainer with their vision collators and transformers'
VideoLlavaProcessor (VideoLlavaImageProcessor, no video processor) on real images (estimator/traces/
vlm-video-llava*.jsonl, written by `hpcmem validate trace --cases estimator/cases/vlm-video-llava.yaml`,
`vlm-video-llava-dpo.yaml`): full fine-tuning and LoRA all-linear, checkpointing on and off, 1 and 2 images per row,
2 rows of 480×640; held out at the published depth (32 decoder layers, two 24-layer CLIP towers,
vlm-video-llava-7b.yaml); the idle video tower by hand; what is refused."""

from __future__ import annotations

from pathlib import Path

import pytest

from hpcmem.errors import SpecError
from hpcmem.estimate import estimate
from hpcmem.estimate.vision import GRADIENTS, OPTIMIZER, WEIGHTS
from hpcmem.estimate.workspaces import tensor_bytes
from tests.helpers.stored_cases import largest_component, stored_case_job, trace_records

ROOT = Path(__file__).resolve().parents[2]
RECORDS = trace_records(ROOT, "vlm-video-llava", "vlm-video-llava-dpo", "vlm-video-llava-7b")
MAX_PCT = 3.0
H, I, O = 1024, 4096, 4096
LAYER = 4 * (H * H + H) + 2 * H * I + I + H + 4 * H
# patch Conv2d without bias, class embedding, (224 / 14)² + 1 positions, pre_layrnorm; post_layernorm
EMBEDDINGS = 3 * 14 * 14 * H + H + 257 * H + 2 * H
TOWER = EMBEDDINGS + 4 * LAYER + 2 * H
PROJECTOR = H * O + O + O * O + O


def _job(case_id: str, **changes):
    return stored_case_job(RECORDS[case_id], ROOT, **changes)


def test_the_matrix_is_all_there():
    assert len(RECORDS) == 9 + 4 + 4


@pytest.mark.parametrize("case_id", sorted(RECORDS))
def test_estimate_within_3_percent_of_the_trace(case_id):
    traced = RECORDS[case_id]["traced"]
    estimated = max(tensor_bytes(p) for p in estimate(_job(case_id)).phases)
    assert abs(estimated - traced) <= MAX_PCT / 100 * traced, (estimated, traced)


def test_full_fine_tuning_loads_the_video_tower_and_trains_the_image_path():
    """Both towers' weights are loaded; the image tower's layers up to -2 (3 of 4), its embeddings and the projector
    get bf16 gradients and two bf16 Adam moments; the video tower, never run on images, gets none."""
    est = estimate(_job("vl-full-gc-1img"))
    trained = EMBEDDINGS + 3 * LAYER + PROJECTOR
    assert largest_component(est, WEIGHTS) == 2 * (2 * TOWER + PROJECTOR)
    assert largest_component(est, GRADIENTS) == 2 * trained
    assert largest_component(est, OPTIMIZER) == 4 * trained


def test_lora_all_linear_adapts_both_towers():
    """peft's all-linear wraps the 6 linears of every layer of both towers and the projector's two (r 16, fp32); only
    the image tower's first 3 layers and the projector's adapters get gradients."""
    job = _job("vl-lora-all-gc-1img")
    r = job.train.lora_r
    per_layer = r * (4 * 2 * H + 2 * (H + I))
    merger = r * (H + O + 2 * O)
    est = estimate(job)
    assert largest_component(est, GRADIENTS) == 4 * (3 * per_layer + merger)
    assert largest_component(est, WEIGHTS) == 2 * (2 * TOWER + PROJECTOR) + 4 * (2 * 4 * per_layer + merger)


@pytest.mark.parametrize(("case_id", "images"), [("vl-full-nogc-1img", 1), ("vl-full-nogc-2row-2img", 4),
                                                 ("vl-dpo-full-nogc-2img", 2 * 2)])
def test_the_image_tokens(case_id, images):
    """256 image tokens per 224-px image whatever its size (VideoLlavaImageProcessor crops); pixel_values fp32."""
    est = estimate(_job(case_id))
    assert est.extra["vision"]["image_tokens_per_micro_batch"] == 256 * images
    pixels = next(c for p in est.phases for c in p.components if c.name == "pixel_values")
    assert pixels.bytes == images * 3 * 224 * 224 * 4


@pytest.mark.parametrize(("changes", "words"), [
    ({"trainer": "rloo"}, "trainer rloo on video_llava: hpcmem models video_llava's images for sft, dpo only"),
    ({"max_pixels": 1_000_000}, "VideoLlavaImageProcessor has no such setting"),
])
def test_what_is_not_modelled_is_a_one_line_refusal(changes, words):
    with pytest.raises(SpecError, match=words) as err:
        _job("vl-full-gc-1img", **changes)
    assert all("\n" not in p for p in err.value.problems)
