"""Inkling's parts as hpcmem counts them (its hierarchical-MLP tower and idle audio tower in hpcmem.models.inkling, the
language model from the learned profile of its inkling_text config, hpcmem.models.vlm_learned) against
`AutoModelForImageTextToText.from_config` on the meta device, on the cut of estimator/cases/vlm-inkling.yaml; the
planned scales against transformers' own `plan_out_scales`; peft's all-linear targets on that model; the patches and
image tokens of a picture as transformers' own `InklingImageProcessor._preprocess` and `InklingProcessor` make them
(the image processor's module imports torchvision at its top: loaded here over a stand-in module that only satisfies
that import, its `_preprocess` run with torch pad/normalize for the two TorchvisionBackend methods it calls)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hpcmem.errors import SpecError
from hpcmem.estimate.vision import vision_adapters
from hpcmem.job.images import image_geometry
from hpcmem.models.inkling import inkling_tower_from_config, plan_scales, scale_ladder
from hpcmem.models.resolve import resolve_model
from hpcmem.validate.cases import case_job
from tests.helpers.meta_models import meta_image_text_model, peft_all_linear_targets
from tests.helpers.torchvision_stand_in import real_image_processor_class, torch_backend
from tests.helpers.vlm_cuts import assert_refused_without_text_profile

# transformers' own image processor, run over a torchvision stand-in (tests.helpers.torchvision_stand_in)
PROCESSOR = ("transformers.models.inkling.image_processing_inkling", "InklingImageProcessor")

CUT = Path(__file__).resolve().parents[1] / "fixtures" / "vlm" / "inkling-defaults-L2-D2.json"


def _job(height: int, width: int, **extra):
    return case_job({"trainer": "sft", "model_name_or_path": str(CUT), "max_length": 4096, "images_per_example": 1,
                     "image_height": height, "image_width": width, "dtype": "bfloat16", "bf16": True, **extra})


def test_the_cut_s_tower_by_hand():
    """plan_out_scales(2, 40, 6, 3): 40 = 5 · 2 · 2 · 2 taken largest first, h = 5, 10, 20, 40, channels ⌈h² · 3 / 64⌉
    · 64 = 128, 320, 1216, 4800; the temporal rung (2, 40, 40, 40² · 3 · 2 · 64 = 614,400). Ideal log-spacing of
    1 .. 9600 over 6 layers: 1, 4.6, 21.3, 97.9, 451, 2078, 9600 → rungs pixel, pixel, 5², 10², 20², 40² (2078 is
    nearer 1600 than 3200 in log), temporal. Layers: 3 → 3, 3 · 25 = 75 → 128, 128 · 4 = 512 → 320, 320 · 4 = 1280 →
    1216, 1216 · 4 = 4864 → 4800, 4800 · 2 = 9600 → 6144 (the last: the text width, no norm); the norms 3 + 128 +
    320 + 1216 + 4800, final_norm 6144. Audio: 80 · 256 · 6144 + 6144."""
    v = resolve_model(str(CUT)).vision
    assert [(x.in_features, x.out_features, x.norm) for x in v.layers()] == [
        (3, 3, True), (75, 128, True), (512, 320, True), (1280, 1216, True), (4864, 4800, True), (9600, 6144, False)]
    assert v.tower_params == (9 + 75 * 128 + 512 * 320 + 1280 * 1216 + 4864 * 4800 + 9600 * 6144
                              + 3 + 128 + 320 + 1216 + 4800 + 6144)
    assert v.audio_params == 80 * 256 * 6144 + 6144
    assert scale_ladder(2, 40, 3)[-1] == (2, 40, 40, 614_400)


@pytest.mark.torch
@pytest.mark.parametrize(("temporal", "patch"), [(2, 40), (1, 14), (2, 16), (4, 28), (3, 20)])
def test_the_plan_equals_transformers_plan_out_scales(temporal, patch):
    """Every depth from the rung count (below it transformers calls scipy) to 30."""
    pytest.importorskip("transformers")
    from transformers.models.inkling.modeling_inkling import plan_out_scales
    for layers in range(len(scale_ladder(temporal, patch, 3)), 31):
        assert [list(x) for x in plan_scales(temporal, patch, layers, 3)] == \
            plan_out_scales(temporal, patch, layers, 3).tolist()


@pytest.mark.torch
def test_parts_and_linears_equal_the_meta_model():
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    model = meta_image_text_model(json.loads(CUT.read_text()))
    assert type(model).__name__ == "InklingForConditionalGeneration"
    spec = resolve_model(str(CUT))
    parts = {"vision": 0, "audio": 0, "language": 0}
    for name, p in model.named_parameters():
        part = "vision" if ".vision_tower." in name else "audio" if ".audio_tower." in name else "language"
        parts[part] += p.numel()
    assert parts == {"vision": spec.vision.tower_params, "audio": spec.vision.audio_params,
                     "language": spec.num_params}
    assert sum(b.numel() * b.element_size() for b in model.model.audio_tower.buffers()) == \
        spec.vision.audio_buffer_bytes
    linears = {n.split("vision_tower.", 1)[1]: (m.in_features, m.out_features, m.bias is not None)
               for n, m in model.named_modules() if isinstance(m, torch.nn.Linear) and "vision_tower." in n}
    assert linears == {x.name: (x.in_features, x.out_features, x.bias) for x in spec.vision.linears()}
    assert not any(isinstance(m, torch.nn.Linear) for m in model.model.audio_tower.modules())
    assert spec.tie_word_embeddings is (model.get_output_embeddings().weight is model.get_input_embeddings().weight)
    assert spec.learned is not None


@pytest.mark.torch
def test_peft_all_linear_reaches_what_the_spec_adapts():
    """peft's all-linear on the real model: every projection of the tower, nothing in the audio tower."""
    pytest.importorskip("torch")
    pytest.importorskip("peft")
    model = meta_image_text_model(json.loads(CUT.read_text()))
    targets = peft_all_linear_targets(model)
    theirs = sorted(t.split("vision_tower.", 1)[1] for t in targets if "vision_tower." in t)
    job = _job(640, 640, use_peft=True, lora_target_modules="all-linear")
    assert theirs == sorted(x.name for x in vision_adapters(job, job.model.vision))
    assert not any("audio_tower" in t for t in targets)
    assert "lm_head" not in targets


