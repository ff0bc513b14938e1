"""Mistral Large 4's parts as hpcmem counts them (Mistral 3's Pixtral tower and projector at MistralLarge4Config's
defaults, hpcmem.models.mistral_large4; the language model from the learned profile of its mistral_large4_text config,
hpcmem.models.vlm_learned) against `AutoModelForImageTextToText.from_config` on the meta device, on the cut of
estimator/cases/vlm-mistral-large4.yaml; peft's all-linear targets on that model; the image tokens a picture takes
counted by transformers' PixtralProcessor (the processor transformers pairs with mistral_large4)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hpcmem.errors import SpecError
from hpcmem.estimate.vision import vision_adapters
from hpcmem.models.mistral_large4 import mistral_large4_tower_from_config
from hpcmem.validate.cases import case_job
from tests.helpers.meta_models import assert_tower_and_projector_match, meta_image_text_model, peft_all_linear_targets
from tests.helpers.vlm_cuts import assert_refused_without_text_profile, processed_one_image

CUT = Path(__file__).resolve().parents[1] / "fixtures" / "vlm" / "mistral-large4-defaults-L2-D2.json"


def _job(height: int, width: int, **extra):
    return case_job({"trainer": "sft", "model_name_or_path": str(CUT), "max_length": 4096, "images_per_example": 1,
                     "image_height": height, "image_width": width, "dtype": "bfloat16", "bf16": True, **extra})


def _vision_name(name: str) -> str | None:
    """A meta model module's name below `vision_tower.transformer.layers.N.` (the index dropped) or
    `multi_modal_projector.`, as hpcmem's TowerLinear names it."""
    if ".vision_tower.transformer.layers." in f".{name}":
        return name.rsplit("vision_tower.transformer.layers.", 1)[-1].split(".", 1)[1]
    if ".multi_modal_projector." in f".{name}":
        return name.rsplit("multi_modal_projector.", 1)[-1]
    return None


def test_the_default_tower_by_hand():
    """MistralLarge4Config.sub_configs_defaults' Pixtral (width 2048, MLP 6144, 30 layers, 16 heads, 14 px patches,
    longest_edge 1540, silu) under Mistral3Config's projector (gelu, no bias, merge 2) into the 6144-wide text part;
    a 1540 px square: 110 × 110 patches, 55 merged rows of 55 [IMG] and a break."""
    v = mistral_large4_tower_from_config({"model_type": "mistral_large4"}, "x")
    assert (v.depth, v.hidden_size, v.intermediate_size, v.num_heads, v.patch_size, v.image_size, v.hidden_act,
            v.out_hidden_size) == (30, 2048, 6144, 16, 14, 1540, "silu", 6144)
    assert (v.spatial_merge_size, v.projector_act, v.projector_bias) == (2, "gelu", False)
    assert v.grid(1540, 1540) == (110, 110) and v.image_tokens(1540, 1540) == 55 * 56


@pytest.mark.torch
def test_a_named_vision_config_takes_pixtral_s_class_defaults():
    """A vision_config the file names is built as PixtralVisionConfig over its own keys (sub_configs_defaults'
    init_kwargs apply only to an omitted one): transformers' config and hpcmem's spec agree."""
    from transformers import MistralLarge4Config

    cfg = {"model_type": "mistral_large4", "vision_config": {"model_type": "pixtral", "num_hidden_layers": 2}}
    theirs = MistralLarge4Config(vision_config=cfg["vision_config"]).vision_config
    v = mistral_large4_tower_from_config(cfg, "x")
    assert (v.hidden_size, v.intermediate_size, v.patch_size, v.image_size, v.hidden_act) == (
        theirs.hidden_size, theirs.intermediate_size, theirs.patch_size, theirs.image_size, theirs.hidden_act)
    omitted = MistralLarge4Config().vision_config
    d = mistral_large4_tower_from_config({"model_type": "mistral_large4"}, "x")
    assert (d.depth, d.hidden_size, d.intermediate_size, d.patch_size, d.image_size, d.hidden_act) == (
        omitted.num_hidden_layers, omitted.hidden_size, omitted.intermediate_size, omitted.patch_size,
        omitted.image_size, omitted.hidden_act)


