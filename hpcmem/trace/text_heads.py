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
"""

# no `from __future__ import annotations`: PreTrainedModel reads the class body's `config` annotation as a class

from typing import Any

# model_types (text configs, mistral4) AutoModelForCausalLM builds only after `register`
TEXT_ONLY_TYPES = ("cosmos3_edge_text", "deepseek_ocr2_text", "ernie4_5_vl_moe_text", "glm5_next_text",
                   "hunyuan_vl_text", "hy_v4_vl_text", "mistral4", "mistral_large4_text", "molmo2_text",
                   "muse_glimmer_text", "muse_spark_text", "step3p5", "unlimited_ocr_text")
_DONE: list[bool] = []


def _cosmos3_edge_text_lm() -> tuple[Any, Any]:
    from torch import nn
    from transformers.generation import GenerationMixin
    from transformers.models.cosmos3_edge.configuration_cosmos3_edge import Cosmos3EdgeTextConfig
    from transformers.models.cosmos3_edge.modeling_cosmos3_edge import (Cosmos3EdgePreTrainedModel,
                                                                        Cosmos3EdgeTextModel)
    from transformers.models.llama.modeling_llama import LlamaForCausalLM

    class Cosmos3EdgeTextForCausalLM(Cosmos3EdgePreTrainedModel, GenerationMixin):
        """Cosmos3EdgeTextModel and the head Cosmos3EdgeForConditionalGeneration puts on it (untied by default:
        Cosmos3EdgeConfig.tie_word_embeddings False), under LlamaForCausalLM's forward."""

        config: Cosmos3EdgeTextConfig
        config_class = Cosmos3EdgeTextConfig
        _tied_weights_keys = {"lm_head.weight": "model.embed_tokens.weight"}
        input_modalities = ("text",)

        def __init__(self, config: Cosmos3EdgeTextConfig) -> None:
            super().__init__(config)
            self.model = Cosmos3EdgeTextModel(config)
            self.vocab_size = config.vocab_size
            self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
            self.post_init()

        forward = LlamaForCausalLM.forward

    return Cosmos3EdgeTextConfig, Cosmos3EdgeTextForCausalLM


def _deepseek_ocr2_text_lm() -> tuple[Any, Any]:
    from torch import nn
    from transformers.generation import GenerationMixin
    from transformers.models.deepseek_ocr2.configuration_deepseek_ocr2 import DeepseekOcr2TextConfig
    from transformers.models.deepseek_ocr2.modeling_deepseek_ocr2 import (DeepseekOcr2TextModel,
                                                                          DeepseekOcr2TextPreTrainedModel)
    from transformers.models.llama.modeling_llama import LlamaForCausalLM

    class DeepseekOcr2TextForCausalLM(DeepseekOcr2TextPreTrainedModel, GenerationMixin):
        """DeepseekOcr2TextModel and the untied head DeepseekOcr2ForConditionalGeneration puts on it, under
        LlamaForCausalLM's forward."""

        config: DeepseekOcr2TextConfig
        config_class = DeepseekOcr2TextConfig
        base_model_prefix = "model"
        _tied_weights_keys = {"lm_head.weight": "model.embed_tokens.weight"}
        input_modalities = ("text",)

        def __init__(self, config: DeepseekOcr2TextConfig) -> None:
            super().__init__(config)
            self.model = DeepseekOcr2TextModel(config)
            self.vocab_size = config.vocab_size
            self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
            self.post_init()

        forward = LlamaForCausalLM.forward

    # as for Mistral Large 4's class above: the experts' implementation the text model's module picks (grouped_mm)
    DeepseekOcr2TextForCausalLM._can_set_experts_implementation_cached_value = \
        DeepseekOcr2TextModel._can_set_experts_implementation()
    return DeepseekOcr2TextConfig, DeepseekOcr2TextForCausalLM


