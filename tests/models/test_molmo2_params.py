"""Molmo2's parts as hpcmem counts them (hpcmem.models.molmo2: its ViT over fixed crops and the pooling adapter at
Molmo2VisionConfig's and Molmo2AdapterConfig's defaults, the language model from the learned profile of its
molmo2_text config, hpcmem.models.vlm_learned) against `AutoModelForImageTextToText.from_config` on the meta device,
on the cut of estimator/cases/vlm-molmo2.yaml; peft's all-linear targets on that model; the crops, patches and tokens
a picture takes counted by transformers' Molmo2Processor around Molmo2ImageProcessor (hpcmem.trace.vision_molmo2:
torch's resize and normalize in place of torchvision's)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hpcmem.errors import SpecError
from hpcmem.estimate.vision import vision_adapters
from hpcmem.models.molmo2 import molmo2_tower_from_config, select_tiling
from hpcmem.models.resolve import resolve_model
from hpcmem.validate.cases import case_job
from tests.helpers.meta_models import meta_image_text_model, meta_part_counts, peft_all_linear_targets
from tests.helpers.vlm_cuts import assert_refused_without_text_profile

CUT = Path(__file__).resolve().parents[1] / "fixtures" / "vlm" / "molmo2-defaults-L2-D2.json"
BASE = {"model_type": "molmo2", "adapter_config": {"text_hidden_size": 4096}}


def _job(height: int, width: int, **extra):
    return case_job({"trainer": "sft", "model_name_or_path": str(CUT), "max_length": 4096, "images_per_example": 1,
                     "image_height": height, "image_width": width, "dtype": "bfloat16", "bf16": True, **extra})


def _vision_name(name: str) -> str | None:
    """A meta model module's name as hpcmem's TowerLinear names it: below `vision_tower.` (layers.N.<name>,
    patch_embedding) or `multi_modal_projector.`."""
    for part in ("vision_tower.", "multi_modal_projector."):
        if f".{part}" in f".{name}":
            return name.rsplit(part, 1)[-1]
    return None


def _ours(linears, depth: int) -> dict[str, tuple[int, int]]:
    out = {}
    for x in linears:
        if x.part != "tower":
            out[x.name] = (x.in_features, x.out_features)
            continue
        for i in range(depth):
            out[f"layers.{i}.{x.name}"] = (x.in_features, x.out_features)
    return out


def test_the_default_tower_by_hand():
    """Molmo2VisionConfig's defaults: 25 layers of width 1152 (MLP 4304), patch_embedding Linear(3 · 14² = 588 →
    1152), the table of (378 / 14)² = 729 rows; the adapter reads layers [24, 18] (2 · 1152 = 2304 wide) into
    image_pooling_2d (→ 1152) and the gated MLP 1152 → 18944 → 4096."""
    v = molmo2_tower_from_config(BASE, "x")
    by_name = {x.name: x for x in v.linears()}
    assert (v.depth, v.hidden_size, v.patches, v.feature_layers) == (25, 1152, 729, (24, 18))
    assert (by_name["patch_embedding"].in_features, by_name["image_pooling_2d.k_proj"].in_features,
            by_name["image_pooling_2d.o_proj"].out_features, by_name["image_projector.up_proj"].out_features,
            by_name["image_projector.down_proj"].out_features) == (588, 2304, 1152, 18944, 4096)


def test_the_crops_of_a_640_by_480_picture_by_hand():
    """378² crops, 27 patches a side, overlap margins 4 + 4 patches: windows of 19 patches (266 px) over the image
    less 112 px, 368 × 528 px: 1 × 2 windows would downscale (266 / 368 < 1), 2 × 2 cover it at scale
    min(532 / 368, 532 / 528) ≈ 1.008, the least upscaling of those that cover; the canvas 2 · 266 + 112 = 644 px a
    side, 46 patches, pooled 2 × 2 into 23 × 23 = 529 tokens, beside the global crop's ⌈27 / 2⌉² = 196: 725 tokens,
    5 crops; its text 2 + 14 · 15 and 2 + 23 · 24 tokens with the start, end and column tokens."""
    v = molmo2_tower_from_config(BASE, "x")
    assert select_tiling(480 - 112, 640 - 112, 266, 8) == (2, 2)
    assert v.layout(480, 640) == (2, 2, 644, 644)
    assert (v.crops(480, 640), v.image_tokens(480, 640), v.text_tokens(480, 640)) == (5, 725, 212 + 554)


@pytest.mark.parametrize(("cfg", "match"), [
    ({"adapter_config": {}}, "text_hidden_size 3584 is not the text width 4096"),
    ({"adapter_config": {"text_hidden_size": 4096, "vision_feature_layer": [18, 12]}}, "does not read the last"),
    ({"adapter_config": {"text_hidden_size": 4096}, "vision_config": {"image_size": [378, 336]}}, "square"),
    ({"adapter_config": {"text_hidden_size": 4096, "hidden_act": "gelu"}}, "SiLU-gated"),
    ({"vit_config": {}}, "vit_config")])
def test_what_it_does_not_model_is_refused(cfg, match):
    with pytest.raises(SpecError, match=match):
        molmo2_tower_from_config({"model_type": "molmo2", **cfg}, "x")


@pytest.mark.torch
def test_parts_and_linears_equal_the_meta_model():
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    model = meta_image_text_model(json.loads(CUT.read_text()))
    assert type(model).__name__ == "Molmo2ForConditionalGeneration"
    spec = resolve_model(str(CUT))
    count = meta_part_counts(model, tower=".vision_tower.", merger=".multi_modal_projector.")
    assert count == {"tower": spec.vision.tower_params, "merger": spec.vision.merger_params,
                     "language": spec.num_params}
    linears = {_vision_name(n): (m.in_features, m.out_features) for n, m in model.named_modules()
               if isinstance(m, torch.nn.Linear) and _vision_name(n)}
    assert linears == _ours(spec.vision.linears(), spec.vision.depth)
    biases = {_vision_name(n): m.bias is not None for n, m in model.named_modules()
              if isinstance(m, torch.nn.Linear) and _vision_name(n) and ".layers.1." not in f".{n}"}
    assert biases == {k: x.bias for x in spec.vision.linears()
                      for k in ([f"layers.0.{x.name}"] if x.part == "tower" else [x.name])}
    assert spec.tie_word_embeddings is False and model.get_output_embeddings().weight.shape[0] == 151936
    assert spec.learned is not None


@pytest.mark.torch
def test_peft_all_linear_reaches_what_the_spec_adapts():
    """peft's all-linear on the real model (peft/tuners/tuners_utils.py `_maybe_include_all_linear_layers`: every
    nn.Linear but the output embedding): its tower and adapter targets are hpcmem's `vision_adapters`."""
    pytest.importorskip("torch")
    pytest.importorskip("peft")

    model = meta_image_text_model(json.loads(CUT.read_text()))
    targets = peft_all_linear_targets(model)
    job = _job(480, 640, use_peft=True, lora_target_modules="all-linear")
    theirs = {n for n in (_vision_name(t) for t in targets) if n}
    assert theirs == set(_ours(vision_adapters(job, job.model.vision), job.model.vision.depth))
    assert "lm_head" not in targets


