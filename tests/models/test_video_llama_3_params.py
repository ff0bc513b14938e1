"""VideoLLaMA3's parts as hpcmem counts them (hpcmem.models.video_llama_3, the language model by the qwen2 family)
against `AutoModelForImageTextToText.from_config` on the meta device: VideoLLaMA3-2B's widths cut to 1 decoder layer
and 2 tower layers, VideoLlama3Config's defaults (VideoLlama3VisionConfig's class defaults, a default Qwen2); the
projector and the image tokens by hand."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hpcmem.models.resolve import resolve_model
from hpcmem.job.images import image_geometry
from hpcmem.validate.cases import case_job
from tests.helpers.meta_models import meta_image_text_model, meta_part_counts

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "vlm"
CUT = "video-llama-3-2b-width-L1-D2.json"


def _counts(cfg: dict, path: Path) -> tuple[dict, dict, object, object]:
    model = meta_image_text_model(cfg)
    path.write_text(json.dumps(cfg))
    spec = resolve_model(str(path))
    ours = {"tower": spec.vision.tower_params, "merger": spec.vision.merger_params, "language": spec.num_params}
    return meta_part_counts(model, tower=".vision_model.", merger=".projector."), ours, model, spec


@pytest.mark.torch
def test_parts_and_linears_equal_the_meta_model(tmp_path):
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    count, ours, model, spec = _counts(json.loads((FIXTURES / CUT).read_text()), tmp_path / "config.json")
    assert type(model).__name__ == "VideoLlama3ForConditionalGeneration"
    assert count == ours
    linears = {n.split("model.", 1)[1] for n, m in model.named_modules()
               if isinstance(m, torch.nn.Linear) and (".vision_model." in n or ".projector." in n)}
    mine = {f"vision_model.encoder.layers.{i}.{x.name}" for x in spec.vision.linears()
            if x.part == "tower" for i in range(x.count)}
    mine |= {f"projector.{x.name}" for x in spec.vision.linears() if x.part == "merger"}
    assert linears == mine
    assert spec.tie_word_embeddings is (model.get_output_embeddings().weight is model.get_input_embeddings().weight)


@pytest.mark.torch
def test_the_config_class_defaults_equal_the_meta_model(tmp_path):
    """No vision_config, no text_config: VideoLlama3VisionConfig's defaults (768 wide, 12 layers, 16 px patches) and
    Qwen2Config's (4096 wide), untied."""
    pytest.importorskip("transformers")
    count, ours, model, spec = _counts({"model_type": "video_llama_3"}, tmp_path / "config.json")
    assert count == ours
    assert (spec.vision.hidden_size, spec.vision.depth, spec.vision.patch_size) == (768, 12, 16)
    assert spec.tie_word_embeddings is (model.get_output_embeddings().weight is model.get_input_embeddings().weight)


def test_projector_and_tower_by_hand():
    """The projector Linear(1152 → 1536) and Linear(1536 → 1536) with biases; the tower a Conv2d of 3 · 14² inputs
    with bias, two layers of two LayerNorms, q/k/v/out_proj and fc1/fc2 with biases, and post_layernorm."""
    v = resolve_model(str(FIXTURES / CUT)).vision
    assert v.merger_params == (1152 * 1536 + 1536) + (1536 * 1536 + 1536)
    layer = 4 * 1152 + 4 * (1152 * 1152 + 1152) + (1152 * 4304 + 4304) + (4304 * 1152 + 1152)
    assert v.tower_params == 3 * 14 * 14 * 1152 + 1152 + 2 * layer + 2 * 1152


@pytest.mark.parametrize(("size", "tokens"), [((480, 640), 34 * 46), ((896, 896), 64 * 64)])
def test_image_tokens_by_hand(size, tokens):
    """smart_resize at factor 14 (patch 14 · merge_size 1): 480 × 640 → round(480 / 14) = 34, round(640 / 14) = 46
    patches a side; 896 × 896 → 64 × 64 (802,816 px, within the class's 1,003,520 max); one token per patch."""
    job = case_job({"model_name_or_path": str(FIXTURES / CUT), "trainer": "sft", "images_per_example": 1,
                    "image_height": size[0], "image_width": size[1], "max_length": 8192})
    g = image_geometry(job.train, job.model.vision)
    assert (g.patches, g.tokens) == (tokens, tokens)