def _unlimited_ocr_text_lm() -> tuple[Any, Any]:
    from torch import nn
    from transformers.generation import GenerationMixin
    from transformers.models.llama.modeling_llama import LlamaForCausalLM
    from transformers.models.unlimited_ocr.configuration_unlimited_ocr import UnlimitedOcrTextConfig
    from transformers.models.unlimited_ocr.modeling_unlimited_ocr import (UnlimitedOcrTextModel,
                                                                          UnlimitedOcrTextPreTrainedModel)

    class UnlimitedOcrTextForCausalLM(UnlimitedOcrTextPreTrainedModel, GenerationMixin):
        """UnlimitedOcrTextModel and the untied head UnlimitedOcrForConditionalGeneration puts on it, under
        LlamaForCausalLM's forward."""

        config: UnlimitedOcrTextConfig
        config_class = UnlimitedOcrTextConfig
        base_model_prefix = "model"
        _tied_weights_keys = {"lm_head.weight": "model.embed_tokens.weight"}
        input_modalities = ("text",)

        def __init__(self, config: UnlimitedOcrTextConfig) -> None:
            super().__init__(config)
            self.model = UnlimitedOcrTextModel(config)
            self.vocab_size = config.vocab_size
            self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
            self.post_init()

        forward = LlamaForCausalLM.forward

    UnlimitedOcrTextForCausalLM._can_set_experts_implementation_cached_value = \
        UnlimitedOcrTextModel._can_set_experts_implementation()
    return UnlimitedOcrTextConfig, UnlimitedOcrTextForCausalLM


def _ernie4_5_vl_moe_text_lm() -> tuple[Any, Any]:
    from torch import nn
    from transformers.generation import GenerationMixin
    from transformers.models.ernie4_5_vl_moe.configuration_ernie4_5_vl_moe import Ernie4_5_VLMoeTextConfig
    from transformers.models.ernie4_5_vl_moe.modeling_ernie4_5_vl_moe import (Ernie4_5_VLMoePreTrainedModel,
                                                                              Ernie4_5_VLMoeTextModel)
    from transformers.models.llama.modeling_llama import LlamaForCausalLM

    class Ernie4_5_VLMoeTextForCausalLM(Ernie4_5_VLMoePreTrainedModel, GenerationMixin):
        """Ernie4_5_VLMoeTextModel and the head Ernie4_5_VLMoeForConditionalGeneration puts on it (tied when the
        text config's tie_word_embeddings says so, as the outer config's), under LlamaForCausalLM's forward."""

        config: Ernie4_5_VLMoeTextConfig
        config_class = Ernie4_5_VLMoeTextConfig
        base_model_prefix = "model"
        _tied_weights_keys = {"lm_head.weight": "model.embed_tokens.weight"}
        input_modalities = ("text",)

        def __init__(self, config: Ernie4_5_VLMoeTextConfig) -> None:
            super().__init__(config)
            self.model = Ernie4_5_VLMoeTextModel(config)
            self.vocab_size = config.vocab_size
            self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
            self.post_init()

        forward = LlamaForCausalLM.forward

    # as for Mistral Large 4's class below: the experts' implementation transformers picks for the text model's module
    # (grouped_mm), not the eager per-expert loop a class defined here would get
    Ernie4_5_VLMoeTextForCausalLM._can_set_experts_implementation_cached_value = \
        Ernie4_5_VLMoeTextModel._can_set_experts_implementation()
    return Ernie4_5_VLMoeTextConfig, Ernie4_5_VLMoeTextForCausalLM


def _molmo2_text_lm() -> tuple[Any, Any]:
    from torch import nn
    from transformers.generation import GenerationMixin
    from transformers.models.llama.modeling_llama import LlamaForCausalLM
    from transformers.models.molmo2.configuration_molmo2 import Molmo2TextConfig
    from transformers.models.molmo2.modeling_molmo2 import Molmo2PreTrainedModel, Molmo2TextModel

    class Molmo2TextForCausalLM(Molmo2PreTrainedModel, GenerationMixin):
        """Molmo2TextModel and the head Molmo2ForConditionalGeneration puts on it (vocab_size columns, untied by
        default: Molmo2Config.tie_word_embeddings False), under LlamaForCausalLM's forward."""

        config: Molmo2TextConfig
        config_class = Molmo2TextConfig
        base_model_prefix = "model"
        _tied_weights_keys = {"lm_head.weight": "model.embed_tokens.weight"}
        input_modalities = ("text",)

        def __init__(self, config: Molmo2TextConfig) -> None:
            super().__init__(config)
            self.model = Molmo2TextModel(config)
            self.vocab_size = config.vocab_size
            self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
            self.post_init()

        forward = LlamaForCausalLM.forward

    return Molmo2TextConfig, Molmo2TextForCausalLM


