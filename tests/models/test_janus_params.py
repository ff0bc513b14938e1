"""Janus's parts as hpcmem counts them (hpcmem.models.janus, the language model by the llama family) against
`AutoModelForImageTextToText.from_config` on the meta device: Janus-Pro-1B's widths cut to 1 decoder layer and 4 tower
layers at 384 and 512 px with JanusVQVAEConfig's defaults; the aligner, the image tokens and the generation head by
hand; what is refused."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hpcmem.errors import SpecError
from hpcmem.models.resolve import catalog, resolve_model
from tests.helpers.meta_models import meta_image_text_model

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "vlm"
CUTS = ["janus-pro-1b-width-L1-D4-384.json", "janus-pro-1b-width-L1-D4-512.json"]
HUB = "deepseek-community/Janus-Pro-1B"
IDLE = (".vqmodel.", ".generation_")


def _part(name: str) -> str:
    if ".vision_model." in name:
        return "tower"
    if any(k in name for k in IDLE):
        return "idle"
    return "merger" if ".aligner." in name else "language"


@pytest.mark.torch
@pytest.mark.parametrize("name", [*CUTS, HUB])
def test_parts_and_linears_equal_the_meta_model(name, tmp_path):
    """The two cuts and the catalog's Janus-Pro-1B (its tie as the real class ties it too)."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    cfg = catalog()[HUB]["config"] if name == HUB else json.loads((FIXTURES / name).read_text())
    model = meta_image_text_model(cfg)
    assert type(model).__name__ == "JanusForConditionalGeneration"
    count = {"tower": 0, "merger": 0, "idle": 0, "language": 0}
    for n, p in model.named_parameters():
        count[_part(n)] += p.numel()
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    spec = resolve_model(str(path))
    assert spec.tie_word_embeddings is (model.get_output_embeddings().weight is model.get_input_embeddings().weight)
    v = spec.vision
    assert count == {"tower": v.tower_params, "merger": v.merger_params, "idle": v.idle_params,
                     "language": spec.num_params}
    linears = {n.split("model.", 1)[1] for n, m in model.named_modules()
               if isinstance(m, torch.nn.Linear) and n.startswith("model.") and "language_model" not in n}
    mine = {f"vision_model.encoder.layers.{i}.{x.name}" for x in v.linears() if x.part == "tower"
            for i in range(x.count)}
    mine |= {f"aligner.{x.name}" for x in v.linears() if x.part == "merger"}
    mine |= {x.name for x in v.linears() if x.part == "generation"}
    assert linears == mine


def test_image_tokens_aligner_and_generation_head_by_hand():
    """(384 / 16)² = 576 tokens per image, (512 / 16)² = 1,024; the aligner Linear(1024 → 2048) and
    Linear(2048 → 2048) with bias; the idle generation_head's vision_head Linear(2048 → 16384) with bias among the
    idle parameters; the tower's MLP 1024 · mlp_ratio 4 = 4096 wide."""
    v384, v512 = (resolve_model(str(FIXTURES / n)).vision for n in CUTS)
    assert (v384.tokens_per_image, v512.tokens_per_image) == (576, 1024)
    assert v384.merger_params == (1024 * 2048 + 2048) + (2048 * 2048 + 2048)
    assert v384.intermediate_size == 4096
    assert v384.idle_params > 2048 * 16384 + 16384
    assert v384.idle_params == v512.idle_params


def test_a_projection_dim_other_than_the_text_width_is_refused(tmp_path):
    """JanusConfig's bare defaults: projection_dim 2048 beside LlamaConfig's 4096-wide text."""
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"model_type": "janus"}))
    with pytest.raises(SpecError, match="projection_dim 2048 must equal text_config.hidden_size 4096"):
        resolve_model(str(path))


def test_qk_norm_is_refused(tmp_path):
    cfg = json.loads((FIXTURES / CUTS[0]).read_text())
    cfg["vision_config"]["use_qk_norm"] = True
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    with pytest.raises(SpecError, match="use_qk_norm true or attention_bias false is not modelled"):
        resolve_model(str(path))
