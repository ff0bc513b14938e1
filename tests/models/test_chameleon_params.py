"""Chameleon's parts as hpcmem counts them (its image path, the VQ-VAE, in hpcmem.models.chameleon; the decoder from
the learned profile of its chameleon_text part, hpcmem.models.vlm_learned) against
`AutoModelForImageTextToText.from_config` on the meta device, on the cut of estimator/cases/vlm-chameleon.yaml; peft's
all-linear targets on that model; the image tokens of a picture as transformers' ChameleonProcessor and
ChameleonImageProcessorPil make them; the tiny model the trainability record builds."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hpcmem.errors import SpecError
from hpcmem.estimate.vision import vision_adapters
from hpcmem.models.chameleon import chameleon_tower_from_config
from hpcmem.models.resolve import resolve_model
from hpcmem.validate.cases import case_job
from tests.helpers.meta_models import meta_image_text_model, peft_all_linear_targets

CUT = Path(__file__).resolve().parents[1] / "fixtures" / "vlm" / "chameleon-defaults-L2-D2.json"
SIZES = ((480, 640), (448, 448), (1000, 300), (512, 512), (2048, 1536), (64, 900))


def _job(height: int, width: int, **extra):
    return case_job({"trainer": "sft", "model_name_or_path": str(CUT), "max_length": 4096, "images_per_example": 1,
                     "image_height": height, "image_width": width, "dtype": "bfloat16", "bf16": True, **extra})


def test_the_vq_encoder_by_hand():
    """ChameleonVQVAEConfig's defaults: levels at 512, 256, 128, 64, 32 px with 128, 128, 256, 256, 512 channels; the
    codebook 8,192 × 256; conv_in 3 → 128 (3 × 3): 3 · 128 · 9 + 128 = 3,584; a 128 → 128 ResnetBlock: 2 · (2 · 128 +
    128 · 128 · 9 + 128) = 295,680; the 32 × 32 latent grid: 1,024 codes an image."""
    v = resolve_model(str(CUT)).vision
    assert [(lv.side, lv.cin, lv.cout) for lv in v.levels()] == [
        (512, 128, 128), (256, 128, 128), (128, 128, 256), (64, 256, 256), (32, 256, 512)]
    assert v.image_patches == v.tokens_per_image == 1024
    assert v.linears() == ()
    assert v.num_params > 8192 * 256 + 3584 + 2 * 295_680


@pytest.mark.torch
def test_parts_equal_the_meta_model():
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    model = meta_image_text_model(json.loads(CUT.read_text()))
    assert type(model).__name__ == "ChameleonForConditionalGeneration"
    spec = resolve_model(str(CUT))
    count = {"vision": 0, "language": 0}
    for name, p in model.named_parameters():
        count["vision" if ".vqmodel." in name else "language"] += p.numel()
    assert count == {"vision": spec.vision.num_params, "language": spec.num_params}
    assert not [n for n, m in model.named_modules() if isinstance(m, torch.nn.Linear) and ".vqmodel." in n]
    assert spec.tie_word_embeddings is (model.get_output_embeddings().weight is model.get_input_embeddings().weight)
    assert spec.learned is not None


@pytest.mark.torch
def test_peft_all_linear_adapts_nothing_in_the_vq_vae():
    pytest.importorskip("torch")
    pytest.importorskip("peft")

    model = meta_image_text_model(json.loads(CUT.read_text()))
    targets = peft_all_linear_targets(model)
    assert targets and not any(".vqmodel." in t for t in targets)
    job = _job(480, 640, use_peft=True, lora_target_modules="all-linear")
    assert vision_adapters(job, job.model.vision) == ()


@pytest.mark.torch
@pytest.mark.parametrize(("height", "width"), SIZES)
def test_the_processor_counts_the_spec_s_image_tokens(height, width):
    """ChameleonProcessor (hpcmem.trace.vision `processor`, transformers' own class) through the trace's chat
    template on one image: 1,024 <image> tokens between begin and end, the sep token after the text, pixel_values
    [1, 3, 512, 512] whatever the size."""
    pytest.importorskip("transformers")
    from PIL import Image
    from transformers.models.chameleon.processing_chameleon import ChameleonProcessor

    from hpcmem.job.images import image_geometry
    from hpcmem.trace.vision import processor
    from hpcmem.trace.vision_chameleon import MARKERS_PER_IMAGE, ROW_TOKENS

    job = _job(height, width)
    proc = processor(job)
    assert isinstance(proc, ChameleonProcessor)
    messages = [[{"role": "user", "content": [{"type": "image", "image": Image.new("RGB", (width, height))},
                                               {"type": "text", "text": "t3 t3"}]}]]
    out = proc.apply_chat_template(messages, tokenize=True, return_dict=True, return_tensors="pt",
                                   processor_kwargs={"add_special_tokens": False})
    g = image_geometry(job.train, job.model.vision)
    assert g.tokens == g.patches == 1024
    ids = out["input_ids"][0]
    assert int((ids == proc.image_token_id).sum()) == g.tokens
    assert tuple(out["pixel_values"].shape) == (1, 3, 512, 512)
    assert len(ids) == g.tokens + MARKERS_PER_IMAGE + ROW_TOKENS + 2


@pytest.mark.torch
def test_the_vq_vae_makes_the_processor_s_token_count():
    """The real encoder on a meta [1, 3, 512, 512] batch: a [1, 256, 32, 32] latent, 1,024 codes."""
    torch = pytest.importorskip("torch")
    from transformers import ChameleonVQVAE, ChameleonVQVAEConfig

    with torch.device("meta"):
        vq = ChameleonVQVAE(ChameleonVQVAEConfig())
        latent = vq.encoder(torch.empty(1, 3, 512, 512))
    assert tuple(latent.shape) == (1, 256, 32, 32)


def test_pixel_bounds_are_refused():
    from hpcmem.estimate import estimate

    with pytest.raises(SpecError, match="ChameleonImageProcessor has no such setting"):
        estimate(_job(480, 640, min_pixels=1000))


def test_a_codebook_grid_other_than_the_processor_s_is_refused():
    """Six levels halve the 512 px crop to 16 × 16 = 256 codes; ChameleonProcessor writes 1,024 <image> tokens."""
    cfg = {**json.loads(CUT.read_text()), "vq_config": {"channel_multiplier": [1, 1, 2, 2, 4, 4]}}
    with pytest.raises(SpecError, match="image_seq_length 1024"):
        chameleon_tower_from_config(cfg, "cut")


@pytest.mark.torch
def test_the_tiny_model_builds():
    """hpcmem.validate.vlm_tiny: ChameleonConfig's defaults leave vocabulary_map None, which ChameleonModel reads
    `<image>` from when it is built; the tiny config holds the placeholder at the shrunk vocabulary's last id."""
    torch = pytest.importorskip("torch")
    from transformers import ChameleonConfig, ChameleonForConditionalGeneration

    from hpcmem.validate.vlm_tiny import tiny_config

    cfg = tiny_config("chameleon")
    assert cfg["vocabulary_map"] == {"<image>": cfg["vocab_size"] - 1}
    data = {k: v for k, v in cfg.items() if k != "model_type"}
    with torch.device("meta"):
        model = ChameleonForConditionalGeneration(ChameleonConfig(**data))
    assert model.model.vocabulary_mapping.image_token_id == cfg["vocab_size"] - 1


def test_a_text_config_without_a_learned_profile_is_refused(tmp_path):
    """The decoder's keys are the config's own (flat): a depth no profile was learned for is refused in one line."""
    cfg = {**json.loads(CUT.read_text()), "num_hidden_layers": 3}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(SpecError, match="no learned profile of its text config"):
        resolve_model(str(tmp_path / "config.json"))
