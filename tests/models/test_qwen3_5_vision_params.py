"""Qwen3.5's and Qwen3.5-MoE's parts as hpcmem counts them (Qwen3-VL's tower and merger in hpcmem.models.vision,
without deepstack mergers; the language model from the learned profile of the text config, hpcmem.models.vlm_learned)
against `AutoModelForImageTextToText.from_config` on the meta device, on the cuts of estimator/cases/vlm-qwen3-5.yaml
and vlm-qwen3-5-moe.yaml (the config classes' defaults, 2 decoder layers — one Gated DeltaNet, one full attention —
and 2 vision blocks); the image tokens a picture takes counted by transformers' Qwen3VLProcessor (the processor
processing_auto.py pairs with both types)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hpcmem.job.images import image_geometry
from hpcmem.models.resolve import resolve_model
from hpcmem.validate.cases import case_job
from tests.helpers.meta_models import meta_image_text_model, meta_part_counts
from tests.helpers.vlm_cuts import assert_refused_without_text_profile

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "vlm"
CUTS = {"Qwen3_5ForConditionalGeneration": FIXTURES / "qwen3_5-defaults-L2-D2.json",
        "Qwen3_5MoeForConditionalGeneration": FIXTURES / "qwen3_5_moe-defaults-L2-D2.json"}


def _job(cut: Path, height: int, width: int):
    return case_job({"trainer": "sft", "model_name_or_path": str(cut), "max_length": 4096, "images_per_example": 1,
                     "image_height": height, "image_width": width, "dtype": "bfloat16", "bf16": True})


@pytest.mark.torch
@pytest.mark.parametrize("class_name", sorted(CUTS))
def test_parts_and_linears_equal_the_meta_model(class_name):
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    cut = CUTS[class_name]
    model = meta_image_text_model(json.loads(cut.read_text()))
    assert type(model).__name__ == class_name
    spec = resolve_model(str(cut))
    count = meta_part_counts(model, tower=".visual.", merger=".visual.merger.")
    assert count == {"tower": spec.vision.tower_params, "merger": spec.vision.merger_params,
                     "language": spec.num_params}
    assert spec.vision.deepstack_visual_indexes == () and spec.vision.deepstack_params == 0
    assert not any("deepstack" in n for n, _ in model.named_parameters())
    linears = {n.rsplit("visual.", 1)[-1] for n, m in model.named_modules()
               if isinstance(m, torch.nn.Linear) and ".visual." in f".{n}."}
    ours = {f"blocks.{i}.{x.name}" for x in spec.vision.linears() if x.part == "tower" for i in range(x.count)}
    ours |= {f"merger.{x.name}" for x in spec.vision.linears() if x.part == "merger"}
    assert linears == ours
    assert spec.tie_word_embeddings is (model.get_output_embeddings().weight is model.get_input_embeddings().weight)
    assert spec.learned is not None and spec.vision.hooked_input is False


@pytest.mark.torch
def test_deepstack_indexes_in_the_config_build_no_deepstack_merger():
    """A vision_config that still names deepstack_visual_indexes (Qwen3-VL's key): Qwen3_5VisionModel.__init__
    deletes the mergers Qwen3VLVisionModel built, so hpcmem counts none."""
    pytest.importorskip("transformers")
    cfg = json.loads(CUTS["Qwen3_5ForConditionalGeneration"].read_text())
    cfg["vision_config"]["deepstack_visual_indexes"] = [0, 1]
    try:
        model = meta_image_text_model(cfg)
    except (TypeError, ValueError) as exc:     # a strict config class that refuses the key: nothing to count
        pytest.skip(f"Qwen3_5VisionConfig refuses deepstack_visual_indexes: {exc}")
    assert not any("deepstack" in n for n, _ in model.named_parameters())
    from hpcmem.models.vision import vision_spec_from_config

    assert vision_spec_from_config(cfg, "cut").deepstack_visual_indexes == ()


@pytest.mark.torch
@pytest.mark.parametrize("cut", sorted(CUTS.values()), ids=lambda p: p.stem)
@pytest.mark.parametrize(("height", "width"), [(448, 448), (896, 896), (600, 1000), (1000, 300)])
def test_the_processor_counts_the_spec_s_image_tokens(cut, height, width):
    """Qwen3VLProcessor (hpcmem.trace.vision `processor`, transformers' own class) on one image: its image_pad tokens,
    pixel_values rows and image_grid_thw are the spec's (smart_resize to 32 px multiples, 16 px patches, 2 × 2
    merged into one token); one vision_start and one vision_end around them."""
    pytest.importorskip("transformers")
    from PIL import Image

    from hpcmem.trace.vision import IMAGE_PAD, VISION_END, VISION_START, processor

    job = _job(cut, height, width)
    from transformers.models.qwen3_vl.processing_qwen3_vl import Qwen3VLProcessor

    proc = processor(job)
    assert isinstance(proc, Qwen3VLProcessor)
    out = proc(text=[VISION_START + IMAGE_PAD + VISION_END + " t3"], images=[Image.new("RGB", (width, height))],
               return_tensors="pt")
    ids = out["input_ids"][0]
    g = image_geometry(job.train, job.model.vision)
    pad, start, end = proc.tokenizer.convert_tokens_to_ids([IMAGE_PAD, VISION_START, VISION_END])
    assert int((ids == pad).sum()) == g.tokens
    assert [int((ids == start).sum()), int((ids == end).sum())] == [1, 1]
    assert tuple(out["image_grid_thw"][0].tolist()) == g.grid_thw
    assert tuple(out["pixel_values"].shape) == (g.patches, job.model.vision.patch_dim)


def test_896_px_by_hand():
    """896 / 16 = 56 patches a side: 3,136 patches, 784 image tokens; 3 · 2 · 16² = 1,536 values a patch row."""
    job = _job(CUTS["Qwen3_5ForConditionalGeneration"], 896, 896)
    g = image_geometry(job.train, job.model.vision)
    assert (g.patches, g.tokens, job.model.vision.patch_dim) == (3136, 784, 1536)


def test_a_text_config_without_a_learned_profile_is_refused(tmp_path):
    assert_refused_without_text_profile(CUTS["Qwen3_5ForConditionalGeneration"], tmp_path, num_hidden_layers=3,
                                        layer_types=["linear_attention", "linear_attention", "full_attention"])
