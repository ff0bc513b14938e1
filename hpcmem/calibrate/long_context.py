"""The campaign's long-context family: the layouts only a GPU can measure, on one node of 8 GPUs.

What CPU ranks already hold (the sequence split per rank, the ring-attention and Ulysses buffers, FSDP2 sharding over
dp_shard × cp, ZeRO over every rank under sequence parallelism, HSDP's states) is measured by
tests/probe/test_probe_layouts.py (estimator/LOG.md, 2026-12-01, long context). What these cases add is what a CPU
cannot run: CUDA flash attention inside torch's ring and its NCCL collectives, FSDP2's prefetch beside them, DeepSpeed
Ulysses with FlashAttention-2 on packed rows, kv heads replicated on a real model, HSDP's 2-D NCCL mesh, and the
long-context regime near the capacity. Each case is a job `hpcmem estimate sft` takes as written (flags are TRL's and
accelerate's field names); the campaign predicts it like every other case and leaves it out of CPU rehearsals.
"""

from __future__ import annotations

from typing import Any, Callable

from hpcmem.calibrate.case import CampaignCase
from hpcmem.probe.matrix import Case

GPUS = 8                    # one node: every case splits a row or shards over 8 ranks
COST_S = 900.0              # long rows of an 8B model: minutes per step, start-up included
QWEN3_8B, QWEN25_15B, LLAMA_8B = "Qwen/Qwen3-8B", "Qwen/Qwen2.5-1.5B", "meta-llama/Llama-3.1-8B"
ROW = {"dtype": "bfloat16", "per_device_train_batch_size": 1, "num_processes": GPUS}
FSDP2 = {"distributed_type": "FSDP", "fsdp_version": 2}
ZERO3 = {"distributed_type": "DEEPSPEED", "zero_stage": 3}
# name → (model, flags, what the GPU shows that the CPU could not)
CASES: dict[str, tuple[str, dict[str, Any], str]] = {
    "long-qwen3-8b-cp4-dpshard2-64k": (QWEN3_8B, {**ROW, **FSDP2, "max_length": 65536, "pad_to_multiple_of": 8,
                                                  "dp_shard_size": 2, "cp_size": 4},
                                       "ring attention on CUDA flash with its NCCL all-gather; FSDP2 prefetch"),
    "long-qwen3-8b-cp8-sac-128k": (QWEN3_8B, {**ROW, **FSDP2, "max_length": 131072, "pad_to_multiple_of": 16,
                                              "gradient_checkpointing_kwargs": {"selective": True}, "cp_size": 8},
                                   "the planner's long-context regime near the capacity"),
    "long-qwen3-8b-cp8-alltoall-128k": (QWEN3_8B, {**ROW, **FSDP2, "max_length": 131072, "pad_to_multiple_of": 16,
                                                   "cp_size": 8, "cp_comm_strategy": "alltoall"},
                                        "one neighbour's k/v chunk in flight instead of every rank's"),
    "long-qwen3-8b-sp4-dp2-64k": (QWEN3_8B, {**ROW, **ZERO3, "max_length": 65536, "pad_to_multiple_of": 8,
                                             "sp_size": 4},
                                  "Ulysses all-to-all with NCCL beside ZeRO-3's prefetch"),
    "long-qwen3-8b-sp8-fa2-packed": (QWEN3_8B, {**ROW, **ZERO3, "max_length": 16384, "per_device_train_batch_size": 8,
                                                "packing": True, "attn_implementation": "flash_attention_2",
                                                "sp_attn_implementation": "flash_attention_2",
                                                "pad_to_multiple_of": 8, "sp_size": 8},
                                     "packed padding-free rows through FlashAttention-2 varlen under Ulysses"),
    "long-qwen2.5-1.5b-sp4-kv-replicated-64k": (QWEN25_15B, {**ROW, **ZERO3, "max_length": 65536,
                                                              "pad_to_multiple_of": 4, "sp_size": 4},
                                                "2 kv heads replicated over sp 4: k, v kept for the whole row"),
    "long-qwen3-8b-sp4-eval-whole-rows": (QWEN3_8B, {**ROW, **ZERO3, "max_length": 65536, "pad_to_multiple_of": 4,
                                                     "per_device_eval_batch_size": 1, "eval_strategy": "steps",
                                                     "sp_size": 4},
                                          "evaluation bypasses Ulysses: every rank scores whole 64k rows"),
    "long-llama8b-hsdp-2x4": (LLAMA_8B, {**ROW, **FSDP2, "max_length": 8192, "per_device_train_batch_size": 2,
                                         "dp_replicate_size": 2, "dp_shard_size": 4},
                              "HSDP's 2-D NCCL mesh: states over 4, replicated over 2"),
}


def cases(gpu: Any, resolve: Callable[[str], str], peak: str, tiny: bool, gpus_per_node: int, notes: list[str],
          wanted: Callable[[str], bool], predicted: Callable[..., CampaignCase]) -> list[CampaignCase]:
    """The family's cases for a preset (each predicted by `predicted`, hpcmem.calibrate.matrix._predicted)."""
    names = [n for n in CASES if wanted(n)]
    if not names:
        return []
    if tiny:
        notes.append("long-*: left out of CPU rehearsals (8 ranks of 64k-token rows); CPU ranks measure these "
                     "layouts in tests/probe/test_probe_layouts.py")
        return []
    if gpus_per_node < GPUS:
        notes.append(f"long-*: left out, they need {GPUS} GPUs on one node; the preset has {gpus_per_node}")
        return []
    return [predicted(CampaignCase(case=Case(name, "sft", CASES[name][0], dict(CASES[name][1]), COST_S, solo=True),
                                   family="long", gpus=GPUS), gpu, resolve, peak)
            for name in names]
