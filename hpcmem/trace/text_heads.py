"""Causal-LM classes for the text parts of image-text types whose text config transformers maps to none, so that
`hpcmem models learn` can trace their decoder the way the image-text model runs it on text rows.

Cosmos3 Edge (transformers 5.24 models/cosmos3_edge/modeling_cosmos3_edge.py): `cosmos3_edge_text` maps to
`Cosmos3EdgeTextModel` in AutoModel only (auto/modeling_auto.py, no causal-LM entry). What
`Cosmos3EdgeForConditionalGeneration` (Qwen2VLForConditionalGeneration's forward) runs on a text row is
`Cosmos3EdgeTextModel` (its `model.language_model`) and then `lm_head` (nn.Linear(hidden, vocab, bias=False)) on the
kept positions and `self.loss_function` — what LlamaForCausalLM.forward does around its decoder. The class below is
that: transformers' own `Cosmos3EdgeTextModel` under LlamaForCausalLM's forward, registered with
AutoModelForCausalLM only inside hpcmem's trace processes (`register`); no other code of it is hpcmem's.

DeepSeek-OCR 2 (models/deepseek_ocr2/modeling_deepseek_ocr2.py): `deepseek_ocr2_text` maps to no model class at all
(auto/auto_mappings.py names its config only). `DeepseekOcr2ForConditionalGeneration.forward` runs on a text row its
`model.language_model` (`DeepseekOcr2TextModel`: DeepSeek-V2's decoder with Llama's multi-head attention and
cos/sin RoPE), `lm_head` (untied: DeepseekOcr2Config.tie_word_embeddings False) on the kept positions and
`self.loss_function` (no router aux loss) — LlamaForCausalLM.forward around the decoder.

Unlimited-OCR (models/unlimited_ocr/modular_unlimited_ocr.py): `unlimited_ocr_text` likewise maps to no model class.
`UnlimitedOcrForConditionalGeneration.forward` runs on a text row `UnlimitedOcrTextModel` (DeepSeek-OCR 2's decoder
whose layers take the reference sliding-window mask: with no cache, causal over every earlier token, always
materialised), its untied `lm_head` on the kept positions and `self.loss_function` — again LlamaForCausalLM.forward
around the decoder.

ERNIE-4.5-VL (models/ernie4_5_vl_moe/modular_ernie4_5_vl_moe.py): `ernie4_5_vl_moe_text` maps to no class in
transformers' auto mappings. What `Ernie4_5_VLMoeForConditionalGeneration` (Glm4vForConditionalGeneration's layout,
its own forward) runs on a text row is `Ernie4_5_VLMoeTextModel` (`model.language_model`) with no
moe_mm_token_type_ids, so every token through the text experts (`Ernie4_5_VLMoeMoeBlock.forward`'s else branch), then
`lm_head` (nn.Linear(hidden, vocab, bias=False), tied to the token embeddings by the outer
tie_word_embeddings, True by default) on the kept positions and `self.loss_function` (the router's aux loss only under
output_router_logits, False by default) — again LlamaForCausalLM.forward around the decoder.

GLM-5.3-Flash (models/glm5_next/modeling_glm5_next.py): `glm5_next_text` maps to `Glm5NextTextModel` in AutoModel
only. What `Glm5NextForConditionalGeneration.forward` runs on a text row is `Glm5NextTextModel` (its
`model.language_model`, through `Glm5NextModel.forward`), then `lm_head` (nn.Linear(hidden, vocab, bias=False), untied
by default: Glm5NextConfig.tie_word_embeddings False) on the kept positions and `self.loss_function`; the router's
load-balancing loss only when output_router_logits, which TRL turns off at router_aux_loss_coef 0 (the one setting
the type trains with: hpcmem/models/coverage.json "requires"). The class below is that, under LlamaForCausalLM's
forward, as for Cosmos3 Edge.

Mistral 4 (models/mistral4/modeling_mistral4.py): transformers 5.24 maps `mistral4` to `Mistral4ForCausalLM` in the
image-text-to-text mapping only (auto/modeling_auto.py), though that class is a text decoder with no image input.
TRL's create_model_from_path (trl/trainer/utils.py) builds `getattr(transformers, config.architectures[0])`, that
class itself; `register` maps Mistral4Config to it for AutoModelForCausalLM, so the trace builds what TRL trains.

HunYuanVL (models/hunyuan_vl/modeling_hunyuan_vl.py): `hunyuan_vl_text` maps to `HunYuanVLTextModel` in AutoModel only
likewise. `HunYuanVLForConditionalGeneration.forward` runs it (`model.language_model`; on a text row
`compute_3d_position_ids` returns None and the text model lays the sequence positions on every M-RoPE axis) and then
`lm_head` (nn.Linear(hidden, vocab, bias=False), tied to the token embeddings: `_tied_weights_keys`) and
`self.loss_function`: transformers' own `HunYuanVLTextModel` under LlamaForCausalLM's forward, tied the same way.

HY-V4-VL (models/hy_v4_vl/modular_hy_v4_vl.py): `hy_v4_vl_text` maps to `HYV4VLTextModel` in AutoModel only.
`HYV4VLForConditionalGeneration.forward` runs it and then its fp32 `lm_head` (nn.Linear(hidden, vocab, bias=False,
dtype=torch.float32), `_keep_in_fp32_modules_strict`) on the hidden states cast to fp32, and `self.loss_function` —
what HYV4ForCausalLM.forward does around HYV4Model: transformers' own `HYV4VLTextModel` under HYV4ForCausalLM's
forward, with the same fp32 head, untied (HYV4VLConfig.tie_word_embeddings False).

Molmo2 (models/molmo2/modeling_molmo2.py): `molmo2_text` maps to `Molmo2TextModel` in AutoModel only.
`Molmo2ForConditionalGeneration.forward` runs `Molmo2TextModel` (its `model.language_model`: an embedding of
vocab_size + additional_vocab_size rows) and then its own `lm_head` (nn.Linear(hidden, vocab_size, bias=False): the
base vocabulary only) on the kept positions and `self.loss_function`; the class below is that, likewise.

Step 3.7 Flash (models/step3p7/modeling_step3p7.py): its text config's model_type `step3p5` (Step3p7TextConfig) maps
to no model class in transformers' auto mappings. `Step3p7ForConditionalGeneration.forward` runs on a text row
`Step3p7TextModel` (its `model.language_model`, through `Step3p7Model.forward`), then `lm_head` (nn.Linear(hidden,
vocab, bias=False), untied: Step3p7Config declares no tie_word_embeddings) on the kept positions and
`self.loss_function`; the class below is that, under LlamaForCausalLM's forward, taking the experts' implementation
transformers picks for the text model's module, as Mistral Large 4's does.

Mistral Large 4 (models/mistral_large4/modeling_mistral_large4.py): `mistral_large4_text` maps to
`MistralLarge4TextModel` in AutoModel only. `MistralLarge4ForConditionalGeneration.forward` runs on a text row its
`model.language_model` (MistralLarge4TextModel), `lm_head` (untied: MistralLarge4Config.tie_word_embeddings False)
on the kept positions, the final logit softcapping (logits / cap → tanh → · cap, cap the text config's
final_logit_softcapping) and `self.loss_function` — what Gemma2ForCausalLM.forward does around its decoder (it reads
`config.final_logit_softcapping` the same way). TRL's fused LM head (trl/trainer/utils.py `add_fused_lm_head`) runs
neither forward's head: it reads the backbone (`base_model`, here `model`), `get_output_embeddings` and the text
config's final_logit_softcapping, alike for both classes.

Mistral 4 (models/mistral4/modeling_mistral4.py): transformers 5.24 maps `mistral4` to `Mistral4ForCausalLM` in the
image-text-to-text mapping only (auto/modeling_auto.py), though that class is a text decoder with no image input.
TRL's create_model_from_path (trl/trainer/utils.py) builds `getattr(transformers, config.architectures[0])`, that
class itself; `register` maps Mistral4Config to it for AutoModelForCausalLM, so the trace builds what TRL trains.

Muse Glimmer (models/muse_glimmer/modeling_muse_glimmer.py): `muse_glimmer_text` maps to `MuseGlimmerTextModel` in
AutoModel only. `MuseGlimmerForConditionalGeneration.forward` runs `MuseGlimmerModel` (on a text row: the token ids
with image/video ids zeroed, a clone, `language_model` = MuseGlimmerTextModel) and then `lm_head`
(nn.Linear(hidden, vocab, bias=False), untied unless the outer config.json sets tie_word_embeddings) with its
`output_multiplier` and tanh softcap. TRL trains through its fused head instead (trl/trainer/utils.py
`add_fused_lm_head`: the backbone's last_hidden_state, then the head in tiles with `final_logit_softcapping` and
`output_multiplier` read from the text config), which is the same on the class below: transformers'
`MuseGlimmerTextModel` under LlamaForCausalLM's forward, registered the same way.

Muse Spark (models/muse_spark/modeling_muse_spark.py): `muse_spark_text` maps to `MuseSparkTextModel` in AutoModel
only; `MuseSparkForConditionalGeneration` is Muse Glimmer's forward with an MoE decoder (its head never tied:
`_tied_weights_keys` deleted) and TRL's fused head reads the same two text config fields. The class below is
transformers' `MuseSparkTextModel` under LlamaForCausalLM's forward (`output_router_logits` is False by default, and
the fused head asks for router logits only when the config does), registered the same way, and taking the
experts' implementation transformers picks for the text model's module, as Mistral Large 4's does.

Chameleon (models/chameleon/modeling_chameleon.py): ChameleonConfig is the decoder's config itself (no text config
class) and maps to `ChameleonForConditionalGeneration` in the image-text-to-text mapping only; hpcmem names its
decoder's config `chameleon_text` (ChameleonConfig under that model_type, registered with AutoConfig beside the class
below), so that the text part is not taken for the image-text type. What it runs on a text
row is `ChameleonModel` (its `model`: embed_tokens, the layers, norm; `get_image_features` and so `vqmodel` only when
pixel_values are given), `lm_head` (untied: ChameleonConfig.tie_word_embeddings False), the image-code columns of the
logits set to the dtype's minimum and `self.loss_function`; TRL's fused LM head runs the backbone and the head in tiles
instead (trl/trainer/utils.py `add_fused_lm_head`), no masking. The class below is `ChameleonModel` with its
`vqmodel` deleted (the image path's, hpcmem.models.chameleon, counted there) under LlamaForCausalLM's forward.
Emu3 (models/emu3/modeling_emu3.py): `emu3_text_model` (Emu3TextConfig) maps to no causal-LM class (auto's `emu3` entry
is the outer Emu3Config's). `Emu3ForConditionalGeneration.forward` runs on a text row `Emu3TextModel` (its
`model.text_model`), `lm_head` (nn.Linear(hidden, vocab, bias=False), untied: Emu3Config.tie_word_embeddings False)
and `self.loss_function` — what transformers' own `Emu3ForCausalLM` (config Emu3TextConfig) does around the same
Emu3TextModel; `register` maps Emu3TextConfig to that class, as Mistral4Config to Mistral4ForCausalLM.
"""

