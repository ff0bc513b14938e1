"""Granite-Docling's parts as hpcmem counts them (Idefics3's tower at GraniteDoclingVisionConfig's defaults and
Granite-Docling's connector in hpcmem.models.granite_docling, the language model from the learned profile of its
Granite text config, hpcmem.models.vlm_learned) against `AutoModelForImageTextToText.from_config` on the meta device,
on the cut of estimator/cases/vlm-granite-docling.yaml; peft's all-linear targets on that model; the tiles and image
tokens a picture takes counted by transformers' GraniteDoclingProcessor."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hpcmem.estimate.vision import vision_adapters
from hpcmem.job.images import image_geometry
from hpcmem.models.resolve import resolve_model
from hpcmem.validate.cases import case_job
from tests.helpers.meta_models import meta_image_text_model, peft_all_linear_targets
from tests.helpers.vlm_cuts import assert_refused_without_text_profile

CUT = Path(__file__).resolve().parents[1] / "fixtures" / "vlm" / "granite-docling-defaults-L2-D2.json"


def _job(height: int, width: int, **extra):
    return case_job({"trainer": "sft", "model_name_or_path": str(CUT), "max_length": 4096, "images_per_example": 1,
                     "image_height": height, "image_width": width, "dtype": "bfloat16", "bf16": True, **extra})


def _vision_name(name: str) -> str | None:
    """A meta model module's name as hpcmem's TowerLinear names it: below `vision_model.`, a layer index or a deepstack
    merger index dropped."""
    if ".vision_model." not in f".{name}.":
        return None
    tail = name.rsplit("vision_model.", 1)[-1]
    parts = tail.split(".")
    if parts[0] == "encoder":
        return "encoder." + ".".join(parts[3:])
    return ".".join(p for p in parts if not p.isdigit())


def test_the_connector_by_hand():
    """modular_granite_docling.py `GraniteDoclingConnectorPath.__init__`: projection Linear(768 · 4² → 1024, no bias),
    one GraniteDoclingDeepStackMerger per tapped layer (LayerNorm(12,288), linear_1 12,288 → 1024, linear_2
    1024 → 1024); the fine path at scale 2 (768 · 2² = 3072) idle; `GraniteDoclingConnector.mlp_fc2` Linear(1024 → 1024, no bias);
    image_seq_len (512 / 16)² / 4² = 64; the head tied (GraniteDoclingConfig.tie_word_embeddings True)."""
    spec = resolve_model(str(CUT))
    v = spec.vision
    by_name = {x.name: x for x in v.linears()}
    assert (by_name["connector.coarse.projection"].in_features, by_name["connector.coarse.projection"].bias) == (
        12288, False)
    assert by_name["connector.coarse.deepstack_mergers.linear_1"].count == 2
    assert by_name["connector.fine.projection"].in_features == 3072
    assert by_name["connector.fine.projection"].part == "idle"
    assert v.tokens_per_tile == 64 and v.patches == 1024
    assert spec.tie_word_embeddings is True and spec.hidden_size == v.out_hidden_size == 1024


@pytest.mark.torch
def test_parts_and_linears_equal_the_meta_model():
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    model = meta_image_text_model(json.loads(CUT.read_text()))
    assert type(model).__name__ == "GraniteDoclingForConditionalGeneration"
    spec = resolve_model(str(CUT))
    count = {"tower": 0, "merger": 0, "idle": 0, "language": 0}
    for name, p in model.named_parameters():
        part = "idle" if ".connector.fine." in name else "merger" if ".connector." in name else \
            "tower" if ".vision_model." in name else "language"
        count[part] += p.numel()
    assert count == {"tower": spec.vision.tower_params, "merger": spec.vision.merger_params,
                     "idle": spec.vision.idle_params, "language": spec.num_params}
    theirs: dict[str, list[tuple[int, int, bool]]] = {}
    for n, m in model.named_modules():
        if isinstance(m, torch.nn.Linear) and _vision_name(n):
            theirs.setdefault(_vision_name(n), []).append((m.in_features, m.out_features, m.bias is not None))
    ours: dict[str, list[tuple[int, int, bool]]] = {}
    for x in spec.vision.linears():
        key = f"encoder.{x.name}" if x.part == "tower" else x.name
        ours.setdefault(key, []).extend([(x.in_features, x.out_features, x.bias)] * x.count)
    assert {k: sorted(v) for k, v in theirs.items()} == {k: sorted(v) for k, v in ours.items()}
    assert spec.tie_word_embeddings is (model.get_output_embeddings().weight is model.get_input_embeddings().weight)
    assert spec.learned is not None


@pytest.mark.torch
def test_peft_all_linear_reaches_what_the_spec_adapts():
    """peft's all-linear on the real model (peft/tuners/tuners_utils.py `_maybe_include_all_linear_layers`: every
    nn.Linear but the output embedding): its tower and connector targets, the idle fine path's among them, are
    hpcmem's `vision_adapters`."""
    pytest.importorskip("torch")
    pytest.importorskip("peft")

    model = meta_image_text_model(json.loads(CUT.read_text()))
    targets = peft_all_linear_targets(model)
    theirs = sorted(n for n in (_vision_name(t) for t in targets) if n)
    job = _job(448, 448, use_peft=True, lora_target_modules="all-linear")
    ours = sorted(f"encoder.{x.name}" if x.part == "tower" else x.name
                  for x in vision_adapters(job, job.model.vision) for _ in range(x.count))
    assert theirs == ours
    assert "lm_head" not in targets


@pytest.mark.torch
@pytest.mark.parametrize(("height", "width"), [(448, 448), (672, 896), (600, 1000), (100, 6400)])
def test_the_processor_counts_the_spec_s_tiles_and_tokens(height, width):
    """GraniteDoclingProcessor (hpcmem.trace.vision `processor`, transformers' own class) on one image: its <image>
    tokens, tiles (pixel_values' second axis) and the tokens around them are the spec's (GotOcr2's canvas, a
    thumbnail when split, 64 tokens a tile)."""
    pytest.importorskip("transformers")
    from PIL import Image
    from transformers.models.granite_docling.processing_granite_docling import GraniteDoclingProcessor

    from hpcmem.trace.vision import processor
    from hpcmem.trace.vision_granite_docling import IMAGE, markers

    job = _job(height, width)
    proc = processor(job)
    assert isinstance(proc, GraniteDoclingProcessor)
    out = proc(text=[IMAGE + " t3"], images=[Image.new("RGB", (width, height))], return_tensors="pt")
    g = image_geometry(job.train, job.model.vision)
    image = proc.tokenizer.convert_tokens_to_ids(IMAGE)
    tokens = int((out["input_ids"][0] == image).sum())
    assert tokens == g.tokens
    assert out["pixel_values"].shape[1] == g.grid_thw[0]
    assert out["input_ids"].shape[1] - tokens - 1 == markers(job)


def test_a_text_config_without_a_learned_profile_is_refused(tmp_path):
    assert_refused_without_text_profile(CUT, tmp_path, num_hidden_layers=3)
