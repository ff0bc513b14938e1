"""Causal-LM classes for the text parts of image-text types whose text config transformers maps to none, so that
`hpcmem models learn` can trace their decoder the way the image-text model runs it on text rows.

Cosmos3 Edge (transformers 5.24 models/cosmos3_edge/modeling_cosmos3_edge.py): `cosmos3_edge_text` maps to
`Cosmos3EdgeTextModel` in AutoModel only (auto/modeling_auto.py, no causal-LM entry). What
`Cosmos3EdgeForConditionalGeneration` (Qwen2VLForConditionalGeneration's forward) runs on a text row is
`Cosmos3EdgeTextModel` (its `model.language_model`) and then `lm_head` (nn.Linear(hidden, vocab, bias=False)) on the
kept positions and `self.loss_function` — what LlamaForCausalLM.forward does around its decoder. The class below is
that: transformers' own `Cosmos3EdgeTextModel` under LlamaForCausalLM's forward, registered with
AutoModelForCausalLM only inside hpcmem's trace processes (`register`); no other code of it is hpcmem's.

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
the fused head asks for router logits only when the config does), registered the same way.
"""

# no `from __future__ import annotations`: PreTrainedModel reads the class body's `config` annotation as a class

from typing import Any

# text config model_type → the causal-LM class `register` builds for it
TEXT_ONLY_TYPES = ("cosmos3_edge_text", "muse_glimmer_text", "muse_spark_text")
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
        # modeling_utils.py `_can_set_experts_implementation` looks for "@use_experts_implementation" in the source of
        # the class's module, which here is hpcmem's: without this the experts would fall back to their eager loop,
        # where MuseSparkForConditionalGeneration (modeling_muse_spark.py holds the decorator) runs grouped_mm
        _can_set_experts_implementation_cached_value = True

        def __init__(self, config: MuseSparkTextConfig) -> None:
            super().__init__(config)
            self.model = MuseSparkTextModel(config)
            self.vocab_size = config.vocab_size
            self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
            self.post_init()

        forward = LlamaForCausalLM.forward

    return MuseSparkTextConfig, MuseSparkTextForCausalLM


def register() -> None:
    """Register the classes above with AutoModelForCausalLM (once per process)."""
    if _DONE:
        return
    from transformers import AutoModelForCausalLM

    for build in (_cosmos3_edge_text_lm, _muse_glimmer_text_lm, _muse_spark_text_lm):
        config, model = build()
        AutoModelForCausalLM.register(config, model, exist_ok=True)
    _DONE.append(True)
