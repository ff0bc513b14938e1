"""Reserved above the worst-batch estimate when the batch shape changes every step (stdlib; no torch).

TRL's default collation pads each micro-batch to its longest row (trl/trainer/sft_trainer.py
`DataCollatorForLanguageModeling`; DPO's and Reward's preference collators likewise), so a padded job sees a new
[rows, length] every step. The caching allocator (c10/cuda/CUDACachingAllocator.cpp; hpcmem.estimate.caching_allocator)
keeps every segment it made for earlier shapes: a request larger than every cached block maps a new segment, and a
block never grows past its segment (`try_merge_blocks`), so the longest batch can find the cache cut for shorter ones.
The estimate's reserved is that of the worst batch repeated (hpcmem.estimate.allocator); a drawn sequence of shapes
can reserve more. transformers' Trainer empties the cache every `torch_empty_cache_steps` steps
(transformers/trainer.py `training_step`: `clear_device_cache()` after the loss and before `accelerator.backward`
when `global_step % torch_empty_cache_steps == 0`): the forward's saved tensors stay, every wholly free segment goes,
and the backward maps its blocks afresh around what stayed.

    shapes = c(mode, cadence) · W          W: the peak phase's bytes that scale with the batch (everything but the model's
                                        states, gradients, workspaces and block tails)

c is fitted to the allocator model, not measured on a GPU: hpcmem.lab.shape_sequences traces N steps of padded SFT
jobs whose micro-batches are drawn (seeded) from a `hpcmem lengths` profile and replays each stream with and without
`torch_empty_cache_steps`; c is the largest (reserved − the constant worst batch's reserved) / W seen, × SAFETY
(estimator/LOG.md, "reserved under varying batch shapes"; the streams are in estimator/allocator/shapes/, the fit in
estimator/shapes-fit.json), per allocator mode (expandable segments map pages, not segments) and per cadence class
("never": torch_empty_cache_steps unset, "set": any k). The term is one-sided: the verdict's safe bound adds it whole
(hpcmem.estimate.verdict). Padded layouts only: packing and padding-free batches change their length too but were
not replayed, and generating trainers (GRPO, RLOO) are left out.
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
# c per allocator mode and cadence class, fitted by `python -m hpcmem.lab.shape_sequences --survey 12 --write
# estimator/shapes-fit.json` (estimator/LOG.md)
COEFFICIENTS: dict[str, dict[str, float]] = {"default": {"never": 0.0, "set": 0.0},
                                             "expandable": {"never": 0.0, "set": 0.0}}
SAFETY = 1.5            # the fit saw few sequences (estimator/LOG.md): the largest ratio seen, half as much again


def varies(job: JobSpec) -> bool:
    """Whether the job's micro-batches are padded per batch, so their shape follows the data: not packed, not
    padding-free, not a generating trainer."""
    t = job.train
    return not (t.packing or t.padding_free or entry(t.trainer).generates)


def batch_bytes(phases: Sequence[Phase]) -> int:
    """W: the largest forward or backward phase's bytes less the model's states, gradients, workspaces and block
    tails (0 without such a phase)."""
    step = [p for p in phases if p.name.startswith((str(FORWARD), str(BACKWARD)))]
    if not step:
        return 0
    peak = max(step, key=lambda p: p.bytes)
    return sum(c.bytes for c in peak.components if str(c.name) not in STATES)


def cadence(job: JobSpec) -> str:
    return "never" if job.train.torch_empty_cache_steps is None else "set"


def shapes_bytes(job: JobSpec, phases: Sequence[Phase]) -> int:
    """The reserved a drawn sequence of batch shapes may add to the worst batch's (bytes; 0 where shapes do not
    vary)."""
    if not varies(job):
        return 0
    mode = "expandable" if job.expandable_segments else "default"
    return int(COEFFICIENTS[mode][cadence(job)] * SAFETY * batch_bytes(phases))


def shapes_note(job: JobSpec) -> str:
    k = job.train.torch_empty_cache_steps
    when = "without torch_empty_cache_steps" if k is None else f"with torch_empty_cache_steps {k}"
    return (f"batch shapes change every step (padded to the longest row): the allocator model reserved up to this "
            f"much more over drawn shape sequences, {when} (estimate/shapes.py)")
