"""Causal-LM classes for the text parts of image-text types whose text config transformers maps to none, so that
`hpcmem models learn` can trace their decoder the way the image-text model runs it on text rows.

Cosmos3 Edge (transformers 5.24 models/cosmos3_edge/modeling_cosmos3_edge.py): `cosmos3_edge_text` maps to
`Cosmos3EdgeTextModel` in AutoModel only (auto/modeling_auto.py, no causal-LM entry). What
`Cosmos3EdgeForConditionalGeneration` (Qwen2VLForConditionalGeneration's forward) runs on a text row is
`Cosmos3EdgeTextModel` (its `model.language_model`) and then `lm_head` (nn.Linear(hidden, vocab, bias=False)) on the
kept positions and `self.loss_function` — what LlamaForCausalLM.forward does around its decoder. The class below is
that: transformers' own `Cosmos3EdgeTextModel` under LlamaForCausalLM's forward, registered with
AutoModelForCausalLM only inside hpcmem's trace processes (`register`); no other code of it is hpcmem's.

ERNIE-4.5-VL (models/ernie4_5_vl_moe/modular_ernie4_5_vl_moe.py): `ernie4_5_vl_moe_text` maps to no class in
transformers' auto mappings. What `Ernie4_5_VLMoeForConditionalGeneration` (Glm4vForConditionalGeneration's layout,
its own forward) runs on a text row is `Ernie4_5_VLMoeTextModel` (`model.language_model`) with no
moe_mm_token_type_ids, so every token through the text experts (`Ernie4_5_VLMoeMoeBlock.forward`'s else branch), then
`lm_head` (nn.Linear(hidden, vocab, bias=False), tied to the token embeddings by the outer
tie_word_embeddings, True by default) on the kept positions and `self.loss_function` (the router's aux loss only under
output_router_logits, False by default) — again LlamaForCausalLM.forward around the decoder.
"""

# no `from __future__ import annotations`: PreTrainedModel reads the class body's `config` annotation as a class

from typing import Any

# text config model_type → the causal-LM class `register` builds for it
TEXT_ONLY_TYPES = ("cosmos3_edge_text", "ernie4_5_vl_moe_text")
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
        # PreTrainedModel picks the experts' implementation only for a class whose module's source holds
        # "@use_experts_implementation" (modeling_utils.py `_can_set_experts_implementation`), so this class, defined
        # here, would run the eager per-expert loop while Ernie4_5_VLMoeForConditionalGeneration, from
        # modeling_ernie4_5_vl_moe.py, runs `get_correct_experts_implementation`'s default, grouped_mm: the flag the
        # heuristic caches, set to what it finds for the real class
        _can_set_experts_implementation_cached_value = True

        def __init__(self, config: Ernie4_5_VLMoeTextConfig) -> None:
            super().__init__(config)
            self.model = Ernie4_5_VLMoeTextModel(config)
            self.vocab_size = config.vocab_size
            self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
            self.post_init()

        forward = LlamaForCausalLM.forward

    return Ernie4_5_VLMoeTextConfig, Ernie4_5_VLMoeTextForCausalLM


def register() -> None:
    """Register the classes above with AutoModelForCausalLM (once per process)."""
    if _DONE:
        return
    from transformers import AutoModelForCausalLM

    for build in (_cosmos3_edge_text_lm, _ernie4_5_vl_moe_text_lm):
        config, model = build()
        AutoModelForCausalLM.register(config, model, exist_ok=True)
    _DONE.append(True)
