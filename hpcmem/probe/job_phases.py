"""The job around the steps, measured: one evaluation and one checkpoint save after training, as the Trainer runs them.

- "evaluation": `trainer.evaluate` on rows shaped like the estimate's eval micro-batch (per_device_eval_batch_size
  rows, one batch per rank) — TRL's own eval path (prediction_step under no_grad).
- "checkpoint save": `Trainer._save_checkpoint`, what `save_strategy` triggers (transformers trainer.py): save_model
  (DeepSpeed's 16-bit gather or state-dict clone, FSDP's full or sharded state dict, safetensors) and, unless
  save_only_model, the optimizer (DeepSpeed `save_checkpoint`, `save_fsdp_optimizer`, torch.save).
Each gets the tracker's live-tensor peak (the clock's phase segment) and the process RSS: before, and its peak
(VmHWM, reset through /proc/self/clear_refs just before the phase). The C heap is trimmed first (glibc keeps freed
memory for reuse, so a phase after another would otherwise grow into pages the RSS already counts).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from hpcmem.probe import fixtures
from hpcmem.probe.meters import reset_rss_peak, rss_bytes, rss_peak_bytes, trim_heap

EVALUATION, SAVE = "evaluation", "checkpoint save"
PHASES = (EVALUATION, SAVE)


def eval_dataset(job: Any) -> Any:
    """Rows for one eval batch per rank, shaped like training rows of per_device_eval_batch_size."""
    t = job.train
    eval_job = dataclasses.replace(job, train=dataclasses.replace(
        t, per_device_train_batch_size=t.per_device_eval_batch_size, gradient_accumulation_steps=1))
    return fixtures.dataset(eval_job, steps=0)


def run_job_phases(trainer: Any, job: Any, clock: Any, phases: tuple[str, ...]) -> dict[str, dict[str, Any]]:
    unknown = sorted(set(phases) - set(PHASES))
    if unknown:
        raise ValueError(f"unknown job phase(s) {', '.join(unknown)}; choose from {', '.join(PHASES)}")
    out: dict[str, dict[str, Any]] = {}
    for name in phases:
        data = eval_dataset(job) if name == EVALUATION else None
        tracker = getattr(clock.meter, "tracker", None)
        trim_heap()
        reset_rss_peak()
        before, live_before = rss_bytes(), tracker.current_bytes if tracker is not None else None
        clock.switch(name)
        clock.pinned = True         # evaluate calls compute_loss, whose wrapper would switch to "forward"
        try:
            metrics = trainer.evaluate(eval_dataset=data) if name == EVALUATION else None
            if name == SAVE:
                trainer._save_checkpoint(trainer.model, trial=None)
        finally:
            clock.pinned = False
        clock.switch("end")
        segment = clock.steps.get(clock.step, {}).get(name, {})
        out[name] = {"allocated_bytes": segment.get("allocated_bytes"), "live_before_bytes": live_before,
                     "rss_before_bytes": before, "rss_peak_bytes": rss_peak_bytes(),
                     **({"metrics": metrics} if metrics is not None else {})}
    return out
