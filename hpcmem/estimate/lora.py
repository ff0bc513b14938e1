"""LoRA / QLoRA: which linears carry adapters, their size, and what their forward keeps for backward.

Adapter size (Hu et al. 2021, "LoRA"): r·(in + out) per adapted linear. Placement follows peft: `lora_target_modules`
names the modules; empty means peft's per-architecture default
(peft TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING); "all-linear" means every nn.Linear of the decoder layers.
Dtypes (MEMORY-FACTS): adapters are fp32 by default (peft autocast_adapter_dtype); with a quantized base TRL casts
trainable parameters to bf16 (sft_trainer.py); DeepSpeed casts the whole module to its 16-bit dtype.
"""

from __future__ import annotations

from dataclasses import dataclass

from hpcmem.estimate.shape import Precision
from hpcmem.spec import JobSpec, ModelSpec

# peft's default targets per model_type (peft/utils/constants.py), for the architectures in the catalog.
PEFT_DEFAULT_TARGETS = {
    "llama": ("q_proj", "v_proj"), "mistral": ("q_proj", "v_proj"), "qwen2": ("q_proj", "v_proj"),
    "qwen3": ("q_proj", "v_proj"), "gemma2": ("q_proj", "v_proj"), "gemma3_text": ("q_proj", "v_proj"),
    "mixtral": ("q_proj", "v_proj"), "qwen2_moe": ("q_proj", "v_proj"), "qwen3_moe": ("q_proj", "v_proj"),
    "phi3": ("qkv_proj",), "olmo2": ("q_proj", "v_proj"),
}
LORA_DROPOUT_MASK_BYTES = 1   # nn.Dropout (TRL's lora_dropout 0.05) keeps a bool mask per input element


def layer_linears(m: ModelSpec) -> dict[str, tuple[int, int]]:
    """nn.Linear modules of one decoder layer: name → (in_features, out_features). Experts stored as fused 3-D
    parameters in transformers 5 are not nn.Linear and take no adapters."""
    h, q, kv = m.hidden_size, m.num_attention_heads * m.head_dim, m.num_key_value_heads * m.head_dim
    out = {"q_proj": (h, q), "k_proj": (h, kv), "v_proj": (h, kv), "o_proj": (q, h)}
    if m.model_type == "phi3":
        out = {"qkv_proj": (h, q + 2 * kv), "o_proj": (q, h)}
    if not m.is_moe:
        if m.model_type == "phi3":
            out.update({"gate_up_proj": (h, 2 * m.intermediate_size), "down_proj": (m.intermediate_size, h)})
        elif m.gated_mlp:
            out.update({"gate_proj": (h, m.intermediate_size), "up_proj": (h, m.intermediate_size),
                        "down_proj": (m.intermediate_size, h)})
        else:
            out.update({"up_proj": (h, m.intermediate_size), "down_proj": (m.intermediate_size, h)})
    return out


@dataclass(frozen=True, kw_only=True)
class LoraLayout:
    enabled: bool
    r: int = 0
    adapted: tuple[tuple[str, int, int], ...] = ()   # (name, in, out) per layer
    adapter_bytes: int = 4
    num_layers: int = 0

    @property
    def params_per_layer(self) -> int:
        return sum(self.r * (i + o) for _, i, o in self.adapted)

    @property
    def num_params(self) -> int:
        return self.params_per_layer * self.num_layers

    def saved_per_layer(self, tokens: int, prec: Precision) -> int:
        """Each adapted linear keeps the dropout mask, its input to lora_A in the compute dtype, and lora_A's
        [tokens, r] output for lora_B (peft/tuners/lora/layer.py Linear.forward)."""
        if not self.enabled:
            return 0
        per_token = sum(i * (LORA_DROPOUT_MASK_BYTES + prec.act) + self.r * prec.act for _, i, _ in self.adapted)
        return per_token * tokens


def lora_layout(job: JobSpec) -> LoraLayout:
    t, m = job.train, job.model
    if not t.use_peft:
        return LoraLayout(enabled=False)
    linears = layer_linears(m)
    targets = t.lora_target_modules or PEFT_DEFAULT_TARGETS.get(m.model_type, ("q_proj", "v_proj"))
    if "all-linear" in targets:
        chosen = list(linears)
    else:
        chosen = [n for n in linears if n in targets]
    if t.quantized or (job.parallel.deepspeed and (t.bf16 or t.fp16)):
        adapter_bytes = 2
    else:
        adapter_bytes = 4
    return LoraLayout(enabled=True, r=t.lora_r, adapted=tuple((n, *linears[n]) for n in chosen),
                      adapter_bytes=adapter_bytes, num_layers=m.num_hidden_layers)
