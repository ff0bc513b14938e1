"""PaliGemma's parts as hpcmem counts them (hpcmem.models.paligemma, the language model by the gemma2 family) against
`AutoModelForImageTextToText.from_config` on the meta device: PaliGemma 2 3B's widths cut to 1 decoder layer and 4
SigLIP layers at 224 and 448 px; the full-depth tower and the image tokens by hand."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hpcmem.errors import SpecError
from hpcmem.models.resolve import resolve_model
from tests.helpers.meta_models import meta_image_text_model, meta_part_counts

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "vlm"


@pytest.mark.torch
@pytest.mark.parametrize("name", ["paligemma2-3b-width-L1-D4-224.json", "paligemma2-3b-width-L1-D4-448.json"])
def test_parts_equal_the_meta_model(name):
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    model = meta_image_text_model(json.loads((FIXTURES / name).read_text()))
    assert type(model).__name__ == "PaliGemmaForConditionalGeneration"
    count = meta_part_counts(model)
    spec = resolve_model(str(FIXTURES / name))
    assert count == {"tower": spec.vision.tower_params, "merger": spec.vision.merger_params,
                     "language": spec.num_params}
    linears = {n.split("model.", 1)[1] for n, m in model.named_modules()
               if isinstance(m, torch.nn.Linear) and (".vision_tower." in n or ".multi_modal_projector." in n)}
    ours = {f"vision_tower.encoder.layers.{i}.{x.name}" for x in spec.vision.linears()
            if x.part == "tower" for i in range(x.count)}
    ours |= {f"multi_modal_projector.{x.name}" for x in spec.vision.linears() if x.part == "merger"}
    assert linears == ours


@pytest.mark.parametrize(("name", "tokens"), [("paligemma2-3b-224.json", 256),
                                               ("paligemma2-3b-width-L1-D4-448.json", 1024)])
def test_image_tokens_by_hand(name, tokens):
    """(image_size / patch_size)² tokens per image: (224 / 14)² = 16² = 256, (448 / 14)² = 32² = 1,024; the projector
    one Linear 1152 → 2304 with bias."""
    v = resolve_model(str(FIXTURES / name)).vision
    assert v.tokens_per_image == tokens
    assert v.merger_params == 1152 * 2304 + 2304


def test_the_3b_tower_by_hand():
    """SigLIP So400m/14 at 224 px: 27 layers of width 1152 (q/k/v/out_proj 1152² + bias, fc1/fc2 1152 ↔ 4304 + bias,
    two LayerNorms), a 3·14²·1152 patch embedding with bias, 256 positions, post_layernorm; no head."""
    v = resolve_model(str(FIXTURES / "paligemma2-3b-224.json")).vision
    layer = 4 * (1152 * 1152 + 1152) + (1152 * 4304 + 4304) + (4304 * 1152 + 1152) + 4 * 1152
    assert v.tower_params == 3 * 14 * 14 * 1152 + 1152 + 256 * 1152 + 27 * layer + 2 * 1152 == 412_442_352


def test_a_projection_the_text_width_cannot_take_is_refused(tmp_path):
    cfg = json.loads((FIXTURES / "paligemma2-3b-width-L1-D4-448.json").read_text())
    cfg["projection_dim"] = 2048
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    with pytest.raises(SpecError, match="projection_dim 2048 must equal text_config.hidden_size 2304"):
        resolve_model(str(path))
