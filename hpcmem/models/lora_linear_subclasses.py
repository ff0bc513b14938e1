"""The nn.Linear subclasses of transformers 5.24 that peft 0.21.2's LoRA wraps but cannot run (stdlib).

peft wraps every module that is an nn.Linear — a subclass too — as `lora.Linear` when target_modules (or all-linear,
which takes every nn.Linear but the output layer: peft/tuners/tuners_utils.py `_maybe_include_all_linear_layers`)
reaches it (peft/tuners/lora/model.py `dispatch_default`). `lora.Linear.forward` (peft/tuners/lora/layer.py) calls the
base layer, reads its result's dtype and adds lora_B(lora_A(x)) · scaling, a [..., out_features] tensor, to it: a
subclass whose forward returns something else raises on the first forward.

BROKEN: model_type → leaf name → (the class, what the first forward raises). Every `class …(nn.Linear)` of
transformers' modeling files is either here or in HARMLESS with why (tests/job/test_lora_refusals_torch.py reads the
installed transformers and holds both to it, and runs peft on a tiny model of each BROKEN entry).
"""

from __future__ import annotations

BROKEN: dict[str, dict[str, tuple[str, str]]] = {
    "phimoe": {"router": ("PhimoeTopKRouter", "its forward (modeling_phimoe.py) returns (router_logits, "
                          "routing_weights, selected_experts), and lora.Linear.forward raises AttributeError: 'tuple' "
                          "object has no attribute 'dtype'")},
    "deepseek_v4": {"o_a_proj": ("DeepseekV4GroupedLinear", "its forward (modeling_deepseek_v4.py) multiplies each "
                                 "head group by its block of the weight, so its output is not LoRA's "
                                 "[..., out_features] of its input, and adding the delta raises RuntimeError (the "
                                 "sizes do not match)")},
}

# the other nn.Linear subclasses: why no LoRA job of a type hpcmem estimates breaks on them
HARMLESS: dict[str, str] = {
    "FalconLinear": "falcon: input @ weight.T + bias, nn.Linear's result (peft's LoRA runs on it)",
    "Llama4Router": "llama4/llama4_text: returns a tuple like PhiMoE's router, but hpcmem refuses the type whole "
                    "(hpcmem/models/coverage.json)",
    "DoryLMHead": "dory: the output layer (all-linear leaves it out) of a type hpcmem refuses",
    "EsmFoldLinear": "esm: a protein model, not a type TRL fine-tunes",
    "IdeficsDecoupledLinear": "idefics: a vision-language model hpcmem does not estimate",
}


def broken_leaves(model_type: str) -> dict[str, tuple[str, str]]:
    """Leaf name → (class, why peft's lora.Linear fails on it) for this model type ({} for most)."""
    return BROKEN.get(model_type, {})
