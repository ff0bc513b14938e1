"""accelerator_config's `sync_each_batch` as a planner choice: an FSDP sharding named with "+sync".

Under gradient accumulation transformers' Trainer runs every micro-batch but the last under `accelerator.no_sync`,
so FSDP keeps each parameter's gradient unsharded until the window's last backward (hpcmem.estimate.states
`accumulated_gradients`); `gradient_accumulation_kwargs: {sync_each_batch: true}` makes it reduce-scatter every
micro-batch instead — the gradients stay sharded, the step moves (accumulation − 1) more reduce-scatters
(hpcmem.plan.throughput). With one micro-batch a window both are the same job, so "+sync" is only searched with
accumulation.
"""

from __future__ import annotations

from typing import Any

from hpcmem.job.spec import TrainSpec

SYNC = "+sync"
FSDP_BASES = ("fsdp2", "fsdp2+offload")     # the FSDP shardings the planner names (hpcmem.plan.knobs.SHARDINGS)


def is_sync(sharding: str) -> bool:
    return sharding.endswith(SYNC)


def base(sharding: str) -> str:
    """The sharding without "+sync"."""
    return sharding[: -len(SYNC)] if is_sync(sharding) else sharding


def own_sharding(name: str, t: TrainSpec) -> str:
    """The job's own sharding name: "+sync" where it already syncs each micro-batch of a window."""
    return name + SYNC if name in FSDP_BASES and t.sync_each_batch and t.gradient_accumulation_steps > 1 else name


def sync_changes(t: TrainSpec, sharding: str, accum: int) -> dict[str, Any]:
    """The accelerator_config a combination needs: sync_each_batch set for "+sync", dropped for its base under
    accumulation; with one micro-batch a window the job's own is kept (it changes nothing there)."""
    if sharding not in FSDP_BASES and not is_sync(sharding):
        return {}
    want = is_sync(sharding)
    if accum <= 1 or want == t.sync_each_batch:
        return {}
    cfg = dict(t.accelerator_config or {})
    kwargs = dict(cfg.get("gradient_accumulation_kwargs") or {})
    if want:
        kwargs["sync_each_batch"] = True
    else:
        kwargs.pop("sync_each_batch", None)
    if kwargs:
        cfg["gradient_accumulation_kwargs"] = kwargs
    else:
        cfg.pop("gradient_accumulation_kwargs", None)
    return {"accelerator_config": cfg}
