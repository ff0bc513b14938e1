"""Block tails: bytes torch's `allocated_bytes` counts beyond the tensors' own, because the caching allocator hands
out whole blocks (c10/cuda/CUDACachingAllocator.cpp `malloc`: the stat adds `block->size`) and does not split a
large-pool block whose remainder is ≤ 1 MiB (`should_split`). A CPU trace counts tensor bytes, so it never sees them.

Counted for the tensors that live through the step — weights, adapters, AdamW states — by the allocator's rules in
allocation order (hpcmem.estimate.allocator `persistent_tails`). Gradients and activations have tails too, but where
they land depends on what the step freed before; they are left out.

Checked against the H200 records' allocated peaks with `python -m hpcmem.lab.allocator_records` (estimator/LOG.md).
"""

from __future__ import annotations

from hpcmem.estimate.allocator import persistent_tails
from hpcmem.estimate.lora import LoraLayout
from hpcmem.job.jobspec import JobSpec
from hpcmem.job.shape import Precision


def block_tails(job: JobSpec, prec: Precision, lora: LoraLayout) -> tuple[int, str]:
    """Bytes of the persistent tensors' tails in the job's allocator mode, and the note that says what they are. 0
    for ZeRO / FSDP (flat partitions: a few large tensors, not one per parameter; not modelled)."""
    if job.parallel.flat_partitions:
        return 0, ""
    n = persistent_tails(job.model, job.train.trainer, job.train.optim, prec.weight, lora, job.expandable_segments)
    mode = "expandable segments: 512 B rounding only" if job.expandable_segments else "unsplit remainders ≤ 1 MiB"
    return n, f"weights, adapters, optimizer states counted as whole allocator blocks ({mode})"
