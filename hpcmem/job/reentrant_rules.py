"""Full fine-tuning that reentrant checkpointing cannot run: a tensor made once from a trainable parameter before the
decoder layers and handed to every one of them as a keyword argument.

transformers' checkpointed layer passes its keyword arguments inside a `functools.partial` and only the positional
ones through the checkpoint (transformers/modeling_layers.py `GradientCheckpointingLayer.__call__`). torch's
reentrant checkpoint detaches the tensors it is given, runs the layer again in its backward and calls
`torch.autograd.backward` on the recomputed outputs (torch/utils/checkpoint.py `CheckpointFunction.backward`). A
keyword tensor that carries a graph keeps it: the last layer's backward runs through that shared graph and frees it,
and the next layer's raises "Trying to backward through the graph a second time". Non-reentrant checkpointing, and
LoRA (the parameter is frozen, so the tensor has no graph), run.

The types: those whose rotary embedding holds an `nn.Parameter` (every `*RotaryEmbedding` class of transformers 5.24's
modeling files that creates one): Mistral Large 4's `MistralLarge4TextRotaryEmbedding.alpha`, a learned scale of
the inverse frequencies, from which `MistralLarge4TextModel.forward` makes `position_embeddings` once for all layers.
The trace of the real code on its cut raises the error for every full fine-tune with use_reentrant True.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from hpcmem.job.protocol import Job

TRAINABLE_ROTARY = frozenset({"mistral_large4", "mistral_large4_text"})


def reentrant_graph_problems(job: Job) -> list[str]:
    t, model_type = job.train, job.model.model_type
    if model_type not in TRAINABLE_ROTARY or t.use_peft or not job.reentrant_checkpointing:
        return []
    return [f"gradient_checkpointing_kwargs use_reentrant True with full fine-tuning of model_type {model_type!r}: its "
            "rotary embedding's trainable alpha makes position_embeddings once for every layer, reentrant "
            "checkpointing runs each layer's backward through that shared graph, and the second layer's raises "
            "'Trying to backward through the graph a second time'; set use_reentrant False or use_peft"]
