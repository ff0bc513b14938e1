"""PP-Chart2Table's parts as hpcmem counts them (hpcmem.models.got_ocr2_tower: GOT-OCR 2.0's SAM-style tower, its neck
and the convolution projector at PPChart2TableVisionConfig's defaults cut to 2 layers, one windowed and one global;
the Qwen2 decoder at PPChart2TableConfig's text defaults cut to 2 layers) against
`AutoModelForImageTextToText.from_config` (GotOcr2ForConditionalGeneration) on the meta device, at both image sizes
of estimator/cases/vlm-pp-chart2table.yaml; peft's all-linear targets on that model; the image tokens a picture takes
through transformers' PPChart2TableProcessor (the trace's, hpcmem.trace.vision_pp_chart2table)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hpcmem.errors import SpecError
from hpcmem.estimate.vision import vision_adapters
from hpcmem.job.images import image_geometry
from hpcmem.models.got_ocr2_tower import got_ocr2_tower_from_config
from hpcmem.models.resolve import resolve_model
from hpcmem.validate.cases import case_job
from tests.helpers.meta_models import meta_image_text_model, meta_part_counts, peft_all_linear_targets

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "vlm"
CUTS = {1024: FIXTURES / "pp-chart2table-defaults-L2-D2.json", 768: FIXTURES / "pp-chart2table-defaults-L2-D2-768.json"}


def _job(cut: Path, height: int = 480, width: int = 640, **extra):
    return case_job({"trainer": "sft", "model_name_or_path": str(cut), "max_length": 1024, "images_per_example": 1,
                     "image_height": height, "image_width": width, "dtype": "bfloat16", "bf16": True, **extra})


def _vision_name(name: str) -> str | None:
    """A meta model module's name as hpcmem's TowerLinear names it: below `vision_tower.` (layers.N.<name>) or
    `multi_modal_projector.`."""
    for part in ("vision_tower.", "multi_modal_projector."):
        if f".{part}" in f".{name}":
            return name.rsplit(part, 1)[-1]
    return None


def _ours(linears, depth: int) -> dict[str, tuple[int, int]]:
    out = {}
    for x in linears:
        if x.part != "tower":
            out[x.name] = (x.in_features, x.out_features)
            continue
        for i in range(depth):
            out[f"layers.{i}.{x.name}"] = (x.in_features, x.out_features)
    return out


def test_the_default_tower_by_hand():
    """PPChart2TableVisionConfig's defaults (SAM ViT-B): 12 layers, 4 global, 1024 px / 16 = a 64 × 64 grid, padded to
    70 × 70 for 14 × 14 windows (25 of them); the projector's two stride-2 convolutions make 16 × 16 = 256 tokens."""
    v = got_ocr2_tower_from_config({"model_type": "pp_chart2table"}, "x")
    assert (v.depth, v.global_layers, v.grid, v.padded_grid, v.windows, v.tokens_per_image) == (12, 4, 64, 70, 25,
                                                                                               256)
    by_name = {x.name: x for x in v.linears()}
    assert by_name["attn.qkv"].out_features == 3 * 768 and by_name["mlp.lin1"].out_features == 3072
    assert by_name["multimodal_projector"].in_features == 1024


def test_a_global_index_outside_the_tower_is_refused():
    with pytest.raises(SpecError, match="global_attn_indexes"):
        got_ocr2_tower_from_config({"model_type": "pp_chart2table", "vision_config": {
            "num_hidden_layers": 2, "global_attn_indexes": [5]}}, "x")


@pytest.mark.torch
@pytest.mark.parametrize("size", sorted(CUTS))
def test_parts_and_linears_equal_the_meta_model(size):
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    cut = CUTS[size]
    model = meta_image_text_model(json.loads(cut.read_text()))
    assert type(model).__name__ == "GotOcr2ForConditionalGeneration"
    spec = resolve_model(str(cut))
    assert spec.vision.image_size == size
    count = meta_part_counts(model, tower=".vision_tower.", merger=".multi_modal_projector.")
    assert count == {"tower": spec.vision.tower_params, "merger": spec.vision.merger_params,
                     "language": spec.num_params}
    linears = {_vision_name(n): (m.in_features, m.out_features) for n, m in model.named_modules()
               if isinstance(m, torch.nn.Linear) and _vision_name(n)}
    assert linears == _ours(spec.vision.linears(), spec.vision.depth)
    assert spec.tie_word_embeddings is (model.get_output_embeddings().weight is model.get_input_embeddings().weight)


@pytest.mark.torch
def test_peft_all_linear_reaches_what_the_spec_adapts():
    """peft's all-linear on the real model (peft/tuners/tuners_utils.py `_maybe_include_all_linear_layers`: every
    nn.Linear but the output embedding): its tower and projector targets are hpcmem's `vision_adapters`."""
    pytest.importorskip("torch")
    pytest.importorskip("peft")

    cut = CUTS[1024]
    model = meta_image_text_model(json.loads(cut.read_text()))
    targets = peft_all_linear_targets(model)
    job = _job(cut, use_peft=True, lora_target_modules="all-linear")
    theirs = {n for n in (_vision_name(t) for t in targets) if n}
    assert theirs == set(_ours(vision_adapters(job, job.model.vision), job.model.vision.depth))
    assert "lm_head" not in targets


@pytest.mark.torch
@pytest.mark.parametrize("size", sorted(CUTS))
@pytest.mark.parametrize(("height", "width"), [(480, 640), (1000, 300)])
def test_the_processor_counts_the_spec_s_image_tokens(size, height, width):
    """PPChart2TableProcessor (hpcmem.trace.vision `processor`) on one image: the chat template's <imgpad> tokens and
    the pixel_values square are the spec's, whatever the image's size (the image processor resizes to image_size)."""
    pytest.importorskip("transformers")
    from PIL import Image
    from transformers.models.pp_chart2table.processing_pp_chart2table import PPChart2TableProcessor

    from hpcmem.trace.vision import processor, token_ids

    job = _job(CUTS[size], height, width)
    proc = processor(job)
    assert isinstance(proc, PPChart2TableProcessor)
    text = proc.apply_chat_template([{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "t3"}]}],
                                    tokenize=False)
    out = proc(text=[text], images=[Image.new("RGB", (width, height))], return_tensors="pt")
    g = image_geometry(job.train, job.model.vision)
    assert int((out["input_ids"][0] == token_ids(proc)["image_token_index"]).sum()) == g.tokens
    assert tuple(out["pixel_values"].shape) == (1, 3, size, size)
    assert g.tokens == {1024: 256, 768: 144}[size]
