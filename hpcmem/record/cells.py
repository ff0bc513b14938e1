"""The cell a job belongs to in the accuracy tables: trainer × technique (stdlib, works on job dicts from records).

A technique names what changes memory most: the weights being trained (full / LoRA / QLoRA), activation
checkpointing (gc / sac for selective / nogc), packing or padding-free, activation offloading, and the parallel layout
(ZeRO-n / FSDPn / DDP with its size). Fine enough to separate behaviours, coarse enough that cells hold several runs.
"""

from __future__ import annotations

from typing import Any


def cell_of(job: dict[str, Any]) -> tuple[str, str]:
    t, par = job["train"], job.get("parallel") or {}
    parts = ["qlora" if t.get("load_in_4bit") or t.get("load_in_8bit") else "lora" if t.get("use_peft") else "full"]
    if not t.get("gradient_checkpointing", True):
        parts.append("nogc")
    elif (t.get("gradient_checkpointing_kwargs") or {}).get("selective"):
        parts.append("sac")
    else:
        parts.append("gc")
    if t.get("packing"):
        parts.append(f"pack-{t.get('packing_strategy', 'bfd')}")
    elif t.get("padding_free"):
        parts.append("padfree")
    if t.get("activation_offloading"):
        parts.append("offload")
    world = int(par.get("num_processes", 1))
    kind = par.get("distributed_type", "NO")
    if kind == "DEEPSPEED":
        parts.append(f"zero{par.get('zero_stage', 0)}x{world}")
    elif kind == "FSDP":
        parts.append(f"fsdp{par.get('fsdp_version', 2)}x{world}")
    elif world > 1:
        parts.append(f"ddpx{world}")
    return str(t["trainer"]), "+".join(parts)
