"""Qianfan-OCR's parts as hpcmem counts them (hpcmem.models.qianfan_ocr: InternVL's tower and projector, the language
model by the qwen3 family) against `AutoModelForImageTextToText.from_config` on the meta device: QianfanOCRConfig's
default widths cut to 1 decoder layer and 2 vision layers, a variant without q/k/v bias and with tied embeddings, and
the vision config class's own defaults (attention_bias True, drop_path_rate 0.1) for keys the config omits."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hpcmem.errors import SpecError
from hpcmem.models.qianfan_ocr import qianfan_tower_from_config
from hpcmem.models.resolve import resolve_model
from tests.helpers.meta_models import meta_image_text_model, meta_part_counts

CUT = Path(__file__).resolve().parents[1] / "fixtures" / "vlm" / "qianfan-ocr-defaults-L1-D2.json"


def _variant(name: str) -> dict:
    cfg = json.loads(CUT.read_text())
    if name == "no-qkv-bias-tied":
        cfg["vision_config"]["attention_bias"] = False
        cfg["tie_word_embeddings"] = True
    elif name == "vision-omitted-keys":
        for key in ("attention_bias", "drop_path_rate"):
            cfg["vision_config"].pop(key)
        cfg.pop("tie_word_embeddings")
    return cfg


@pytest.mark.torch
@pytest.mark.parametrize("name", ["defaults-L1-D2", "no-qkv-bias-tied", "vision-omitted-keys"])
def test_parts_equal_the_meta_model(name, tmp_path):
    pytest.importorskip("transformers")
    cfg = _variant(name)
    model = meta_image_text_model(cfg)
    assert type(model).__name__ == "QianfanOCRForConditionalGeneration"
    count = meta_part_counts(model)
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    spec = resolve_model(str(path))
    v = spec.vision
    assert count == {"tower": v.tower_params, "merger": v.merger_params, "language": spec.num_params}
    tied = model.get_output_embeddings().weight is model.get_input_embeddings().weight
    assert spec.tie_word_embeddings == tied
    if name == "vision-omitted-keys":
        assert model.config.vision_config.attention_bias and v.attention_bias
        assert v.drop_path_rate == model.config.vision_config.drop_path_rate == 0.1


def test_the_default_widths_by_hand():
    """InternViT at 448 px / 14 px: a class token, a Conv2d with bias, 32² + 1 positions; a layer's six linears (q/k/v
    with bias), two LayerNorms, two layer-scale vectors; the projector's LayerNorm over 4 · 1024 → 4096."""
    v = qianfan_tower_from_config(json.loads(CUT.read_text()), "cut")
    h, i, o = 1024, 4096, 4096
    assert v.embed_params == h + 3 * 14 * 14 * h + h + 1025 * h
    assert v.block_params == 4 * (h * h + h) + 2 * h * i + i + h + 4 * h + 2 * h
    assert v.merger_params == 2 * 4 * h + 4 * h * o + o + o * o + o
    assert v.tokens_per_image == 256 and v.family == "internvl" and v.model_type == "qianfan_ocr"


def test_an_internvl_vision_config_is_refused():
    cfg = json.loads(CUT.read_text())
    cfg["vision_config"]["model_type"] = "internvl_vision"
    with pytest.raises(SpecError, match="qianfan_ocr_vision"):
        qianfan_tower_from_config(cfg, "x")
