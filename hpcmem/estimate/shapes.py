"""Reserved above the worst-batch estimate when the batch shape changes every step (stdlib; no torch).

TRL's default collation pads each micro-batch to its longest row (trl/trainer/sft_trainer.py
`DataCollatorForLanguageModeling`; dpo_trainer.py / reward_trainer.py `DataCollatorForPreference` through
trl/trainer/utils.py `pad`), so a padded job sees a new [rows, length] every step. The caching allocator
(c10/cuda/CUDACachingAllocator.cpp; hpcmem.estimate.caching_allocator) keeps every segment it made for earlier shapes:
a request larger than every cached block maps a new segment, and a block never grows past its segment
(`try_merge_blocks`), so the longest batch can find the cache cut for shorter ones. The estimate's reserved is that of
the worst batch repeated (hpcmem.estimate.allocator); a drawn sequence of shapes can reserve more. transformers'
Trainer empties the cache every `torch_empty_cache_steps` steps (transformers/trainer.py `training_step`:
`clear_device_cache()` after the loss and before `accelerator.backward` when `global_step % torch_empty_cache_steps ==
0`): the forward's saved tensors stay, every wholly free segment goes, and the backward maps its blocks afresh around
what stayed.

    shapes = c(group, cadence) · W    W: the peak phase's bytes that scale with the batch (everything but the
                                        model's states, gradients, workspaces and block tails)

c is fitted to the allocator model, not measured on a GPU: hpcmem.lab.shape_sequences traces N steps of padded SFT
jobs whose micro-batches are drawn (seeded) from a `hpcmem lengths` profile and replays each stream with and without
`torch_empty_cache_steps`, in the drawn step order and in shuffled ones; c is the largest (reserved − the constant
worst batch's reserved) / W seen, × SAFETY (estimator/LOG.md, "reserved under varying batch shapes"; streams in
estimator/allocator/shapes/, the fit in estimator/shapes-fit.json), per group — allocator mode (expandable segments
map pages, not segments) and gradient checkpointing (W is one layer's working set or every layer's activations) —
and per cadence class of torch_empty_cache_steps: "never" (unset), "1" (every step), "2-4"
(replayed at 2 and 4: fragmentation piles up between two empties); k ≥ 5 was not replayed and takes the larger of
"never" and "2-4". That is what reserved can reach on an allocator that never has to give memory back. A GPU has a
capacity: when a request cannot be met the allocator frees its cached blocks and tries again
(CUDACachingAllocator.cpp `malloc` → `release_cached_blocks`), so what the sequence costs the job is the capacity its
replay needs without running out (hpcmem.lab.shape_capacity, on a grid of capacities, same streams) — a share of the reserved
growth, NEEDED_SHARE per group, and that share is what the verdict's safe bound adds (hpcmem.estimate.verdict). Padded
layouts only: packing and padding-free batches change their length too but were not replayed, and generating
trainers (GRPO, RLOO) are left out. The term does not read the job's length profile: a profile whose rows all
reach max_length (constant shapes) still gets it.
"""

from __future__ import annotations

from collections.abc import Sequence

from hpcmem.estimate.breakdown import Phase
from hpcmem.estimate.names import BACKWARD, BLOCK_TAILS, CUBLAS_WORKSPACES, FORWARD, GRADIENTS, OPTIMIZER_STATES
from hpcmem.job.jobspec import JobSpec
from hpcmem.job.trainers import entry

# The model's states and what does not scale with the batch (hpcmem.estimate.closing `resident_components`).
STATES = frozenset({"weights", "quantization constants", "lora adapters", str(OPTIMIZER_STATES), "fp32 master weights",
                    "gradient buckets", str(GRADIENTS), str(CUBLAS_WORKSPACES), str(BLOCK_TAILS)})
