"""Aria's parts as hpcmem counts them (Idefics3's tower and Aria's projector in hpcmem.models.aria, the language model
from the learned profile of its aria_text config, hpcmem.models.vlm_learned) against
`AutoModelForImageTextToText.from_config` on the meta device, on the cut of estimator/cases/vlm-aria.yaml; peft's
all-linear targets on that model; the image tokens and pixel shapes a picture takes counted by transformers'
AriaProcessor."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hpcmem.estimate.vision import vision_adapters
from hpcmem.job.images import image_geometry
from hpcmem.models.resolve import resolve_model
from hpcmem.validate.cases import case_job
from tests.helpers.meta_models import meta_image_text_model, meta_part_counts, peft_all_linear_targets
from tests.helpers.vlm_cuts import assert_refused_without_text_profile

CUT = Path(__file__).resolve().parents[1] / "fixtures" / "vlm" / "aria-defaults-L2-D2.json"


def _job(height: int, width: int, **extra):
    return case_job({"trainer": "sft", "model_name_or_path": str(CUT), "max_length": 4096, "images_per_example": 1,
                     "image_height": height, "image_width": width, "dtype": "bfloat16", "bf16": True, **extra})


def _vision_name(name: str) -> str | None:
    """A meta model module's name as hpcmem's TowerLinear names it: below `vision_tower.` (a layer index dropped) or
    from `multi_modal_projector.` on."""
    if ".vision_tower." in f".{name}.":
        parts = name.rsplit("vision_tower.", 1)[-1].split(".")
        return "encoder." + ".".join(parts[3:]) if parts[0] == "encoder" else ".".join(parts)
    if "multi_modal_projector." in name:
        return "multi_modal_projector." + name.rsplit("multi_modal_projector.", 1)[-1]
    return None


def test_the_projector_by_hand():
    """modular_aria.py `AriaProjector.__init__`: query [256, 1152] (the largest of projector_patch_to_query_dict's
    values), AriaCrossAttention's q/k/v_proj (no bias), MultiheadAttention's out_proj and `linear` (bias),
    AriaProjectorMLP linear_in 1152 → 4096 and linear_out 4096 → 4096 (no bias); 980 px images of 14 px patches:
    4,900 patches, 256 queries; the head untied (AriaConfig.tie_word_embeddings False)."""
    spec = resolve_model(str(CUT))
    v = spec.vision
    by_name = {x.name: x for x in v.linears()}
    assert (by_name["multi_modal_projector.feed_forward.linear_in"].out_features,
            by_name["multi_modal_projector.feed_forward.linear_in"].bias) == (4096, False)
    assert by_name["multi_modal_projector.cross_attn.multihead_attn.out_proj"].bias is True
    assert v.patches == 4900 and v.tokens_per_tile == 256 and v.max_queries == 256
    assert spec.tie_word_embeddings is False and spec.hidden_size == v.out_hidden_size == 4096


@pytest.mark.torch
def test_parts_and_linears_equal_the_meta_model():
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    model = meta_image_text_model(json.loads(CUT.read_text()))
    assert type(model).__name__ == "AriaForConditionalGeneration"
    spec = resolve_model(str(CUT))
    count = meta_part_counts(model, tower=".vision_tower.", merger="multi_modal_projector.")
    assert count == {"tower": spec.vision.tower_params, "merger": spec.vision.merger_params,
                     "language": spec.num_params}
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
    nn.Linear but the output embedding, by its last name): its tower and projector targets are hpcmem's
    `vision_adapters`."""
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
@pytest.mark.parametrize(("height", "width"), [(448, 448), (672, 896), (600, 1000), (100, 6400), (1200, 300)])
def test_the_processor_counts_the_spec_s_tokens_and_pixels(height, width):
    """AriaProcessor (hpcmem.trace.vision `processor`, transformers' own class) on one image: its <|img|> tokens are
    the spec's (256 at 980), nothing around them, pixel_values one 980 × 980 square, pixel_mask's real rows and
    columns the spec's resize."""
    pytest.importorskip("transformers")
    from PIL import Image
    from transformers.models.aria.processing_aria import AriaProcessor

    from hpcmem.trace.vision import processor
    from hpcmem.trace.vision_aria import IMAGE, MARKERS_PER_IMAGE

    job = _job(height, width)
    proc = processor(job)
    assert isinstance(proc, AriaProcessor)
    out = proc(text=[IMAGE + " t3"], images=[Image.new("RGB", (width, height))], return_tensors="pt")
    g = image_geometry(job.train, job.model.vision)
    image = proc.tokenizer.convert_tokens_to_ids(IMAGE)
    tokens = int((out["input_ids"][0] == image).sum())
    assert tokens == g.tokens == 256
    assert out["input_ids"].shape[1] - tokens - 1 == MARKERS_PER_IMAGE
    assert tuple(out["pixel_values"].shape) == (1, 3, 980, 980)
    mask = out["pixel_mask"][0]
    assert (int(mask.any(1).sum()), int(mask.any(0).sum())) == g.resized


def test_a_text_config_without_a_learned_profile_is_refused(tmp_path):
    assert_refused_without_text_profile(CUT, tmp_path, num_hidden_layers=3)