def test_other_feature_layers_and_towers_are_refused():
    with pytest.raises(SpecError, match="vision_feature_layer -2"):
        mistral_large4_tower_from_config({"model_type": "mistral_large4", "vision_feature_layer": -2}, "x")
    with pytest.raises(SpecError, match="mistral_large4's vision_config.model_type 'siglip_vision_model'"):
        mistral_large4_tower_from_config({"model_type": "mistral_large4",
                                          "vision_config": {"model_type": "siglip_vision_model"}}, "x")


@pytest.mark.torch
def test_parts_and_linears_equal_the_meta_model():
    pytest.importorskip("transformers")
    model, spec = assert_tower_and_projector_match(CUT, "MistralLarge4ForConditionalGeneration",
                                                   layers="transformer.layers")
    assert spec.tie_word_embeddings is (model.get_output_embeddings().weight is model.get_input_embeddings().weight)
    assert spec.tie_word_embeddings is False
    assert spec.learned is not None
    # by hand: patch_conv without bias and ln_pre; per layer 4 h² attention, 3 h·i MLP, 2 RMSNorms; the projector's
    # RMSNorm, merging_layer 4h → h, linear_1 h → o, linear_2 o → o, none with bias
    h, i, o, d = 2048, 6144, 6144, 2
    assert spec.vision.tower_params == 3 * 14 * 14 * h + h + d * (4 * h * h + 3 * h * i + 2 * h)
    assert spec.vision.merger_params == h + 4 * h * h + h * o + o * o


@pytest.mark.torch
def test_peft_all_linear_reaches_what_the_spec_adapts():
    """peft's all-linear on the real model (peft/tuners/tuners_utils.py `_maybe_include_all_linear_layers`: every
    nn.Linear but the output embedding): its tower and projector targets are hpcmem's `vision_adapters`."""
    pytest.importorskip("torch")
    pytest.importorskip("peft")
    model = meta_image_text_model(json.loads(CUT.read_text()))
    targets = peft_all_linear_targets(model)
    theirs = sorted(n for n in (_vision_name(t) for t in targets) if n)
    job = _job(448, 448, use_peft=True, lora_target_modules="all-linear")
    ours = sorted(x.name for x in vision_adapters(job, job.model.vision) for _ in range(x.count))
    assert theirs == ours
    assert "lm_head" not in targets


@pytest.mark.torch
@pytest.mark.parametrize(("height", "width"), [(448, 448), (672, 896), (1540, 1540), (3000, 2000), (500, 700),
                                               (100, 120)])
def test_the_processor_counts_the_spec_s_image_tokens(height, width):
    """PixtralProcessor (hpcmem.trace.vision `processor`, transformers' own class) on one image: its [IMG],
    [IMG_BREAK] and [IMG_END] tokens and the pixel grid are the spec's."""
    pytest.importorskip("transformers")
    out, ids, g, proc = processed_one_image(_job(height, width), height, width)
    assert type(proc).__name__ == "PixtralProcessor"
    words = proc.tokenizer.convert_tokens_to_ids(["[IMG]", "[IMG_BREAK]", "[IMG_END]"])
    assert sum(int((ids == w).sum()) for w in words) == g.tokens
    assert tuple(int(x) for x in out["image_sizes"][0]) == g.resized


