"""What the final norm's backward brings back under activation offloading, traced per model type: the source of
hpcmem.models.final_norm's table.

    python -m hpcmem.lab.final_norm_scan [TYPE ...]

For each type with a stored random job (estimator/random/trace.jsonl; default all of them), traces one SFT step pair
of a one-row, 512-token job on that job's cut of the model with activation offloading and non-reentrant checkpointing
at bf16 weights — LoRA on all-linear, or full fine-tuning where hpcmem refuses that job on the type — recording every
device allocation (hpcmem.trace.snapshot). It prints one JSON row per type: the bytes that an unpack of the offloader
(hpcmem.trace.offload) during the LM head's backward phase left alive when the last decoder layer's backward begins,
per token per hidden unit (`width`), and whether it differs from the table (`table`).
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from hpcmem.errors import HpcmemError
from hpcmem.job.shape import micro_batch
from hpcmem.models.final_norm import restored_width
from hpcmem.trace.run import run_trace
from hpcmem.trace.snapshot import SnapshotRecorder
from hpcmem.validate.random_jobs import RandomJob
from hpcmem.validate.random_model import job_spec
from hpcmem.validate.random_run import load, records_path

HEAD_PHASE = "step 2 / backward / lm head / loss"
LAYER_PHASE = "step 2 / backward / layer "
TOKENS = 512
BASE = {"activation_offloading": True, "gradient_checkpointing": True, "bf16": True, "fp16": False,
        "dtype": "bfloat16", "max_length": TOKENS, "per_device_train_batch_size": 1}
LORA = {"use_peft": True, "lora_r": 8, "lora_alpha": 16, "lora_target_modules": ["all-linear"]}
FULL = {"use_peft": False, "router_aux_loss_coef": 0.0}


def restored_at_last_layer(events: list[dict[str, Any]], phases: list[str]) -> int:
    """Bytes the offloader's unpacks in the LM head's backward phase hold when the last layer's backward begins."""
    layers = [int(p[len(LAYER_PHASE):]) for p in phases if p.startswith(LAYER_PHASE)]
    if not layers:
        return 0
    last = f"{LAYER_PHASE}{max(layers)}"
    alive: dict[int, int] = {}
    for event, phase in zip(events, phases, strict=True):
        if phase == last:
            return sum(alive.values())
        if event["action"] == "alloc" and phase == HEAD_PHASE and any(
                f["name"] == "unpack" and f["filename"].endswith("trace/offload.py") for f in event["frames"]):
            alive[event["addr"]] = event["size"]
        elif event["action"] == "free_completed":
            alive.pop(event["addr"], None)
    return 0


def width(job: dict[str, Any]) -> dict[str, Any]:
    """The traced width of one stored random job's type (see the module docstring)."""
    for technique in (LORA, FULL):
        one = {**job, "trainer": "sft", "settings": {**BASE, **technique}}
        try:
            spec = job_spec(RandomJob.from_dict(one))
        except HpcmemError as exc:
            refused = str(exc)
            continue
        recorder = SnapshotRecorder()
        run_trace(spec, snapshot=recorder)
        got = restored_at_last_layer(recorder.events, recorder.phases)
        per = round(got / (micro_batch(spec).tokens * spec.model.hidden_size), 3)
        return {"model_type": job["model_type"], "technique": "lora" if technique is LORA else "full",
                "width": per, "table": restored_width(job["model_type"], 2)}
    return {"model_type": job["model_type"], "refused": refused[:200]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m hpcmem.lab.final_norm_scan", description=__doc__.split("\n")[0])
    ap.add_argument("types", nargs="*", help="model types (default: every type with a stored random job)")
    args = ap.parse_args(argv)
    jobs: dict[str, dict[str, Any]] = {}
    for rec in load(records_path("trace")):
        if rec.get("job"):
            jobs.setdefault(rec["job"]["model_type"], rec["job"])
    for name in args.types or sorted(jobs):
        if name not in jobs:
            print(json.dumps({"model_type": name, "refused": "no stored random job of this type"}), flush=True)
            continue
        print(json.dumps(width(jobs[name])), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
