"""HyperCLOVAX Vision V2's parts as hpcmem counts them (Qwen2.5-VL's tower and merger at Qwen2_5_VLVisionConfig's
defaults and the projector after the merger in hpcmem.models.vision, the language model from the learned profile of
its HyperCLOVAX text config, hpcmem.models.vlm_learned) against `AutoModelForImageTextToText.from_config` on the meta
device, on the cut of estimator/cases/vlm-hyperclovax-vision-v2.yaml; peft's all-linear targets on that model; the
image tokens a picture takes counted by transformers' HyperCLOVAXVisionV2Processor (Exaone4_5_Processor's subclass)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hpcmem.estimate.vision import vision_adapters
from hpcmem.models.resolve import resolve_model
from hpcmem.validate.cases import case_job
from tests.helpers.meta_models import meta_image_text_model, peft_all_linear_targets
from tests.helpers.vlm_cuts import assert_processor_geometry, assert_refused_without_text_profile

CUT = Path(__file__).resolve().parents[1] / "fixtures" / "vlm" / "hyperclovax-vision-v2-defaults-L2-D2.json"


def _job(height: int, width: int, **extra):
    return case_job({"trainer": "sft", "model_name_or_path": str(CUT), "max_length": 4096, "images_per_example": 1,
                     "image_height": height, "image_width": width, "dtype": "bfloat16", "bf16": True, **extra})


def _vision_name(name: str) -> str | None:
    """A meta model module's name as hpcmem's VisionLinear names it: below `vision_model.`, or "projector"."""
    if name.endswith("model.projector"):
        return "projector"
    return name.rsplit("vision_model.", 1)[-1] if ".vision_model." in f".{name}." else None


def test_the_projector_and_the_ungrouped_qkv_by_hand():
    """HyperCLOVAXVisionV2Model.__init__: projector = Linear(out_hidden_size 3584, text hidden_size 4096) with bias;
    Qwen2_5_VLVisionAttention's qkv 3 · 3584 (no grouped attention, unlike EXAONE 4.5's); the head tied
    (HyperCLOVAXVisionV2Config.tie_word_embeddings True)."""
    spec = resolve_model(str(CUT))
    by_name = {x.name: x for x in spec.vision.linears()}
    assert (by_name["projector"].in_features, by_name["projector"].out_features) == (3584, 4096)
    assert by_name["attn.qkv"].out_features == 3 * 3584
    assert spec.vision.feature_width == spec.hidden_size == 4096
    assert spec.tie_word_embeddings is True


@pytest.mark.torch
def test_parts_and_linears_equal_the_meta_model():
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    model = meta_image_text_model(json.loads(CUT.read_text()))
    assert type(model).__name__ == "HyperCLOVAXVisionV2ForConditionalGeneration"
    spec = resolve_model(str(CUT))
    count = {"tower": 0, "merger": 0, "language": 0}
    for name, p in model.named_parameters():
        merger = ".vision_model.merger." in name or ".projector." in name
        count["merger" if merger else "tower" if ".vision_model." in name else "language"] += p.numel()
    assert count == {"tower": spec.vision.tower_params, "merger": spec.vision.merger_params,
                     "language": spec.num_params}
    linears = {_vision_name(n): (m.in_features, m.out_features) for n, m in model.named_modules()
               if isinstance(m, torch.nn.Linear) and _vision_name(n)}
    ours = {f"blocks.{i}.{x.name}": (x.in_features, x.out_features)
            for x in spec.vision.linears() if x.part == "tower" for i in range(x.count)}
    ours |= {(x.name if x.name == "projector" else f"merger.{x.name}"): (x.in_features, x.out_features)
             for x in spec.vision.linears() if x.part == "merger"}
    assert linears == ours
    assert spec.tie_word_embeddings is (model.get_output_embeddings().weight is model.get_input_embeddings().weight)
    assert spec.learned is not None


@pytest.mark.torch
def test_peft_all_linear_reaches_what_the_spec_adapts():
    """peft's all-linear on the real model (peft/tuners/tuners_utils.py `_maybe_include_all_linear_layers`: every
    nn.Linear but the output embedding): its tower, merger and projector targets are hpcmem's `vision_adapters`."""
    pytest.importorskip("torch")
    pytest.importorskip("peft")

    model = meta_image_text_model(json.loads(CUT.read_text()))
    targets = peft_all_linear_targets(model)
    theirs = sorted(n for n in (_vision_name(t) for t in targets) if n)
    job = _job(448, 448, use_peft=True, lora_target_modules="all-linear")
    ours = sorted(f"blocks.{i}.{x.name}" if x.part == "tower" else x.name if x.name == "projector" else
                  f"merger.{x.name}" for x in vision_adapters(job, job.model.vision) for i in range(x.count))
    assert theirs == ours
    assert "lm_head" not in targets


@pytest.mark.torch
@pytest.mark.parametrize(("height", "width"), [(448, 448), (672, 896), (600, 1000)])
def test_the_processor_counts_the_spec_s_image_tokens(height, width):
    """HyperCLOVAXVisionV2Processor (hpcmem.trace.vision `processor`, transformers' own class) on one image: its
    image_pad tokens, pixel_values rows and image_grid_thw are the spec's (smart_resize to 28 px multiples, 14 px
    patches, 2 × 2 merged into one token)."""
    assert_processor_geometry(CUT, height, width, "HyperCLOVAXVisionV2Processor", patch_columns=True)


def test_a_text_config_without_a_learned_profile_is_refused(tmp_path):
    assert_refused_without_text_profile(CUT, tmp_path, num_hidden_layers=3)
