"""Model states per GPU: weights, gradients, optimizer states, their sharding (ZeRO, FSDP) and CPU offload.

Formulas:
- ZeRO (Rajbhandari et al. 2020, "ZeRO: Memory Optimizations Toward Training Trillion Parameter Models", §5): with Ψ
  parameters, N ranks and K = 12 bytes of fp32 optimizer state per parameter (master copy + Adam m, v), per GPU
  ZeRO-1 = 2Ψ + 2Ψ + KΨ/N, ZeRO-2 = 2Ψ + (2 + K)Ψ/N, ZeRO-3 = (2 + 2 + K)Ψ/N. DeepSpeed casts the module to its
  16-bit dtype (engine `_configure_distributed_model`), so the 2-byte weights hold whatever dtype TRL loaded.
- Plain PyTorch / DDP (transformers Trainer): weights, gradients and torch AdamW's two states all take the parameter
  dtype (torch/optim/adamw.py `zeros_like(p)`), so fp32 loads cost 4 + 4 + 8 B/param and bf16 loads 2 + 2 + 4.
  DDP's reducer holds flat gradient buckets the size of all gradients unless gradient_as_bucket_view
  (torch DistributedDataParallel docs), which accelerate leaves False.
- FSDP2 (torch.distributed.fsdp.fully_shard): parameters, gradients and optimizer states are sharded in the
  parameter dtype; each unit (decoder layer) is all-gathered in the mixed-precision dtype while it runs.
- bitsandbytes: 8-bit Adam keeps 1 B per state + an fp32 absmax per 256-element block for tensors ≥ 4096 elements
  (bitsandbytes/optim/optimizer.py, min_8bit_size); 4-bit NF4 weights take 0.5 B + an fp32 absmax per 64 (QLoRA,
  Dettmers et al. 2023), double quantization 8-bit absmax + an fp32 per 256 absmax.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from hpcmem.estimate.fsdp_units import fsdp_gather
from hpcmem.estimate.lora import LoraLayout
from hpcmem.estimate.zero_buckets import resident_bucket_bytes, zero_buckets
from hpcmem.job.jobspec import JobSpec
from hpcmem.job.shape import Precision
from hpcmem.job.trainers import entry
from hpcmem.models.params import count_params, linear_modules
from hpcmem.models.spec import ModelSpec

ADAM_STATES = 2
# model types whose lm_head transformers keeps in fp32 whatever the load dtype (`_keep_in_fp32_modules_strict =
# ["lm_head"]`, an nn.Linear built with dtype=torch.float32): models/hy_v4/modeling_hy_v4.py `HYV4ForCausalLM`,
# models/hy_v4_vl/modular_hy_v4_vl.py `HYV4VLForConditionalGeneration` (its text part hy_v4_vl_text, which
# hpcmem.trace.text_heads builds the same way); its weight, gradient and optimizer states are fp32 (`fp32_head_extra`)
FP32_HEAD_TYPES = ("hy_v4", "hy_v4_vl", "hy_v4_vl_text")
BNB_BLOCK = 256                 # 8-bit optimizer absmax block
NF4_BLOCK = 64                  # 4-bit weight quantization block (QLoRA)
NESTED_BLOCK = 256              # double quantization: blocks of absmax values


@dataclass(frozen=True, kw_only=True)
class ParamParts:
    total: int
    embed: int
    lm_head: int                 # 0 when tied to the embedding
    per_layer: int               # the largest decoder layer
    quantizable: int             # nn.Linear weights of all layers (what bitsandbytes replaces; fused experts are not)
    linear_rows: int             # output rows of those linears (LLM.int8 keeps an fp32 scale per row)
    largest_tensor: int = 0      # elements of the largest single parameter (embedding, head, a linear, fused experts)
    largest_module: int = 0      # elements a module holds directly (fused experts: gate_up + down in one module)
    # elements of the layers' weights autocast keeps a 16-bit copy of (aten/src/ATen/autocast_mode.cpp `cached_cast`:
    # a leaf that requires grad, cast by a lower-precision op): every nn.Linear and bare router weight. A fused expert
    # stack is not: transformers' experts index it or hand it to grouped_mm with the input cast to the weight's dtype
    # (integrations/moe.py `_grouped_mm`), so no cast of the stack is made or cached; norms are not cast
    autocast_cached: int = 0
    autocast_cached_per_layer: int = 0   # the same, the largest decoder layer's
    largest_moe_tensor: int = 0  # elements of an MoE layer's largest MLP weight (a fused expert stack, or one expert)
    largest_attention_tensor: int = 0   # elements of the largest attention projection's weight
    moe_stack_rest: int = 0      # elements of an MoE layer's fused expert stacks but its largest
    moe_down_stack: int = 0      # elements of the fused stack whose output is the hidden size (down_proj): the first
    #                              whose gradient the layer's backward writes

    @property
    def layers(self) -> int:
        return self.total - self.embed - self.lm_head


def reward_parts(parts: ParamParts, m: ModelSpec) -> ParamParts:
    """RewardTrainer's AutoModelForSequenceClassification: the causal LM's vocabulary head is replaced by a 1-output
    `score` Linear(hidden, 1, bias=False) (transformers modeling_*ForSequenceClassification), never tied."""
    score = m.hidden_size
    return ParamParts(total=parts.total - parts.lm_head + score, embed=parts.embed, lm_head=score,
                      per_layer=parts.per_layer, quantizable=parts.quantizable, linear_rows=parts.linear_rows,
                      largest_tensor=parts.largest_tensor, largest_module=parts.largest_module,
                      autocast_cached=parts.autocast_cached,
                      autocast_cached_per_layer=parts.autocast_cached_per_layer,
                      largest_moe_tensor=parts.largest_moe_tensor,
                      largest_attention_tensor=parts.largest_attention_tensor,
                      moe_stack_rest=parts.moe_stack_rest, moe_down_stack=parts.moe_down_stack)


def job_param_parts(job: JobSpec) -> ParamParts:
    """The parameters the trainer's model class holds: the causal LM's, or the reward model's (score head)."""
    parts = param_parts(job.model)
    return reward_parts(parts, job.model) if entry(job.train.trainer).head == "score" else parts


