"""Qwen3-Omni thinker's parts as hpcmem counts them (hpcmem.models.vision with hpcmem.models.qwen3_omni_audio: Qwen3-VL's tower, merger and
deepstack mergers, the idle audio encoder, a Qwen3-MoE text part) against `AutoModelForImageTextToText.from_config`
on the meta device, on the cut of estimator/cases/vlm-qwen3-omni.yaml; what peft does with the cases' named targets
and with all-linear on that model; the image tokens a picture takes counted by transformers' Qwen3OmniMoeProcessor."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from hpcmem.errors import SpecError
from hpcmem.estimate.vision import vision_adapters
from hpcmem.models.qwen3_omni_audio import audio_spec_from_config
from hpcmem.models.resolve import resolve_model
from hpcmem.validate.cases import case_job
from tests.helpers.meta_models import meta_image_text_model
from tests.helpers.vlm_cuts import assert_processor_geometry

ROOT = Path(__file__).resolve().parents[2]
CUT = ROOT / "tests" / "fixtures" / "vlm" / "qwen3-omni-30b-thinker-width-L2-D2.json"
# the LoRA cases' targets (estimator/cases/vlm-qwen3-omni.yaml): every nn.Linear leaf but the head, named
TARGETS = next(c["lora_target_modules"] for c in yaml.safe_load(
    (ROOT / "estimator" / "cases" / "vlm-qwen3-omni.yaml").read_text())["cases"] if c.get("use_peft"))


def _job(**extra):
    return case_job({"trainer": "sft", "model_name_or_path": str(CUT), "max_length": 1536, "images_per_example": 1,
                     "image_height": 448, "image_width": 448, "dtype": "bfloat16", "bf16": True, **extra})


def _part(name: str) -> str:
    """A meta model parameter's or module's part: the deepstack mergers (`visual.merger_list.`), the merger
    (`visual.merger.`), the rest of the tower (`visual.`), the audio encoder (`audio_tower.`), the language model."""
    for key, part in ((".visual.merger_list.", "deepstack"), (".visual.merger.", "merger"), (".visual.", "tower"),
                      (".audio_tower.", "audio")):
        if key in f".{name}":
            return part
    return "language"


def test_the_audio_encoder_by_hand():
    """Qwen3OmniMoeAudioEncoderConfig's defaults: 32 layers of d_model 1280 (ffn 5120), 480 conv channels over 128 mel
    bins (⌈⌈⌈128/2⌉/2⌉/2⌉ = 16, so conv_out 7680 → 1280), proj2 1280 → 3584. Per layer: q/k/v/out_proj 4 ·
    (1280² + 1280), fc1 1280 · 5120 + 5120, fc2 5120 · 1280 + 1280, two LayerNorms 4 · 1280; then ln_post 2 · 1280,
    conv2d1 480 · 9 + 480, conv2d2 and conv2d3 480² · 9 + 480 each, conv_out 7680 · 1280, proj1 1280² + 1280, proj2
    1280 · 3584 + 3584."""
    a = audio_spec_from_config({}, "x")
    layer = 4 * (1280 ** 2 + 1280) + (1280 * 5120 + 5120) + (5120 * 1280 + 1280) + 4 * 1280
    rest = 2 * 1280 + (480 * 9 + 480) + 2 * (480 ** 2 * 9 + 480) + 7680 * 1280 + (1280 ** 2 + 1280) + \
        (1280 * 3584 + 3584)
    assert a.conv_frequencies == 16
    assert a.params == 32 * layer + rest
    assert a.buffer_values == 1500 * 1280


def test_an_audio_config_that_is_not_an_object_is_refused():
    with pytest.raises(SpecError, match="audio_config must be an object"):
        audio_spec_from_config({"audio_config": [1]}, "x")


def test_the_token_ids_are_the_released_thinker_config_s():
    """Qwen/Qwen3-Omni-30B-A3B-Instruct config.json `thinker_config`: vision_start 151652, vision_end 151653,
    image 151655, video 151656, audio 151675, audio_start 151669, audio_end 151670 (Qwen3OmniMoeThinkerConfig
    declares no vision_start_token_id, which get_rope_index reads; its audio ids' defaults differ)."""
    cfg = json.loads(CUT.read_text())
    assert {k: cfg[k] for k in cfg if k.endswith("_token_id") and k != "user_token_id"} == {
        "vision_start_token_id": 151652, "vision_end_token_id": 151653, "image_token_id": 151655,
        "video_token_id": 151656, "audio_token_id": 151675, "audio_start_token_id": 151669,
        "audio_end_token_id": 151670}


@pytest.mark.torch
def test_parts_buffers_and_linears_equal_the_meta_model():
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    model = meta_image_text_model(json.loads(CUT.read_text()))
    assert type(model).__name__ == "Qwen3OmniMoeThinkerForConditionalGeneration"
    spec = resolve_model(str(CUT))
    v = spec.vision
    count = {"tower": 0, "merger": 0, "deepstack": 0, "audio": 0, "language": 0}
    for name, p in model.named_parameters():
        count[_part(name)] += p.numel()
    assert count == {"tower": v.tower_params, "merger": v.merger_params, "deepstack": v.deepstack_params,
                     "audio": v.idle_params, "language": spec.num_params}
    table = dict(model.named_buffers())["model.audio_tower.positional_embedding.positional_embedding"]
    assert (table.numel(), table.dtype) == (v.audio.buffer_values, torch.float32)
    linears = {}
    for name, m in model.named_modules():
        if isinstance(m, torch.nn.Linear) and _part(name) != "language":
            linears.setdefault(_part(name), set()).add((name.rsplit(".", 1)[-1] if _part(name) != "merger"
                                                        else name.split("merger.", 1)[1], m.in_features,
                                                        m.out_features))
    ours = {}
    for x in v.linears():
        ours.setdefault("tower" if x.part == "tower" else x.part, set()).add(
            (x.name.rsplit(".", 1)[-1] if x.part != "merger" else x.name, x.in_features, x.out_features))
    assert linears == ours
    assert not spec.tie_word_embeddings and model.lm_head.weight is not model.get_input_embeddings().weight


@pytest.mark.torch
def test_peft_wraps_the_linears_the_named_targets_reach_in_each_part():
    """get_peft_model with the cases' targets (TRL hands a list on as a set): the adapters peft makes in the tower,
    the mergers and the audio encoder are hpcmem's `vision_adapters`, r · (in + out) each; the text part's are the
    decoder's q/k/v/o_proj (557,056 at r = 16 by hand: 2 layers · 16 · ((2048 + 4096) · 2 + (2048 + 512) · 2))."""
    pytest.importorskip("torch")
    pytest.importorskip("peft")
    from peft import LoraConfig, get_peft_model

    model = get_peft_model(meta_image_text_model(json.loads(CUT.read_text())),
                           LoraConfig(r=16, target_modules=list(TARGETS)))
    theirs = {"tower": 0, "merger": 0, "deepstack": 0, "audio": 0, "language": 0}
    for name, p in model.named_parameters():
        if "lora_" in name:
            theirs[_part(name)] += p.numel()
    job = _job(use_peft=True, lora_target_modules=TARGETS)
    ours = {"tower": 0, "merger": 0, "deepstack": 0, "audio": 0}
    for x in vision_adapters(job, job.model.vision):
        ours[x.part] += 16 * (x.in_features + x.out_features) * x.count
    assert theirs == {**ours, "language": 2 * 16 * ((2048 + 4096) * 2 + (2048 + 512) * 2)}
    assert ours["audio"] > 0 and ours["merger"] > 0


@pytest.mark.torch
def test_peft_all_linear_raises_and_so_does_hpcmem():
    """peft 0.21.2's MoE conversion of qwen3_omni_moe_thinker resolves all-linear to leaf names, among them the
    mergers' "0" and "2", which end layer paths too: get_peft_model raises (as TRL's SFTTrainer calls it)."""
    pytest.importorskip("torch")
    pytest.importorskip("peft")
    from peft import LoraConfig, get_peft_model

    with pytest.raises(ValueError, match="is not supported"):
        get_peft_model(meta_image_text_model(json.loads(CUT.read_text())),
                       LoraConfig(r=16, target_modules="all-linear", lora_dropout=0.0))
    with pytest.raises(SpecError, match="'0' \\(of mlp.0\\).*Target module … is not supported"):
        _job(use_peft=True, lora_target_modules="all-linear", lora_dropout=0.0)


@pytest.mark.torch
@pytest.mark.parametrize(("height", "width"), [(448, 448), (896, 896), (300, 500), (1000, 700), (100, 120)])
def test_the_processor_counts_the_spec_s_image_tokens(height, width):
    """Qwen3OmniMoeProcessor (hpcmem.trace.vision `processor`, transformers' own class around
    Qwen2VLImageProcessorPil): its image_pad tokens, pixel_values rows and image_grid_thw are the spec's (smart_resize
    to 32 px multiples, 16 px patches, 2 × 2 merged into one token)."""
    assert_processor_geometry(CUT, height, width, "Qwen3OmniMoeProcessor", patch_columns=True)
