"""Qwen2.5-Omni's thinker as hpcmem counts it (Qwen2.5-VL's tower and merger with three q/k/v Linears, the idle audio
tower and Qwen2's decoder at Qwen2_5OmniTextConfig's defaults: hpcmem.models.vision, hpcmem.models.qwen2_5_omni)
against `AutoModelForImageTextToText.from_config` on the meta device, on the cut of
estimator/cases/vlm-qwen2-5-omni-thinker.yaml; peft's all-linear targets on that model, audio tower included; the
image tokens a picture takes counted by transformers' Qwen2_5OmniProcessor."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hpcmem.errors import SpecError
from hpcmem.estimate.vision import vision_adapters
from hpcmem.models.resolve import resolve_model
from hpcmem.validate.cases import case_job
from tests.helpers.meta_models import meta_image_text_model, peft_all_linear_targets
from tests.helpers.vlm_cuts import assert_processor_geometry

CUT = Path(__file__).resolve().parents[1] / "fixtures" / "vlm" / "qwen2_5_omni_thinker-defaults-L2-D2.json"


def _job(**extra):
    return case_job({"trainer": "sft", "model_name_or_path": str(CUT), "max_length": 4096, "images_per_example": 1,
                     "image_height": 448, "image_width": 448, "dtype": "bfloat16", "bf16": True, **extra})


def _name(name: str) -> str | None:
    """A meta model module's name as hpcmem names it: "visual.<below the tower>", "audio.<below the audio tower>"."""
    for outer, short in ((".visual.", "visual."), (".audio_tower.", "audio.")):
        if outer in f".{name}.":
            return short + name.split(outer.strip("."), 1)[1].lstrip(".")
    return None


def _ours(linears) -> set[str]:
    """hpcmem's vision linears as module names below the tower they sit in."""
    names = set()
    for x in linears:
        if x.part == "tower":
            names |= {f"visual.blocks.{i}.{x.name}" for i in range(x.count)}
        elif x.part == "merger":
            names.add(f"visual.merger.{x.name}")
        elif x.name == "proj":
            names.add("audio.proj")
        else:
            names |= {f"audio.layers.{i}.{x.name}" for i in range(x.count)}
    return names


def test_the_audio_tower_and_the_split_qkv_by_hand():
    """Qwen2_5OmniAudioEncoder at the cut's 2 layers of d_model 1280, FFN 5120, 128 mel bins, output 3584:
    conv1 128·1280·3 + 1280, conv2 1280·1280·3 + 1280, audio_bos_eos_token 2·3584, per layer q/v/out_proj
    1280² + 1280 each, k_proj 1280² (no bias), two LayerNorms 2·2·1280, fc1 1280·5120 + 5120, fc2 5120·1280 + 1280,
    ln_post 2·1280, proj 1280·3584 + 3584; its fp32 sinusoid buffer 1500·1280·4 bytes. The vision attention's
    q, k, v three 3584 → 3584 Linears; the head untied (the thinker config's tie_word_embeddings, False)."""
    spec = resolve_model(str(CUT))
    d, f = 1280, 5120
    layer = 3 * (d * d + d) + d * d + 2 * 2 * d + (d * f + f) + (f * d + d)
    audio = (128 * d * 3 + d) + (d * d * 3 + d) + 2 * 3584 + 2 * layer + 2 * d + (d * 3584 + 3584)
    assert spec.vision.idle_params == audio == 49_362_432
    assert spec.vision.audio.buffer_bytes == 1500 * 1280 * 4
    by_name = {x.name: x for x in spec.vision.linears() if x.part == "tower"}
    assert "attn.qkv" not in by_name
    assert [(by_name[f"attn.{x}"].in_features, by_name[f"attn.{x}"].out_features) for x in "qkv"] == [(3584, 3584)] * 3
    assert spec.tie_word_embeddings is False


@pytest.mark.torch
def test_parts_and_linears_equal_the_meta_model():
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    model = meta_image_text_model(json.loads(CUT.read_text()))
    assert type(model).__name__ == "Qwen2_5OmniThinkerForConditionalGeneration"
    spec = resolve_model(str(CUT))
    count = {"tower": 0, "merger": 0, "audio": 0, "language": 0}
    for name, p in model.named_parameters():
        part = "merger" if ".visual.merger." in name else "tower" if ".visual." in name else \
            "audio" if ".audio_tower." in name else "language"
        count[part] += p.numel()
    assert count == {"tower": spec.vision.tower_params, "merger": spec.vision.merger_params,
                     "audio": spec.vision.idle_params, "language": spec.num_params}
    assert spec.vision.num_params == count["tower"] + count["merger"] + count["audio"]
    linears = {_name(n) for n, m in model.named_modules() if isinstance(m, torch.nn.Linear) and _name(n)}
    assert linears == _ours(spec.vision.linears())
    assert spec.tie_word_embeddings is (model.get_output_embeddings().weight is model.get_input_embeddings().weight)
    buffers = dict(model.named_buffers())
    sinusoids = buffers["model.audio_tower.positional_embedding.positional_embedding"]
    assert sinusoids.numel() * sinusoids.element_size() == spec.vision.audio.buffer_bytes
    assert spec.learned is None      # Qwen2's decoder, derived, as Qwen2.5-VL's


@pytest.mark.torch
def test_peft_all_linear_reaches_what_the_spec_adapts():
    """peft's all-linear on the real model (peft/tuners/tuners_utils.py `_maybe_include_all_linear_layers`: every
    nn.Linear but the output embedding): its vision and audio targets are hpcmem's `vision_adapters`, the audio
    tower's q/k/v/out_proj, fc1, fc2 and proj among them."""
    pytest.importorskip("torch")
    pytest.importorskip("peft")

    model = meta_image_text_model(json.loads(CUT.read_text()))
    targets = peft_all_linear_targets(model)
    theirs = {n for n in (_name(t) for t in targets) if n}
    job = _job(use_peft=True, lora_target_modules="all-linear")
    assert theirs == _ours(vision_adapters(job, job.model.vision))
    assert {n for n in theirs if n.startswith("audio.")} == {
        *(f"audio.layers.{i}.{x}" for i in range(2) for x in ("self_attn.q_proj", "self_attn.k_proj",
                                                               "self_attn.v_proj", "self_attn.out_proj", "fc1", "fc2")),
        "audio.proj"}
    assert "lm_head" not in targets


@pytest.mark.torch
@pytest.mark.parametrize(("height", "width"), [(448, 448), (672, 896), (600, 1000)])
def test_the_processor_counts_the_spec_s_image_tokens(height, width):
    """Qwen2_5OmniProcessor (hpcmem.trace.vision `processor`, transformers' own class with its real feature extractor
    and a stand-in video processor) on one image: its <|IMAGE|> tokens, pixel_values rows and image_grid_thw are the
    spec's (smart_resize to 28 px multiples, 14 px patches, 2 × 2 merged into one token)."""
    assert_processor_geometry(CUT, height, width, "Qwen2_5OmniProcessor", patch_columns=True)


def test_a_bad_audio_config_is_refused(tmp_path):
    cfg = json.loads(CUT.read_text())
    cfg["audio_config"]["encoder_attention_heads"] = 7
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(SpecError, match="audio_config.d_model 1280 must be divisible by encoder_attention_heads 7"):
        resolve_model(str(tmp_path / "config.json"))