@lru_cache(maxsize=256)    # pure in the spec (hpcmem.models.params caches its inputs the same way)
def param_parts(m: ModelSpec) -> ParamParts:
    b = count_params(m)
    dense = b.attention_per_layer + b.norms_per_layer + b.mlp_per_layer
    moe = b.attention_per_layer + b.norms_per_layer + b.experts_per_layer + b.router_per_layer + \
        b.shared_expert_per_layer
    mods = linear_modules(m)
    linears = [mod for mod in mods if mod.nn_linear]
    tensors = [mod.in_features * mod.out_features * mod.count_per_layer for mod in mods]
    experts = sum(t for mod, t in zip(mods, tensors) if mod.kind == "expert")   # one Experts module per layer
    stack_sizes = [t for mod, t in zip(mods, tensors) if mod.kind == "expert" and not mod.nn_linear]
    stacks = sum(stack_sizes)
    # one tensor each: a fused stack holds its count_per_layer matrices, an nn.Linear expert one
    moe_tensors = [mod.in_features * mod.out_features * (1 if mod.nn_linear else mod.count_per_layer)
                   for mod in mods if mod.kind in ("expert", "shared_expert", "router")]
    return ParamParts(total=b.total, embed=b.embed, lm_head=b.lm_head,
                      largest_tensor=max([b.embed, b.lm_head, *tensors]),
                      largest_module=max([b.embed, b.lm_head, experts, *tensors]),
                      per_layer=max(dense if b.num_dense_layers else 0, moe if b.num_moe_layers else 0),
                      quantizable=sum(mod.in_features * mod.out_features * mod.count_per_layer * mod.weight_layers
                                      for mod in linears),
                      linear_rows=sum(mod.out_features * mod.count_per_layer * mod.weight_layers for mod in linears),
                      autocast_cached=sum(mod.in_features * mod.out_features * mod.count_per_layer * mod.weight_layers
                                          for mod in mods if mod.nn_linear or mod.kind != "expert"),
                      autocast_cached_per_layer=max(dense if b.num_dense_layers else 0,
                                                    moe - stacks if b.num_moe_layers else 0) - b.norms_per_layer,
                      largest_moe_tensor=max(moe_tensors, default=0),
                      largest_attention_tensor=max((mod.in_features * mod.out_features for mod in mods
                                                    if mod.kind == "attention"), default=0),
                      moe_stack_rest=stacks - max(stack_sizes, default=0),
                      moe_down_stack=max((t for mod, t in zip(mods, tensors) if mod.kind == "expert"
                                          and not mod.nn_linear and mod.out_features == m.hidden_size), default=0))


