"""LoRA / QLoRA: which linears carry adapters, their size, and what their forward keeps for backward.

Adapter size (Hu et al. 2021, "LoRA"): r·(in + out) per adapted linear. Placement follows peft: `lora_target_modules`
names the modules; empty means peft's per-architecture default
(peft TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING); "all-linear" means every nn.Linear of the decoder layers.
On an MoE type with fused experts peft first rewrites the targets (hpcmem.models.peft_targets): the experts' and the
router's names become target_parameters, the fused gate_up_proj at twice the rank.
Dtypes (peft and TRL 1.16 source): adapters are fp32 by default (peft autocast_adapter_dtype); with a quantized base
TRL casts trainable parameters to bf16 (sft_trainer.py); DeepSpeed casts the whole module to its 16-bit dtype.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

from hpcmem.estimate import lora_variants
from hpcmem.estimate.lora_variants import modules_to_save
from hpcmem.job.jobspec import JobSpec
from hpcmem.job.shape import Precision
from hpcmem.job.spec import TrainSpec
from hpcmem.models.params import LinearModule, parameter_key, peft_default_targets
from hpcmem.models.peft_targets import adapted, model_targets

LORA_DROPOUT_MASK_BYTES = 1   # nn.Dropout (TRL's lora_dropout 0.05) keeps a bool mask per input element
# linears that read one tensor (transformers' Llama-family modeling, modeling_llama.py: LlamaAttention.forward calls
# q_proj, k_proj and v_proj on `hidden_states`, LlamaMLP.forward gate_proj and up_proj on `x`)
SHARED_INPUT = (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj"))


def _sharing(mods: tuple[LinearModule, ...], groups: tuple[tuple[str, ...], ...]) -> list[list[LinearModule]]:
    """Of `mods`, each group's one-matrix linears that read the same input, where two or more do."""
    found = ([m for m in mods if m.leaf in group and m.count_per_layer == 1] for group in groups)
    return [members for members in found if len(members) > 1]


