"""`run_trace`: two optimizer steps of TRL's real SFTTrainer, DPOTrainer or RewardTrainer on a fake, full-size
model, every storage counted.

    result = run_trace(job)                 # kernels="cuda": what a CUDA GPU allocates
    result = run_trace(job, kernels="cpu")  # what a CPU run allocates (the self-check's reference)
    result = run_trace(job, allocator="both")   # + simulated caching allocator (hpcmem.estimate.caching_allocator)

The model is built from its config inside a FakeTensorMode on the fake CPU with the load dtype TRL uses; the
trainer is TRL's own (PEFT wrapping, gradient checkpointing, selective checkpointing, fused LM head, collator,
optimizer, gradient clipping) and `trainer.train()` runs `max_steps=2`: optimizer states are born in step 1, so the
steady peak is in step 2. See `hpcmem.trace.fakeenv` for the adjustments the fake world needs and
`hpcmem.trace.kernels` for the CUDA mapping.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from typing import Any, Literal

import hpcmem.trace.trainer as builders
from hpcmem.errors import SpecError
from hpcmem.estimate.caching_allocator import allocator_modes
from hpcmem.estimate.workspaces import workspace_bytes
from hpcmem.job.jobspec import JobSpec
from hpcmem.job.trainers import entry
from hpcmem.trace.data import design_batch, profiled_rows
from hpcmem.trace.events import EventLog
from hpcmem.trace.fakeenv import fake_collator, fake_world, sent_to_device
from hpcmem.trace.kernels import cuda_mapping
from hpcmem.trace.offload import OffloadEmulation
from hpcmem.trace.oracle import ROUTING_NOTE
from hpcmem.trace.phases import instrument
from hpcmem.trace.replay import Workspaces, replay
from hpcmem.trace.result import NOT_MODELLED, RESERVED_MODELLED, TraceResult, versions
from hpcmem.trace.tracker import CUDA_BLOCK_BYTES, StorageTracker
from hpcmem.trace.vision import NOTES as VISION_NOTES
from hpcmem.trace.trainer import build_model, build_trainer, load_dtype, require_traceable

Kernels = Literal["cuda", "cpu"]
KERNELS: tuple[str, ...] = ("cuda", "cpu")

# What the trace runs that is not TRL/transformers code, always.
ADJUSTMENTS: tuple[str, ...] = (
    "Trainer._move_model_to_device skipped and accelerate device_placement off (fake parameters cannot be swapped)",
    "collator runs on real tensors; the batch is handed over as fake tensors with known values",
    "a collated batch counts as host memory until Trainer.get_batch_samples takes it (where device placement would "
    "send it to the GPU; the batch the data loader collates one ahead waits on the host)",
    "transformers.masking_utils.is_tracing ignores FakeTensor (mask decisions use the batch's real values)",
    "values read from tensors computed from fake weights (loss, metrics) read as 0 / False",
)


def run_trace(job: JobSpec, kernels: Kernels = "cuda", *, timeline: bool = False,
              allocator: bool | str = False, generation: bool = False, steps: int | None = None,
              snapshot: Any = None, design: Any = None, say: Callable[[str], None] | None = None) -> TraceResult:
    """Trace two training steps of `job` (single GPU) and return the peak and its breakdown.

    `generation` (GRPO/RLOO, off by default: slow): run TRL's transformers `generate` call to full length in the
    phase "generation" instead of skipping it (hpcmem.trace.rl).

    `allocator` (off by default): record every counted device allocation (hpcmem.trace.events) and replay the stream
    through the caching-allocator model with cuBLAS's workspaces (hpcmem.trace.replay) — True/"default",
    "expandable" (expandable_segments:True), "both", or "auto" (the job's own mode); the stats land in
    `result.allocator`, the stream in `result.events`, and the reserved peak of the job's mode in the JSON's
    `peak_reserved_bytes` (`hpcmem trace` runs "auto" unless told `--allocator off`). `steps` (default 2): optimizer steps to run; a GPU probe runs 3 and reads steps 2–3; 1 sees every
    activation term of the step without the optimizer states (hpcmem.trace.learn reads the layers' terms from it, at
    half the cost).

    `snapshot` (a hpcmem.trace.snapshot.SnapshotRecorder, off by default) records every device allocation with its
    Python frames and phase, in the layout of torch's memory snapshot; the allocator model, if any, still hears all.

    `design` (a hpcmem.trace.data.BatchDesign, default the job's worst-case micro-batch) replaces the rows the
    dataset is made of: hpcmem.lab.shape_sequences hands in the rows of several micro-batches drawn from a length
    profile, so the steps see the shapes a real dataset gives.

    `say` (off by default) hears one line per stage (build, each traced step, the allocator replay), so a command
    that traces a large model for a minute shows that it is working."""
    if kernels not in KERNELS:
        raise SpecError(f"kernels must be one of {', '.join(KERNELS)}; got {kernels!r}")
    _check_single_gpu(job)
    job = profiled_rows(job)

    require_traceable(job)
    start = time.perf_counter()

    design = design_batch(job) if design is None else design
    sim, modes = _allocator_sim(job_mode(job) if allocator == "auto" else allocator)
    listener = sim
    if snapshot is not None:
        snapshot.inner, listener = sim, snapshot
    tracker = StorageTracker(round_to=CUDA_BLOCK_BYTES if kernels == "cuda" else 1, timeline=timeline,
                             allocator=listener)
    if snapshot is not None:
        snapshot.phase = lambda: tracker.current_phase
    notes: list[str] = list(ADJUSTMENTS) + trainer_notes(job, generation)
    with _quiet(), fake_world() as (_, oracle), _trace_steps(steps):
        mapping = cuda_mapping(tracker, job) if kernels == "cuda" else contextlib.nullcontext([])
        with mapping as mapped:
            if say:
                say(f"building {job.model.name} ({job.train.trainer}) on fake tensors")
            trainer, num_params = _build(job, design, generation)
            if steps is not None:
                trainer.args.max_steps = steps
            if say:
                say(f"tracing {trainer.args.max_steps} optimizer steps of {num_params:,} parameters")
                _say_each_step(trainer, say, start)
            if not entry(job.train.trainer).generates:    # generating trainers collate nothing (identity on prompts)
                trainer.data_collator = fake_collator(trainer.data_collator, oracle, tracker)
            _offload(job, trainer, tracker, notes)
            with sent_to_device(trainer, tracker):
                result = _train(trainer, tracker, oracle)
        notes += list(mapped)
    if oracle.unknown_reads:
        notes.append(f"unknown values read as defaults: {dict(oracle.unknown_reads)}")
    if oracle.routing_reads:
        notes.append(ROUTING_NOTE + f" (reads: {dict(oracle.routing_reads)})")
    out = _result(job, tracker, result, kernels, notes, num_params, design, time.perf_counter() - start)
    if modes:
        if say:
            say(f"replaying {len(sim.events):,} allocations through the caching-allocator model ({', '.join(modes)})")
        out.events = sim.events
        out.allocator = replay_modes(job, sim.events, modes)
        out.reserved_mode = job_mode(job) if job_mode(job) in modes else modes[0]
        out.not_modelled = [RESERVED_MODELLED.format(mode=out.reserved_mode) if n == NOT_MODELLED[1] else n
                            for n in out.not_modelled]
    elif sim is not None and hasattr(sim, "stats"):
        out.allocator = sim.stats()
    return out


def _say_each_step(trainer: Any, say: Callable[[str], None], start: float) -> None:
    """One line as each optimizer step ends (transformers TrainerCallback.on_step_end)."""
    from transformers import TrainerCallback

    class StepLines(TrainerCallback):
        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            say(f"step {state.global_step} of {state.max_steps} traced ({time.perf_counter() - start:.0f} s)")

    trainer.add_callback(StepLines())


def job_mode(job: JobSpec) -> str:
    """The allocator mode the job runs under: PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True or the default."""
    return "expandable" if job.expandable_segments else "default"


def _allocator_sim(choice: Any) -> tuple[Any, tuple[str, ...]]:
    """The listener the tracker feeds and the allocator modes to replay: an EventLog for a mode choice, None when off;
    an object with malloc/free is used as given (hpcmem.lab.allocator_sim records the stream that way)."""
    if hasattr(choice, "malloc"):
        return choice, ()
    try:
        modes = allocator_modes(choice)
    except ValueError as exc:
        raise SpecError(str(exc)) from None
    return (EventLog(), modes) if modes else (None, ())


def replay_modes(job: JobSpec, events: list[Any], modes: tuple[str, ...]) -> dict[str, dict[str, Any]]:
    """The allocator model's stats per mode for a recorded stream, cuBLAS workspaces sized for the job's GPU."""
    ws = Workspaces(cublas=workspace_bytes(job.gpu, job.env.cublas_workspace_bytes))
    out = {}
    for mode in modes:
        r = replay(events, expandable=mode == "expandable", workspaces=ws)
        out[mode] = {**r.stats, "steady_reserved_bytes": r.steady_reserved_bytes,
                     "steady_allocated_bytes": r.steady_allocated_bytes, "workspace_bytes": r.workspace_bytes}
    return out


@contextlib.contextmanager
def _trace_steps(steps: int | None) -> Any:
    """Run `steps` optimizer steps: the trainer builders read hpcmem.trace.trainer.TRACE_STEPS when they size the
    dataset and set max_steps."""
    if steps is None:
        yield
        return
    if steps < 1:
        raise SpecError(f"steps must be ≥ 1; got {steps}")
    saved, builders.TRACE_STEPS = builders.TRACE_STEPS, steps
    try:
        yield
    finally:
        builders.TRACE_STEPS = saved


def trainer_notes(job: JobSpec, generation: bool = False) -> list[str]:
    """What the trace does differently from a real run of the trainer (its registry hook `trace_notes`)."""
    notes = entry(job.train.trainer).hook("trace_notes")
    images = list(VISION_NOTES) if job.train.images_per_example else []
    return (list(notes(job, generation)) if notes is not None else []) + images


def _check_single_gpu(job: JobSpec) -> None:
    par = job.parallel
    if par.world_size > 1 or par.deepspeed or par.fsdp:
        raise SpecError(f"the trace runs one GPU; this job has {par.world_size} process(es) with "
                        f"{par.distributed_type}: trace the single-GPU job and shard analytically "
                        "(`hpcmem estimate` does both)")


def _build(job: JobSpec, design: Any, generation: bool = False) -> tuple[Any, int]:
    """The fake model in the load dtype (default dtype set to it, as the brief's feasibility run did) and TRL's
    trainer around it; returns (trainer, parameters of the model before PEFT adds adapters)."""
    import torch

    previous = torch.get_default_dtype()
    torch.set_default_dtype(load_dtype(job))
    try:
        model = build_model(job)
    finally:
        torch.set_default_dtype(previous)
    num_params = sum(p.numel() for p in model.parameters())
    trainer = build_trainer(job, model, design, fake=True, generation=generation)
    return trainer, num_params


def _offload(job: JobSpec, trainer: Any, tracker: Any, notes: list[str]) -> None:
    """Install the activation-offloading emulation where SFTTrainer.training_step looks for its context."""
    if job.train.activation_offloading:
        OffloadEmulation(trainer, tracker)
        notes.append(OffloadEmulation.NOTE)


def _train(trainer: Any, tracker: Any, oracle: Any) -> Any:
    """`trainer.train()` with the tracker counting every op output (through the oracle's dispatch: one mode, not
    two, on the per-op path)."""
    inst = instrument(trainer, tracker)
    oracle.observer = tracker
    try:
        trainer.train()
        inst.close_step()
    finally:
        oracle.observer = None
        inst.remove()
    return inst


def _result(job: JobSpec, tracker: Any, inst: Any, kernels: str, notes: list[str], num_params: int,
            design: Any, seconds: float) -> TraceResult:
    best = max(inst.step_peaks, key=lambda s: s.peak_bytes)
    warnings = []
    if job.train.gradient_accumulation_steps > 2:
        warnings.append(f"gradient_accumulation_steps {job.train.gradient_accumulation_steps} traced as 2: from the "
                        "second micro-batch on every micro-batch holds the same memory")
    return TraceResult(
        model_name=job.model.name, num_params=num_params, peak_allocated_bytes=best.peak_bytes, phase=best.phase,
        components=best.components, kernels=kernels, versions=versions(), seconds=seconds, reimplemented=notes,
        warnings=warnings,
        step_peaks=[{"step": s.step, "peak_allocated_bytes": s.peak_bytes, "phase": s.phase} for s in inst.step_peaks],
        batch={"layout": design.layout, "shape": list(design.batch_shape), "tokens": design.tokens,
               "documents": len(design.documents), "note": design.note},
        offloaded_host_peak_bytes=tracker.peak_uncounted_bytes, num_ops=tracker.num_ops, timeline=tracker.timeline,
        left_after_backward=dict(inst.left_after_backward), idle_in_layers=inst.idle_in_layers(),
    )


@contextlib.contextmanager
def _quiet() -> Any:
    """Silence transformers/TRL/datasets progress bars and info logs during the trace; whatever a library still prints
    (DeepSpeed's logger writes its accelerator notice to stdout when transformers imports it) goes to stderr, so
    `--json` output stays clean."""
    import logging
    import sys
    import warnings

    import datasets
    from transformers.utils import logging as hf_logging

    level = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    datasets.disable_progress_bars()
    loggers = [logging.getLogger(n) for n in ("trl", "accelerate", "datasets")]
    old = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings(), contextlib.redirect_stdout(sys.stderr):
            warnings.simplefilter("ignore")
            yield
    finally:
        hf_logging.set_verbosity(level)
        datasets.enable_progress_bars()
        for lg, lv in zip(loggers, old, strict=True):
            lg.setLevel(lv)
