"""The GPU kit's OOM-boundary sweep: runs sized, on the GPU at hand, so that the predicted peak spans 85–105 % of
its capacity — where "fits" is decided and where the safe bound earns its margin (stdlib + the estimator).

Each base is one model × one technique; its size is a per-device batch and a max_length (multiples of 64, at most
MAX_LENGTH so the rows stay the lengths people train on): the smallest batch whose longest rows reach the target,
then the smallest max_length at that batch whose predicted peak reaches it (bisection on the estimate, which is
monotone in the length), so the recorded fraction is the target or just above it. The order is a Latin square: the
first round gives base i the target TARGETS[i], the next round shifts by one, so the first len(BASES) runs already
span every model, technique and target — 88 and 93 % (the safe bound says fits: an OOM there is a false fit), 96 and
99 % (tight: a run that survives is a false refusal), 103 and 105 % (the point estimate refuses). Each run is one
probe record, an OOM included (need ≥ capacity).

On a GPU the peak is the device peak against torch's total (the capacity the kit detected); in `--tiny` dry runs on
CPU it is the tracked tensor bytes ("tensors") against a simulated capacity (`--capacity-bytes`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from hpcmem.estimate import estimate
from hpcmem.estimate.workspaces import tensor_bytes
from hpcmem.gpus.spec import GpuSpec
from hpcmem.job.trl_config import build_job
from hpcmem.probe.fixtures import hf_config
from hpcmem.probe.matrix import Case

Q05, L1, L3 = "Qwen/Qwen2.5-0.5B", "meta-llama/Llama-3.2-1B", "meta-llama/Llama-3.2-3B"
NOGC = {"dtype": "bfloat16", "gradient_checkpointing": False}


# One model × one technique each (cost_s: one run on an H100/H200, start-up included; an OOM ends sooner).
BASES: tuple[Case, ...] = (
    Case("q05-full", "sft", Q05, dict(NOGC), 25.0),
    Case("l1b-lora", "sft", L1, {**NOGC, "use_peft": True}, 30.0),
    Case("l3b-full", "sft", L3, dict(NOGC), 45.0),
    Case("q05-lora", "sft", Q05, {**NOGC, "use_peft": True}, 25.0),
    Case("l1b-full", "sft", L1, dict(NOGC), 30.0),
    Case("l3b-lora", "sft", L3, {**NOGC, "use_peft": True}, 40.0),
)
TARGETS = (0.93, 0.99, 1.03, 0.88, 0.96, 1.05)
BATCHES = (1, 2, 4, 8, 16, 32, 64, 128, 256)
LENGTH_STEP = 64
MAX_LENGTH = 8192


@dataclass(frozen=True)
class Sized:
    base: Case
    target: float
    batch: int
    max_length: int
    predicted_bytes: int
    capacity_bytes: int

    @property
    def fraction(self) -> float:
        return self.predicted_bytes / self.capacity_bytes

    @property
    def name(self) -> str:
        return f"boundary-{self.base.name}-{round(100 * self.target)}"

    @property
    def flags(self) -> dict[str, Any]:
        return {**self.base.flags, "per_device_train_batch_size": self.batch, "max_length": self.max_length}


def predicted(base: Case, model: str, batch: int, max_length: int, gpu: GpuSpec, peak: str) -> int:
    """The estimate's peak for the base at this size on `gpu`: "device", or "tensors" (what a CPU probe tracks:
    the allocated peak without cuBLAS's workspaces)."""
    job, _ = build_job(base.trainer, {"model_name_or_path": model, **base.flags, "max_length": max_length,
                                      "per_device_train_batch_size": batch}, gpu=gpu)
    est = estimate(job)
    return est.device_peak_bytes if peak == "device" else tensor_bytes(est.peak_phase)


def size_for(base: Case, model: str, target: float, gpu: GpuSpec, capacity: int, peak: str,
             max_positions: int, max_length: int = MAX_LENGTH) -> Sized | None:
    """The smallest max_length (at the smallest batch that can) whose predicted peak reaches target × capacity."""
    goal = target * capacity
    step = min(LENGTH_STEP, max_length // 8)
    top = min(max_positions, max_length) // step
    for batch in BATCHES:
        if batch == BATCHES[0] and predicted(base, model, batch, step, gpu, peak) > goal:
            return None                   # the states alone are past the target
        if predicted(base, model, batch, top * step, gpu, peak) < goal:
            continue                      # the longest rows fall short at this batch: more rows
        lo, hi = 0, top                   # in steps: predicted(lo · step) < goal ≤ predicted(hi · step)
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if predicted(base, model, batch, mid * step, gpu, peak) >= goal:
                hi = mid
            else:
                lo = mid
        return Sized(base=base, target=target, batch=batch, max_length=hi * step, capacity_bytes=capacity,
                     predicted_bytes=predicted(base, model, batch, hi * step, gpu, peak))
    return None


def sweep(gpu: GpuSpec, capacity: int, *, peak: str = "device", models: dict[str, str] | None = None,
          bases: tuple[Case, ...] = BASES, targets: tuple[float, ...] = TARGETS,
          max_length: int = MAX_LENGTH) -> list[Sized]:
    """Every (target, base) run in priority order; a base that cannot reach a target on this GPU is left out.

    `models` maps a base's catalog model to what the probe loads (a tiny config file in dry runs); `max_length`
    caps the rows (CPU dry runs keep them at one LENGTH_STEP: CPU attention materialises the s² scores the GPU
    kernels the estimate assumes do not)."""
    models = models or {}
    gpu = dataclasses.replace(gpu, capacity_bytes=capacity)
    out = []
    for shift in range(len(targets)):
        for i, base in enumerate(bases):
            target = targets[(i + shift) % len(targets)]
            model = models.get(base.model, base.model)
            positions = int(hf_config(model).get("max_position_embeddings") or MAX_LENGTH)
            sized = size_for(base, model, target, gpu, capacity, peak, positions, max_length)
            if sized is not None:
                out.append(sized)
    return out
