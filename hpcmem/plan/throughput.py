"""How fast a combination of knobs trains: tokens/s per GPU and step time, from FLOPs, bandwidths, efficiencies.

A ranking model, not a promise: every constant below is named and cites where its value comes from. The MFU curve
(MFU_MAX, MFU_HALF_TOKENS) is fitted per GPU from probe records that timed their steps (`hpcmem validate
probes --fit`, `hpcmem calibrate --collect`: hpcmem.validate.speed) and read from the GPU's calibration file
(`throughput`); a GPU without one uses the documented defaults below, uncalibrated. What is NOT modelled: generation time of GRPO/RLOO (only the training step), MoE all-to-all,
kernel-level differences between attention implementations, CPU dataloader stalls.

Formulas
- Training FLOPs per token ≈ 6·N (2·N forward + 4·N backward) — Kaplan et al. 2020 "Scaling Laws for Neural Language
  Models" §2.1; Hoffmann et al. 2022 (Chinchilla) appendix F. N counts the weights a token passes through (embedding
  lookups excluded, LM head included, MoE: active experts only).
- Attention scores add 12·L·h·s FLOPs per token forward+backward (QKᵀ and A·V: 2 matmuls × 2·h·s forward, ×3 with
  backward) — Narayanan et al. 2021 "Efficient Large-Scale Language Model Training on GPU Clusters using Megatron-LM"
  §5.1 (their 72·B·s·l·h² (1 + s/6h + …) counts full checkpointing; we split the terms).
- Full checkpointing recomputes one forward: + 2·N + 4·L·h·s per token. Selective checkpointing (TRL's SAC policy,
  trl/models/selective_activation_checkpointing.py) MUST_SAVEs the attention output, so only + 2·N is recomputed.
- LoRA skips the frozen weights' gradient matmuls: ≈ 4·N per token instead of 6·N (Hu et al. 2021 "LoRA" §4.2:
  no gradients or optimizer states for frozen weights; the input-gradient half of the backward remains).
- Communication per GPU (Rajbhandari et al. 2020 "ZeRO" §7.1): DDP and ZeRO-1/2 move 2Ψ per step (reduce-scatter +
  all-gather, like an all-reduce); ZeRO-3 / FSDP move 3Ψ per micro-step (parameter all-gather in forward and backward
  + gradient reduce-scatter). Ring collectives move (n−1)/n of that over the slowest link. FSDP under gradient
  accumulation reduce-scatters once per window: transformers' Trainer runs the other micro-batches under
  `accelerator.no_sync` (FSDP2 `set_requires_gradient_sync(False)`, FSDP1 `no_sync`), unless accelerator_config's
  `sync_each_batch` (then every micro-step, with the gradients kept sharded: hpcmem.estimate.states). ZeRO-2
  reduces every micro-step as well and gathers the updated weights once a step; ZeRO-1 reduces at the accumulation
  boundary only (DeepSpeed 0.19 runtime/engine.py `allreduce_gradients`: "ZeRO stage >= 2 communicates during non
  gradient accumulation boundaries as well").
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

from hpcmem.gpus.calibration import load_calibration
from hpcmem.models.params import count_params
from hpcmem.models.spec import ModelSpec

# What the model cannot tell apart: its FLOP counts follow the formulas above, its efficiencies (MFU curve, overlap,
# bandwidths) are uncalibrated guesses, and between two plans that differ in micro-batch, recompute or sharding they
# move the ratio of tokens/s by about this much (MFU_MAX alone spans the reported 35–55 %: ±20 % in absolute terms, of
# which a ranking keeps the part that does not cancel). A stated judgment, not a measurement: plans within it are
# ranked by memory headroom (hpcmem.plan.ranking.rank_plans) until probe timings calibrate the model.
THROUGHPUT_UNCERTAINTY = 0.10
# Model FLOPs utilisation as a function of the tokens in one micro-batch: a saturating (Michaelis–Menten) curve
# MFU(t) = MFU_MAX · t / (t + MFU_HALF_TOKENS). The default, uncalibrated: shape from Megatron-LM/torchtitan reports of
# 35–55 % MFU on Llama-class models at 8k+ tokens per GPU and much lower at a few hundred tokens (kernel launch bound).
MFU_MAX = 0.55
MFU_HALF_TOKENS = 1024
# A GPU described without its bf16 rate (`--gpu 96GB`): the ranking still needs a compute rate to weigh against
# communication and offload copies. An A100-class guess, uncalibrated like the GPU itself.
UNKNOWN_TFLOPS = 300.0


@dataclass(frozen=True, kw_only=True)
class MfuCurve:
    """MFU(t) = mfu_max · t / (t + half_tokens), t the tokens of one micro-batch; `source` says where it comes from."""

    mfu_max: float = MFU_MAX
    half_tokens: float = MFU_HALF_TOKENS
    source: str = "default (uncalibrated)"

    def at(self, tokens: float) -> float:
        return self.mfu_max * tokens / (tokens + self.half_tokens)


DEFAULT_MFU = MfuCurve()


def mfu_curve(gpu_name: str | None) -> MfuCurve:
    """The GPU's fitted curve from its calibration file (`throughput`: mfu_max, mfu_half_tokens, n), else the default."""
    fit = (load_calibration(gpu_name) or {}).get("throughput") if gpu_name else None
    try:
        return MfuCurve(mfu_max=float(fit["mfu_max"]), half_tokens=float(fit["mfu_half_tokens"]),
                        source=f"fitted on {int(fit['n'])} timed probe runs ({fit.get('fitted_at', '?')[:10]})")
    except (TypeError, KeyError, ValueError):
        return DEFAULT_MFU
