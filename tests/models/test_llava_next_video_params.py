"""LLaVA-NeXT-Video's parts as hpcmem counts them (hpcmem.models.llava_next's LlavaNextTowerSpec, the language model by
the llama family) against `AutoModelForImageTextToText.from_config` on the meta device: a Vicuna-7B width cut to
1 decoder layer and 4 CLIP layers, and LlavaNextVideoConfig's own defaults (24 CLIP layers, a default Llama); its video
pooler (`vision_resampler`, average mode) holds no parameter; the conv pooler is refused."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hpcmem.errors import SpecError
from hpcmem.models.llava_next import llava_next_tower_from_config
from hpcmem.models.resolve import resolve_model
from tests.helpers.meta_models import meta_image_text_model

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "vlm"
CUT = FIXTURES / "llava-next-video-7b-width-L1-D4.json"


@pytest.mark.torch
@pytest.mark.parametrize("cfg", [json.loads(CUT.read_text()), {"model_type": "llava_next_video"}],
                         ids=["width-L1-D4", "class-defaults"])
def test_parts_equal_the_meta_model(cfg, tmp_path):
    pytest.importorskip("transformers")
    model = meta_image_text_model(cfg)
    assert type(model).__name__ == "LlavaNextVideoForConditionalGeneration"
    count = {"tower": 0, "merger": 0, "newline": 0, "resampler": 0, "language": 0}
    for param_name, p in model.named_parameters():
        part = ("merger" if ".multi_modal_projector." in param_name else "tower" if ".vision_tower." in param_name
                else "resampler" if ".vision_resampler." in param_name
                else "newline" if param_name.endswith("image_newline") else "language")
        count[part] += p.numel()
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    spec = resolve_model(str(path))
    v, width = spec.vision, model.config.text_config.hidden_size
    assert (v.model_type, v.grid_pinpoints) == ("llava_next_video", ((336, 672), (672, 336), (672, 672), (1008, 336),
                                                                     (336, 1008)))
    assert count == {"tower": v.tower_params, "merger": v.merger_params, "newline": width, "resampler": 0,
                     "language": spec.num_params}


def test_the_conv_pooler_is_refused():
    cfg = json.loads(CUT.read_text())
    with pytest.raises(SpecError, match="spatial_pool_mode 'conv': hpcmem models llava_next_video's video pooler "
                                        "without parameters"):
        llava_next_tower_from_config({**cfg, "spatial_pool_mode": "conv"}, "m", "llava_next_video")
