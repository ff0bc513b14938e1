"""The images of a vision-language job: what hpcmem says the processor makes of one image (resize, patch grid, image
tokens) against transformers' own Qwen2.5-VL processor built offline on tiny images, and the one-line refusals."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hpcmem.errors import SpecError
from hpcmem.job.images import DEFAULT_MAX_PIXELS, DEFAULT_MIN_PIXELS, image_geometry, smart_resize
from hpcmem.job.trl_config import build_job
from hpcmem.models.resolve import resolve_model

CONFIG = Path(__file__).resolve().parents[1] / "fixtures" / "vlm" / "Qwen2.5-VL-7B-Instruct.json"
BASE = {"model_name_or_path": str(CONFIG), "images_per_example": 1, "image_height": 224, "image_width": 224,
        "max_length": 2048, "per_device_train_batch_size": 1}


def job(**kw):
    return build_job("sft", {**BASE, **kw})[0]


def test_geometry_by_hand():
    """224×224 is a multiple of 28 inside the default bounds: 16×16 patches of 14 px, merged 2×2 into 64 tokens."""
    g = image_geometry(job().train, resolve_model(str(CONFIG)).vision)
    assert g.resized == (224, 224) and g.grid_thw == (1, 16, 16) and g.patches == 256 and g.tokens == 64
    # 100×10 px is under min_pixels 3136: scaled up by sqrt(3136 / 1000), both sides rounded up to 28
    assert smart_resize(100, 10, 28, DEFAULT_MIN_PIXELS, DEFAULT_MAX_PIXELS) == (196, 28)


@pytest.mark.parametrize("kw, match", [
    ({"images_per_example": -1}, "images_per_example must be ≥ 0"),
    ({"image_height": 0}, "image_height must be ≥ 1 pixel when images_per_example > 0"),
    ({"min_pixels": 5000, "max_pixels": 4000}, "min_pixels 5000 must be ≤ max_pixels 4000"),
    ({"max_pixels": 0}, "max_pixels must be ≥ 1 or None"),
    ({"image_height": 10, "image_width": 3000}, "aspect ratio 300 > 200"),
    ({"packing": True}, "Packing is not supported for vision datasets"),
    ({"padding_free": True}, "Padding-free training is yet not supported"),
    ({"max_length": 32}, r"1 × 64 image tokens .* > max_length 32"),
    ({"activation_offloading": True}, "activation_offloading with images"),
    ({"gradient_checkpointing_kwargs": {"selective": True}}, "selective checkpointing with images"),
    ({"num_processes": 2}, r"images with 2 process\(es\) under MULTI_GPU"),
])
def test_bad_values_are_one_line_errors(kw, match):
    with pytest.raises(SpecError, match=match) as err:
        job(**kw)
    assert all("\n" not in line.removeprefix("- ") for line in str(err.value).splitlines())


def test_images_need_a_vision_tower_and_a_trainer_with_an_image_path():
    with pytest.raises(SpecError, match="has no vision tower"):
        build_job("sft", {**BASE, "model_name_or_path": "Qwen/Qwen2.5-0.5B"})
    # KTO with Qwen2.5-VL's images: the refusal names the type, the trainer and the trainers allowed for it
    with pytest.raises(SpecError, match=r"with trainer kto on qwen2_5_vl: hpcmem models qwen2_5_vl's images for sft, "
                                        r"dpo, grpo, rloo only"):
        build_job("kto", {**BASE, "per_device_train_batch_size": 2})
    llava = {"model_name_or_path": "llava-hf/llava-1.5-7b-hf", "images_per_example": 1, "image_height": 336,
             "image_width": 336, "max_length": 1024}
    build_job("sft", llava)
    build_job("dpo", llava)
    grpo = {**{k: v for k, v in llava.items() if k != "max_length"}, "max_prompt_length": 1024}
    with pytest.raises(SpecError, match=r"with trainer grpo on llava: hpcmem models llava's images for sft, dpo only"):
        build_job("grpo", grpo)


# -- against transformers' processor (torch tier) ---------------------------------------------------------------------

@pytest.mark.torch
@pytest.mark.parametrize("hw, bounds", [((60, 90), {}), ((224, 224), {}), ((333, 517), {}),
                                        ((900, 1200), {"max_pixels": 200_000}),
                                        ((30, 40), {"min_pixels": 100_000})])
def test_geometry_equals_the_real_processor(hw, bounds):
    """Qwen2_5_VLProcessor (transformers 5.24, its PIL image processor) on a blank image of that size, offline: the
    resized size, image_grid_thw, pixel_values rows and the image tokens it writes into the text."""
    pytest.importorskip("transformers")
    from PIL import Image

    from hpcmem.trace.vision import IMAGE_PAD, PLACEHOLDER, processor

    j = job(image_height=hw[0], image_width=hw[1], **bounds)
    proc = processor(j)
    out = proc(images=[[Image.new("RGB", (hw[1], hw[0]))]], text=[PLACEHOLDER + " t3"], return_tensors="pt")
    g = image_geometry(j.train, j.model.vision)
    assert tuple(out["image_grid_thw"][0].tolist()) == g.grid_thw
    assert out["pixel_values"].shape == (g.patches, j.model.vision.patch_dim)
    image_id = proc.tokenizer.convert_tokens_to_ids(IMAGE_PAD)
    assert int((out["input_ids"] == image_id).sum()) == g.tokens


@pytest.mark.torch
def test_smart_resize_is_transformers():
    pytest.importorskip("transformers")
    # the PIL image processor's copy (image_processing_pil_qwen2_vl.py: "Copied from" the torchvision one, which
    # needs torchvision)
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import smart_resize as theirs

    for h, w in ((2, 300), (28, 28), (57, 1000), (4000, 3000), (1080, 1920), (50, 9000)):
        for lo, hi in ((DEFAULT_MIN_PIXELS, DEFAULT_MAX_PIXELS), (3136, 12845056), (256 * 28 * 28, 1280 * 28 * 28)):
            assert smart_resize(h, w, 28, lo, hi) == theirs(h, w, factor=28, min_pixels=lo, max_pixels=hi)


def test_fixture_is_the_published_config():
    cfg = json.loads(CONFIG.read_text())
    assert cfg["model_type"] == "qwen2_5_vl" and cfg["vision_config"]["fullatt_block_indexes"] == [7, 15, 23, 31]


def test_grpo_image_tokens_are_bounded_by_max_prompt_length_not_max_length():
    """GRPOConfig has no max_length (TRL's own dataclass, read here); a GRPO prompt's image tokens count against
    max_prompt_length (1,344² px → 980² after smart_resize: 35 × 35 = 1,225 tokens, by hand). TrainSpec's
    max_length default (1,024) once refused this job in words a GRPO user cannot act on."""
    import dataclasses

    trl = pytest.importorskip("trl")
    assert "max_length" not in {f.name for f in dataclasses.fields(trl.GRPOConfig)}
    settings = {"model_name_or_path": "Qwen/Qwen2.5-VL-7B-Instruct", "use_peft": True,
                "lora_target_modules": "all-linear", "images_per_example": 1, "image_height": 1344,
                "image_width": 1344, "max_completion_length": 256, "num_generations": 4,
                "per_device_train_batch_size": 4, "dtype": "bfloat16"}
    job, _ = build_job("grpo", {**settings, "max_prompt_length": 4096})
    assert job.train.images_per_example == 1
    with pytest.raises(SpecError, match="max_prompt_length 1024 with images_per_example 1 × \\(1225 image tokens"):
        build_job("grpo", {**settings, "max_prompt_length": 1024})


def test_images_without_a_size_are_one_problem_that_says_what_is_missing():
    """images_per_example with neither image_height nor image_width: one line naming both (not two reading the unset
    default 0 as a value the user gave)."""
    from hpcmem.errors import SpecError
    from hpcmem.job.trl_config import build_job

    with pytest.raises(SpecError) as refused:
        build_job("sft", {"model_name_or_path": "Qwen/Qwen2.5-VL-7B-Instruct", "images_per_example": 1})
    problems = [p for p in refused.value.problems if "image_" in p]
    assert problems == ["images_per_example 1 needs image_height and image_width (each image's size in pixels before "
                        "the processor resizes it), or a length profile of the data (--lengths)"]
