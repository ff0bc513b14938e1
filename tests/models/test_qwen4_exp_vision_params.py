"""Qwen4-Exp's parts as hpcmem counts them (Qwen3.5's tower and merger in hpcmem.models.vision, no deepstack mergers;
the language model from the learned profile of the text config, hpcmem.models.vlm_learned) against
`AutoModelForImageTextToText.from_config` on the meta device, on the cut of estimator/cases/vlm-qwen4-exp.yaml (the
config classes' defaults with the QSA indexer sizes a checkpoint sets, 2 decoder layers — one Gated DeltaNet, one
indexed attention — and 2 vision blocks); the image tokens a picture takes counted by transformers' Qwen3VLProcessor
(the processor processing_auto.py pairs with qwen4_exp)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hpcmem.job.images import image_geometry
from hpcmem.models.resolve import resolve_model
from hpcmem.validate.cases import case_job
from tests.helpers.meta_models import meta_image_text_model, meta_part_counts
from tests.helpers.vlm_cuts import assert_refused_without_text_profile

CUT = Path(__file__).resolve().parents[1] / "fixtures" / "vlm" / "qwen4_exp-defaults-L2-D2.json"


def _job(height: int, width: int):
    return case_job({"trainer": "sft", "model_name_or_path": str(CUT), "max_length": 1024, "images_per_example": 1,
                     "image_height": height, "image_width": width, "dtype": "bfloat16", "bf16": True})


@pytest.mark.torch
def test_parts_and_linears_equal_the_meta_model():
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    model = meta_image_text_model(json.loads(CUT.read_text()))
    assert type(model).__name__ == "Qwen4ExpForConditionalGeneration"
    spec = resolve_model(str(CUT))
    count = meta_part_counts(model, tower=".visual.", merger=".visual.merger.")
    assert count == {"tower": spec.vision.tower_params, "merger": spec.vision.merger_params,
                     "language": spec.num_params}
    assert spec.vision.deepstack_visual_indexes == () and spec.vision.deepstack_params == 0
    assert not any("deepstack" in n for n, _ in model.named_parameters())
    linears = {n.rsplit("visual.", 1)[-1] for n, m in model.named_modules()
               if isinstance(m, torch.nn.Linear) and ".visual." in f".{n}."}
    ours = {f"blocks.{i}.{x.name}" for x in spec.vision.linears() if x.part == "tower" for i in range(x.count)}
    ours |= {f"merger.{x.name}" for x in spec.vision.linears() if x.part == "merger"}
    assert linears == ours
    assert spec.tie_word_embeddings is (model.get_output_embeddings().weight is model.get_input_embeddings().weight)
    assert spec.learned is not None and spec.vision.hooked_input is False
    # the cut builds the indexed attention the trace runs: its indexer's 640-wide index_qk_proj (4 + 1 heads of 128)
    text = model.config.text_config
    assert text.layer_types == ["linear_attention", "indexed_attention"]
    assert model.model.language_model.layers[1].self_attn.indexer.index_qk_proj.out_features == 5 * 128


@pytest.mark.parametrize(("height", "width"), [(448, 448), (896, 896), (600, 1000), (1000, 300)])
def test_the_processor_counts_the_spec_s_image_tokens(height, width):
    """Qwen3VLProcessor (hpcmem.trace.vision `processor`, transformers' own class) on one image: its image_pad tokens,
    pixel_values rows and image_grid_thw are the spec's (smart_resize to 32 px multiples, 16 px patches, 2 × 2
    merged into one token); one vision_start and one vision_end around them."""
    pytest.importorskip("transformers")
    from PIL import Image
    from transformers.models.qwen3_vl.processing_qwen3_vl import Qwen3VLProcessor

    from hpcmem.trace.vision import IMAGE_PAD, VISION_END, VISION_START, processor

    job = _job(height, width)
    proc = processor(job)
    assert isinstance(proc, Qwen3VLProcessor)
    out = proc(text=[VISION_START + IMAGE_PAD + VISION_END + " t3"], images=[Image.new("RGB", (width, height))],
               return_tensors="pt")
    ids = out["input_ids"][0]
    g = image_geometry(job.train, job.model.vision)
    pad, start, end = proc.tokenizer.convert_tokens_to_ids([IMAGE_PAD, VISION_START, VISION_END])
    assert int((ids == pad).sum()) == g.tokens
    assert [int((ids == start).sum()), int((ids == end).sum())] == [1, 1]
    assert tuple(out["image_grid_thw"][0].tolist()) == g.grid_thw
    assert tuple(out["pixel_values"].shape) == (g.patches, job.model.vision.patch_dim)


def test_448_px_by_hand():
    """448 / 16 = 28 patches a side: 784 patches, 196 image tokens (2 × 2 merged); 3 · 2 · 16² = 1,536 values a
    patch row."""
    g = image_geometry(_job(448, 448).train, _job(448, 448).model.vision)
    assert (g.patches, g.tokens, _job(448, 448).model.vision.patch_dim) == (784, 196, 1536)


def test_a_text_config_without_a_learned_profile_is_refused(tmp_path):
    assert_refused_without_text_profile(CUT, tmp_path, num_hidden_layers=4,
                                        layer_types=["linear_attention"] * 3 + ["indexed_attention"])
