"""Idefics2's parts as hpcmem counts them (hpcmem.models.idefics2, the language model by the mistral family) against
`AutoModelForImageTextToText.from_config` on the meta device: a cut config at SigLIP So400m/14 and Mistral-7B widths,
and the config classes' defaults; the connector, the resize and the image tokens by hand."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hpcmem.errors import SpecError
from hpcmem.models.idefics2 import idefics2_resize
from hpcmem.models.resolve import resolve_model
from tests.helpers.meta_models import meta_image_text_model, meta_part_counts

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "vlm"
CUT = FIXTURES / "idefics2-8b-width-L1-D2.json"


def _defaults_config(tmp_path: Path) -> Path:
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"model_type": "idefics2", "text_config": {"num_hidden_layers": 1},
                                "vision_config": {"num_hidden_layers": 1}}))
    return path


@pytest.mark.torch
@pytest.mark.parametrize("which", ["cut", "defaults"])
def test_parts_equal_the_meta_model(which, tmp_path):
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    path = CUT if which == "cut" else _defaults_config(tmp_path)
    model = meta_image_text_model(json.loads(path.read_text()))
    assert type(model).__name__ == "Idefics2ForConditionalGeneration"
    count = meta_part_counts(model, tower=".vision_model.", merger=".connector.")
    spec = resolve_model(str(path))
    assert count == {"tower": spec.vision.tower_params, "merger": spec.vision.merger_params,
                     "language": spec.num_params}
    linears = {n.split("model.", 1)[1] for n, m in model.named_modules()
               if isinstance(m, torch.nn.Linear) and (".vision_model." in n or ".connector." in n)}
    ours = {f"vision_model.encoder.layers.{i}.{x.name}" for x in spec.vision.linears()
            if x.part == "tower" for i in range(x.count)}
    for x in (x for x in spec.vision.linears() if x.part == "merger"):
        head, _, tail = x.name.partition("layers.")
        ours |= {f"connector.{head}layers.{i}.{tail}" for i in range(x.count)} if tail else {f"connector.{x.name}"}
    assert linears == ours


def test_the_connector_by_hand():
    """modality_projection: gate/up 1152 → 14336 and down 14336 → 4096, no biases; the perceiver: 64 latents of 4096,
    3 layers of q 4096 → 16·96, k/v 4096 → 4·96, o 16·96 → 4096, a gated MLP 4096 ↔ 16384, three RMSNorms, and a
    final RMSNorm."""
    v = resolve_model(str(CUT)).vision
    projection = 2 * 1152 * 14336 + 14336 * 4096
    layer = 4096 * 1536 + 2 * 4096 * 384 + 1536 * 4096 + 3 * 4096 * 16384 + 3 * 4096
    assert v.merger_params == projection + 64 * 4096 + 3 * layer + 4096 == 743_219_200
    assert v.tokens_per_image == 64


@pytest.mark.parametrize(("size", "resized"), [((480, 640), (480, 640)), ((200, 300), (378, 378)),
                                               ((1200, 1600), (735, 980)), ((2000, 500), (980, 378))])
def test_resize_by_hand(size, resized):
    """longest side ≤ 980 (the other by int() of the aspect ratio), each side ≥ 378: 1600 → 980 and 1200 → int(980 ·
    0.75) = 735; 2000×500 → 980×245 → 980×378."""
    assert idefics2_resize(*size) == resized


def test_a_kv_head_count_the_heads_cannot_share_is_refused(tmp_path):
    cfg = json.loads(CUT.read_text())
    cfg["perceiver_config"]["num_key_value_heads"] = 3
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    with pytest.raises(SpecError, match="resampler_n_heads 16 is not a multiple of num_key_value_heads 3"):
        resolve_model(str(path))