@dataclass(frozen=True, kw_only=True)
class LoraLayout:
    enabled: bool
    r: int = 0
    adapted: tuple[LinearModule, ...] = ()
    adapter_bytes: int = 4
    num_layers: int = 0
    dropout: bool = True          # lora_dropout > 0 (TRL's 0.05) and no disable_dropout (DPO/Reward/KTO set p = 0)
    # lora_dropout > 0: peft built an nn.Dropout, kept (at p = 0) under disable_dropout — DoRA's forward then still
    # recomputes the base output with F.linear (peft/tuners/lora/variants.py DoraLinearVariant.forward tests for
    # nn.Identity, not for p); a p = 0 dropout returns its input itself (aten/src/ATen/native/Dropout.cpp `_dropout`,
    # the fused CUDA kernel only for 0 < p < 1): no mask, no copy
    dropout_module: bool = True
    dora: bool = False            # use_dora: a magnitude vector per adapted linear, and DoRA's forward (lora_variants)
    saved_modules: tuple[tuple[str, int], ...] = ()     # lora_modules_to_save: (name, elements of its trainable copy)
    targeted: tuple[LinearModule, ...] = ()   # target_parameters: the nn.Parameters adapted (fused experts, router)
    rank_factors: tuple[tuple[str, int], ...] = ()   # leaf → factor on r (peft's rank_pattern for a fused gate_up_proj)

    @cached_property
    def _factors(self) -> dict[str, int]:
        return dict(self.rank_factors)

    def rank(self, m: LinearModule) -> int:
        return self.r * self._factors.get(m.leaf, 1)

    @cached_property        # frozen: counted once (the states, the step and the allocator rules each read it)
    def num_params(self) -> int:
        """Trainable adapter elements in the adapter dtype: lora_A/lora_B of every adapted linear and targeted
        parameter (r·(in + out) per matrix; a fused expert stack counts E matrices), DoRA's magnitudes."""
        mods = self.adapted + self.targeted
        lora = sum(self.rank(m) * (m.in_features + m.out_features) * m.count_per_layer * m.num_layers for m in mods)
        return lora + self.magnitudes

    @property
    def idle_params(self) -> int:
        """Of num_params, the adapters of linears a layer holds but never calls (Zamba2's per-hybrid-layer adapter
        slots: hpcmem.trace.layer_map SLOT_LISTS): they never get a gradient, so neither a gradient nor optimizer states
        (torch/optim/adamw.py `_init_group` skips a parameter whose grad is None)."""
        return sum(self.rank(m) * (m.in_features + m.out_features) * m.count_per_layer * m.idle for m in self.adapted)

    @property
    def magnitudes(self) -> int:
        """DoRA's magnitude vector, one element per output feature of each adapted linear (peft dora.py
        `update_layer`: the weight norm, column-wise)."""
        return sum(m.out_features * m.count_per_layer * m.num_layers for m in self.adapted) if self.dora else 0

    @property
    def saved_numel(self) -> int:
        return sum(n for _, n in self.saved_modules)

    @property
    def trains_head(self) -> bool:
        return any(name == "lm_head" for name, _ in self.saved_modules)

    @property
    def trains_embedding(self) -> bool:
        return any(name == "embed_tokens" for name, _ in self.saved_modules)

    def matrices(self) -> tuple[tuple[int, int, int], ...]:
        """(rows, columns, how many) of every adapter weight: lora_A is [r, in], lora_B is [out, r]
        (peft/tuners/lora/layer.py `update_layer`: nn.Linear(in, r) and nn.Linear(r, out)); a targeted stack of E
        matrices has one lora_A [r·E, in] and one lora_B [out, r·E] (ParamWrapper.update_layer)."""
        out = []
        for m in self.adapted:
            count = m.count_per_layer * m.num_layers
            out += [(self.rank(m), m.in_features, count), (m.out_features, self.rank(m), count)]
        for m in self.targeted:
            rows = self.rank(m) * m.count_per_layer
            out += [(rows, m.in_features, m.num_layers), (m.out_features, rows, m.num_layers)]
        return tuple(out)

    def placement(self) -> str:
        """Where the adapters sit, for the table: the wrapped linears' leaf names, then the wrapped parameters
        (with their rank where peft's rank_pattern changes it)."""
        params = [f"{parameter_key(m).split('.', 1)[-1]}" + (f" (r={self.rank(m)})" if self.rank(m) != self.r else "")
                  for m in self.targeted]
        linears = ",".join(m.leaf for m in self.adapted)
        return linears + (f"; parameters {', '.join(params)}" if params else "")

    @property
    def params_per_layer(self) -> int:
        """Adapter parameters of the largest decoder layer (what a per-layer FSDP unit or ZeRO-3 fetch adds)."""
        return sum(self.rank(m) * (m.in_features + m.out_features) * m.count_per_layer
                   for m in self.adapted + self.targeted)

    def modules(self, part: str | None = None) -> tuple[LinearModule, ...]:
        """Adapted modules, all or those of one part of the layer ("attention", or "mlp" for MLP/expert linears)."""
        if part is None:
            return self.adapted
        return tuple(m for m in self.adapted if (m.kind == "attention") == (part == "attention"))

    def saved_per_layer(self, tokens: int, prec: Precision, part: str | None = None) -> int:
        """Each adapted linear keeps the dropout mask, its input to lora_A in the compute dtype, and lora_A's
        [tokens, r] output for lora_B (peft/tuners/lora/layer.py Linear.forward); DoRA and targeted parameters keep
        more (hpcmem.estimate.lora_variants)."""
        if not self.enabled:
            return 0
        mods = self.modules(part)
        per_token = sum(self._input_side(m, prec) * m.count_per_layer * m.num_layers for m in mods)
        per_token -= self._shared_inputs(mods, prec)
        per_token += lora_variants.saved_per_token(self, mods, prec)
        weights = lora_variants.saved_weights(self, mods, prec) if part in (None, "mlp") else 0
        return (per_token * tokens + weights) // max(self.num_layers, 1)  # averaged over layers that hold the module

    def reads_input_itself(self, prec: Precision) -> bool:
        """lora_A saves the adapted linear's input tensor itself: no dropout (nn.Identity, or p = 0, which returns its
        input) and no cast (`_cast_input_dtype` returns x when its dtype is the adapter's; without autocast nothing
        casts it either) — plain LoRA only."""
        return not self.dropout and not self.dora and not prec.amp and self.adapter_bytes == prec.act

    def input_copy_bytes(self, prec: Precision) -> int:
        """Bytes per input element of peft's cast of an adapted linear's input to the adapters' dtype
        (peft/tuners/tuners_utils.py `_cast_input_dtype`), a forward temporary beyond the saved terms: none when the
        input has that dtype already, or when the copy is lora_A's saved input itself — nothing between them, no
        autocast (lora_A computes in fp32 on it) and no dropout (nn.Identity, or p = 0 under TRL's disable_dropout)."""
        a = self.adapter_bytes
        return a if a != prec.act and (prec.amp or self.dropout) else 0

    def dropout_output_bytes(self, prec: Precision) -> int:
        """Bytes per input element of an active dropout's output (in the adapters' dtype), a forward temporary beyond
        the saved terms under autocast, where lora_A keeps its own 16-bit cast instead; without autocast lora_A keeps
        the dropout's output itself (a saved term)."""
        return self.adapter_bytes if self.dropout and prec.amp else 0

    def _shared_inputs(self, mods: tuple[LinearModule, ...], prec: Precision) -> int:
        """Bytes per token `_input_side` counts more than once when lora_A saves the input itself
        (`reads_input_itself`): the linears of a SHARED_INPUT group read one tensor, saved once."""
        if not self.reads_input_itself(prec):
            return 0
        return sum(m.in_features * prec.act * m.num_layers
                   for members in _sharing(mods, SHARED_INPUT) for m in members[1:])

    def shared_input_groups(self, prec: Precision, groups: tuple[tuple[str, ...], ...] = SHARED_INPUT) -> int:
        """Bytes per token of the inputs two or more adapters save as one tensor (`groups`, by default
        `_shared_inputs`' q/k/v and gate/up), each counted once; 0 unless lora_A saves the input itself
        (`reads_input_itself`)."""
        if not self.enabled or not self.reads_input_itself(prec):
            return 0
        return sum(members[0].in_features * prec.act for members in _sharing(self.adapted, groups))

    def saved_attention_output(self, tokens: int, prec: Precision) -> int:
        """Of `saved_per_layer`, o_proj's saved input when lora_A saves the input itself (`reads_input_itself`): the
        attention's output, which SDPA keeps for its own backward — one tensor: the CUDA kernels write it as
        [batch, seq, heads, head_dim] (aten `_scaled_dot_product_flash_attention` / `_efficient_attention`), so
        sdpa_attention_forward's `transpose(1, 2).contiguous()` copies nothing."""
        if not self.enabled or not self.reads_input_itself(prec):
            return 0
        mods = [m for m in self.modules("attention") if m.leaf == "o_proj" and m.count_per_layer == 1]
        return sum(m.in_features * prec.act * m.num_layers for m in mods) * tokens // max(self.num_layers, 1)

    def _input_side(self, m: LinearModule, prec: Precision) -> int:
        """Bytes per token one adapted linear keeps on its input side: the dropout mask, lora_A's input in the
        compute dtype, lora_A's [tokens, r] output."""
        mask = LORA_DROPOUT_MASK_BYTES if self.dropout else 0
        act = prec.act if prec.amp else self.adapter_bytes     # without autocast the adapters compute in their dtype
        return m.in_features * (mask + act) + self.r * act

    def module_saved(self, m: LinearModule, tokens: int, prec: Precision) -> int:
        """What one layer's `m` (count_per_layer matrices) keeps for backward: `saved_per_layer`'s terms for that
        module alone — freed when its backward has run."""
        per_token = self._input_side(m, prec) + m.out_features * lora_variants.dora_out_bytes(self, prec)
        weight = m.in_features * m.out_features * lora_variants.dora_weight_copy_bytes(self, prec)
        return (per_token * tokens + weight) * m.count_per_layer


    def saved_after_weight_norm(self, m: LinearModule, tokens: int, prec: Precision) -> int:
        """`module_saved`'s part that does not exist yet at `m`'s DoRA weight norm (peft/tuners/lora/dora.py
        DoraLinearLayer.forward runs get_lora_weight and get_weight_norm first): lora_A's input cast and output,
        lora_B's output, and the base output — with a dropout module `F.linear`'s, made after the norm; without one
        the base layer's own output, alive but already counted beside the norm (lora_variants `_weight_norm`). Not in it: the
        dropout mask (variants.py DoraLinearVariant.forward drops x before the norm) and the base-weight copy
        (`_weight_norm` leaves it out itself)."""
        mask = LORA_DROPOUT_MASK_BYTES * m.in_features * tokens * m.count_per_layer if self.dropout else 0
        copy = m.in_features * m.out_features * lora_variants.dora_weight_copy_bytes(self, prec) * m.count_per_layer
        return self.module_saved(m, tokens, prec) - mask - copy


