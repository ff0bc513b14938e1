"""The trace's own check: the same two steps run for real on the CPU, counted by the same StorageTracker.

`measure_cpu(job)` builds the model with real (random) weights, hands it to TRL's plain `SFTTrainer` (no fake
world, no oracle, no patches: the real collator, the real `is_tracing`, `_move_model_to_device` and accelerate's
device placement) and counts every storage while `trainer.train()` runs two optimizer steps — a collated batch from
the step that takes it, as the trace counts it (hpcmem.trace.fakeenv `host_collator`, `sent_to_device`). For a tiny
model this takes seconds; `run_trace(job, kernels="cpu")` must land on the same peak (tests/trace/test_trace_selfcheck.py).
"""

from __future__ import annotations

import time

from hpcmem.job.jobspec import JobSpec
from hpcmem.job.trainers import entry
from hpcmem.trace.data import design_batch
from hpcmem.trace.fakeenv import host_collator, sent_to_device
from hpcmem.trace.phases import instrument
from hpcmem.trace.result import TraceResult, versions
from hpcmem.trace.run import _quiet
from hpcmem.trace.tracker import StorageTracker
from hpcmem.trace.trainer import build_model, build_trainer, require_traceable


def measure_cpu(job: JobSpec) -> TraceResult:
    """Peak live tensor bytes of two real SFTTrainer steps on the CPU (use a model small enough to run)."""
    require_traceable(job)
    start = time.perf_counter()
    design = design_batch(job)
    tracker = StorageTracker(round_to=1)
    with _quiet():
        model = build_model(job)
        num_params = sum(p.numel() for p in model.parameters())
        trainer = build_trainer(job, model, design, fake=False)
        if not entry(job.train.trainer).generates:     # generating trainers collate nothing (identity on prompts)
            trainer.data_collator = host_collator(trainer.data_collator, tracker)
        inst = instrument(trainer, tracker)
        try:
            with tracker, sent_to_device(trainer, tracker):
                trainer.train()
            inst.close_step()
        finally:
            inst.remove()
    best = max(inst.step_peaks, key=lambda s: s.peak_bytes)
    return TraceResult(
        model_name=job.model.name, num_params=num_params,
        peak_allocated_bytes=best.peak_bytes, phase=best.phase, components=best.components, kernels="cpu (real)",
        versions=versions(), seconds=time.perf_counter() - start,
        step_peaks=[{"step": s.step, "peak_allocated_bytes": s.peak_bytes, "phase": s.phase} for s in inst.step_peaks],
        batch={"layout": design.layout, "shape": list(design.batch_shape), "tokens": design.tokens},
        num_ops=tracker.num_ops,
    )
