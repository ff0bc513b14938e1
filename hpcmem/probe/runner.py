"""One probe run in this process: estimate first, then N real steps of the real TRL trainer, peaks per phase.

Phases come from the trainer's own seams: `_prepare_inputs` (GRPO/RLOO generation and scoring), `compute_loss`
(forward; a reference model's forward nests as "reference"), backward until the optimizer step, the optimizer step
(DeepSpeed steps inside `backward`: its engine's `step` is wrapped), and what follows until the next step. Every
phase of every step gets its own peak; the run's peaks are the maxima over the steps after `warmup_steps` (optimizer
states are born in the first step, so the first step is not the steady state).

Speed: each step's wall time (the trainer's step-begin to step-end callbacks, the device synchronised at both) and
the tokens its micro-batches held (`count_tokens`) are kept for every step after step 0 and `warmup_steps` (step 0
also initialises cuBLAS and the allocator and creates the optimizer states: not the steady state).

An out-of-memory error is a result, not a crash: the record says "oom" and that the need is ≥ the capacity.
"""

from __future__ import annotations

import gc
import os
import time
from collections.abc import Mapping
from typing import Any

from hpcmem.errors import HpcmemError
from hpcmem.estimate import estimate
from hpcmem.job.trainers import entry
from hpcmem.probe import fixtures
from hpcmem.probe.job_phases import run_job_phases
from hpcmem.probe.meters import CpuMeter, CudaMeter
from hpcmem.probe.shards import ShardInventory
from hpcmem.probe.trainers import build_trainer
from hpcmem.record import GpuInfo, Measured, Record, RunInfo, job_to_dict, package_versions, relevant_env

METRICS = ("allocated_bytes", "reserved_bytes", "device_bytes", "device_derived_bytes", "rss_bytes")


class PhaseClock:
    """Peaks per (step, phase): `switch(phase)` closes the running segment and starts the next."""

    def __init__(self, meter: Any, sync: Any = None) -> None:
        self.meter = meter
        self.sync = sync or (lambda: None)      # torch.cuda.synchronize on a GPU: kernels finish inside their step
        self.step: int | None = None
        self.phase = "setup"
        self.setup: dict[str, dict[str, int]] = {}
        self.steps: dict[int, dict[str, dict[str, int]]] = {}
        self.began: dict[int, float] = {}
        self.seconds: dict[int, float] = {}
        self.tokens: dict[int, int] = {}

    def begin_step(self, step: int) -> None:
        self.sync()
        self.began[step] = time.perf_counter()

    def end_step(self, step: int) -> None:
        self.sync()
        if step in self.began:
            self.seconds[step] = time.perf_counter() - self.began[step]

    def add_tokens(self, count: int) -> None:
        if self.step is not None:
            self.tokens[self.step] = self.tokens.get(self.step, 0) + count

    pinned = False      # while a job phase runs (probe/job_phases.py), the trainer's own seams do not switch

    def switch(self, phase: str, step: int | None = None) -> None:
        if self.pinned:
            return
        segment = self.meter.segment()
        bucket = self.setup if self.step is None else self.steps.setdefault(self.step, {})
        slot = bucket.setdefault(self.phase, {})
        for key, value in segment.items():
            if value is not None:
                slot[key] = max(slot.get(key, 0), int(value))
        if step is not None:
            self.step = step
        self.phase = phase
        self.meter.set_phase(phase)

    def summary(self, warmup_steps: int) -> dict[str, Any]:
        done = sorted(self.steps)
        steady = [s for s in done if s >= warmup_steps] or done[-1:]
        phases: dict[str, dict[str, int]] = {}
        for s in steady:
            for name, slot in self.steps[s].items():
                merged = phases.setdefault(name, {})
                for key, value in slot.items():
                    merged[key] = max(merged.get(key, 0), value)
        timed = [s for s in sorted(self.seconds) if s >= max(1, warmup_steps)]
        out: dict[str, Any] = {"phases": phases, "setup": self.setup, "measured_steps": steady,
                               "steps": [{"step": s, **_peaks(self.steps[s])} for s in done],
                               "step_times_s": [round(self.seconds[s], 6) for s in timed],
                               "tokens_per_step": [self.tokens.get(s, 0) for s in timed]}
        out.update(_peaks(phases))
        return out


def _peaks(phases: dict[str, dict[str, int]]) -> dict[str, Any]:
    def top(key: str) -> int | None:
        values = [slot[key] for slot in phases.values() if key in slot]
        return max(values) if values else None

    alloc = top("allocated_bytes")
    sampled, derived = top("device_bytes"), top("device_derived_bytes")
    device = None if sampled is None and derived is None else max(sampled or 0, derived or 0)
    phase = max(phases, key=lambda p: phases[p].get("allocated_bytes", 0)) if phases else None
    return {"peak_allocated_bytes": alloc, "peak_reserved_bytes": top("reserved_bytes"),
            "device_peak_bytes": device, "device_sampled_peak_bytes": sampled, "rss_bytes": top("rss_bytes"),
            "peak_phase": phase}


