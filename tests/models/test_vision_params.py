"""Qwen2.5-VL's, Qwen2-VL's, Qwen3-VL's and Qwen3-VL-MoE's parts as hpcmem counts them (hpcmem.models.vision, the
language model by the qwen2 / qwen3 / qwen3_moe family) against `AutoModelForImageTextToText.from_config` on the meta device: the published 7B configs (fixtures and
the catalog's vision-language entries) and cut ones."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hpcmem.models.config import model_spec_from_config
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
                                  "Qwen3-VL-8B-Instruct.json", "qwen3_vl-8b-width-L3-D4.json",
                                  "Qwen3-VL-30B-A3B-Instruct.json", "qwen3_vl_moe-30b-width-L2-D4.json",
                                  "qwen3_vl_moe-tiny.json", *VLM_CATALOG])
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


def test_qwen3_vl_moe_text_defaults_equal_the_meta_model():
    """A Qwen3-VL-MoE config whose text_config names one key: the rest are Qwen3VLMoeTextConfig's defaults (60
    experts of 1408, top 4, 16 heads), counted as the class builds them, the head untied by the outer config."""
    pytest.importorskip("transformers")
    cfg = {**json.loads((FIXTURES / "qwen3_vl_moe-tiny.json").read_text()), "text_config": {"num_hidden_layers": 1}}
    model = meta_image_text_model(cfg)
    language = sum(p.numel() for n, p in model.named_parameters() if ".visual." not in n)
    assert language == model_spec_from_config(cfg, "defaults").num_params
