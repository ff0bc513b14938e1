"""Muse Spark's parts as hpcmem counts them (hpcmem.models.muse_spark: Muse Glimmer's tower, vision adapter and
projection beside the idle audio tower, the language model from the learned profile of its MoE muse_spark_text
config, hpcmem.models.vlm_learned) against `AutoModelForImageTextToText.from_config` on the meta device, on the cut of
estimator/cases/vlm-muse-spark.yaml; peft's all-linear targets on that model; the image tokens a picture takes
counted by transformers' MuseSparkProcessor (around hpcmem.trace.vision_muse_glimmer's PIL stand-in)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hpcmem.errors import SpecError
from hpcmem.estimate.vision import vision_adapters
from hpcmem.models.muse_spark import muse_spark_tower_from_config
from hpcmem.models.resolve import resolve_model
from hpcmem.validate.cases import case_job
from tests.helpers.meta_models import meta_image_text_model, peft_all_linear_targets
from tests.helpers.vlm_cuts import assert_processor_geometry, assert_refused_without_text_profile

CUT = Path(__file__).resolve().parents[1] / "fixtures" / "vlm" / "muse-spark-defaults-L2-D2.json"
MERGER = (".vision_adapter.", ".vision_projection.")


def _job(height: int, width: int, **extra):
    return case_job({"trainer": "sft", "model_name_or_path": str(CUT), "max_length": 4096, "images_per_example": 1,
                     "image_height": height, "image_width": width, "dtype": "bfloat16", "bf16": True, **extra})


def _part(name: str) -> str:
    dotted = f".{name}."
    return "merger" if any(m in dotted for m in MERGER) else "tower" if ".vision_tower." in dotted else \
        "audio" if ".audio_tower." in dotted else "language"


def _vision_name(name: str) -> str | None:
    """A meta model module's name as hpcmem's TowerLinear names it: below `vision_tower.` as it is there (layers.N.…,
    patch_embedder.…), the adapter's, the projection's and the audio tower's below `model.`; None elsewhere."""
    part = _part(name)
    if part == "tower":
        return name.split("vision_tower.", 1)[1]
    return name.split("model.", 1)[1] if part in ("merger", "audio") else None


def _ours(linears) -> dict[str, tuple[int, int]]:
    return {(f"layers.{i}.{x.name}" if x.part == "tower" else x.name): (x.in_features, x.out_features)
            for x in linears for i in range(x.count if x.part == "tower" else 1)}


def test_the_default_audio_tower_by_hand():
    """MuseSparkAudioConfig's defaults: four stages of widths 256, 512, 1024, 2048 (patches 16, 6, 5, 4; two conv
    blocks each, MLP 4 × wide, depthwise kernel 7), then 2048 → 8192. Linears: the patch embeddings 16 → 256, 1536 →
    512, 2560 → 1024, 4096 → 2048, fc1/fc2 h ↔ 4h twice a stage, proj 2048 → 8192, all with biases; the rest: a
    patch-embedding RMSNorm (h) and per block the Conv1d (7h + h) and its RMSNorm (h), `norm` (2048) and
    `post_proj_norm` (8192)."""
    v = muse_spark_tower_from_config({"model_type": "muse_spark"}, "x")
    widths, patches = (256, 512, 1024, 2048), (16, 6, 5, 4)
    ins = (1, 256, 512, 1024)
    embed = sum(i * p * h + h for i, p, h in zip(ins, patches, widths, strict=True))
    mlp = sum(2 * (2 * 4 * h * h + 4 * h + h) for h in widths)
    proj = 2048 * 8192 + 8192
    other = sum(h + 2 * (7 * h + h + h) for h in widths) + 2048 + 8192
    assert v.audio_params == embed + mlp + proj + other
    assert v.out_hidden_size == 8192 and v.merger_params == 6144 * 4096 + 4096 * 4096 + 4096 * 8192