# Interconnect bandwidths in GB/s per GPU, achieved bus bandwidth (nccl-tests busbw), uncalibrated.
NVLINK_GBPS = {"H100-80GB": 360.0, "H200": 360.0, "B200": 720.0, "GH200-96GB": 360.0, "A100-80GB": 230.0,
               "A100-40GB": 230.0, "H100-NVL-94GB": 300.0, "MI300X": 300.0, "V100-32GB": 130.0}
PCIE_GBPS = 22.0            # PCIe 4.0 x16 achieved (~25 GB/s theoretical per direction); GPUs without NVLink
INTER_NODE_GBPS = 40.0      # one 400 Gb/s NDR InfiniBand NIC per GPU at ~80 % (nccl-tests), uncalibrated
HOST_PCIE_GBPS = 22.0       # GPU ↔ pinned host memory (optimizer / parameter / activation offload copies)
COMM_OVERLAP_FRACTION = 0.5     # share of collective time hidden behind compute (DDP buckets, ZeRO prefetch)
# DeepSpeed CPU-Adam (Ren et al. 2021 "ZeRO-Offload" §4.1: ~1 B params/s per process with AVX-512), uncalibrated.
CPU_ADAM_PARAMS_PER_S = 1.0e9
QLORA_DEQUANT_SLOWDOWN = 1.3    # NF4 dequantise before each matmul (Dettmers et al. 2023 QLoRA, bitsandbytes)
# Padded batches compute on padding: assumed mean row length / max_length without a length profile (hpcmem lengths
# measures it). Packing and padding-free rows compute on real tokens only.
PADDED_FILL_FRACTION = 0.7
# Activation bytes saved per token per layer, in units of hidden_size bf16 elements × 2 bytes (Korthikanti et al.
# 2022 "Reducing Activation Recomputation" §4: s·b·h·34 bytes without recompute, flash attention drops the 5as/h
# term; full checkpointing keeps the layer input: 2 bytes·h; selective keeps input + attention output: 4 bytes·h).
SAVED_BYTES_PER_HIDDEN = {"off": 34, "selective": 4, "full": 2}


class Throughput(NamedTuple):
    """One combination's speed (a tuple: the planner makes one per distinct setting, tens of thousands)."""

    tokens_per_s_per_gpu: float     # useful (non-padding) tokens
    step_s: float                   # one optimizer step (all micro-batches)
    compute_s: float
    comm_s: float                   # exposed collective time
    offload_s: float                # optimizer / parameter / activation copies and CPU-Adam
    mfu: float
    flops: float = 0.0              # model FLOPs of one optimizer step on one GPU (what MFU is a share of)


def flops_params(model: ModelSpec) -> int:
    """N of 6·N: weights a token multiplies by (no embedding lookup; LM head counted even when tied)."""
    p = count_params(model)
    return p.active - p.embed - p.lm_head + model.vocab_size * model.hidden_size


def interconnect_gbps(gpu_name: str, num_machines: int) -> float:
    """The slowest link of a ring over all GPUs: IB between nodes, else NVLink or PCIe inside one."""
    intra = NVLINK_GBPS.get(gpu_name, PCIE_GBPS)
    return min(intra, INTER_NODE_GBPS) if num_machines > 1 else intra


class Setting(NamedTuple):
    """What the throughput model reads from one combination (cheap to build — a tuple, not a frozen dataclass, whose
    per-field setattr costs three times as much; the planner builds one per distinct setting — hashable)."""

    tokens: int                 # tokens computed per micro-batch per GPU (rows × seq)
    useful_fraction: float      # useful / computed tokens (padding)
    attn_seq: int               # attention span per token (row length, or mean document length when packed)
    grad_accum: int
    gc: str                     # off | selective | full
    activation_offloading: bool
    sharding: str               # ddp | zero1 | zero2 | zero3 | fsdp
    offload_optimizer: bool
    offload_params: bool
    peft: str                   # none | lora | qlora
    trainable_params: int
    seq_shards: int = 1         # ranks one row is split over (context / sequence parallelism); `tokens` is the share
    seq_split: str = ""         # "cp" | "sp" | ""
    sync_each_batch: bool = False   # accelerator_config's: FSDP reduce-scatters every micro-step, not once a window


