"""Causal-LM classes for the text parts of image-text types whose text config transformers maps to none, so that
`hpcmem models learn` can trace their decoder the way the image-text model runs it on text rows.

Cosmos3 Edge (transformers 5.24 models/cosmos3_edge/modeling_cosmos3_edge.py): `cosmos3_edge_text` maps to
`Cosmos3EdgeTextModel` in AutoModel only (auto/modeling_auto.py, no causal-LM entry). What
`Cosmos3EdgeForConditionalGeneration` (Qwen2VLForConditionalGeneration's forward) runs on a text row is
`Cosmos3EdgeTextModel` (its `model.language_model`) and then `lm_head` (nn.Linear(hidden, vocab, bias=False)) on the
kept positions and `self.loss_function` — what LlamaForCausalLM.forward does around its decoder. The class below is
that: transformers' own `Cosmos3EdgeTextModel` under LlamaForCausalLM's forward, registered with
AutoModelForCausalLM only inside hpcmem's trace processes (`register`); no other code of it is hpcmem's.

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
"""

# no `from __future__ import annotations`: PreTrainedModel reads the class body's `config` annotation as a class

from typing import Any

# model_types (text configs, mistral4) AutoModelForCausalLM builds only after `register`
TEXT_ONLY_TYPES = ("cosmos3_edge_text", "glm5_next_text", "mistral4")
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


def register() -> None:
    """Register the classes above with AutoModelForCausalLM (once per process)."""
    if _DONE:
        return
    from transformers import AutoModelForCausalLM

    from transformers.models.mistral4.configuration_mistral4 import Mistral4Config
    from transformers.models.mistral4.modeling_mistral4 import Mistral4ForCausalLM

    for config, model in (_cosmos3_edge_text_lm(), _glm5_next_text_lm(), (Mistral4Config, Mistral4ForCausalLM)):
        AutoModelForCausalLM.register(config, model, exist_ok=True)
    _DONE.append(True)