@pytest.mark.torch
def test_parts_and_linears_equal_the_meta_model():
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    model = meta_image_text_model(json.loads(CUT.read_text()))
    assert type(model).__name__ == "MuseSparkForConditionalGeneration"
    spec = resolve_model(str(CUT))
    count = {"tower": 0, "merger": 0, "audio": 0, "language": 0}
    for name, p in model.named_parameters():
        count[_part(name)] += p.numel()
    assert count == {"tower": spec.vision.tower_params, "merger": spec.vision.merger_params,
                     "audio": spec.vision.audio_params, "language": spec.num_params}
    linears = {_vision_name(n): (m.in_features, m.out_features) for n, m in model.named_modules()
               if isinstance(m, torch.nn.Linear) and _vision_name(n)}
    assert linears == _ours(spec.vision.linears())
    assert spec.tie_word_embeddings is (model.get_output_embeddings().weight is model.get_input_embeddings().weight)
    assert spec.learned is not None


@pytest.mark.torch
def test_the_head_is_never_tied():
    """MuseSparkForConditionalGeneration deletes Muse Glimmer's `_tied_weights_keys` (modular_muse_spark.py): a
    config.json's top-level tie_word_embeddings true ties nothing, and the text part is untied."""
    pytest.importorskip("torch")
    from hpcmem.models.vision import text_part

    cfg = {**json.loads(CUT.read_text()), "tie_word_embeddings": True}
    model = meta_image_text_model(cfg)
    assert model.get_output_embeddings().weight is not model.get_input_embeddings().weight
    assert text_part(cfg)["tie_word_embeddings"] is False


@pytest.mark.torch
def test_peft_all_linear_reaches_what_the_spec_adapts():
    """peft's all-linear on the real model (peft/tuners/tuners_utils.py `_maybe_include_all_linear_layers`: every
    nn.Linear but the output embedding; the experts' 3-D parameters are no nn.Linear): its tower, adapter,
    projection and audio targets are hpcmem's `vision_adapters`."""
    pytest.importorskip("torch")
    pytest.importorskip("peft")

    model = meta_image_text_model(json.loads(CUT.read_text()))
    targets = peft_all_linear_targets(model)
    job = _job(448, 448, use_peft=True, lora_target_modules="all-linear")
    theirs = {n for n in (_vision_name(t) for t in targets) if n}
    assert theirs == set(_ours(vision_adapters(job, job.model.vision)))
    assert "lm_head" not in targets and not any("experts" in t for t in targets)


@pytest.mark.torch
@pytest.mark.parametrize(("height", "width"), [(448, 448), (672, 896), (500, 333)])
def test_the_processor_counts_the_spec_s_image_tokens(height, width):
    """MuseSparkProcessor (hpcmem.trace.vision `processor`, transformers' own class around Muse Glimmer's PIL
    stand-in) on one image: its <|patch|> tokens, pixel_values [patches, 2 · 3 · 14²] and grid are the spec's."""
    proc = assert_processor_geometry(CUT, height, width, "MuseSparkProcessor", patch_columns=True)
    assert proc.audio_token_id not in (proc.image_token_id, proc.video_token_id)


def test_an_audio_width_other_than_the_text_s_is_refused():
    cfg = json.loads(CUT.read_text())
    cfg["audio_config"] = {"out_hidden_size": 4096}
    with pytest.raises(SpecError, match="audio_config.out_hidden_size 4096"):
        muse_spark_tower_from_config(cfg, "cut")


def test_a_text_config_without_a_learned_profile_is_refused(tmp_path):
    assert_refused_without_text_profile(CUT, tmp_path, num_hidden_layers=3)


@pytest.mark.torch
def test_the_learned_text_head_runs_the_experts_as_the_image_text_model_does():
    """hpcmem.trace.text_heads' MuseSparkTextForCausalLM (what `hpcmem models learn` traces) keeps transformers'
    grouped_mm experts, as MuseSparkForConditionalGeneration does (modeling_utils.py
    `get_correct_experts_implementation` falls back to the eager loop for a class whose module lacks
    "@use_experts_implementation")."""
    torch = pytest.importorskip("torch")
    from transformers import AutoConfig, AutoModelForCausalLM

    from hpcmem.models.vision import text_part
    from hpcmem.trace import text_heads

    text_heads.register()
    text = dict(text_part(json.loads(CUT.read_text())))
    config = AutoConfig.for_model(text.pop("model_type"), **text)
    with torch.device("meta"):
        head = AutoModelForCausalLM.from_config(config)
    assert type(head).__name__ == "MuseSparkTextForCausalLM"
    assert head.config._experts_implementation == "grouped_mm"
    model = meta_image_text_model(json.loads(CUT.read_text()))
    assert model.config.text_config._experts_implementation == "grouped_mm"