# no `from __future__ import annotations`: PreTrainedModel reads the class body's `config` annotation as a class

from importlib import import_module
from typing import Any, NamedTuple

# model_types (text configs, mistral4) AutoModelForCausalLM builds only after `register`
TEXT_ONLY_TYPES = ("chameleon_text", "cosmos3_edge_text", "deepseek_ocr2_text", "ernie4_5_vl_moe_text", "glm5_next_text",
                   "hunyuan_vl_text", "hy_v4_vl_text", "mistral4", "mistral_large4_text", "molmo2_text",
                   "muse_glimmer_text", "muse_spark_text", "step3p5", "unlimited_ocr_text", "emu3_text_model")
_DONE: list[bool] = []
LLAMA_FORWARD = "transformers.models.llama.modeling_llama.LlamaForCausalLM"


class TextHead(NamedTuple):
    """One causal-LM class to build: transformers' text model `model` (its config `config`, its pretrained base
    `pretrained`, all in `module`'s configuration_/modeling_ files) under the forward of `forward` (a dotted class
    path) with an nn.Linear(hidden, vocab, bias=False) head, as the paragraphs above say per type."""

    name: str
    module: str
    config: str
    model: str
    pretrained: str
    forward: str = LLAMA_FORWARD
    base_model_prefix: bool = False     # the pretrained base names another prefix than `model`
    tied_keys: bool = True              # the head may be tied to the token embeddings (MuseSpark's never is)
    experts: bool = False               # take the experts implementation transformers picks for the text model's
    #                                     module (grouped_mm): modeling_utils.py `_can_set_experts_implementation`
    #                                     scans the class's own module source for the decorator, which this module
    #                                     does not hold, so the class would otherwise run the eager per-expert loop
    fp32_head: bool = False             # HY-V4-VL's lm_head, kept in fp32 (`_keep_in_fp32_modules_strict`)
    drop: tuple[str, ...] = ()          # submodules of the text model deleted once built: Chameleon's vqmodel
    text_type: str = ""                 # the model_type `config` is registered under for its text part (Chameleon's
    #                                     config is the image-text type's own); "": the config's own


