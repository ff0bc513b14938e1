"""dots3 Note's parts as hpcmem counts them (hpcmem.models.dots3_note: the tower and Qwen2-VL's merger beside the idle
audio encoder, the language model from the learned profile of its dots3_note_text config, hpcmem.models.vlm_learned)
against `AutoModelForImageTextToText.from_config` on the meta device, on the cut of estimator/cases/vlm-dots3-note.yaml;
peft's all-linear targets on that model; the image tokens a picture takes counted by transformers' Dots3NoteProcessor
(around Qwen2-VL's PIL image processor at temporal_patch_size 1)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hpcmem.errors import SpecError
from hpcmem.estimate.vision import vision_adapters
from hpcmem.job.images import image_geometry
from hpcmem.models.dots3_note import dots3_note_tower_from_config
from hpcmem.models.resolve import resolve_model
from hpcmem.validate.cases import case_job
from tests.helpers.meta_models import meta_image_text_model, peft_all_linear_targets
from tests.helpers.vlm_cuts import assert_processor_geometry, assert_refused_without_text_profile

CUT = Path(__file__).resolve().parents[1] / "fixtures" / "vlm" / "dots3_note-defaults-L2-D2.json"


def _job(height: int, width: int, **extra):
    return case_job({"trainer": "sft", "model_name_or_path": str(CUT), "max_length": 1024, "images_per_example": 1,
                     "image_height": height, "image_width": width, "dtype": "bfloat16", "bf16": True, **extra})


def _part(name: str) -> str:
    dotted = f".{name}."
    return "merger" if ".vision_tower.merger." in dotted else "tower" if ".vision_tower." in dotted else \
        "audio" if ".audio_tower." in dotted else "language"


def _vision_name(name: str) -> str | None:
    """A meta model module's name as hpcmem names it: below `vision_tower.` for the tower and merger (blocks.N.…,
    merger.…), below `model.` for the audio tower; None elsewhere."""
    part = _part(name)
    if part in ("tower", "merger"):
        return name.split("vision_tower.", 1)[1]
    return name.split("model.", 1)[1] if part == "audio" else None


def _ours(linears) -> dict[str, tuple[int, int]]:
    out = {}
    for x in linears:
        for i in range(x.count):
            name = f"blocks.{i}.{x.name}" if x.part == "tower" else f"merger.{x.name}" if x.part == "merger" else \
                x.name.replace("layers.N", f"layers.{i}")
            out[name] = (x.in_features, x.out_features)
    return out


def test_the_default_tower_by_hand():
    """Dots3NoteVisionConfig's defaults, 42 dense layers assumed (the released pyramid's routed layers refused, below):
    per block norm1, norm2 (1536 each), qkv 1536 → 4608 and proj 1536 → 1536 without bias, q_norm and k_norm (64 each),
    gate/up 1536 → 4224 and down 4224 → 1536 without bias; the Conv2d 3 · 14² → 1536 with bias and its RMSNorm; the
    final RMSNorm; the merger's LayerNorm (2 · 1536), 6144 → 6144 and 6144 → 5120 with biases."""
    v = dots3_note_tower_from_config({"model_type": "dots3_note", "vision_config": {"mlp_layer_types": ["dense"] * 42}},
                                     "x")
    h, i = 1536, 4224
    block = 2 * h + 3 * h * h + h * h + 2 * 64 + 3 * h * i
    assert v.tower_params == 588 * h + h + h + 42 * block + h
    assert v.merger_params == 2 * h + 6144 * 6144 + 6144 + 6144 * 5120 + 5120
    assert (v.patch_dim, v.out_hidden_size, v.temporal_patch_size) == (588, 5120, 1)


def test_the_default_audio_encoder_by_hand():
    """Dots3NoteAudioConfig's defaults: 32 layers of width 1280, MLP 5120 (gate_up 1280 → 10240), q/v/o with bias and
    k without, two RMSNorms; the conv stem's Conv2d 1 → 480, 480 → 480 twice (3 × 3, bias) and conv_out 480 · 16 →
    1280 without bias; layer_norm (1280); the adapter's LayerNorm (2 · 1280), fc1 1280 → 5120 and fc2 5120 → 5120."""
    a = dots3_note_tower_from_config({"model_type": "dots3_note", "vision_config": {"mlp_layer_types": ["dense"] * 42}},
                                     "x").audio
    h = 1280
    layer = 3 * (h * h + h) + h * h + (h * 10240 + 10240) + (5120 * h + h) + 2 * h
    stem = (9 * 480 + 480) + 2 * (9 * 480 * 480 + 480) + 7680 * h
    assert a.params == 32 * layer + stem + h + 2 * h + (h * 5120 + 5120) + (5120 * 5120 + 5120)


