"""Block tails: bytes torch's `allocated_bytes` counts beyond the tensors' own, because the caching allocator hands
out whole blocks (c10/cuda/CUDACachingAllocator.cpp `malloc`: the stat adds `block->size`) and does not split a
large-pool block whose remainder is ≤ 1 MiB (`should_split`). A CPU trace counts tensor bytes, so it never sees them.

Counted for the tensors that live through the step — weights, adapters, AdamW states — by the allocator's rules in
allocation order (hpcmem.estimate.allocator `persistent_tails`). Gradients and activations have tails too, but where
they land depends on what the step freed before; they are left out (the H200 records below put them at −14 to
+12 MiB against this term: full fine-tuning only).

Measured: the H200 records of 2026-11-29 (estimator/probes/nvidia-h200.jsonl) against their CPU traces' device
streams (estimator/allocator/nvidia-h200): max_memory_allocated − (traced tensors + the cuBLAS workspaces) is
9.7–50.2 MiB on every SFT record of Qwen2.5-0.5B / 7B and Gemma-3-1B and ≤ 4 MiB on Llama, Mistral, Phi-3 and
Qwen3-MoE, whose weights are whole multiples of 2 MiB or nearly; the allocator model replaying the same streams
(whole blocks, and cuBLASLt's workspaces) matches every SFT record's allocated peak within 1.5 MiB
(`python -m hpcmem.lab.allocator_records`). Gemma-3-1B LoRA: 52 + 26 [I, H] weights
of 15.19 MiB with 0.81 / 0.31 MiB tails = 50.4 MiB (GPU gap 50.2); Qwen2.5-7B LoRA: 84 of 129.5 MiB with 0.5 MiB
tails = 42 MiB (+1) (gap 44.9).
"""

from __future__ import annotations

from hpcmem.estimate.allocator import persistent_tails
from hpcmem.estimate.lora import LoraLayout
from hpcmem.job.shape import Precision
from hpcmem.job.jobspec import JobSpec



def block_tails(job: JobSpec, prec: Precision, lora: LoraLayout) -> tuple[int, str]:
    """Bytes of the persistent tensors' tails in the job's allocator mode, and the note that says what they are. 0
    for ZeRO / FSDP (flat partitions: a few large tensors, not one per parameter; not modelled)."""
    if job.parallel.flat_partitions:
        return 0, ""
    n = persistent_tails(job.model, job.train.trainer, job.train.optim, prec.weight, lora, job.expandable_segments)
    mode = "expandable segments: 512 B rounding only" if job.expandable_segments else "unsplit remainders ≤ 1 MiB"
    return n, f"weights, adapters, optimizer states counted as whole allocator blocks ({mode})"