def backward_transient(lora: LoraLayout, tokens: int, prec: Precision, part: str | None = None) -> int:
    """Gradient temporaries of one adapter's backward, alive beside the base path's input gradient: peft casts the
    input to the adapter dtype before dropout (peft/tuners/lora/layer.py `_cast_input_dtype`), so the gradient runs
    back through lora_A's compute-dtype cast, dropout and that cast in the adapter dtype — about
    (2 · adapter bytes − 1) bytes per input element at once for the widest adapted input (7 B for fp32 adapters under
    bf16 autocast; estimator/LOG.md)."""
    mods = lora.modules(part) if lora.enabled else ()
    if not mods:
        return 0
    widest = max(mod.in_features for mod in mods)
    per_element = backward_bytes_per_input(lora)
    if lora.dora:
        return lora_variants.backward_transient(lora, mods, tokens, per_element)
    return tokens * widest * per_element


def backward_bytes_per_input(lora: LoraLayout) -> int:
    """`backward_transient`'s bytes per element of an adapted linear's input; without dropout (DPO/Reward
    disable_dropout) the fp32 gradient through the dropout step does not exist."""
    return 2 * lora.adapter_bytes - 1 - (0 if lora.dropout else lora.adapter_bytes)


def lora_dropout_active(t: TrainSpec) -> bool:
    """Whether peft's LoRA dropout masks and copies its input: lora_dropout > 0 and no TRL disable_dropout. lora_dropout
    0: peft builds nn.Identity (peft/tuners/lora/layer.py update_layer); DPO/Reward/KTO's disable_dropout sets every
    nn.Dropout to p = 0 (trl/trainer/utils.py disable_dropout_in_model): no mask either way, but the nn.Dropout module
    stays."""
    return t.lora_dropout > 0 and not t.disable_dropout


def lora_layout(job: JobSpec) -> LoraLayout:
    t, m = job.train, job.model
    if not t.use_peft:
        return LoraLayout(enabled=False)
    targets = model_targets(m, tuple(t.lora_target_modules or peft_default_targets(m)),
                            tuple(t.lora_target_parameters))
    chosen, params = adapted(m, targets)
    if t.quantized or (job.parallel.deepspeed and (t.bf16 or t.fp16)):
        adapter_bytes = 2
    else:
        adapter_bytes = 4
    return LoraLayout(enabled=True, r=t.lora_r, adapted=chosen, adapter_bytes=adapter_bytes,
                      num_layers=m.num_hidden_layers, dropout=lora_dropout_active(t),
                      dropout_module=t.lora_dropout > 0,
                      dora=t.use_dora, saved_modules=modules_to_save(job), targeted=params,
                      rank_factors=targets.rank_factors)