@dataclass(frozen=True, kw_only=True)
class States:
    """Bytes per GPU of each state, plus what lives in host RAM."""

    weights: int                 # the model's own (base) weights, as they rest on this rank
    adapters: int                # LoRA adapter weights, as they rest on this rank (0 without PEFT)
    quant_constants: int
    gradients: int
    optimizer: int
    master: int                  # fp32 master copy (DeepSpeed)
    grad_buffers: int            # DDP buckets / DeepSpeed's fp32 grad partition
    reduce_bucket: int           # ZeRO-3's reduce bucket, held for the run (hpcmem.estimate.zero_buckets)
    gathered: int                # ZeRO-3 / FSDP parameters all-gathered through every phase of the step
    prefetched: int = 0          # FSDP: the next unit, gathered beside them in a layer's backward
    prefetch_late: bool = False  # ... only from the attention projections' backward (hpcmem.estimate.fsdp_units)
    host: int
    trainable: int
    notes: dict
    # what a rank keeps between the micro-batches of a gradient-accumulation window (0 without accumulation):
    # `gradients`, except under FSDP, whose gradients stay unsharded until the window's last micro-batch
    # (`unsharded_accumulation`, `accumulated_gradients`)
    accumulated: int = 0


ADAM_OPTIMS = ("adamw_torch_fused", "adamw_torch", "adamw_torch_foreach", "paged_adamw_32bit")


def flat_partition_state_bytes(optim: str) -> float:
    """Optimizer state bytes per element of a DeepSpeed ZeRO fp32 flat partition (stage_1_and_2.py
    `single_partition_of_fp32_groups`, stage3.py `fp32_partitioned_groups_flat`: the client optimizer's param groups
    hold those 1-D tensors). transformers' Adafactor factors only tensors of 2+ dimensions (optimization.py
    `Adafactor._get_options`: factored = len(shape) >= 2) and keeps no first moment with the Trainer's beta1 None, so
    a flat partition gets a whole fp32 second moment: 4 B (measured on 2 CPU ranks under ZeRO-2: 4Ψ/N,
    tests/probe/test_probe_sharding.py); the others as on any fp32 parameter."""
    if optim == "adafactor":
        return 4.0
    return optimizer_bytes_per_param(optim, 4)


def optimizer_bytes_per_param(optim: str, param_bytes: int) -> float:
    """Optimizer state bytes per trainable element whose gradient has `param_bytes` bytes."""
    if optim in ("adamw_torch_fused", "adamw_torch", "adamw_torch_foreach"):
        return ADAM_STATES * param_bytes
    if optim in ("adamw_8bit", "adamw_bnb_8bit", "paged_adamw_8bit"):
        return ADAM_STATES * (1 + 4 / BNB_BLOCK)
    if optim == "paged_adamw_32bit":
        return ADAM_STATES * 4
    if optim == "adafactor":
        return 0.0   # factored second moment: rows + cols per matrix, counted by the caller
    return 0.0       # sgd: HF's default momentum 0 keeps no state


def _quantized_weights(parts: ParamParts, job: JobSpec, w: int) -> tuple[int, int]:
    """(weight bytes, quantization constants) with a 4/8-bit base: layer linears quantized, the rest in `w`."""
    t = job.train
    linear = parts.quantizable
    rest = (parts.total - linear) * w
    if t.load_in_4bit:
        consts = linear / NF4_BLOCK * (1 + 4 / NESTED_BLOCK) if t.use_bnb_nested_quant else linear / NF4_BLOCK * 4
        return int(rest + linear / 2), int(consts)
    return int(rest + linear), int(parts.linear_rows * 4)       # LLM.int8: 1 B/param + an fp32 scale per output row


