"""Emu3's parts as hpcmem counts them (its VQ-VAE in hpcmem.models.emu3; the Emu3 text model from the learned
profile of its text config, hpcmem.models.vlm_learned) against `AutoModelForImageTextToText.from_config` on the meta
device, on the cut of estimator/cases/vlm-emu3.yaml (its two-entry vocabulary map stands in for the tokenizer's:
Emu3Config's defaults leave it None, and the model reads its image token from it at construction); peft's all-linear targets on that model; the image tokens of a picture as
transformers' Emu3Processor and Emu3ImageProcessor make them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hpcmem.errors import SpecError
from hpcmem.estimate.vision import vision_adapters
from hpcmem.models.resolve import resolve_model
from hpcmem.validate.cases import case_job
from tests.helpers.meta_models import meta_image_text_model, peft_all_linear_targets
from tests.helpers.vlm_cuts import assert_refused_without_text_profile

CUT = Path(__file__).resolve().parents[1] / "fixtures" / "vlm" / "emu3-defaults-L2.json"
# (height, width) → the resized sides: image_processing_emu3.py smart_resize(factor 8, min 512², max 1024²) by hand:
# sides rounded to multiples of 8; below 512² pixels scaled up by sqrt(512² / (h·w)) (ceil to 8), above 1024² down
RESIZED = {(512, 512): (512, 512), (480, 640): (480, 640), (100, 100): (512, 512), (2048, 2048): (1024, 1024),
           (300, 700): (336, 784), (1000, 1003): (1000, 1000)}


def _job(height: int, width: int, **extra):
    return case_job({"trainer": "sft", "model_name_or_path": str(CUT), "max_length": 20000, "images_per_example": 1,
                     "image_height": height, "image_width": width, "dtype": "bfloat16", "bf16": True, **extra})


def _meta_model():
    return meta_image_text_model(json.loads(CUT.read_text()))


def _spec_linears(v) -> dict[str, tuple[int, int]]:
    """The spec's linears by module name below `vqmodel.` (a middle block's one attention, a level's numbered)."""
    out = {}
    for x in v.linears():
        where, leaf = x.name.rsplit(".", 1)
        for i in range(x.count):
            out[f"{where}.{leaf}" if where.endswith("attn_1") else f"{where}.{i}.{leaf}"] = (x.in_features,
                                                                                          x.out_features)
    return out


def test_the_vq_vae_by_hand():
    """Emu3VQVAEConfig's defaults: seven attention blocks (two at the encoder's level 3, its middle block's, the
    decoder's middle block's and three at its level 3), four Linear(1024 → 1024) each; the head untied."""
    spec = resolve_model(str(CUT))
    v = spec.vision
    assert sum(x.count for x in v.linears()) == 7 * 4
    assert all((x.in_features, x.out_features, x.part) == (1024, 1024, "idle") for x in v.linears())
    assert v.idle_params == v.num_params and v.parts["quantize"] == 32768 * 4
    assert spec.tie_word_embeddings is False
    assert spec.num_hidden_layers == 2 and spec.hidden_size == 4096


@pytest.mark.torch
def test_parts_and_linears_equal_the_meta_model():
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    model = _meta_model()
    assert type(model).__name__ == "Emu3ForConditionalGeneration"
    spec = resolve_model(str(CUT))
    vq = model.model.vqmodel
    assert {n: sum(p.numel() for p in m.parameters()) for n, m in vq.named_children()} == {
        "encoder": spec.vision.parts["encoder"], "decoder": spec.vision.parts["decoder"],
        "quantize": spec.vision.parts["quantize"], "quant_conv": spec.vision.parts["convs"] // 2,
        "post_quant_conv": spec.vision.parts["convs"] // 2}
    language = sum(p.numel() for n, p in model.named_parameters() if ".vqmodel." not in n)
    assert language == spec.num_params
    linears = {n.split("vqmodel.", 1)[1]: (m.in_features, m.out_features) for n, m in model.named_modules()
               if isinstance(m, torch.nn.Linear) and ".vqmodel." in n}
    assert linears == _spec_linears(spec.vision)
    assert spec.tie_word_embeddings is (model.get_output_embeddings().weight is model.get_input_embeddings().weight)
    assert spec.learned is not None


@pytest.mark.torch
def test_peft_all_linear_reaches_what_the_spec_adapts():
    """peft's all-linear on the real model wraps the VQ-VAE's q/k/v/out_proj (every nn.Linear but the output
    embedding): hpcmem's `vision_adapters`."""
    pytest.importorskip("torch")
    pytest.importorskip("peft")
    targets = peft_all_linear_targets(_meta_model())
    assert not any(t.endswith("lm_head") for t in targets)
    job = _job(512, 512, use_peft=True, lora_target_modules="all-linear")
    adapted = vision_adapters(job, job.model.vision)
    assert {t.split("vqmodel.", 1)[1] for t in targets if ".vqmodel." in t} == set(_spec_linears(job.model.vision))
    assert set(adapted) == set(job.model.vision.linears())


@pytest.mark.torch
@pytest.mark.parametrize(("height", "width"), sorted(RESIZED))
def test_the_processor_counts_the_spec_s_image_tokens(height, width):
    """Emu3Processor (hpcmem.trace.vision `processor`, transformers' own class) through the trace's chat template on
    one image: its pixel_values' size is hpcmem.job.images' resize, its <image> tokens rows · (columns + 1), the rest
    of the row hpcmem.trace.vision_emu3's markers, the bos and the words."""
    pytest.importorskip("transformers")
    from PIL import Image

    from hpcmem.job.images import image_geometry
    from hpcmem.trace.vision import processor
    from hpcmem.trace.vision_emu3 import MARKERS_PER_IMAGE, ROW_TOKENS

    job = _job(height, width)
    proc = processor(job)
    messages = [[{"role": "user", "content": [{"type": "image", "image": Image.new("RGB", (width, height))},
                                               {"type": "text", "text": "t3 t3"}]}]]
    out = proc.apply_chat_template(messages, tokenize=True, return_dict=True, return_tensors="pt")
    g = image_geometry(job.train, job.model.vision)
    h, w = RESIZED[(height, width)]
    assert g.resized == (h, w) and g.patches == (h // 8) * (w // 8) and g.tokens == (h // 8) * (w // 8 + 1)
    assert tuple(out["pixel_values"].shape) == (1, 3, h, w)
    ids = out["input_ids"][0]
    assert int((ids == proc.image_token_id).sum()) == g.tokens
    assert len(ids) == g.tokens + MARKERS_PER_IMAGE + ROW_TOKENS + 2


def test_pixel_bounds_and_a_partial_lora_on_the_vq_vae_are_refused():
    from hpcmem.estimate import estimate

    with pytest.raises(SpecError, match="min_pixels/max_pixels on emu3"):
        estimate(_job(512, 512, min_pixels=1000))
    with pytest.raises(SpecError, match="modelled for all four"):
        estimate(_job(512, 512, use_peft=True, lora_target_modules="q_proj,v_proj"))


def test_a_text_config_without_a_learned_profile_is_refused(tmp_path):
    assert_refused_without_text_profile(CUT, tmp_path, num_hidden_layers=3)
