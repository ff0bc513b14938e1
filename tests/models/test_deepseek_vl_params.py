"""DeepSeek-VL's parts as hpcmem counts them (hpcmem.models.deepseek_vl, the language model by the llama family) against
`AutoModelForImageTextToText.from_config` on the meta device: DeepSeek-VL 1.3B's widths cut to 1 decoder layer and 4
SigLIP layers at 384 and 512 px, DeepseekVLConfig's defaults (SigLIP class defaults with the pooling head, a default
Llama); the aligner and the image tokens by hand."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hpcmem.errors import SpecError
from hpcmem.models.resolve import resolve_model
from tests.helpers.meta_models import meta_image_text_model, meta_part_counts

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "vlm"
CUTS = ["deepseek-vl-1.3b-width-L1-D4-384.json", "deepseek-vl-1.3b-width-L1-D4-512.json"]


def _counts(cfg: dict, path: Path) -> tuple[dict, dict, object, object]:
    model = meta_image_text_model(cfg)
    path.write_text(json.dumps(cfg))
    spec = resolve_model(str(path))
    ours = {"tower": spec.vision.tower_params, "merger": spec.vision.merger_params, "language": spec.num_params}
    return meta_part_counts(model, tower=".vision_model.", merger=".aligner."), ours, model, spec


@pytest.mark.torch
@pytest.mark.parametrize("name", CUTS)
def test_parts_and_linears_equal_the_meta_model(name, tmp_path):
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    count, ours, model, spec = _counts(json.loads((FIXTURES / name).read_text()), tmp_path / "config.json")
    assert type(model).__name__ == "DeepseekVLForConditionalGeneration"
    assert count == ours
    linears = {n.split("model.", 1)[1] for n, m in model.named_modules()
               if isinstance(m, torch.nn.Linear) and (".vision_model." in n or ".aligner." in n)}
    mine = {f"vision_model.encoder.layers.{i}.{x.name}" for x in spec.vision.linears()
            if x.part == "tower" for i in range(x.count)}
    mine |= {f"aligner.{x.name}" for x in spec.vision.linears() if x.part == "merger"}
    assert linears == mine


@pytest.mark.torch
def test_the_config_class_defaults_equal_the_meta_model(tmp_path):
    """No vision_config, no text_config: SiglipVisionConfig's defaults (768 wide, 12 layers, 224 / 16 px, the
    attention-pooling head loaded) and LlamaConfig's (4096 wide), tied."""
    pytest.importorskip("transformers")
    count, ours, model, spec = _counts({"model_type": "deepseek_vl"}, tmp_path / "config.json")
    assert count == ours
    assert spec.vision.pooling_head and spec.vision.tokens_per_image == (224 // 16) ** 2
    assert spec.tie_word_embeddings is (model.get_output_embeddings().weight is model.get_input_embeddings().weight)


@pytest.mark.parametrize(("name", "tokens"), [(CUTS[0], 576), (CUTS[1], 1024)])
def test_image_tokens_and_aligner_by_hand(name, tokens):
    """(image_size / patch_size)² tokens per image: (384 / 16)² = 24² = 576, (512 / 16)² = 32² = 1,024; the aligner
    Linear(1024 → 2048) and Linear(2048 → 2048), both with bias."""
    v = resolve_model(str(FIXTURES / name)).vision
    assert v.tokens_per_image == tokens
    assert v.merger_params == (1024 * 2048 + 2048) + (2048 * 2048 + 2048)


def test_a_tower_other_than_siglip_is_refused(tmp_path):
    cfg = json.loads((FIXTURES / CUTS[0]).read_text())
    cfg["vision_config"]["model_type"] = "clip_vision_model"
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    with pytest.raises(SpecError, match="deepseek_vl's vision_config.model_type 'clip_vision_model' is not modelled"):
        resolve_model(str(path))
