"""Gemma 3's parts as hpcmem counts them (hpcmem.models.siglip: the SigLIP tower, the projector; the language model by
the gemma3_text family) against `AutoModelForImageTextToText.from_config` on the meta device: the catalog's published
configs, the cut fixtures, and transformers' own default Gemma3Config (224 px, 16 px patches, SigLIP's pooling head
loaded). The totals are the model cards' sizes (gemma-3-4b-it 4.3 B, gemma-3-12b-it 12.2 B)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hpcmem.models.resolve import catalog, resolve_model
from tests.helpers.meta_models import meta_image_text_model

pytestmark = pytest.mark.torch
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "vlm"
CASES = ["google/gemma-3-4b-it", "google/gemma-3-12b-it", "gemma3-4b-width-L2-D4.json", "gemma3-12b-width-L1-D3.json",
         "gemma3-tiny.json", "default"]


def _config(name: str) -> dict:
    if name == "default":
        return transformers.AutoConfig.for_model("gemma3").to_dict()
    return catalog()[name]["config"] if name in catalog() else json.loads((FIXTURES / name).read_text())


@pytest.mark.parametrize("name", CASES)
def test_parts_equal_the_meta_model(name, tmp_path):
    cfg = _config(name)
    model = meta_image_text_model(cfg)
    count = {"tower": 0, "projector": 0, "language": 0}
    for param_name, p in model.named_parameters():
        part = ("tower" if ".vision_tower." in f".{param_name}" else
                "projector" if ".multi_modal_projector." in f".{param_name}" else "language")
        count[part] += p.numel()
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    spec = resolve_model(name if name in catalog() else str(tmp_path / "config.json"))
    assert count == {"tower": spec.vision.tower_params, "projector": spec.vision.merger_params,
                     "language": spec.num_params}
    # the linears peft's all-linear can reach: the encoder layers' (the pooling head, loaded by the default config
    # alone and never run by Gemma 3, aside), none in the projector (its weight is an nn.Parameter)
    linear_names = {n.split("encoder.", 1)[-1] for n, m in model.named_modules()
                    if isinstance(m, torch.nn.Linear) and "vision_tower." in n and ".head." not in n}
    ours = {f"layers.{i}.{x.name}" for x in spec.vision.linears() for i in range(x.count)}
    assert linear_names == ours
    assert not any(isinstance(m, torch.nn.Linear) for m in model.model.multi_modal_projector.modules())


@pytest.mark.parametrize(("hub_id", "card"), [("google/gemma-3-4b-it", 4.3e9), ("google/gemma-3-12b-it", 12.2e9)])
def test_the_catalog_entries_have_the_model_cards_size(hub_id, card):
    spec = resolve_model(hub_id)
    total = spec.num_params + spec.vision.num_params
    assert round(total / 1e8) == round(card / 1e8), total
    assert total == sum(p.numel() for p in meta_image_text_model(catalog()[hub_id]["config"]).parameters())


@pytest.mark.parametrize("targets", ["all-linear", ["q_proj", "v_proj"]])
def test_peft_adapts_the_tower_linears_hpcmem_names(targets, tmp_path):
    """peft's own get_peft_model on the tiny Gemma 3: the tower's modules it wraps are the VisionSpec linears
    hpcmem.estimate.vision.vision_adapters picks (all-linear: every SigLIP linear; q_proj/v_proj: SigLIP's too), and
    the projector is untouched."""
    peft = pytest.importorskip("peft")
    from hpcmem.estimate.vision import vision_adapters
    from hpcmem.job.trl_config import build_job

    cfg = _config("gemma3-tiny.json")
    data = {k: v for k, v in cfg.items() if k not in ("architectures", "torch_dtype")}
    model = transformers.AutoModelForImageTextToText.from_config(
        transformers.AutoConfig.for_model(data.pop("model_type"), **data))
    wrapped = peft.get_peft_model(model, peft.LoraConfig(r=4, target_modules=targets))
    theirs = {n.split("encoder.layers.0.", 1)[-1] for n, m in wrapped.named_modules()
              if isinstance(m, peft.tuners.lora.LoraLayer) and "vision_tower" in n and "encoder.layers.0." in n}
    assert not any(isinstance(m, peft.tuners.lora.LoraLayer) for n, m in wrapped.named_modules()
                   if "multi_modal_projector" in n)
    job = build_job("sft", {"model_name_or_path": str(FIXTURES / "gemma3-tiny.json"), "use_peft": True,
                            "lora_target_modules": targets if isinstance(targets, list) else [targets]})[0]
    assert theirs == {x.name for x in vision_adapters(job, job.model.vision)}