def quiet() -> None:
    """No progress bars or advice banners from datasets / transformers in probe output."""
    import logging
    import warnings

    import datasets
    import transformers

    datasets.disable_progress_bars()
    transformers.logging.set_verbosity_error()
    logging.getLogger("DeepSpeed").setLevel(logging.WARNING)
    warnings.filterwarnings("ignore", category=FutureWarning)
    warnings.filterwarnings("ignore", category=UserWarning)


def estimate_before(job: Any) -> tuple[dict[str, Any] | None, str | None]:
    """The estimator's answer for the job, made before anything runs (None + the reason if it cannot)."""
    try:
        return estimate(job).to_json(), None
    except Exception as exc:  # noqa: BLE001 - a broken estimate must not lose the measurement
        return None, f"{type(exc).__name__}: {exc}"


def make_meter(device: str, capacity_bytes: int | None, local_rank: int = 0) -> Any:
    if device == "cpu":
        return CpuMeter(capacity_bytes)
    return CudaMeter(local_rank, capacity_bytes)


def measure(job: Any, *, device: str = "cpu", steps: int = 3, warmup_steps: int = 1,
            capacity_bytes: int | None = None, local_rank: int = 0, shards: bool | None = None,
            after: tuple[str, ...] = ()) -> dict[str, Any]:
    """Run the trainer and return what was measured (no estimate, no file); then the job phases `after` asks for."""
    import torch

    images = bool(job.train.images_per_example)
    cfg = fixtures.hf_config(job.model.name)
    cfg = fixtures.image_config(job, cfg) if images else cfg
    real = fixtures.has_weights(job.model.name)
    model_id = job.model.name if real else f"hpcmem-random/{job.model.name}"
    shards = job.parallel.world_size > 1 if shards is None else shards
    meter = make_meter(device, capacity_bytes, local_rank)
    clock = PhaseClock(meter, sync=None if device == "cpu" else torch.cuda.synchronize)
    result: dict[str, Any] = {"status": "ok"}
    t0 = time.perf_counter()
    timings: dict[str, float] = {}
    inventory = None
    with meter:
        trainer = None
        try:
            init_device = None if device == "cpu" else f"cuda:{local_rank}"
            with (fixtures.random_weights(cfg, model_id, init_device, image_text=images) if not real else _nothing()):
                try:
                    trainer, dropped = build_trainer(job, steps=steps, device=device, model_id=model_id, cfg=cfg)
                except ValueError as exc:       # TRL, peft or transformers refusing the job's settings as they stand
                    raise HpcmemError("the real trainer refused the job before its first step: "
                                      + " ".join(str(exc).split())[:400]) from None
            result["not_applied"] = dropped
            _count_loaded_weights(meter, trainer)
            timings["setup_s"] = time.perf_counter() - t0
            inventory = _instrument(trainer, clock, job, shards)
            t1 = time.perf_counter()
            trainer.train()
            clock.switch("end")
            timings["train_s"] = time.perf_counter() - t1
            if after:
                result["job_phases"] = run_job_phases(trainer, job, clock, after)
        except ImportError as exc:      # a package the job needs is missing here (flash_attn, bitsandbytes…)
            raise HpcmemError(f"the run cannot start on this machine: {type(exc).__name__}: {exc}") from None
        except (torch.OutOfMemoryError, RuntimeError) as exc:
            if not is_oom(exc):
                raise
            where = {"step": clock.step, "phase": clock.phase}
            clock.switch("oom")
            result.update(status="oom", oom={"message": str(exc).splitlines()[0][:500], **where})
        finally:
            totals = meter.totals()
            info = meter.info()
            del trainer
            gc.collect()
            if device != "cpu":
                torch.cuda.empty_cache()
    timings["total_s"] = time.perf_counter() - t0
    result.update(clock.summary(warmup_steps))
    result.update(totals=totals, device_info=info, timings=timings)
    if inventory is not None:
        result["shards"] = inventory.summary()
    if result["status"] == "oom":
        capacity = capacity_bytes or info.get("memory_bytes")
        result["oom"]["need_at_least_bytes"] = capacity
        result["oom"]["verdict"] = f"did not fit; measured ≥ capacity ({capacity} B)"
    return result


def _count_loaded_weights(meter: Any, trainer: Any) -> None:
    """Weights read from a checkpoint come from safetensors' storages, born outside any op the tracker sees: register
    every model tensor once the trainer holds them (a no-op for what was already counted)."""
    tracker = getattr(meter, "tracker", None)
    if tracker is None:
        return
    for model in (trainer.model, getattr(trainer, "ref_model", None)):
        if model is not None:
            tracker.tag(list(model.parameters()) + list(model.buffers()), "param")


def is_oom(exc: BaseException) -> bool:
    """torch's OutOfMemoryError, or a RuntimeError that wraps one (DeepSpeed, NCCL and cuBLAS re-raise as text)."""
    import torch

    text = str(exc).lower()
    return isinstance(exc, torch.OutOfMemoryError) or "out of memory" in text or "cublas_status_alloc_failed" in text


