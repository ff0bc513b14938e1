"""Video-LLaVA's parts as hpcmem counts them (hpcmem.models.video_llava's VideoLlavaTowerSpec, the language model by the
llama family) against `AutoModelForImageTextToText.from_config` on the meta device: the Vicuna-7B width cut to 1
decoder layer and 4 CLIP layers, VideoLlavaConfig's own defaults and the catalog's LanguageBind/Video-LLaVA-7B-hf. The
video tower is a second CLIP tower of the same config, loaded and idle with images."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hpcmem.models.resolve import catalog, resolve_model
from tests.helpers.meta_models import meta_image_text_model

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "vlm"
CUT = FIXTURES / "video-llava-7b-width-L1-D4.json"
HUB = "LanguageBind/Video-LLaVA-7B-hf"


@pytest.mark.torch
@pytest.mark.parametrize("cfg", [json.loads(CUT.read_text()), {"model_type": "video_llava"}, catalog()[HUB]["config"]],
                         ids=["width-L1-D4", "class-defaults", "7b"])
def test_parts_equal_the_meta_model(cfg, tmp_path):
    pytest.importorskip("transformers")
    model = meta_image_text_model(cfg)
    assert type(model).__name__ == "VideoLlavaForConditionalGeneration"
    count = {"image": 0, "video": 0, "merger": 0, "language": 0}
    for name, p in model.named_parameters():
        part = ("merger" if ".multi_modal_projector." in name else "image" if ".image_tower." in name
                else "video" if ".video_tower." in name else "language")
        count[part] += p.numel()
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    spec = resolve_model(str(path))
    v = spec.vision
    assert count == {"image": v.tower_params, "video": v.idle_params, "merger": v.merger_params,
                     "language": spec.num_params}
    assert v.num_params == count["image"] + count["video"] + count["merger"]
    # VideoLlavaConfig's vision default is 224 px: 256 image tokens
    assert v.tokens_per_image == (v.image_size // v.patch_size) ** 2


@pytest.mark.torch
def test_all_linear_adapts_both_towers():
    """peft's all-linear wraps the video tower's linears too (loaded, never run on images): the spec lists them as
    part "video"."""
    pytest.importorskip("peft")
    import peft

    cfg = json.loads(CUT.read_text())
    model = meta_image_text_model(cfg)
    wrapped = peft.get_peft_model(model, peft.LoraConfig(r=4, target_modules="all-linear"))
    names = [n for n, m in wrapped.named_modules() if hasattr(m, "lora_A") and "lm_head" not in n]
    spec = resolve_model(str(CUT))
    by_part = {part: sum(x.count for x in spec.vision.linears() if x.part == part) for part in ("tower", "merger",
                                                                                                   "video")}
    assert sum(".video_tower." in n for n in names) == by_part["video"] == 6 * 4
    assert sum(".image_tower." in n for n in names) == by_part["tower"]
    assert sum(".multi_modal_projector." in n for n in names) == by_part["merger"] == 2