def _glm5_next_text_lm() -> tuple[Any, Any]:
    from torch import nn
    from transformers.generation import GenerationMixin
    from transformers.models.glm5_next.configuration_glm5_next import Glm5NextTextConfig
    from transformers.models.glm5_next.modeling_glm5_next import Glm5NextPreTrainedModel, Glm5NextTextModel
    from transformers.models.llama.modeling_llama import LlamaForCausalLM

    class Glm5NextTextForCausalLM(Glm5NextPreTrainedModel, GenerationMixin):
        """Glm5NextTextModel and the head Glm5NextForConditionalGeneration puts on it, under LlamaForCausalLM's
        forward."""

        config: Glm5NextTextConfig
        config_class = Glm5NextTextConfig
        _tied_weights_keys = {"lm_head.weight": "model.embed_tokens.weight"}
        input_modalities = ("text",)

        def __init__(self, config: Glm5NextTextConfig) -> None:
            super().__init__(config)
            self.model = Glm5NextTextModel(config)
            self.vocab_size = config.vocab_size
            self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
            self.post_init()

        forward = LlamaForCausalLM.forward

    return Glm5NextTextConfig, Glm5NextTextForCausalLM


def _hunyuan_vl_text_lm() -> tuple[Any, Any]:
    from torch import nn
    from transformers.generation import GenerationMixin
    from transformers.models.hunyuan_vl.configuration_hunyuan_vl import HunYuanVLTextConfig
    from transformers.models.hunyuan_vl.modeling_hunyuan_vl import HunYuanVLPreTrainedModel, HunYuanVLTextModel
    from transformers.models.llama.modeling_llama import LlamaForCausalLM

    class HunYuanVLTextForCausalLM(HunYuanVLPreTrainedModel, GenerationMixin):
        """HunYuanVLTextModel and the head HunYuanVLForConditionalGeneration puts on it (tied by default:
        HunYuanVLConfig.tie_word_embeddings True), under LlamaForCausalLM's forward."""

        config: HunYuanVLTextConfig
        config_class = HunYuanVLTextConfig
        _tied_weights_keys = {"lm_head.weight": "model.embed_tokens.weight"}
        input_modalities = ("text",)

        def __init__(self, config: HunYuanVLTextConfig) -> None:
            super().__init__(config)
            self.model = HunYuanVLTextModel(config)
            self.vocab_size = config.vocab_size
            self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
            self.post_init()

        forward = LlamaForCausalLM.forward

    return HunYuanVLTextConfig, HunYuanVLTextForCausalLM


def _hy_v4_vl_text_lm() -> tuple[Any, Any]:
    import torch
    from torch import nn
    from transformers.generation import GenerationMixin
    from transformers.models.hy_v4.modeling_hy_v4 import HYV4ForCausalLM
    from transformers.models.hy_v4_vl.configuration_hy_v4_vl import HYV4VLTextConfig
    from transformers.models.hy_v4_vl.modeling_hy_v4_vl import HYV4VLPreTrainedModel, HYV4VLTextModel

    class HYV4VLTextForCausalLM(HYV4VLPreTrainedModel, GenerationMixin):
        """HYV4VLTextModel and the fp32 head HYV4VLForConditionalGeneration puts on it, under HYV4ForCausalLM's
        forward."""

        config: HYV4VLTextConfig
        config_class = HYV4VLTextConfig
        _tied_weights_keys = {"lm_head.weight": "model.embed_tokens.weight"}
        _keep_in_fp32_modules_strict = [*HYV4VLPreTrainedModel._keep_in_fp32_modules_strict, "lm_head"]
        input_modalities = ("text",)

        def __init__(self, config: HYV4VLTextConfig) -> None:
            super().__init__(config)
            self.model = HYV4VLTextModel(config)
            self.vocab_size = config.vocab_size
            self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False, dtype=torch.float32)
            self.post_init()

        forward = HYV4ForCausalLM.forward

    # as for ERNIE-4.5-VL's class: the experts' implementation transformers picks for the text model's module
    # (modeling_hy_v4_vl.py: grouped_mm), not the eager per-expert loop a class defined here would get
    HYV4VLTextForCausalLM._can_set_experts_implementation_cached_value = \
        HYV4VLTextModel._can_set_experts_implementation()
    return HYV4VLTextConfig, HYV4VLTextForCausalLM


