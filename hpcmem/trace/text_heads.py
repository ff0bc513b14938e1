"""Causal-LM classes for the text parts of image-text types whose text config transformers maps to none, so that
`hpcmem models learn` can trace their decoder the way the image-text model runs it on text rows.

Cosmos3 Edge (transformers 5.24 models/cosmos3_edge/modeling_cosmos3_edge.py): `cosmos3_edge_text` maps to
`Cosmos3EdgeTextModel` in AutoModel only (auto/modeling_auto.py, no causal-LM entry). What
`Cosmos3EdgeForConditionalGeneration` (Qwen2VLForConditionalGeneration's forward) runs on a text row is
`Cosmos3EdgeTextModel` (its `model.language_model`) and then `lm_head` (nn.Linear(hidden, vocab, bias=False)) on the
kept positions and `self.loss_function` — what LlamaForCausalLM.forward does around its decoder. The class below is
that: transformers' own `Cosmos3EdgeTextModel` under LlamaForCausalLM's forward, registered with
AutoModelForCausalLM only inside hpcmem's trace processes (`register`); no other code of it is hpcmem's.

Molmo2 (models/molmo2/modeling_molmo2.py): `molmo2_text` maps to `Molmo2TextModel` in AutoModel only.
`Molmo2ForConditionalGeneration.forward` runs `Molmo2TextModel` (its `model.language_model`: an embedding of
vocab_size + additional_vocab_size rows) and then its own `lm_head` (nn.Linear(hidden, vocab_size, bias=False): the
base vocabulary only) on the kept positions and `self.loss_function`; the class below is that, likewise.
"""

# no `from __future__ import annotations`: PreTrainedModel reads the class body's `config` annotation as a class

from typing import Any

# text config model_type → the causal-LM class `register` builds for it
TEXT_ONLY_TYPES = ("cosmos3_edge_text", "molmo2_text")
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


def register() -> None:
    """Register the classes above with AutoModelForCausalLM (once per process)."""
    if _DONE:
        return
    from transformers import AutoModelForCausalLM

    for build in (_cosmos3_edge_text_lm, _molmo2_text_lm):
        config, model = build()
        AutoModelForCausalLM.register(config, model, exist_ok=True)
    _DONE.append(True)
