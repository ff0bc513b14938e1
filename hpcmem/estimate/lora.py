"""LoRA / QLoRA: which linears carry adapters, their size, and what their forward keeps for backward.

Adapter size (Hu et al. 2021, "LoRA"): r·(in + out) per adapted linear. Placement follows peft: `lora_target_modules`
names the modules; empty means peft's per-architecture default
(peft TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING); "all-linear" means every nn.Linear of the decoder layers.
Dtypes (peft and TRL 1.16 source): adapters are fp32 by default (peft autocast_adapter_dtype); with a quantized base
TRL casts trainable parameters to bf16 (sft_trainer.py); DeepSpeed casts the whole module to its 16-bit dtype.
"""

from __future__ import annotations

from dataclasses import dataclass

from hpcmem.estimate.shape import Precision
from hpcmem.models.params import LinearModule, all_linear_targets, linear_modules, peft_default_targets
from hpcmem.spec import JobSpec

LORA_DROPOUT_MASK_BYTES = 1   # nn.Dropout (TRL's lora_dropout 0.05) keeps a bool mask per input element


@dataclass(frozen=True, kw_only=True)
class LoraLayout:
    enabled: bool
    r: int = 0
    adapted: tuple[LinearModule, ...] = ()
    adapter_bytes: int = 4
    num_layers: int = 0
    dropout: bool = True          # lora_dropout active (TRL's 0.05); DPO/Reward's disable_dropout sets p = 0

    @property
    def num_params(self) -> int:
        return sum(self.r * (m.in_features + m.out_features) * m.count_per_layer * m.num_layers
                   for m in self.adapted)

    def matrices(self) -> tuple[tuple[int, int, int], ...]:
        """(rows, columns, how many) of every adapter weight: lora_A is [r, in], lora_B is [out, r]
        (peft/tuners/lora/layer.py `update_layer`: nn.Linear(in, r) and nn.Linear(r, out))."""
        out = []
        for m in self.adapted:
            count = m.count_per_layer * m.num_layers
            out += [(self.r, m.in_features, count), (m.out_features, self.r, count)]
        return tuple(out)

    @property
    def params_per_layer(self) -> int:
        """Adapter parameters of the largest decoder layer (what a per-layer FSDP unit or ZeRO-3 fetch adds)."""
        return sum(self.r * (m.in_features + m.out_features) * m.count_per_layer for m in self.adapted)

    def modules(self, part: str | None = None) -> tuple[LinearModule, ...]:
        """Adapted modules, all or those of one part of the layer ("attention", or "mlp" for MLP/expert linears)."""
        if part is None:
            return self.adapted
        return tuple(m for m in self.adapted if (m.kind == "attention") == (part == "attention"))

    def saved_per_layer(self, tokens: int, prec: Precision, part: str | None = None) -> int:
        """Each adapted linear keeps the dropout mask, its input to lora_A in the compute dtype, and lora_A's
        [tokens, r] output for lora_B (peft/tuners/lora/layer.py Linear.forward)."""
        if not self.enabled:
            return 0
        mask = LORA_DROPOUT_MASK_BYTES if self.dropout else 0
        per_token = sum((m.in_features * (mask + prec.act) + self.r * prec.act)
                        * m.count_per_layer * m.num_layers for m in self.modules(part))
        return per_token * tokens // max(self.num_layers, 1)     # averaged over layers that hold the module


def backward_transient(lora: LoraLayout, tokens: int, prec: Precision, part: str | None = None) -> int:
    """Gradient temporaries of one adapter's backward, alive beside the base path's input gradient: peft casts the
    input to the adapter dtype before dropout (peft/tuners/lora/layer.py `_cast_input_dtype`), so the gradient runs
    back through lora_A's compute-dtype cast, dropout and that cast in the adapter dtype — about
    (2 · adapter bytes − 1) bytes per input element at once for the widest adapted input (7 B for fp32 adapters under
    bf16 autocast; matches the trace of Qwen2.5-0.5B with down_proj adapters to 2 %, estimator/LOG.md)."""
    mods = lora.modules(part) if lora.enabled else ()
    if not mods:
        return 0
    widest = max(mod.in_features for mod in mods)
    # without dropout (DPO/Reward disable_dropout) the fp32 gradient through the dropout step does not exist
    per_element = 2 * lora.adapter_bytes - 1 - (0 if lora.dropout else lora.adapter_bytes)
    return tokens * widest * per_element


def lora_layout(job: JobSpec) -> LoraLayout:
    t, m = job.train, job.model
    if not t.use_peft:
        return LoraLayout(enabled=False)
    targets = t.lora_target_modules or peft_default_targets(m)
    names = set(all_linear_targets(m)) if "all-linear" in targets else set(targets)
    chosen = tuple(mod for mod in linear_modules(m) if mod.nn_linear and mod.leaf in names)
    if t.quantized or (job.parallel.deepspeed and (t.bf16 or t.fp16)):
        adapter_bytes = 2
    else:
        adapter_bytes = 4
    return LoraLayout(enabled=True, r=t.lora_r, adapted=chosen, adapter_bytes=adapter_bytes,
                      num_layers=m.num_hidden_layers, dropout=not t.disable_dropout)