STEP_PHASES = (str(FORWARD), str(BACKWARD))
# c per group (allocator mode, gradient checkpointing) and cadence class, fitted by `python -m
# hpcmem.lab.shape_sequences --survey 10 --write estimator/shapes-fit.json` (estimator/LOG.md)
CLASSES = ("never", "1", "2-4")
GROUPS = tuple(f"{mode}, {gc}" for mode in ("default", "expandable") for gc in ("checkpointed", "not checkpointed"))
COEFFICIENTS: dict[str, dict[str, float]] = {
    "default, checkpointed": {"never": 0.3415, "1": 0.134, "2-4": 0.1427},
    "default, not checkpointed": {"never": 0.6089, "1": 0.0849, "2-4": 0.2515},
    "expandable, checkpointed": {"never": 0.0058, "1": 0.0, "2-4": 0.0874},
    "expandable, not checkpointed": {"never": 0.0058, "1": 0.0058, "2-4": 0.0058},
}
# 20–30 sequences of 24 steps per group and class (estimator/LOG.md); a real run has thousands of steps, and each new
# longest shape can map more: the largest ratio seen, half as much again
SAFETY = 1.5
# (capacity the drawn stream needs − the constant batch's reserved) / (its unbounded reserved − the same), the largest
# per group over the stored streams (`python -m hpcmem.lab.shape_capacity`; default allocator, no empty_cache):
# checkpointed LoRA 0.19 of 0.43 GiB (a full fine-tune: none of −0.24); not checkpointed 0.31 of 1.69, none of 0.04
# and of 1.95 — rounded up. Expandable segments were not replayed against a capacity: their (already small) growth
# is counted whole.
NEEDED_SHARE: dict[str, float] = {"default, checkpointed": 0.44, "default, not checkpointed": 0.19}


def varies(job: JobSpec) -> bool:
    """Whether the job's micro-batches are padded per batch, so their shape follows the data: not packed, not
    padding-free, not a generating trainer."""
    t = job.train
    return not (t.packing or t.padding_free or entry(t.trainer).generates)


def batch_bytes(phases: Sequence[Phase]) -> int:
    """W: the largest forward or backward phase's bytes less the model's states, gradients, workspaces and block
    tails (0 without such a phase)."""
    step = [p for p in phases if p.name.startswith(STEP_PHASES)]
    if not step:
        return 0
    peak = max(step, key=lambda p: p.bytes)
    return sum(c.bytes for c in peak.components if c.name not in STATES)


def cadence(job: JobSpec) -> str:
    """The cadence class of the job's torch_empty_cache_steps ("≥5" for k ≥ 5: not replayed)."""
    k = job.train.torch_empty_cache_steps
    return "never" if k is None else "1" if k == 1 else "2-4" if k <= 4 else "≥5"


def group(job: JobSpec) -> str:
    """The allocator mode and whether the layers are checkpointed: W is one layer's working set or all the
    layers' activations, and segments or pages hold it."""
    mode = "expandable" if job.expandable_segments else "default"
    return f"{mode}, {'checkpointed' if job.train.gradient_checkpointing else 'not checkpointed'}"


def coefficient(grp: str, cls: str) -> float:
    c = COEFFICIENTS[grp]
    return max(c["never"], c["2-4"]) if cls == "≥5" else c[cls]


def shapes_bytes(job: JobSpec, phases: Sequence[Phase]) -> int:
    """The reserved a drawn sequence of batch shapes may add to the worst batch's (bytes; 0 where shapes do not
    vary)."""
    if not varies(job):
        return 0
    return int(coefficient(group(job), cadence(job)) * SAFETY * batch_bytes(phases))


def needed_bytes(job: JobSpec, reserved_growth: int) -> int:
    """What of `shapes_bytes`'s reserved growth a GPU of bounded capacity must hold (the rest the allocator frees
    under pressure): the group's NEEDED_SHARE, all of it where none was measured."""
    return int(reserved_growth * NEEDED_SHARE.get(group(job), 1.0))


def shapes_note(job: JobSpec) -> str:
    k = job.train.torch_empty_cache_steps
    when = "no torch_empty_cache_steps" if k is None else f"torch_empty_cache_steps {k}"
    return (f"when the padded batch shape changes step to step (allocator model over drawn shape sequences, {when}; "
            "estimate/shapes.py)")