class Rates(NamedTuple):
    """What the throughput model reads of the model, the cluster and the GPU: the same for every combination of one
    search (a tuple: read by attribute, built once)."""

    n_flops: int                # flops_params
    n_params: int
    layers: int
    attn_width: int             # heads × head_dim
    hidden: int
    world: int
    num_machines: int
    peak_tflops: float
    link_gbps: float
    mfu_curve: MfuCurve = DEFAULT_MFU
    kv_width: int = 0           # key/value heads × head_dim (attn_width when 0)


def throughput(s: Setting, r: Rates) -> Throughput:
    n_flops, layers, attn_width, world = r.n_flops, r.layers, r.attn_width, r.world
    per_tok = (4 if s.peft != "none" else 6) * n_flops + 12 * layers * attn_width * s.attn_seq
    if s.gc == "full":
        per_tok += 2 * n_flops + 4 * layers * attn_width * s.attn_seq
    elif s.gc == "selective":
        per_tok += 2 * n_flops
    mfu = r.mfu_curve.at(s.tokens)
    micro_compute = per_tok * s.tokens / ((r.peak_tflops or UNKNOWN_TFLOPS) * 1e12 * mfu)
    if s.peft == "qlora":
        micro_compute *= QLORA_DEQUANT_SLOWDOWN
    compute = micro_compute * s.grad_accum
    comm_bytes = (_comm_bytes(s, r.n_params, world)
                  + _sequence_comm_bytes(s, layers, attn_width, r.kv_width or attn_width))
    comm = comm_bytes / (r.link_gbps * 1e9) * (1 - COMM_OVERLAP_FRACTION) if world > 1 else 0.0
    offload = _offload_seconds(s, r.n_params, world, layers, r.hidden)
    step = compute + comm + offload
    useful = s.tokens * s.useful_fraction * s.grad_accum
    return Throughput(tokens_per_s_per_gpu=useful / step, step_s=step, compute_s=compute, comm_s=comm,
                      offload_s=offload, mfu=mfu, flops=per_tok * s.tokens * s.grad_accum)


def _comm_bytes(s: Setting, n_params: int, world: int) -> float:
    """Bytes each GPU sends per optimizer step in bf16 (ZeRO §7.1), ring factor (n−1)/n."""
    ring = (world - 1) / world
    grads = 2 * s.trainable_params
    if s.sharding in ("zero3", "fsdp"):
        gathers = 2 * (2 * n_params) * s.grad_accum       # all-gather params in forward and backward, each micro-step
        # ZeRO-3 reduce-scatters every micro-step; FSDP once a window unless sync_each_batch (module docstring)
        scatters = s.grad_accum if s.sharding == "zero3" or s.sync_each_batch else 1
        return ring * (gathers + grads * scatters)
    if s.sharding == "zero2":
        return ring * (grads * s.grad_accum + grads)      # reduce every micro-step, gather the weights once
    return ring * 2 * grads                               # one all-reduce (or RS + AG) per step


def _sequence_comm_bytes(s: Setting, layers: int, attn_width: int, kv_width: int) -> float:
    """Bytes each rank moves per optimizer step for a split row, per layer and pass (forward, the recompute under
    full checkpointing, backward). CP (torch ring attention, hpcmem.estimate.parallel): the other ranks' bf16 k/v
    each pass, plus fp32 dk/dv passed around the ring in backward. SP (DeepSpeed Ulysses): all-to-alls of q, k, v
    and the output, (sp − 1)/sp of the local share each, forward and backward."""
    if s.seq_shards == 1:
        return 0.0
    passes = 3 if s.gc == "full" else 2
    others = (s.seq_shards - 1) / s.seq_shards
    if s.seq_split == "cp":
        kv_row = 2 * s.tokens * s.seq_shards * kv_width                     # k and v of the whole row, elements
        per_layer = others * kv_row * (2 * passes + 4)                      # bf16 gathers + fp32 dk/dv in backward
    else:
        per_layer = others * 2 * s.tokens * (2 * attn_width + 2 * kv_width) * passes
    return per_layer * layers * s.grad_accum


def _offload_seconds(s: Setting, n_params: int, world: int, layers: int, hidden: int) -> float:
    """Host copies that do not overlap compute (ZeRO-Offload §4: grads down, params up; CPU-Adam on the shard)."""
    out = 0.0
    if s.offload_optimizer:
        shard = s.trainable_params / (world if s.sharding != "ddp" else 1)
        out += (2 * shard + 2 * shard) / (HOST_PCIE_GBPS * 1e9) + shard / CPU_ADAM_PARAMS_PER_S
    if s.offload_params:
        out += 2 * (2 * n_params / world) * s.grad_accum / (HOST_PCIE_GBPS * 1e9)
    if s.activation_offloading:
        saved = SAVED_BYTES_PER_HIDDEN[s.gc] * hidden * layers * s.tokens
        out += 2 * saved * s.grad_accum / (HOST_PCIE_GBPS * 1e9)    # to host in forward, back in backward
    return out