def _step3p5_text_lm() -> tuple[Any, Any]:
    from torch import nn
    from transformers.generation import GenerationMixin
    from transformers.models.llama.modeling_llama import LlamaForCausalLM
    from transformers.models.step3p7.configuration_step3p7 import Step3p7TextConfig
    from transformers.models.step3p7.modeling_step3p7 import Step3p7PreTrainedModel, Step3p7TextModel

    class Step3p7TextForCausalLM(Step3p7PreTrainedModel, GenerationMixin):
        """Step3p7TextModel and the untied head Step3p7ForConditionalGeneration puts on it, under
        LlamaForCausalLM's forward."""

        config: Step3p7TextConfig
        config_class = Step3p7TextConfig
        _tied_weights_keys = {"lm_head.weight": "model.embed_tokens.weight"}
        input_modalities = ("text",)

        def __init__(self, config: Step3p7TextConfig) -> None:
            super().__init__(config)
            self.model = Step3p7TextModel(config)
            self.vocab_size = config.vocab_size
            self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
            self.post_init()

        forward = LlamaForCausalLM.forward

    # as for Mistral Large 4's class: the experts' implementation transformers picks for the text model's module
    Step3p7TextForCausalLM._can_set_experts_implementation_cached_value = \
        Step3p7TextModel._can_set_experts_implementation()
    return Step3p7TextConfig, Step3p7TextForCausalLM


def _mistral_large4_text_lm() -> tuple[Any, Any]:
    from torch import nn
    from transformers.generation import GenerationMixin
    from transformers.models.gemma2.modeling_gemma2 import Gemma2ForCausalLM
    from transformers.models.mistral_large4.configuration_mistral_large4 import MistralLarge4TextConfig
    from transformers.models.mistral_large4.modeling_mistral_large4 import (MistralLarge4PreTrainedModel,
                                                                            MistralLarge4TextModel)

    class MistralLarge4TextForCausalLM(MistralLarge4PreTrainedModel, GenerationMixin):
        """MistralLarge4TextModel and the untied head MistralLarge4ForConditionalGeneration puts on it, under
        Gemma2ForCausalLM's forward (the same final logit softcapping)."""

        config: MistralLarge4TextConfig
        config_class = MistralLarge4TextConfig
        _tied_weights_keys = {"lm_head.weight": "model.embed_tokens.weight"}
        input_modalities = ("text",)

        def __init__(self, config: MistralLarge4TextConfig) -> None:
            super().__init__(config)
            self.model = MistralLarge4TextModel(config)
            self.vocab_size = config.vocab_size
            self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
            self.post_init()

        forward = Gemma2ForCausalLM.forward

    # transformers lets a class choose its experts implementation (grouped_mm by default) only when its module's
    # source text holds the experts-implementation decorator, written with its at sign (modeling_utils.py
    # `_can_set_experts_implementation`, a cached class flag; this comment does not spell it so, or it would pass that
    # check itself); this module uses none, so the class would fall back to eager experts where
    # MistralLarge4ForConditionalGeneration (modeling_mistral_large4.py, which does) runs grouped_mm: the class takes
    # transformers' answer for the text model's module
    MistralLarge4TextForCausalLM._can_set_experts_implementation_cached_value = \
        MistralLarge4TextModel._can_set_experts_implementation()
    return MistralLarge4TextConfig, MistralLarge4TextForCausalLM