def fp32_head_extra(head: int, w: int, gbytes: int, optim: str, trained: bool) -> tuple[int, int, int]:
    """(weights, gradients, optimizer states) an fp32 lm_head of `head` elements (`FP32_HEAD_TYPES`; 0 when tied)
    holds beyond what the weights' dtype would: 4 − w bytes per weight, and when it trains (full fine-tuning) an fp32
    gradient and its optimizer states over fp32 parameters (torch/optim/adamw.py: exp_avg, exp_avg_sq like the
    parameter)."""
    if not head:
        return 0, 0, 0
    if not trained:
        return head * (4 - w), 0, 0
    return (head * (4 - w), head * (4 - gbytes),
            int(head * (optimizer_bytes_per_param(optim, 4) - optimizer_bytes_per_param(optim, gbytes))))


def model_states(job: JobSpec, prec: Precision, lora: LoraLayout) -> States:
    t, par, m = job.train, job.parallel, job.model
    parts = job_param_parts(job)
    n = par.layout.state_shards        # every rank, or FSDP2's dp_shard × cp mesh (HSDP replicates across it)
    w = prec.weight
    notes: dict[str, str] = {}
    if t.quantized:
        weights, consts = _quantized_weights(parts, job, w)
    else:
        weights, consts = parts.total * w, 0
    # the parameters that get a gradient: an adapter on a linear its layer never calls, or calls without a graph, gets
    # none (LoraLayout.idle_params); under full fine-tuning a learned layer's parameters the traced step left without
    # one (`idle_layer_params`)
    idle = 0 if lora.enabled else idle_layer_params(m)
    trainable = lora.num_params - lora.idle_params if lora.enabled else parts.total - idle
    gbytes = lora.adapter_bytes if lora.enabled else w
    adapters = lora.num_params * lora.adapter_bytes
    grads = trainable * gbytes
    opt = int(trainable * optimizer_bytes_per_param(t.optim, gbytes))
    if m.model_type in FP32_HEAD_TYPES and not t.quantized:
        w_extra, g_extra, o_extra = fp32_head_extra(parts.lm_head, w, gbytes, t.optim, trained=not lora.enabled)
        weights, grads, opt = weights + w_extra, grads + g_extra, opt + o_extra
    copies = lora.saved_numel if lora.enabled else 0
    if copies:
        # lora_modules_to_save: trainable copies in the base dtype (hpcmem.estimate.lora_variants)
        adapters += copies * w
        grads += copies * w
        opt += int(copies * optimizer_bytes_per_param(t.optim, w))
        trainable += copies
        notes["adapters"] = "with the trainable copies of " + ", ".join(n for n, _ in lora.saved_modules)
    if t.optim == "adafactor":
        opt = int(trainable ** 0.5 * 4 * 2 * m.num_hidden_layers)      # factored rows + cols, fp32, order of √Ψ
    whole_grads = grads                 # every trainable gradient, before any sharding or offload
    master = grad_buffers = gathered = host = reduce_bucket = prefetched = 0
    prefetch_late = False
    if par.deepspeed and par.zero_stage >= 1:
        # DeepSpeed keeps an fp32 master per partition, and the optimizer's states over it: K = 12 with Adam (ZeRO
        # paper). hpcmem's JSON names no optimizer, so transformers hands DeepSpeed the Trainer's own
        # (integrations/deepspeed.py `deepspeed_optim_sched`), which steps the flat fp32 partitions
        # (`flat_partition_state_bytes`); offloaded, accelerate swaps it for DeepSpeedCPUAdam
        # (accelerator.py `prepare_deepspeed`: map_pytorch_optim_to_deepspeed), Adam's 8 B whatever `optim` says.
        # ... over every parameter that requires grad: the flat fp32 groups are built from all of them, a parameter
        # that gets no gradient too (stage_1_and_2.py `DeepSpeedZeroOptimizer.__init__`: `trainable_parameters`
        # are those with requires_grad; not measured here for a layer's idle ones)
        trainable += idle
        grads += idle * gbytes
        master = trainable * 4 // n
        offloaded = par.offload_optimizer_device != "none"
        opt = int(trainable * (2 * 4 if offloaded else flat_partition_state_bytes(t.optim))) // n
        if offloaded and t.optim not in ADAM_OPTIMS:
            notes["optimizer"] = (f"DeepSpeedCPUAdam on {trainable:,} trainable params, partitioned /{n}: accelerate "
                                  f"replaces {t.optim} when the optimizer is offloaded")
        # DeepSpeed 0.19 reduces gradients into their partitions as they are produced under stage 1 as well as 2
        # (same DeepSpeedZeroOptimizer path; measured per rank on CPU, estimator/LOG.md): 2Ψ/N, where the paper's
        # ZeRO-1 keeps the full 2Ψ (see zero_paper_bytes).
        grads = grads // n
        grad_buffers = trainable * 4 // n                             # fp32 gradient partition for the step
        if par.zero_stage == 3:
            buckets = zero_buckets(job)
            weights = weights // n
            adapters = zero3_adapter_bytes(lora, n, buckets.persistence_threshold)
            notes["adapters"] = f"partitioned /{n}, those ≤ {buckets.persistence_threshold:,} elements also whole"
            reduce_bucket = resident_bucket_bytes(job)
            notes["reduce bucket"] = f"{buckets.reduce_bucket:,} elements, 16-bit ({buckets.source})"
            unit = parts.per_layer + lora.params_per_layer
            # current + prefetched layer, embedding and head; but DeepSpeed releases a fetched parameter only past
            # max_reuse_distance / max_live_parameters (partitioned_param_coordinator.py `release_sub_module`):
            # with 1e9 (hpcmem's and DeepSpeed's) a model under 1e9 parameters stays gathered whole once fetched
            # (measured per rank on CPU, estimator/LOG.md), a larger one keeps up to 1e9
            fetched = min(parts.total + lora.num_params, buckets.max_live)
            gathered = max(2 * unit + parts.embed + parts.lm_head, fetched) * 2
            if par.offload_param_device != "none":
                gathered += offload_staging(unit, n)
        if par.offload_optimizer_device != "none":
            host += master + opt + grad_buffers
            notes["offload"] = f"optimizer states offloaded to {par.offload_optimizer_device}"
            master = opt = grad_buffers = 0
        if par.offload_param_device != "none":
            host += weights + adapters
            weights = adapters = 0
    elif par.fsdp:
        weights = weights // n
        if lora.enabled:
            # every adapter matrix is its own dim-0 shard (padded): r < N leaves ranks a padded row, so the adapters,
            # their gradients and Adam states take ceil(rows / N) rows per rank, not 1/N of the bytes
            shard = fsdp_shard_numel(lora.matrices(), n)
            adapters, grads = shard * lora.adapter_bytes, shard * gbytes
            notes["adapters"] = f"dim-0 shards /{n}"
            opt = int(shard * optimizer_bytes_per_param(t.optim, gbytes))
        else:
            grads, opt = grads // n, opt // n
        # the root, the running unit, and the next one prefetched in the backward (hpcmem.estimate.fsdp_units)
        units = fsdp_gather(job, parts, lora, prec)
        gathered, prefetched, prefetch_late = units.held, units.unit, units.late
        if par.fsdp_offload_params:
            gathered += -(-units.unit // n)         # the unit's local shard staged on the GPU (offload_staging)
            host += weights + adapters + grads + opt
            weights = adapters = grads = opt = 0
    elif par.distributed_type == "MULTI_GPU" and n > 1:
        grad_buffers = grads          # DDP reducer buckets
        notes["ddp"] = "DDP gradient buckets = gradient size (gradient_as_bucket_view False)"
    shard = {1: "", 2: "", 3: f"sharded /{n}"}.get(par.zero_stage, "") if par.deepspeed else (
        f"sharded /{n}" if par.fsdp else "")
    dtype = {4: "fp32", 2: "16-bit", 1: "8-bit"}.get(w, "")
    notes.setdefault("weights", " · ".join(x for x in (
        dtype + (" base, 4-bit NF4 linears" if t.load_in_4bit else " base, int8 linears" if t.load_in_8bit else ""),
        shard, "offloaded" if par.offload_param_device != "none" else "") if x))
    notes.setdefault("optimizer", f"{t.optim} on {trainable:,} trainable params" + (
        f", partitioned /{n}" if par.flat_partitions else ""))
    unsharded = unsharded_accumulation(job)
    accumulated = 0
    if unsharded:
        accumulated = accumulated_gradients(job, whole_grads, gbytes)
    elif t.gradient_accumulation_steps > 1:
        accumulated = grads
    notes["accumulated"] = "kept across gradient accumulation" + (
        "; unsharded until the window's last micro-batch; accelerator_config gradient_accumulation_kwargs "
        f"sync_each_batch true keeps {grads / 2**30:.2f} GiB on the GPU instead" if unsharded else "")
    return States(weights=weights, adapters=adapters, quant_constants=consts, gradients=grads, optimizer=opt,
                  master=master, grad_buffers=grad_buffers, reduce_bucket=reduce_bucket, gathered=gathered,
                  prefetched=prefetched, prefetch_late=prefetch_late, host=host, trainable=trainable, notes=notes,
                  accumulated=accumulated)


def unsharded_accumulation(job: JobSpec) -> bool:
    """FSDP keeps the gradients unsharded between micro-batches: accumulation without accelerator_config's
    `sync_each_batch` (`accumulated_gradients`)."""
    t = job.train
    return job.parallel.fsdp and t.gradient_accumulation_steps > 1 and not t.sync_each_batch


def accumulated_gradients(job: JobSpec, whole: int, gbytes: int) -> int:
    """Gradient bytes an FSDP rank keeps between the micro-batches of an accumulation window: all of them, unsharded.

    transformers' Trainer runs every micro-batch of the window but the last under `accelerator.no_sync`
    (trainer.py `_inner_training_loop`; DeepSpeed and accelerator_config's `sync_each_batch` excepted: then the
    sharded `gradients`, hpcmem.job.accelerator_config), which for FSDP2 is
    `set_requires_gradient_sync(False)` (accelerate accelerator.py `no_sync`) and for FSDP1 the wrapper's `no_sync`.
    FSDP2 then skips the reduce-scatter and keeps each parameter's unsharded gradient, in the mixed-precision policy's
    dtype (torch/distributed/fsdp/_fully_shard/_fsdp_param_group.py `post_backward`: `if not self.reduce_grads: …
    return`; _fsdp_param.py `to_accumulated_grad_if_needed`, `accumulate_unsharded_grad_if_needed`), which accelerate
    sets to the 16-bit type for both the parameters and the reduction (utils/dataclasses.py
    `FullyShardedDataParallelPlugin.set_mixed_precision`); FSDP1 keeps the unsharded flat gradient the same way. The
    last micro-batch reduce-scatters each unit's sum after its backward, so a layer's backward still holds the
    unsharded sums of the layers below it: counted whole. Offloaded parameters too: the offload copies sharded
    gradients after the reduction, which these never reach. `whole`: every trainable parameter's gradient in
    `gbytes` per element, before sharding (measured on 2 CPU ranks, FSDP2: tests/probe/test_probe_accumulation.py)."""
    t = job.train
    per_element = 2 if (t.bf16 or t.fp16) else gbytes
    return whole * per_element // gbytes


def idle_layer_params(m: ModelSpec) -> int:
    """A learned model's layer parameters that its traced full fine-tuning step left without a gradient
    (`LayerKind.idle`, hpcmem/trace/learn.py `idle_kinds`: a sparse-attention indexer runs under torch.no_grad) — no
    gradient, and no optimizer state: torch/optim/adamw.py `_init_group` skips a parameter whose grad is None. 0 for
    a family descriptor's model."""
    p = getattr(m, "learned", None)
    return sum(p.kinds[k].idle for k in p.layer_kinds) if p is not None else 0


def offload_staging(unit: int, n: int) -> int:
    """Offloaded parameters reach the GPU through a copy of the unit's local shard before the all-gather (FSDP2:
    torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py `foreach_all_gather` moves offloaded shards to the
    device; ZeRO-3: the partition is fetched from host memory before its all-gather): one unit's shard, 16-bit
    (measured on 2 CPU ranks: ≈ one layer / N in both, estimator/LOG.md)."""
    return -(-unit // n) * 2


def zero3_adapter_bytes(lora: LoraLayout, n: int, threshold: int) -> int:
    """LoRA adapters under ZeRO-3: peft adds them after zero.Init, and DeepSpeed's engine partitions them like any
    other parameter (parameter_offload.py `_convert_to_zero_parameters`): ceil(numel / N) elements per rank, plus the
    whole matrix when it is small enough to persist — lora_A of a small r usually is. 16-bit: DeepSpeed casts the
    module (lora.adapter_bytes is 2 there)."""
    numel = 0
    for rows, cols, count in lora.matrices():
        size = rows * cols
        numel += (-(-size // n) + (size if size <= threshold else 0)) * count
    return numel * lora.adapter_bytes


def fsdp_shard_numel(matrices: tuple[tuple[int, int, int], ...], n: int) -> int:
    """Elements per rank of matrices under FSDP2: fully_shard splits each parameter on dim 0 into N chunks padded to
    the first chunk's size (torch/distributed/fsdp/_fully_shard/_fsdp_param.py `_init_sharded_param`)."""
    return sum(-(-rows // n) * cols * count for rows, cols, count in matrices)


def zero_paper_bytes(stage: int, psi: float, n: int, k: int = 12) -> float:
    """Model-state bytes per GPU in the ZeRO paper (Rajbhandari et al. 2020, §5, mixed-precision Adam K = 12):
    stage 0 (DDP) (2 + 2 + K)Ψ, ZeRO-1 (P_os) 4Ψ + KΨ/N, ZeRO-2 (P_os+g) 2Ψ + (2 + K)Ψ/N, ZeRO-3 (4 + K)Ψ/N."""
    return {0: (4 + k) * psi, 1: 4 * psi + k * psi / n, 2: 2 * psi + (2 + k) * psi / n, 3: (4 + k) * psi / n}[stage]


FOREACH_OPTIMS = ("adamw_torch", "adamw_torch_foreach")     # torch AdamW's foreach path (_multi_tensor_adam)


def optimizer_step_transient(job: JobSpec, states: States, parts: ParamParts, lora: LoraLayout | None = None) -> int:
    """Temporaries of the optimizer phase: gradient clipping, then `optimizer.step()`, one after the other.

    `optimizer.step()`: fused AdamW none; foreach AdamW a list the size of the trainable parameters
    (torch/optim/adamw.py _multi_tensor_adamw); the for-loop twice the largest tensor; 8-bit kernels none.
    Clipping (max_grad_norm > 0; torch/nn/utils/clip_grad.py `clip_grad_norm_`): one 0-d norm per gradient tensor
    (`_foreach_norm`), their stack and the clip coefficient — a 512-byte CUDA block each; the scaling is in place."""
    optim = job.train.optim
    if optim in FOREACH_OPTIMS:
        step = states.gradients
    elif optim == "adafactor":
        step = 2 * max(parts.embed, parts.per_layer) * 4 // max(job.parallel.world_size, 1)
    else:
        step = 0
    clip = (trainable_tensors(job, lora) + CLIP_SCALARS) * CUDA_BLOCK if job.train.max_grad_norm > 0 else 0
    return max(step, clip)


CUDA_BLOCK = 512        # the caching allocator's smallest block (CUDACachingAllocator kMinBlockSize)
CLIP_SCALARS = 4        # the norms' stack, the total norm, the coefficient and its clamp


def trainable_tensors(job: JobSpec, lora: LoraLayout | None) -> int:
    """Gradient tensors the clipping walks: two per adapter matrix (lora_A, lora_B) with PEFT; otherwise every
    parameter tensor — the decoder layers' linears (and biases), norms, routers and fused experts, the embedding,
    an untied head, the final norm (hpcmem.models.params layout)."""
    if lora is not None and lora.enabled:
        return 2 * (sum(m.count_per_layer * m.num_layers for m in lora.adapted)
                    + sum(m.num_layers for m in lora.targeted))      # one lora_A, one lora_B per wrapped parameter
    m = job.model
    mods = linear_modules(m)
    linears = sum((1 + int(mod.bias)) * (mod.count_per_layer if mod.nn_linear else 1) * mod.weight_layers
                  for mod in mods)
    norms = (m.norms_per_layer + 2 * int(m.qk_norm)) * m.num_hidden_layers + 1
    return linears + norms + 1 + int(not m.tie_word_embeddings)