@pytest.mark.torch
def test_the_learned_text_model_is_the_image_text_model_s_language_model():
    """`hpcmem models learn` traced the cut's text config through hpcmem.trace.text_heads' causal-LM class (transformers
    maps mistral_large4_text to no causal-LM class): on the meta device in bf16 it holds the parameters
    MistralLarge4ForConditionalGeneration's language model and lm_head hold, name by name with their shapes and dtypes
    (the router weight and LeRoPE's alpha fp32 in both), the head untied, and runs the same experts and attention
    implementations (grouped_mm, sdpa: transformers gives eager experts to a class whose module
    lacks the experts-implementation decorator)."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from hpcmem.trace import text_heads

    text_heads.register()
    cfg = json.loads(CUT.read_text())

    def config():
        data = {k: v for k, v in cfg.items() if k not in ("architectures", "torch_dtype")}
        return transformers.AutoConfig.for_model(data.pop("model_type"), **data)

    with torch.device("meta"):
        vlm = transformers.AutoModelForImageTextToText.from_config(config(), dtype=torch.bfloat16)
        text = transformers.AutoModelForCausalLM.from_config(config().text_config, dtype=torch.bfloat16)
    theirs = {n.replace("model.language_model.", "model.", 1): (tuple(p.shape), p.dtype)
              for n, p in vlm.named_parameters() if n.startswith(("model.language_model.", "lm_head."))}
    ours = {n: (tuple(p.shape), p.dtype) for n, p in text.named_parameters()}
    assert ours == theirs
    assert {n for n, (_, dtype) in ours.items() if dtype != torch.bfloat16} == {"model.layers.1.mlp.gate.weight",
                                                                                "model.rotary_emb.alpha"}
    assert text.get_output_embeddings().weight is not text.get_input_embeddings().weight
    assert type(text.model) is type(vlm.model.language_model)
    assert (text.config._experts_implementation, text.config._attn_implementation) == \
        (vlm.config.text_config._experts_implementation, vlm.config.text_config._attn_implementation) == \
        ("grouped_mm", "sdpa")


def test_a_text_config_without_a_learned_profile_is_refused(tmp_path):
    assert_refused_without_text_profile(CUT, tmp_path, num_hidden_layers=3)


@pytest.mark.torch
def test_the_learned_idle_parameters_are_the_indexer_s():
    """MistralLarge4TextIndexer runs under torch.no_grad (modeling_mistral_large4.py: its forward is decorated so, and
    the attention calls it inside `with torch.no_grad()`), so its parameters get no gradient and AdamW no state. What
    `hpcmem models learn` measured on the trace (`LayerKind.idle`, `idle_linears`) is the meta model's indexer
    modules, counted here on MistralLarge4ForConditionalGeneration: 52,322,944 parameters on the cut's two layers;
    the full fine-tuning states leave them out, and LoRA all-linear's adapters on the indexer's linears
    (r·(in + out) each, Hu et al. 2021) train no more than they."""
    pytest.importorskip("torch")
    from hpcmem.estimate.lora import lora_layout
    from hpcmem.estimate.states import model_states, param_parts
    from hpcmem.job.shape import precision

    model = meta_image_text_model(json.loads(CUT.read_text()))
    indexers = [(path, m) for path, m in model.named_modules() if type(m).__name__ == "MistralLarge4TextIndexer"]
    params = sum(p.numel() for _, m in indexers for p in m.parameters())
    linears = {f"{path}.{n}".split("layers.", 1)[1].split(".", 1)[1]: x for path, m in indexers
               for n, x in m.named_modules() if type(x).__name__ == "Linear"}
    assert params == 52_322_944 and len(indexers) == 2
    job = _job(448, 448)
    p = job.model.learned
    assert sum(p.kinds[k].idle for k in p.layer_kinds) == params
    assert {name for k in p.layer_kinds for name in p.kinds[k].idle_linears} == set(linears) == {
        "self_attn.indexer.wq_b", "self_attn.indexer.wk", "self_attn.indexer.weights_proj"}
    full = model_states(job, precision(job), lora_layout(job))
    assert full.gradients == (param_parts(job.model).total - params) * 2
    assert full.optimizer == (param_parts(job.model).total - params) * 2 * 2
    lora_job = _job(448, 448, use_peft=True, lora_target_modules="all-linear", lora_r=16)
    lora = lora_layout(lora_job)
    assert lora.idle_params == 16 * sum(x.in_features + x.out_features for x in linears.values()) * len(indexers)