def _muse_glimmer_text_lm() -> tuple[Any, Any]:
    from torch import nn
    from transformers.generation import GenerationMixin
    from transformers.models.llama.modeling_llama import LlamaForCausalLM
    from transformers.models.muse_glimmer.configuration_muse_glimmer import MuseGlimmerTextConfig
    from transformers.models.muse_glimmer.modeling_muse_glimmer import (MuseGlimmerPreTrainedModel,
                                                                        MuseGlimmerTextModel)

    class MuseGlimmerTextForCausalLM(MuseGlimmerPreTrainedModel, GenerationMixin):
        """MuseGlimmerTextModel and the head MuseGlimmerForConditionalGeneration puts on it, under
        LlamaForCausalLM's forward (TRL's fused head applies the output multiplier and softcap)."""

        config: MuseGlimmerTextConfig
        config_class = MuseGlimmerTextConfig
        _tied_weights_keys = {"lm_head.weight": "model.embed_tokens.weight"}
        input_modalities = ("text",)

        def __init__(self, config: MuseGlimmerTextConfig) -> None:
            super().__init__(config)
            self.model = MuseGlimmerTextModel(config)
            self.vocab_size = config.vocab_size
            self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
            self.post_init()

        forward = LlamaForCausalLM.forward

    return MuseGlimmerTextConfig, MuseGlimmerTextForCausalLM


def _muse_spark_text_lm() -> tuple[Any, Any]:
    from torch import nn
    from transformers.generation import GenerationMixin
    from transformers.models.llama.modeling_llama import LlamaForCausalLM
    from transformers.models.muse_spark.configuration_muse_spark import MuseSparkTextConfig
    from transformers.models.muse_spark.modeling_muse_spark import MuseSparkPreTrainedModel, MuseSparkTextModel

    class MuseSparkTextForCausalLM(MuseSparkPreTrainedModel, GenerationMixin):
        """MuseSparkTextModel and the untied head MuseSparkForConditionalGeneration puts on it, under
        LlamaForCausalLM's forward (TRL's fused head applies the output multiplier and softcap)."""

        config: MuseSparkTextConfig
        config_class = MuseSparkTextConfig
        input_modalities = ("text",)

        def __init__(self, config: MuseSparkTextConfig) -> None:
            super().__init__(config)
            self.model = MuseSparkTextModel(config)
            self.vocab_size = config.vocab_size
            self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
            self.post_init()

        forward = LlamaForCausalLM.forward

    # as for Mistral Large 4's class: the experts' implementation transformers picks for the text model's module
    # (grouped_mm), not the eager per-expert loop a class defined here would get
    MuseSparkTextForCausalLM._can_set_experts_implementation_cached_value = \
        MuseSparkTextModel._can_set_experts_implementation()
    return MuseSparkTextConfig, MuseSparkTextForCausalLM


def register() -> None:
    """Register the classes above with AutoModelForCausalLM (once per process)."""
    if _DONE:
        return
    from transformers import AutoModelForCausalLM
    from transformers.models.mistral4.configuration_mistral4 import Mistral4Config
    from transformers.models.mistral4.modeling_mistral4 import Mistral4ForCausalLM

    heads = (_cosmos3_edge_text_lm, _deepseek_ocr2_text_lm, _unlimited_ocr_text_lm, _ernie4_5_vl_moe_text_lm,
             _glm5_next_text_lm, _hunyuan_vl_text_lm, _hy_v4_vl_text_lm, _mistral_large4_text_lm, _molmo2_text_lm,
             _muse_glimmer_text_lm, _muse_spark_text_lm, _step3p5_text_lm)
    for config, model in (*(head() for head in heads), (Mistral4Config, Mistral4ForCausalLM)):
        AutoModelForCausalLM.register(config, model, exist_ok=True)
    _DONE.append(True)