HEADS = (
    TextHead("Cosmos3EdgeTextForCausalLM", "cosmos3_edge", "Cosmos3EdgeTextConfig", "Cosmos3EdgeTextModel",
             "Cosmos3EdgePreTrainedModel"),
    TextHead("DeepseekOcr2TextForCausalLM", "deepseek_ocr2", "DeepseekOcr2TextConfig", "DeepseekOcr2TextModel",
             "DeepseekOcr2TextPreTrainedModel", base_model_prefix=True, experts=True),
    TextHead("UnlimitedOcrTextForCausalLM", "unlimited_ocr", "UnlimitedOcrTextConfig", "UnlimitedOcrTextModel",
             "UnlimitedOcrTextPreTrainedModel", base_model_prefix=True, experts=True),
    TextHead("Ernie4_5_VLMoeTextForCausalLM", "ernie4_5_vl_moe", "Ernie4_5_VLMoeTextConfig",
             "Ernie4_5_VLMoeTextModel", "Ernie4_5_VLMoePreTrainedModel", base_model_prefix=True, experts=True),
    TextHead("Molmo2TextForCausalLM", "molmo2", "Molmo2TextConfig", "Molmo2TextModel", "Molmo2PreTrainedModel",
             base_model_prefix=True),
    TextHead("Glm5NextTextForCausalLM", "glm5_next", "Glm5NextTextConfig", "Glm5NextTextModel",
             "Glm5NextPreTrainedModel"),
    TextHead("HunYuanVLTextForCausalLM", "hunyuan_vl", "HunYuanVLTextConfig", "HunYuanVLTextModel",
             "HunYuanVLPreTrainedModel"),
    TextHead("HYV4VLTextForCausalLM", "hy_v4_vl", "HYV4VLTextConfig", "HYV4VLTextModel", "HYV4VLPreTrainedModel",
             forward="transformers.models.hy_v4.modeling_hy_v4.HYV4ForCausalLM", experts=True, fp32_head=True),
    TextHead("Step3p7TextForCausalLM", "step3p7", "Step3p7TextConfig", "Step3p7TextModel", "Step3p7PreTrainedModel",
             experts=True),
    TextHead("MistralLarge4TextForCausalLM", "mistral_large4", "MistralLarge4TextConfig", "MistralLarge4TextModel",
             "MistralLarge4PreTrainedModel", forward="transformers.models.gemma2.modeling_gemma2.Gemma2ForCausalLM",
             experts=True),
    TextHead("MuseGlimmerTextForCausalLM", "muse_glimmer", "MuseGlimmerTextConfig", "MuseGlimmerTextModel",
             "MuseGlimmerPreTrainedModel"),
    TextHead("MuseSparkTextForCausalLM", "muse_spark", "MuseSparkTextConfig", "MuseSparkTextModel",
             "MuseSparkPreTrainedModel", tied_keys=False, experts=True),
    TextHead("ChameleonTextForCausalLM", "chameleon", "ChameleonConfig", "ChameleonModel",
             "ChameleonPreTrainedModel", drop=("vqmodel",), text_type="chameleon_text"),
)