@pytest.mark.torch
def test_parts_and_linears_equal_the_meta_model():
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    model = meta_image_text_model(json.loads(CUT.read_text()))
    assert type(model).__name__ == "Dots3NoteForConditionalGeneration"
    spec = resolve_model(str(CUT))
    count = {"tower": 0, "merger": 0, "audio": 0, "language": 0}
    for name, p in model.named_parameters():
        count[_part(name)] += p.numel()
    assert count == {"tower": spec.vision.tower_params, "merger": spec.vision.merger_params,
                     "audio": spec.vision.idle_params, "language": spec.num_params}
    linears = {_vision_name(n): (m.in_features, m.out_features) for n, m in model.named_modules()
               if isinstance(m, torch.nn.Linear) and _vision_name(n)}
    assert linears == _ours(spec.vision.linears())
    assert spec.tie_word_embeddings is (model.get_output_embeddings().weight is model.get_input_embeddings().weight)
    assert spec.learned is not None
    buffers = {n: b for n, b in model.model.audio_tower.named_buffers()}
    assert sum(b.numel() * b.element_size() for b in buffers.values()) == spec.vision.audio.buffer_bytes
    # the cut builds both attention kinds and both MLP kinds of the text part, and two dense vision blocks
    text = model.config.text_config
    assert text.layer_types == ["indexed_attention", "sliding_attention"] and text.mlp_layer_types == ["dense", "sparse"]
    assert model.config.vision_config.mlp_layer_types == ["dense", "dense"]


@pytest.mark.torch
def test_peft_all_linear_reaches_what_the_spec_adapts():
    """peft's all-linear on the real model (every nn.Linear but the output embedding): its tower, merger and audio
    targets are hpcmem's `vision_adapters`."""
    pytest.importorskip("torch")
    pytest.importorskip("peft")
    model = meta_image_text_model(json.loads(CUT.read_text()))
    targets = peft_all_linear_targets(model)
    job = _job(448, 448, use_peft=True, lora_target_modules="all-linear")
    theirs = {n for n in (_vision_name(t) for t in targets) if n}
    assert theirs == set(_ours(vision_adapters(job, job.model.vision)))
    assert "lm_head" not in targets


@pytest.mark.torch
@pytest.mark.parametrize(("height", "width"), [(448, 448), (560, 560), (600, 1000), (1000, 300)])
def test_the_processor_counts_the_spec_s_image_tokens(height, width):
    """Dots3NoteProcessor (hpcmem.trace.vision `processor`, transformers' own class around Qwen2VLImageProcessorPil):
    its <|imgpad|> tokens, pixel_values [patches, 3 · 14²] and grid are the spec's."""
    proc = assert_processor_geometry(CUT, height, width, "Dots3NoteProcessor", patch_columns=True)
    assert len({proc.image_token_id, proc.video_token_id, proc.audio_token_id}) == 3


def test_560_px_by_hand():
    """560 / 28 = 20 merged blocks a side: 40 × 40 = 1,600 patches of 14 px, 400 image tokens (2 × 2 merged); 3 · 14²
    = 588 values a patch row (temporal_patch_size 1)."""
    job = _job(560, 560)
    g = image_geometry(job.train, job.model.vision)
    assert (g.patches, g.tokens, job.model.vision.patch_dim) == (1600, 400, 588)


def test_routed_expert_vision_layers_are_refused():
    """The class defaults' pyramid (25 dense layers, then 17 of routed experts) is refused, naming the layers."""
    with pytest.raises(SpecError, match=r"mlp_layer_types has routed-expert layers \[25, 26, 27, 28\]"):
        dots3_note_tower_from_config({"model_type": "dots3_note"}, "x")


def test_an_adapter_width_other_than_the_tower_s_is_refused():
    cfg = json.loads(CUT.read_text())
    cfg["vision_config"] = {**cfg["vision_config"], "adapter_in_dim": 1024}
    with pytest.raises(SpecError, match="adapter_in_dim 1024"):
        dots3_note_tower_from_config(cfg, "cut")


def test_a_text_config_without_a_learned_profile_is_refused(tmp_path):
    assert_refused_without_text_profile(CUT, tmp_path, num_hidden_layers=3,
                                        layer_types=["indexed_attention", "indexed_attention", "sliding_attention"],
                                        mlp_layer_types=["dense", "sparse", "sparse"])


def test_an_audio_width_other_than_the_text_s_is_refused():
    """Dots3NoteConfig.validate_architecture: the audio adapter's output is the text width (5120 by default)."""
    cfg = json.loads(CUT.read_text())
    cfg["audio_config"] = {"adapter_out_dim": 4096}
    with pytest.raises(SpecError, match="audio_config.adapter_out_dim 4096"):
        dots3_note_tower_from_config(cfg, "cut")
