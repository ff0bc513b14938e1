"""Causal-LM classes for the text parts of image-text types whose text config transformers maps to none, so that
`hpcmem models learn` can trace their decoder the way the image-text model runs it on text rows.

Cosmos3 Edge (transformers 5.24 models/cosmos3_edge/modeling_cosmos3_edge.py): `cosmos3_edge_text` maps to
`Cosmos3EdgeTextModel` in AutoModel only (auto/modeling_auto.py, no causal-LM entry). What
`Cosmos3EdgeForConditionalGeneration` (Qwen2VLForConditionalGeneration's forward) runs on a text row is
`Cosmos3EdgeTextModel` (its `model.language_model`) and then `lm_head` (nn.Linear(hidden, vocab, bias=False)) on the
kept positions and `self.loss_function` — what LlamaForCausalLM.forward does around its decoder. The class below is
that: transformers' own `Cosmos3EdgeTextModel` under LlamaForCausalLM's forward, registered with
AutoModelForCausalLM only inside hpcmem's trace processes (`register`); no other code of it is hpcmem's.

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
"""

# no `from __future__ import annotations`: PreTrainedModel reads the class body's `config` annotation as a class

from typing import Any

# text config model_type → the causal-LM class `register` builds for it
TEXT_ONLY_TYPES = ("cosmos3_edge_text", "hunyuan_vl_text", "hy_v4_vl_text")
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
        # modeling_utils.py `_can_set_experts_implementation` reads the class's module source for
        # `@use_experts_implementation`: modeling_hy_v4_vl.py has it, so HYV4VLForConditionalGeneration's experts run
        # grouped_mm; this module has not, which would leave the stand-in's on the eager per-expert loop
        _can_set_experts_implementation_cached_value = True

        def __init__(self, config: HYV4VLTextConfig) -> None:
            super().__init__(config)
            self.model = HYV4VLTextModel(config)
            self.vocab_size = config.vocab_size
            self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False, dtype=torch.float32)
            self.post_init()

        forward = HYV4ForCausalLM.forward

    return HYV4VLTextConfig, HYV4VLTextForCausalLM


def register() -> None:
    """Register the classes above with AutoModelForCausalLM (once per process)."""
    if _DONE:
        return
    from transformers import AutoModelForCausalLM

    for make in (_cosmos3_edge_text_lm, _hunyuan_vl_text_lm, _hy_v4_vl_text_lm):
        config, model = make()
        AutoModelForCausalLM.register(config, model, exist_ok=True)
    _DONE.append(True)