def _attr(path: str) -> Any:
    module, _, name = path.rpartition(".")
    return getattr(import_module(module), name)


def build(head: TextHead) -> tuple[Any, Any]:
    """(config class, causal-LM class) of one TextHead: the class PreTrainedModel subclasses are built as, made with
    `type` so that every head is the same code."""
    import torch
    from torch import nn
    from transformers.generation import GenerationMixin

    base = f"transformers.models.{head.module}"
    config = _attr(f"{base}.configuration_{head.module}.{head.config}")
    text_model = _attr(f"{base}.modeling_{head.module}.{head.model}")
    pretrained = _attr(f"{base}.modeling_{head.module}.{head.pretrained}")
    if head.text_type:
        config = type(f"{head.config}Text", (config,), {"__module__": __name__, "model_type": head.text_type})
    dtype = {"dtype": torch.float32} if head.fp32_head else {}

    def __init__(self: Any, config: Any) -> None:
        pretrained.__init__(self, config)       # the next class in the MRO, what super() would call
        self.model = text_model(config)
        for name in head.drop:
            delattr(self.model, name)
        self.vocab_size = config.vocab_size
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False, **dtype)
        self.post_init()

    body: dict[str, Any] = {"__module__": __name__, "__qualname__": head.name, "__annotations__": {"config": config},
                            "__doc__": f"{head.model} and the head its image-text model puts on it, under "
                                       f"{head.forward.rpartition('.')[2]}'s forward (hpcmem.trace.text_heads).",
                            "config_class": config, "input_modalities": ("text",), "__init__": __init__,
                            "forward": _attr(head.forward).forward}
    if head.base_model_prefix:
        body["base_model_prefix"] = "model"
    if head.tied_keys:
        body["_tied_weights_keys"] = {"lm_head.weight": "model.embed_tokens.weight"}
    if head.fp32_head:
        body["_keep_in_fp32_modules_strict"] = [*pretrained._keep_in_fp32_modules_strict, "lm_head"]
    cls = type(head.name, (pretrained, GenerationMixin), body)
    if head.experts:
        cls._can_set_experts_implementation_cached_value = text_model._can_set_experts_implementation()
    return config, cls


def register() -> None:
    """Register the classes above with AutoModelForCausalLM (once per process)."""
    if _DONE:
        return
    from transformers import AutoModelForCausalLM
    from transformers.models.mistral4.configuration_mistral4 import Mistral4Config
    from transformers.models.mistral4.modeling_mistral4 import Mistral4ForCausalLM
    from transformers.models.emu3.configuration_emu3 import Emu3TextConfig
    from transformers.models.emu3.modeling_emu3 import Emu3ForCausalLM

    from transformers import AutoConfig

    for config, model in (*(build(head) for head in HEADS), (Mistral4Config, Mistral4ForCausalLM),
                          (Emu3TextConfig, Emu3ForCausalLM)):
        if config.model_type in TEXT_ONLY_TYPES and config.__module__ == __name__:
            AutoConfig.register(config.model_type, config, exist_ok=True)
        AutoModelForCausalLM.register(config, model, exist_ok=True)
    _DONE.append(True)
