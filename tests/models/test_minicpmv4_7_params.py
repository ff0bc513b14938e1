"""MiniCPM-V 4.7's parts as hpcmem counts them (MiniCPM-V 4.6's tower spec under model type minicpmv4_7,
hpcmem.models.minicpmv4_7; the language model from the learned profile of its Qwen3.5 text config) against
`AutoModelForImageTextToText.from_config` on the meta device, on the cut of estimator/cases/vlm-minicpmv4-7.yaml;
peft's all-linear targets on that model; the image tokens, markers and mm_token_type_ids of transformers'
MiniCPMV4_7Processor; the canvas M-RoPE position ids `MiniCPMV4_7Model.get_rope_index` builds from them
(modular_minicpmv4_7.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hpcmem.errors import SpecError
from hpcmem.estimate.vision import vision_adapters
from hpcmem.job.images import image_geometry
from hpcmem.models.minicpmv4_7 import minicpmv4_7_tower_from_config
from hpcmem.models.resolve import resolve_model
from hpcmem.validate.cases import case_job
from tests.helpers.meta_models import meta_image_text_model, meta_part_counts, peft_all_linear_targets
from tests.helpers.vlm_cuts import assert_refused_without_text_profile

CUT = Path(__file__).resolve().parents[1] / "fixtures" / "vlm" / "minicpmv4-7-defaults-L2-D2.json"
CUT_4_6 = CUT.parent / "minicpmv4-6-defaults-L2-D2.json"


def _job(height: int, width: int, **extra):
    return case_job({"trainer": "sft", "model_name_or_path": str(CUT), "max_length": 4096, "images_per_example": 1,
                     "image_height": height, "image_width": width, "dtype": "bfloat16", "bf16": True, **extra})


def _vision_name(name: str) -> str | None:
    """As tests/models/test_minicpmv4_6_params.py names a meta model's vision linears."""
    for prefix in ("vision_tower.encoder.layers.", "vision_tower.", "model.merger."):
        if prefix in name:
            rest = name.split(prefix, 1)[1]
            return f"blocks.{rest}" if prefix.endswith("layers.") else rest
    return None


def test_the_spec_is_4_6_s_under_its_own_type():
    """MiniCPMV4_7Config / MiniCPMV4_7VisionConfig subclass 4.6's with the same defaults: the same spec but the
    model type, the same parameters and the head untied."""
    spec, spec46 = resolve_model(str(CUT)), resolve_model(str(CUT_4_6))
    assert spec.vision.model_type == "minicpmv4_7" and spec.vision.family == "minicpmv4_6"
    assert spec.vision.linears() == spec46.vision.linears()
    assert (spec.vision.tower_params, spec.vision.merger_params, spec.num_params) == \
        (spec46.vision.tower_params, spec46.vision.merger_params, spec46.num_params)
    assert spec.tie_word_embeddings is False


@pytest.mark.torch
def test_parts_and_linears_equal_the_meta_model():
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    model = meta_image_text_model(json.loads(CUT.read_text()))
    assert type(model).__name__ == "MiniCPMV4_7ForConditionalGeneration"
    spec = resolve_model(str(CUT))
    count = meta_part_counts(model, tower=".vision_tower.", merger=".merger.")
    assert count == {"tower": spec.vision.tower_params, "merger": spec.vision.merger_params,
                     "language": spec.num_params}
    linears = {_vision_name(n): (m.in_features, m.out_features) for n, m in model.named_modules()
               if isinstance(m, torch.nn.Linear) and _vision_name(n)}
    ours = {(f"blocks.{i}.{x.name}" if x.part == "tower" else x.name): (x.in_features, x.out_features)
            for x in spec.vision.linears() for i in range(x.count)}
    assert linears == ours
    assert spec.tie_word_embeddings is (model.get_output_embeddings().weight is model.get_input_embeddings().weight)
    assert spec.learned is not None


@pytest.mark.torch
def test_peft_all_linear_reaches_what_the_spec_adapts():
    pytest.importorskip("torch")
    pytest.importorskip("peft")

    model = meta_image_text_model(json.loads(CUT.read_text()))
    targets = peft_all_linear_targets(model)
    theirs = sorted(n for n in (_vision_name(t) for t in targets) if n)
    job = _job(448, 448, use_peft=True, lora_target_modules="all-linear")
    ours = sorted(f"blocks.{i}.{x.name}" if x.part == "tower" else x.name
                  for x in vision_adapters(job, job.model.vision) for i in range(x.count))
    assert theirs == ours
    assert "lm_head" not in targets