@pytest.mark.torch
@pytest.mark.parametrize(("height", "width", "rows", "cols"),
                         [(640, 640, 16, 17), (960, 1280, 24, 33), (90, 130, 3, 4), (41, 39, 2, 1), (1, 1, 1, 1)])
def test_the_real_preprocess_and_processor_count_the_spec_s_patches(monkeypatch, height, width, rows, cols):
    """The real `_preprocess` on one image: pixel_values [rows · cols, 2, 40, 40, 3] and num_patches rows · cols (by
    hand: ⌈height / 40⌉ rows, width // 40 + 1 columns); hpcmem.trace.vision's stand-in processor makes the same
    tensors, and `InklingProcessor` writes rows · cols image tokens and no marker: the spec's tokens and patches."""
    torch = pytest.importorskip("torch")
    from PIL import Image
    from transformers.image_utils import SizeDict
    from transformers.utils.constants import OPENAI_CLIP_MEAN, OPENAI_CLIP_STD

    from hpcmem.trace.vision import processor

    real = real_image_processor_class(monkeypatch, *PROCESSOR)
    image = torch.full((3, height, width), 7, dtype=torch.uint8)
    out = real._preprocess(torch_backend(), [image], size=SizeDict(height=40, width=40), do_rescale=True,
                           rescale_factor=1 / 255, do_normalize=True, image_mean=list(OPENAI_CLIP_MEAN),
                           image_std=list(OPENAI_CLIP_STD), resample=None, rescale_image_frac=None,
                           rescale_image_max_upscaled_long_edge=2048, return_tensors="pt")
    assert tuple(out["pixel_values"].shape) == (rows * cols, 2, 40, 40, 3)
    assert out["num_patches"].tolist() == [rows * cols]
    job = _job(height, width)
    v = job.model.vision
    assert v.grid(height, width) == (rows, cols)
    proc = processor(job)
    picture = Image.new("RGB", (width, height), (7, 7, 7))
    ours = proc(text=[proc.image_token + " t3"], images=[[picture]], return_tensors="pt")
    assert ours["pixel_values"].dtype == out["pixel_values"].dtype == torch.float32
    assert torch.allclose(ours["pixel_values"], out["pixel_values"], atol=1e-5)
    g = image_geometry(job.train, v)
    ids = ours["input_ids"][0]
    assert int((ids == proc.image_token_id).sum()) == g.tokens == rows * cols == g.patches
    assert len(ids) == g.tokens + 1


def test_unmodelled_geometry_is_refused():
    cfg = json.loads(CUT.read_text())
    cfg["vision_config"]["patch_size"] = 16
    with pytest.raises(SpecError, match="must be 40"):
        inkling_tower_from_config(cfg, "cut")
    cfg = json.loads(CUT.read_text())
    cfg["vision_config"]["temporal_patch_size"] = 1
    with pytest.raises(SpecError, match="twice in time"):
        inkling_tower_from_config(cfg, "cut")
    cfg = json.loads(CUT.read_text())
    cfg["vision_config"]["num_hidden_layers"] = 4      # the released tower's depth: scipy's assignment
    with pytest.raises(SpecError, match="linear_sum_assignment"):
        inkling_tower_from_config(cfg, "cut")


def test_a_text_config_without_a_learned_profile_is_refused(tmp_path):
    assert_refused_without_text_profile(CUT, tmp_path, num_hidden_layers=3)


def test_pixel_bounds_are_refused():
    with pytest.raises(SpecError, match="InklingImageProcessor has no such setting"):
        _job(640, 640, min_pixels=1000)
