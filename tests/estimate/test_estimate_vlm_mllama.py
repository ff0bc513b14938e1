"""Llama-3.2-11B-Vision SFT with images (its widths cut to 3 decoder layers with one cross-attention layer and 5 + 2
vision layers, and to 4 decoder layers with two and 10 + 2) against the trace of TRL's SFTTrainer with its vision
collator, transformers' MllamaImageProcessorPil and MllamaProcessor on real images (estimator/traces/vlm-mllama.jsonl,
written by `hpcmem validate trace --cases estimator/cases/vlm-mllama.yaml`): full fine-tuning and LoRA, checkpointing
on and off, 1 and 4 tiles, 1 and 2 images, 2 rows, bf16 and fp32 weights; the catalog's 11B at full depth
(vlm-mllama-11b.yaml); the batch and the tower's states by hand; what is refused."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hpcmem.errors import SpecError
from hpcmem.estimate import estimate
from hpcmem.estimate.vision import GRADIENTS, OPTIMIZER, WEIGHTS
from hpcmem.estimate.workspaces import tensor_bytes
from tests.helpers.stored_cases import largest_component, stored_case_job

ROOT = Path(__file__).resolve().parents[2]
RECORDS = {r["case"]["id"]: r for name in ("vlm-mllama", "vlm-mllama-11b") for r in map(
    json.loads, (ROOT / "estimator" / "traces" / f"{name}.jsonl").read_text().splitlines())}
MAX_PCT = 3.0
# the cut tower by hand (modeling_mllama.py MllamaVisionModel): 1280 wide, 5120 MLP, 560-px tiles of 14-px patches
# (1,601 rows with the class token), 4 tiles, 8 aspect ratios (9 table rows)
H, I, P = 1280, 5120, 40 * 40 + 1
LAYER = 4 * H * H + 2 * H * I + I + H + 2 * 2 * H               # q/k/v/o_proj without bias, fc1/fc2 with, 2 LayerNorms
EMBED = 3 * 14 * 14 * H + H + (1 + P * H + 9 * 4 * P * H) + 2 * (9 * 4 * H + 1)
TOWER = EMBED + 2 * 2 * H + 7 * LAYER + 2 * 2                  # layernorm_pre/post, 5 + 2 layers, the global gates
PROJECTOR = 7680 * 4096 + 4096
EXTRAS = 8 * 4096 + (2 * 128 + 2)                                # embed_tokens' 8 rows; one cross layer's norms, gates


def _job(case_id: str, **changes):
    return stored_case_job(RECORDS[case_id], ROOT, **changes)


def test_the_matrix_is_all_there():
    assert len(RECORDS) == 15 + 4


@pytest.mark.parametrize("case_id", sorted(RECORDS))
def test_estimate_within_3_percent_of_the_trace(case_id):
    traced = RECORDS[case_id]["traced"]
    estimated = max(tensor_bytes(p) for p in estimate(_job(case_id)).phases)
    assert abs(estimated - traced) <= MAX_PCT / 100 * traced, (estimated, traced)


def test_one_tile_and_four_tiles_are_the_same_job():
    """MllamaImageProcessor pads every image to max_image_tiles: a 560×560 image (1 tile) and a 1120×1120 one (2 × 2)
    hand the tower the same [1, 1, 4, 3, 560, 560] pixel_values; the traces agree to the byte, and so does the
    estimate."""
    one, four = "mllama-lora-all-gc-1tile", "mllama-lora-all-gc-4tile"
    assert RECORDS[one]["traced"] == RECORDS[four]["traced"]
    assert RECORDS[one]["estimated"] == RECORDS[four]["estimated"]
    assert estimate(_job(one)).extra["vision"]["image_grid_thw"] == [4, 40, 40]
    assert estimate(_job(four)).extra["vision"]["resized"] == [1120, 1120]


def test_the_batch_and_the_image_token():
    """pixel_values fp32 [1, 2, 4, 3, 560, 560]; one <|image|> token per image; 2 · 4 · 1,601 image states."""
    est = estimate(_job("mllama-full-gc-2img"))
    vision = est.extra["vision"]
    assert vision["image_tokens_per_micro_batch"] == 2
    assert vision["patches_per_micro_batch"] == 2 * 4 * P
    pixels = next(c for p in est.phases for c in p.components if c.name == "pixel_values")
    assert pixels.bytes == 2 * 4 * 3 * 560 * 560 * 4


def test_full_fine_tuning_trains_the_tower_projector_and_cross_attention_extras():
    est = estimate(_job("mllama-full-gc-1tile"))
    trained = TOWER + PROJECTOR + EXTRAS
    assert _vision(est, WEIGHTS) == 2 * trained
    assert _vision(est, OPTIMIZER) == 4 * trained


def test_lora_all_linear_adapts_the_tower_and_the_projector():
    """peft's all-linear (checked on the real trainer, test_trace_vlm_mllama): every q/k/v/o_proj, fc1, fc2 of the 7
    vision layers and multi_modal_projector (r 16, fp32); the decoder's, cross_attn's included, are the language
    model's."""
    job = _job("mllama-lora-all-gc-1tile")
    r = job.train.lora_r
    adapters = r * (7 * (4 * 2 * H + 2 * (H + I)) + (7680 + 4096))
    est = estimate(job)
    assert _vision(est, GRADIENTS) == 4 * adapters
    assert _vision(est, WEIGHTS) == 2 * (TOWER + PROJECTOR + EXTRAS) + 4 * adapters


def _vision(est, name: str) -> int:
    return largest_component(est, name)


@pytest.mark.parametrize(("changes", "words"), [
    ({"trainer": "dpo"}, "trainer dpo on mllama: hpcmem models mllama's images for sft only"),
    ({"max_pixels": 1_000_000}, "MllamaImageProcessor has no such setting"),
    ({"images_per_example": 0}, "without images MllamaTextModel skips its 1 cross-attention layers"),
    ({"images_per_example": 0, "profile_images": 1, "profile_patches": 6404, "profile_image_tokens": 1},
     "its images are read from images_per_example, image_height and image_width only"),
])
def test_what_is_not_modelled_is_a_one_line_refusal(changes, words):
    with pytest.raises(SpecError, match=words) as err:
        _job("mllama-full-gc-1tile", **changes)
    assert all("\n" not in p for p in err.value.problems)


def test_the_phase_table_keeps_its_column_for_the_longest_phase_name():
    """The text table's phase rows: every GiB figure ends in the same column, the cross-attention layer's long phase
    name included (it ran into its number before)."""
    from hpcmem.estimate.table import render

    est = estimate(_job("mllama-lora-all-gc-1tile"))
    text = render(est)
    rows = text.split("phases (allocated):\n", 1)[1].splitlines()[:len(est.phases)]
    assert any("cross-attention" in r for r in rows), rows
    ends = {r.replace("  ← peak", "").rstrip().index(" GiB") for r in rows}
    assert len(ends) == 1, rows