@pytest.mark.torch
@pytest.mark.parametrize(("height", "width"), [(448, 448), (672, 896)])
def test_the_processor_counts_the_spec_s_image_tokens(height, width):
    """MiniCPMV4_7Processor (hpcmem.trace.vision `processor`, transformers' own class) on one image: its image tokens,
    pixel columns and the tokens around them are the spec's and `markers`'; mm_token_type_ids marks the image tokens
    (`return_mm_token_type_ids = True`)."""
    pytest.importorskip("transformers")
    from PIL import Image
    from transformers.models.minicpmv4_7.processing_minicpmv4_7 import MiniCPMV4_7Processor

    from hpcmem.trace.vision import processor
    from hpcmem.trace.vision_minicpmv4_6 import markers

    job = _job(height, width)
    proc = processor(job)
    assert isinstance(proc, MiniCPMV4_7Processor)
    out = proc(text=[proc.image_token + " t3"], images=[[Image.new("RGB", (width, height))]], return_tensors="pt")
    g = image_geometry(job.train, job.model.vision)
    ids = out["input_ids"][0]
    assert int((ids == proc.image_token_id).sum()) == g.tokens
    assert int(out["mm_token_type_ids"][0].sum()) == g.tokens
    assert out["pixel_values"].shape[-1] == g.patches * job.model.vision.patch_size
    assert tuple(map(tuple, out["target_sizes"].tolist())) == job.model.vision.slices(height, width)
    assert len(ids) == g.tokens + markers(job) + 1
    assert {(448, 448): 49, (672, 896): 240}[(height, width)] == g.tokens


@pytest.mark.torch
def test_canvas_m_rope_returns_int64_ids_of_the_text_rope_s_shape():
    """modular_minicpmv4_7.py `MiniCPMV4_7Model.get_rope_index` on the processor's output with the trace's marker ids
    (hpcmem.trace.vision `token_ids`): int64 position ids [3, B, S] and rope_deltas [B, 1], the shapes
    Qwen3_5TextModel's own 1-D ids expand to (no memory term of their own, hpcmem.models.minicpmv4_7)."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from PIL import Image

    from hpcmem.trace.vision import processor, token_ids

    job = _job(672, 896)
    proc = processor(job)
    ids = token_ids(proc)
    assert set(ids) == {"image_token_id", "video_token_id", "image_start_id", "image_end_id", "slice_start_id",
                        "slice_end_id", "newline_id"}
    cfg = {**json.loads(CUT.read_text()), **ids}
    model = meta_image_text_model(cfg)
    out = proc(text=[proc.image_token + " t3"], images=[[Image.new("RGB", (896, 672))]], return_tensors="pt")
    position_ids, deltas = model.model.get_rope_index(
        out["input_ids"], mm_token_type_ids=out["mm_token_type_ids"], target_sizes=out["target_sizes"],
        attention_mask=out["attention_mask"])
    assert position_ids.dtype == torch.int64 and tuple(position_ids.shape) == (3, *out["input_ids"].shape)
    assert tuple(deltas.shape) == (1, 1)


def test_an_insert_layer_outside_the_tower_is_refused():
    cfg = json.loads(CUT.read_text())
    del cfg["insert_layer_id"]
    with pytest.raises(SpecError, match="insert_layer_id 6 must name one of the tower's 2 layers"):
        minicpmv4_7_tower_from_config(cfg, "cut")


def test_a_downsample_mode_the_model_does_not_have_is_refused_naming_the_type():
    """MiniCPMV4_6Model.get_image_features knows "4x" (the window merger skipped) and anything else as "16x"; hpcmem
    takes those two spellings only."""
    cfg = {**json.loads(CUT.read_text()), "downsample_mode": "8x"}
    with pytest.raises(SpecError, match="hpcmem models minicpmv4_7 at downsample_mode 16x or 4x.*got downsample_mode "
                                        "'8x'"):
        minicpmv4_7_tower_from_config(cfg, "cut")


def test_a_text_config_without_a_learned_profile_is_refused(tmp_path):
    assert_refused_without_text_profile(CUT, tmp_path, num_hidden_layers=3)
