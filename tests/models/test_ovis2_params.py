"""Ovis2's tower, visual-tokenizer head and visual embedding table as hpcmem.models.ovis2 counts them, against
`AutoModelForImageTextToText.from_config` on the meta device: a cut at Ovis2VisionConfig's widths (1024 wide, 8 heads)
with 448 px tiles and hidden_stride 2 beside a 1536-wide Qwen2 layer, and Ovis2Config's class defaults; the image
tokens and the head by hand."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hpcmem.errors import SpecError
from hpcmem.models.ovis2 import ovis2_tower_from_config
from tests.helpers.meta_models import meta_image_text_model, meta_part_counts

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "vlm" / "ovis2-2b-width-L1-D2-448.json"


def _tower_counts(cfg: dict) -> tuple[dict, object, object]:
    model = meta_image_text_model(cfg)
    count = meta_part_counts(model, tower=".vision_tower.transformer.", merger=".visual_embeddings_table.")
    head = sum(p.numel() for n, p in model.named_parameters() if ".vision_tower.head_" in n)
    count = {**count, "merger": count["merger"] + head, "language": count["language"] - head}
    return count, model, ovis2_tower_from_config(cfg, "test")


@pytest.mark.torch
def test_the_cut_tower_head_and_table_equal_the_meta_model():
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    count, model, spec = _tower_counts(json.loads(FIXTURE.read_text()))
    assert type(model).__name__ == "Ovis2ForConditionalGeneration"
    assert (count["tower"], count["merger"]) == (spec.tower_params, spec.merger_params)
    linears = {n.split("vision_tower.", 1)[1] for n, m in model.named_modules()
               if isinstance(m, torch.nn.Linear) and ".vision_tower." in n}
    mine = {f"transformer.encoder.layers.{i}.{x.name}" for x in spec.linears() if x.part == "tower"
            for i in range(x.count)}
    mine |= {x.name for x in spec.linears() if x.part == "merger"}
    assert linears == mine
    assert model.get_output_embeddings().weight is model.get_input_embeddings().weight


@pytest.mark.torch
def test_the_config_class_defaults_equal_the_meta_model():
    """No vision_config: Ovis2VisionConfig's defaults (1024 wide, 24 layers, 224 / 14 px, hidden_stride 1); the text
    config at Ovis2Config's outer width and vocabulary (a bare one, 4096 wide, is refused below)."""
    pytest.importorskip("transformers")
    count, _, spec = _tower_counts({"model_type": "ovis2", "text_config": {"model_type": "qwen2", "hidden_size": 1536,
                                                                           "vocab_size": 151643}})
    assert (count["tower"], count["merger"]) == (spec.tower_params, spec.merger_params)
    assert spec.tokens_per_image == 16 * 16


def test_image_tokens_head_and_table_by_hand():
    """448 / 14 = 32 patches a side, hidden_stride 2: 16² = 256 image tokens per tile (Ovis2Processor's
    image_seq_length); head_linear 4 × 1024 → 16384 − 5 without bias, head_norm's weight and bias; the table
    16384 × 1536."""
    v = ovis2_tower_from_config(json.loads(FIXTURE.read_text()), "test")
    assert v.tokens_per_image == 256 and v.patches == 1024
    assert [x.params for x in v.linears() if x.part == "merger"] == [4 * 1024 * 16379]
    assert v.merger_params == 4 * 1024 * 16379 + 2 * 16379 + 16384 * 1536
    assert ovis2_tower_from_config({"vision_config": {"image_size": 434, "hidden_stride": 2}, "hidden_size": 4096,
                                    "vocab_size": 151936}, "t").tokens_per_image == 16 * 16  # 31 patches a side, zero-padded to 32


def test_a_non_square_image_size_is_refused():
    with pytest.raises(SpecError, match="square images"):
        ovis2_tower_from_config({"vision_config": {"image_size": [448, 448]}}, "test")


def test_outer_widths_other_than_the_text_models_are_refused():
    """Ovis2Config's defaults (hidden_size 1536, vocab_size 151643) beside a bare Qwen2 text config (4096, 151936)."""
    with pytest.raises(SpecError, match="must equal text_config's"):
        ovis2_tower_from_config({"model_type": "ovis2"}, "test")
