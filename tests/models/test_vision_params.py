"""Qwen2.5-VL's, Qwen2-VL's and Qwen3-VL's parts as hpcmem counts them (hpcmem.models.vision, the language model by
the qwen2 / qwen3 family) against `AutoModelForImageTextToText.from_config` on the meta device: the published 7B configs (fixtures and
the catalog's vision-language entries) and cut ones."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hpcmem.models.resolve import catalog, catalog_ids, resolve_model
from tests.helpers.meta_models import meta_image_text_model

pytestmark = pytest.mark.torch
FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "vlm"


# Gemma 3's tower: tests/models/test_siglip_params.py; llava's CLIP tower and projector: test_clip_tower_params.py
VLM_CATALOG = [hub_id for hub_id in catalog_ids() if resolve_model(hub_id).vision is not None
               and getattr(resolve_model(hub_id).vision, "family", "") == "qwen"]


def _config(name: str) -> dict:
    return catalog()[name]["config"] if name in VLM_CATALOG else json.loads((FIXTURES / name).read_text())


@pytest.mark.parametrize("name", ["Qwen2.5-VL-7B-Instruct.json", "qwen2_5_vl-7b-width-L1-D4.json",
                                  "Qwen2-VL-7B-Instruct.json", "qwen2_vl-7b-width-L1-D4.json",
                                  "Qwen3-VL-8B-Instruct.json", "qwen3_vl-8b-width-L3-D4.json", *VLM_CATALOG])
def test_parts_equal_the_meta_model(name):
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    cfg = _config(name)
    model = meta_image_text_model(cfg)
    count = {"tower": 0, "merger": 0, "deepstack": 0, "language": 0}
    for param_name, p in model.named_parameters():
        part = ("merger" if ".visual.merger." in param_name else
                "deepstack" if ".visual.deepstack_merger_list." in param_name else
                "tower" if ".visual." in param_name else "language")
        count[part] += p.numel()
    spec = resolve_model(name if name in VLM_CATALOG else str(FIXTURES / name))
    assert count == {"tower": spec.vision.tower_params, "merger": spec.vision.merger_params,
                     "deepstack": spec.vision.deepstack_params, "language": spec.num_params}
    linear_names = {n.rsplit("visual.", 1)[-1] for n, m in model.named_modules()
                    if isinstance(m, torch.nn.Linear) and ".visual." in f".{n}."}
    ours = {f"blocks.{i}.{x.name}" for x in spec.vision.linears() if x.part == "tower" for i in range(x.count)}
    ours |= {f"merger.{x.name}" for x in spec.vision.linears() if x.part == "merger"}
    ours |= {f"deepstack_merger_list.{i}.{x.name}" for x in spec.vision.linears() if x.part == "deepstack"
             for i in range(x.count)}
    assert linear_names == ours