class _nothing:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: Any) -> None:
        return None


def _instrument(trainer: Any, clock: PhaseClock, job: Any, shards: bool) -> Any:
    """Hook the phases of the trainer into the clock; return a ShardInventory when asked for one."""
    from transformers import TrainerCallback

    inventory = None
    if shards:
        inventory = ShardInventory(trainer, clock)

    generation = entry(job.train.trainer).generates

    class Phases(TrainerCallback):
        def on_step_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            clock.switch("prepare" if generation else "forward", step=state.global_step)
            clock.begin_step(state.global_step)
            if inventory is not None:
                inventory.attach(state.global_step)

        def on_pre_optimizer_step(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            if inventory is not None:
                inventory.snapshot("pre_step")
            clock.switch("optimizer")

        def on_optimizer_step(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            clock.switch("after_step")

        def on_substep_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            if inventory is not None:       # a micro-batch of an accumulation window that is not its last
                inventory.snapshot("between_micro_batches")

        def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            clock.end_step(state.global_step - 1)       # global_step already counts the step just finished
            if inventory is not None:
                inventory.snapshot("resident")

    trainer.add_callback(Phases())
    _wrap(trainer, "compute_loss", clock, "forward", "backward")
    _count_tokens(trainer, clock)
    if generation:
        _wrap(trainer, "_prepare_inputs", clock, "generation", "forward")
    ref = getattr(trainer, "ref_model", None)
    if ref is not None and hasattr(ref, "forward"):
        _wrap(ref, "forward", clock, "reference", "forward")
    return inventory


def _wrap(obj: Any, name: str, clock: PhaseClock, before: str, after: str) -> None:
    original = getattr(obj, name)

    def wrapped(*args: Any, **kwargs: Any) -> Any:
        clock.switch(before)
        try:
            return original(*args, **kwargs)
        finally:
            clock.switch(after)

    setattr(obj, name, wrapped)


def count_tokens(inputs: Any) -> int:
    """Tokens one micro-batch trains on: the ones of its attention mask (TRL 1.16's SFT/DPO/Reward collators pad and
    mask; DPO's holds chosen and rejected rows), else the prompt and completion masks (GRPO/RLOO after
    `_prepare_inputs`), else every input id (packed and padding-free rows hold no padding)."""
    if not isinstance(inputs, Mapping):     # a vision-language collator's BatchFeature is a Mapping, not a dict
        return 0
    masks = [inputs[k] for k in ("attention_mask",) if k in inputs] or \
        [inputs[k] for k in ("prompt_mask", "completion_mask") if k in inputs]
    if masks:
        return int(sum(int(m.sum()) for m in masks if hasattr(m, "sum")))
    ids = inputs.get("input_ids")
    return int(ids.numel()) if hasattr(ids, "numel") else 0


def _count_tokens(trainer: Any, clock: PhaseClock) -> None:
    original = trainer.compute_loss

    def counted(model: Any, inputs: Any, *args: Any, **kwargs: Any) -> Any:
        clock.add_tokens(count_tokens(inputs))
        return original(model, inputs, *args, **kwargs)

    trainer.compute_loss = counted


def make_record(job: Any, *, measured: dict[str, Any], estimate: dict[str, Any] | None,
                estimate_error: str | None, device: str, steps: int, warmup_steps: int,
                capacity_bytes: int | None, started: float) -> Record:
    import datetime as dt
    import uuid

    info = measured.get("device_info") or {}
    gpu = None
    if device != "cpu":
        gpu = GpuInfo(gpu_name=info.get("gpu_name"), memory_bytes=info.get("memory_bytes"),
                      driver=None if info.get("driver") is None else str(info["driver"]),
                      extra={k: v for k, v in info.items() if k not in ("gpu_name", "memory_bytes", "driver")})
    return Record(
        id=uuid.uuid4().hex, case=os.environ.get("HPCMEM_PROBE_CASE"), campaign=os.environ.get("HPCMEM_CAMPAIGN"),
        created=dt.datetime.fromtimestamp(started, dt.timezone.utc).isoformat(timespec="seconds"),
        device=device, gpu=gpu, job=job_to_dict(job), model_config=_safe_config(job),
        run=RunInfo(steps=steps, warmup_steps=warmup_steps, capacity_bytes=capacity_bytes,
                    num_processes=job.parallel.world_size),
        versions={**package_versions(), **_torch_versions(info)}, env=relevant_env(), estimate=estimate,
        estimate_error=estimate_error, status=str(measured.get("status")),
        measured=Measured.from_json(measured, "probe result"),
    )


def _torch_versions(info: dict[str, Any]) -> dict[str, Any]:
    return {k: info.get(k) for k in ("cuda", "driver", "cudnn") if k in info} | {"gpu_name": info.get("gpu_name")}


def _safe_config(job: Any) -> dict[str, Any] | None:
    try:
        return fixtures.hf_config(job.model.name)
    except Exception:  # noqa: BLE001 - the spec in the record is enough to re-estimate
        return None
