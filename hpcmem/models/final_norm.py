"""What the final norm's backward brings back under activation offloading, per model type.

TRL's activation offloader (trl/models/activation_offloading.py `unpack_tensor_with_streams`) copies a saved tensor
back to the GPU when an autograd node unpacks it, and frees it only in the post-hook of the next node that unpacks an
offloaded tensor (`prev_node_ids`). Under full checkpointing, the node after the final norm's backward that unpacks one
is the last decoder layer's recompute: the tensor the norm's last node brought back lives through the last layer's
backward. Most decoders' final norm is an RMSNorm that upcasts to fp32 (transformers modeling_llama.py
`LlamaRMSNorm.forward`: `hidden_states.to(torch.float32)`, then `pow(2)`), whose square saves the fp32 input: 4 bytes
per token per hidden unit. The types below bring back something else — a LayerNorm's 16-bit input (2), or several
residual streams (hyper-connections: 8, 16).

Read off the trace (`python -m hpcmem.lab.final_norm_scan`: a one-row SFT step of each type with offloading and
checkpointing, bf16 weights, LoRA on all-linear or — where peft or TRL refuse that on the type — full fine-tuning,
which read the same on the types traced both ways; the bytes an unpack in the LM head's backward phase left alive
when the last layer's backward begins, per token per hidden unit). Types that train only without checkpointing
(cpmant, ctrl, gpt_neox_japanese, jetmoe, openai-gpt) never meet it. A type not listed — and not traced: a model
learned later — takes the fp32 width, which is the common case and over where the type's norm is a LayerNorm.
"""

from __future__ import annotations

# bytes per token per hidden unit at 16-bit weights, where not 4
RESTORED_WIDTH = {
    **dict.fromkeys(("biogpt", "bloom", "codegen", "dbrx", "falcon", "fuyu", "gemma3n", "gemma3n_text", "gpt-sw3",
                     "gpt2", "gpt_bigcode", "gpt_neo", "gpt_neox", "gptj", "jais2", "modernbert-decoder", "mpt",
                     "nemotron", "opt", "persimmon", "phi", "phimoe", "rwkv", "stablelm", "starcoder2", "xglm"), 2),
    "inkling2_text": 8,
    **dict.fromkeys(("deepseek_v4", "hy_v4", "qwen4_exp", "qwen4_exp_text"), 16),
}
FP32 = 4


def restored_width(model_type: str, residual: int) -> int:
    """Bytes per token per hidden unit of what the final norm's backward brought back (see the module docstring); a
    16-bit entry's input is fp32 where the weights are (`residual`: the residual stream's bytes per element)."""
    return max(RESTORED_WIDTH.get(model_type, FP32), residual)