@pytest.mark.torch
@pytest.mark.parametrize(("height", "width"), [(378, 378), (480, 640), (672, 896), (1000, 300), (2000, 2000),
                                               (150, 900), (800, 1400)])
def test_the_processor_counts_the_spec_s_crops_and_tokens(height, width):
    """Molmo2Processor (hpcmem.trace.vision `processor`, transformers' own class and its image processor's own
    tiling) on one blank image: its crops, pixel rows, pooling windows, image_grids, <im_patch> tokens and all the
    image's tokens (mm_token_type_ids) are the spec's."""
    pytest.importorskip("torch")
    from PIL import Image

    from hpcmem.trace.vision import processor, token_ids

    job = _job(height, width)
    v = job.model.vision
    proc = processor(job)
    out = proc(images=[[Image.new("RGB", (width, height))]], text=["<|image|>t3"], return_tensors="pt")
    crops = v.crops(height, width)
    assert tuple(out["pixel_values"].shape) == (crops, v.patches, v.patch_dim)
    assert tuple(out["image_grids"][0].tolist()) == v.grid(height, width)
    assert out["image_token_pooling"].shape == (v.image_tokens(height, width), v.pool_unit)
    assert int((out["input_ids"] == token_ids(proc)["image_patch_id"]).sum()) == v.image_tokens(height, width)
    assert int(out["mm_token_type_ids"].sum()) == v.text_tokens(height, width)
    assert out["input_ids"].shape[1] == v.text_tokens(height, width) + 2       # the bos (eos) and the word


def test_a_text_config_without_a_learned_profile_is_refused(tmp_path):
    assert_refused_without_text_profile(CUT, tmp_path, num_hidden_layers=3)


def test_the_trace_s_image_processor_differs_from_transformers_only_in_resize_and_normalize():
    """hpcmem.trace.vision_molmo2's stand-in overrides the two TorchvisionBackend methods that need torchvision and
    nothing of Molmo2ImageProcessor's own."""
    pytest.importorskip("torch")
    from transformers.models.molmo2.image_processing_molmo2 import Molmo2ImageProcessor

    from hpcmem.trace.vision_molmo2 import _image_processor_class

    cls = _image_processor_class()
    assert cls.__mro__[1] is Molmo2ImageProcessor
    assert {k for k, x in vars(cls).items() if callable(x)} == {"resize", "normalize"}


@pytest.mark.torch
def test_trl_s_vision_collators_pass_the_processor_s_mm_token_type_ids():
    """Molmo2Model.forward raises in training without mm_token_type_ids: TRL 1.16's SFT collator
    (`DataCollatorForVisionLanguageModeling`) returns the processor's, and its DPO collator
    (`DataCollatorForVisionPreference`) the prompt's with zeros for the completions, 1 on the image's tokens alone."""
    pytest.importorskip("trl")
    from PIL import Image
    from trl.trainer.dpo_trainer import DataCollatorForVisionPreference
    from trl.trainer.sft_trainer import DataCollatorForVisionLanguageModeling

    from hpcmem.trace.vision import processor

    job = _job(480, 640)
    proc, image = processor(job), Image.new("RGB", (640, 480))
    tokens = job.model.vision.text_tokens(480, 640)
    sft = DataCollatorForVisionLanguageModeling(processor=proc, max_length=2048)(
        [{"images": [image], "messages": [{"role": "user", "content": "t3 t3"}]}])
    assert int(sft["mm_token_type_ids"].sum()) == tokens
    dpo = DataCollatorForVisionPreference(processor=proc, max_length=2048)(
        [{"images": [image], "prompt": [{"role": "user", "content": "t3"}],
          "chosen": [{"role": "assistant", "content": " t3 t3"}],
          "rejected": [{"role": "assistant", "content": " t3"}]}])
    assert dpo["mm_token_type_ids"].shape == dpo["input_ids"].shape
    assert dpo["mm_token_type_ids"].sum(dim=1).tolist() == [tokens, tokens]
