"""What FSDP (1 and 2) holds all-gathered beside the shards: the root unit, the running unit and the prefetched one.

Units: accelerate's TRANSFORMER_BASED_WRAP makes each decoder layer a unit and leaves the embedding, the final norm
and the head to the root. Under FSDP1 with a PEFT model, transformers' Trainer swaps in PEFT's policy, which also
makes every trainable LoRA leaf (lora_A, lora_B) its own unit (trainer.py → distributed/fsdp.py
`update_fsdp_plugin_peft` → peft/utils/other.py `fsdp_auto_wrap_policy`; Answer.AI's train.py uses the same
lambda policy). Under FSDP2 the Trainer does not (it only runs on the delayed-optimizer path, which FSDP2 turns off;
trainer.py `delay_optimizer_creation`), so each decoder layer keeps its adapters.

When each is gathered (torch 2.13, measured on 2 CPU ranks over gloo with reentrant and non-reentrant checkpointing,
estimator/LOG.md 2026-12-02 "FSDP units in flight"):
- the root stays gathered from the forward to the end of the backward (FSDP1 `_post_forward_reshard` keeps the root;
  FSDP2's root does not reshard after forward);
- the forward and the recompute hold one decoder unit (no forward prefetch by default: accelerate's
  fsdp_forward_prefetch False; FSDP2 prefetches forward only when told);
- the backward prefetches one unit ahead, the unit that finished its forward just before the current one
  (FSDP1 `_exec_order_utils.get_handle_to_backward_prefetch`, `_backward_prefetch_limit` 1, BACKWARD_PRE; FSDP2
  `FSDPParamGroup._backward_prefetch` over `post_forward_order`). With decoder-layer units that is the previous
  layer, gathered through the whole layer's backward: two units. With LoRA leaves as units, the unit that finished
  just before a layer is its own last LoRA leaf; the previous layer is fetched only by the layer's first leaf
  (q_proj's lora_A), i.e. at the attention projections' backward: the MLP's backward holds one unit.
- the LM head's backward: the root and the last layer (prefetched).

Reserved: the all-gather outputs are allocated on FSDP's own stream (FSDP1 `_unshard` under `_unshard_stream`; FSDP2
its all-gather streams), and the caching allocator hands a freed block only to the stream that allocated it
(c10/cuda/CUDACachingAllocator.cpp `get_free_block`: blocks are pooled by stream). That pool keeps the root's block
and two units' blocks (the running and the prefetched one; FSDP1's limit_all_gathers allows two in flight) whether
or not the instant holds them: what the peak instant does not allocate of them is reserved beside it.

Bytes: a unit is counted in the mixed-precision dtype for every parameter, 4/8-bit linears included. FSDP gathers the
flat parameters' own storage — for bitsandbytes Params4bit in a bf16 quant_storage two 4-bit values per byte
(torch/distributed/fsdp/_flat_param.py `flatten_tensors`), the bytes the shards count (hpcmem.estimate.states) — but
with the packed count the published 70B FSDP+QLoRA rows of three sources fall 10-28 % under their measurements
(estimator/LOG.md 2026-12-02 "FSDP units in flight"): something of that size is not modelled, and until it is named
the 16-bit count stands in for it, with a warning (`quantized_unit_warning`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from hpcmem.estimate.breakdown import Phase
from hpcmem.estimate.lora import LoraLayout
from hpcmem.estimate.names import GATHERED, PREFETCHED_UNIT
from hpcmem.job.jobspec import JobSpec
from hpcmem.job.shape import Precision

if TYPE_CHECKING:
    from hpcmem.estimate.states import ParamParts


@dataclass(frozen=True, kw_only=True)
class FsdpGather:
    root: int            # embedding + head (+ final norm), gathered for the forward and the backward
    unit: int            # one decoder layer unit
    late: bool           # the prefetched unit arrives only at the attention projections' backward

    @property
    def held(self) -> int:
        """Every phase of the step: the root and the running (or, at the head's backward, prefetched) unit."""
        return self.root + self.unit


def lora_leaf_units(job: JobSpec, lora: LoraLayout) -> bool:
    """LoRA leaves are their own units: FSDP1 with a PEFT model (see the module's docstring)."""
    return job.parallel.fsdp and job.parallel.fsdp_version == 1 and lora.enabled


def fsdp_gather(job: JobSpec, parts: ParamParts, lora: LoraLayout, prec: Precision) -> FsdpGather:
    unit = (parts.per_layer + lora.params_per_layer) * prec.act
    return FsdpGather(root=(parts.embed + parts.lm_head) * prec.act, unit=unit, late=lora_leaf_units(job, lora))


def stream_pool_extra(job: JobSpec, phases: list[Phase] | tuple[Phase, ...]) -> int:
    """Reserved beyond the allocated peak for the all-gather streams' pool. The pool is the most any phase holds
    gathered (the root, two units and any offload staging); it stays cached through the whole step and the default
    stream cannot use it, so what the rest of a phase allocates sits beside the whole pool: pool + max over phases of
    (allocated − gathered) − the allocated peak (never negative)."""
    if not job.parallel.fsdp or not phases:
        return 0

    def gathered(p: Phase) -> int:
        return sum(c.bytes for c in p.components if c.name in (GATHERED, PREFETCHED_UNIT))

    pool = max(gathered(p) for p in phases)
    rest = max(p.bytes - gathered(p) for p in phases)
    return max(0, pool + rest - max(p.bytes for p in phases))


def quantized_unit_warning(job: JobSpec) -> str | None:
    """FSDP over a 4/8-bit base: the gathered units are the 16-bit stand-in (see the module's docstring)."""
    if not (job.parallel.fsdp and job.train.quantized):
        return None
    return ("FSDP over a 4/8-bit base: each gathered decoder unit is counted at 16-bit bytes, although FSDP gathers "
            "the packed storage; published 70B FSDP+QLoRA measurements need that difference elsewhere, unexplained "
            "(estimator/LOG.md)")
