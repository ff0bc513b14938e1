"""The real trainer as the oracle of a random job (hpcmem.validate.random_jobs): TRL's own trainer runs the job on a
shrunken model on the CPU.

`run_one(job)` (imports torch; never raises) answers two questions and returns one record:
- **refusal parity**: does TRL's real trainer raise on the job's settings (hpcmem.validate.trl_run, on the shrunken
  config: hpcmem.validate.shrink) exactly where hpcmem refuses the full job (hpcmem.validate.random_model.job_spec,
  as `hpcmem estimate` builds it)? A refusal that depends on the full size (a length past the positions) is kept by
  the shrink: the shrunken positions stay below the shrunken length.
- **peak parity**: where both run, the real CPU step of the shrunken job (hpcmem.trace.measure_cpu) and its
  `--kernels cpu` trace (hpcmem.trace.run_trace) land on the same peak within 1 %, in the same phase.

Verdicts (the random trace oracle's names where they mean the same): `parity` (both refuse), `missed refusal`
(hpcmem accepts, the real trainer raises), `false refusal` (hpcmem's rules refuse, the real trainer runs),
`declined` (the trainer runs, the estimate cannot stand behind the job and says so), `ran` (both run: then `peak`
says within / over 1 %, not traced, or failed), `not run on CPU` (the settings or the trainer's path need a GPU or
a GPU-only package), `shrink failed` (the shrunken config builds no model: the oracle's own limit),
`hpcmem crashed` (hpcmem raised something other than its one-line refusal).
"""

from __future__ import annotations

import json
import tempfile
import time
from pathlib import Path
from typing import Any

from hpcmem.errors import SpecError
from hpcmem.estimate import estimate
from hpcmem.job.trl_config import build_job
from hpcmem.models import resolve_model
from hpcmem.trace.learn import provisional_spec
from hpcmem.trace.result import versions
from hpcmem.trace.run import run_trace
from hpcmem.trace.selfcheck import measure_cpu
from hpcmem.trace.trainer import check_traceable
from hpcmem.validate.random_jobs import RandomJob, draw
from hpcmem.validate.random_model import job_spec
from hpcmem.validate.shrink import shrink_config
from hpcmem.validate.trl_run import deadline, quiet, run_trl

TOLERANCE = 0.01           # the trace's own bar against a real CPU step (tests/helpers/trace_helpers.py)
SHORTEST, LONGEST = 16, 64  # the shrunken max_length: the full one / 32, within these
LENGTH_FIELDS = ("max_length", "max_prompt_length", "max_completion_length")
# what the real trainer raises only for a package a CPU machine cannot have (transformers/integrations/hub_kernels.py:
# packed sequences through an SSM layer need causal_conv1d / mamba_ssm, CUDA kernels)
NEEDS_GPU_PACKAGE = ("to train on packed sequences",)
STAGE_SECONDS = 60         # a stage (trainer run, measure, trace) that takes longer is recorded as timed out


def shrunk_lengths(settings: dict[str, Any]) -> tuple[int, int, dict[str, Any]]:
    """(full length, shrunken length, settings with every length scaled by shrunken/full). The full length is
    max_length, or prompt + completion for the generating trainers (they have no max_length)."""
    s = dict(settings)
    full = s.get("max_length") or (s.get("max_prompt_length") or 0) + (s.get("max_completion_length") or 0) or 1024
    short = max(SHORTEST, min(LONGEST, full // 32))
    for key in LENGTH_FIELDS:
        if isinstance(s.get(key), int):
            s[key] = max(4, round(s[key] * short / full))
    return full, short, s


def run_one(job: RandomJob, *, steps: int = 1, peaks: bool = True) -> dict[str, Any]:
    """The record of one job (see the module docstring). Never raises. `steps`: optimizer steps of the refusal run
    (TRL raises on a job's settings while building the trainer or in its first step); `peaks` off: refusal parity
    only (the peak pair costs two more runs)."""
    start = time.perf_counter()
    rec: dict[str, Any] = {"id": job.id, "oracle": "trainer", "job": job.to_dict()}
    refused, by = hpcmem_verdict(job)
    if refused:
        rec["hpcmem_refused"], rec["hpcmem_refused_by"] = refused, by
    full, short, settings = shrunk_lengths(job.settings)
    config = shrink_config(job.config, full_length=full, max_length=short)
    rec["shrunk"] = {"config": config, "settings": settings}
    with quiet(), deadline(STAGE_SECONDS):
        try:
            trl = run_trl(job.trainer, settings, config, steps=steps)
        except TimeoutError:
            trl = None
    if trl is None:
        rec["trainer"] = {"ran": None, "reason": f"timed out after {STAGE_SECONDS} s"}
        rec["verdict"] = "oracle timed out"
    else:
        rec["trainer"] = {"ran": trl.ran, "reason": trl.reason, "adjusted": trl.adjusted,
                          "seconds": round(trl.seconds, 2)}
        rec["verdict"] = _verdict(trl.ran, trl.reason, by)
    if rec["verdict"] == "ran" and peaks:
        rec["peak"] = _peak_parity(job.trainer, settings, config)
    rec["versions"] = versions()
    rec["seconds"] = round(time.perf_counter() - start, 2)
    return rec


def rescore(rec: dict[str, Any]) -> dict[str, Any]:
    """The record with hpcmem's verdict taken again from today's code (the real trainer's stays as measured): a fix
    to hpcmem's rules rescores every record without running the trainer again."""
    if "job" not in rec or "trainer" not in rec or rec.get("verdict") == "oracle timed out":
        return rec
    refused, by = hpcmem_verdict(RandomJob.from_dict(rec["job"]))
    out = {k: v for k, v in rec.items() if k not in ("hpcmem_refused", "hpcmem_refused_by")}
    if refused:
        out["hpcmem_refused"], out["hpcmem_refused_by"] = refused, by
    out["verdict"] = _verdict(rec["trainer"]["ran"], rec["trainer"]["reason"], by)
    return out


def _verdict(ran: bool | None, reason: str, refused_by: str) -> str:
    if ran is None:
        return "shrink failed" if reason.startswith("shrunken model") else "not run on CPU"
    if not ran and any(m in reason for m in NEEDS_GPU_PACKAGE):
        return "not run on CPU"
    if refused_by == "crash":
        return "hpcmem crashed"
    if ran:
        return "declined" if refused_by == "estimate" else "false refusal" if refused_by else "ran"
    return "parity" if refused_by else "missed refusal"


def hpcmem_verdict(job: RandomJob) -> tuple[str, str]:
    """hpcmem's refusal of the full job, one line, and by what ("", "" where `hpcmem estimate` answers): "rules"
    (hpcmem.job.trl_config.build_job: TRL's, peft's and the layout's refusals as hpcmem reads them) or "estimate"
    (hpcmem.estimate.estimate: peft's default targets of a type, and what the estimate cannot stand behind, such as a
    learned profile's unlearned cell) — what a user of `hpcmem estimate` sees."""
    try:
        spec = job_spec(job)
    except SpecError as exc:
        return " ".join(str(exc).split())[:400], "rules"
    except Exception as exc:  # noqa: BLE001 — a crash of hpcmem's reading is a finding, recorded as such
        return f"crashed: {type(exc).__name__}: {' '.join(str(exc).split())[:380]}", "crash"
    try:
        estimate(spec)
    except SpecError as exc:
        return " ".join(str(exc).split())[:400], "estimate"
    except Exception as exc:  # noqa: BLE001
        return f"crashed: {type(exc).__name__}: {' '.join(str(exc).split())[:380]}", "crash"
    return "", ""


def shrunk_job(trainer: str, settings: dict[str, Any], config: dict[str, Any], folder: Path) -> Any:
    """The shrunken job as hpcmem builds it from a config.json (hpcmem.models.resolve_model; a type hpcmem reads only
    through a learned profile is taken from the meta model, as `hpcmem probe` does: hpcmem.trace.learn)."""
    path = folder / "config.json"
    path.write_text(json.dumps(config))
    try:
        model = resolve_model(str(path))
    except SpecError:
        model = provisional_spec(config, str(path))
    s = dict(settings, model_name_or_path=str(path))
    if trainer == "distillation":
        s["teacher_model_name_or_path"] = str(path)
    return build_job(trainer, s, model=model)[0]


def _peak_parity(trainer: str, settings: dict[str, Any], config: dict[str, Any]) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="hpcmem-shrunk-") as tmp:
        try:
            job = shrunk_job(trainer, settings, config, Path(tmp))
        except SpecError as exc:
            return {"verdict": "shrunk job refused", "why": " ".join(str(exc).split())[:400]}
        problems = check_traceable(job)
        if problems:
            return {"verdict": "not traced", "why": "; ".join(problems)[:400]}
        out: dict[str, Any] = {}
        with quiet(), deadline(STAGE_SECONDS):
            try:
                real = measure_cpu(job)
                out["real"] = {"peak_allocated_bytes": real.peak_allocated_bytes, "phase": real.phase,
                               "seconds": round(real.seconds, 2)}
                traced = run_trace(job, kernels="cpu")
                out["trace"] = {"peak_allocated_bytes": traced.peak_allocated_bytes, "phase": traced.phase,
                                "seconds": round(traced.seconds, 2)}
            except Exception as exc:  # noqa: BLE001 — every outcome is a record
                side = "trace" if "real" in out else "measure_cpu"
                return {**out, "verdict": f"{side} failed", "why": f"{type(exc).__name__}: "
                        f"{' '.join(str(exc).split())[:380]}"}
    delta = (out["trace"]["peak_allocated_bytes"] - out["real"]["peak_allocated_bytes"]) / max(
        1, out["real"]["peak_allocated_bytes"])
    same_phase = out["trace"]["phase"] == out["real"]["phase"]
    out["delta_pct"] = round(100 * delta, 3)
    out["verdict"] = "within 1 %" if abs(delta) <= TOLERANCE and same_phase else (
        "over 1 %" if abs(delta) > TOLERANCE else "other phase")
    return out


def run_many(seed: int, indices: range, out: Path, peak_every: int = 1) -> None:
    """Append the record of job (seed, i) for every i in `indices` to `out` (.jsonl), skipping ids it holds; the
    peak pair for every `peak_every`-th index."""
    out.parent.mkdir(parents=True, exist_ok=True)
    done = {json.loads(line)["id"] for line in out.read_text().splitlines() if line.strip()} if out.exists() else set()
    for index in indices:
        if f"s{seed}-{index}" in done:
            continue
        try:
            job = draw(seed, index)
        except Exception as exc:  # noqa: BLE001 — a draw that fails is recorded, the batch goes on
            rec = {"id": f"s{seed}-{index}", "oracle": "trainer", "verdict": "draw failed",
                   "why": f"{type(exc).__name__}: {' '.join(str(exc).split())[:380]}"}
        else:
            rec = run_one(job, peaks=index % peak_every == 0)
        with out.open("a") as f:
            f.write(json.dumps(rec, default=str) + "\n")
        print(rec["id"], rec.get("verdict"), rec.get("peak", {}).get("verdict", ""), rec.get("seconds", ""),
              flush=True)


def add_peaks(path: Path, until: float) -> None:
    """The peak pair for records of `path` where both ran and no pair was taken (a refusal-only pass first, the
    pairs after), until time.time() reaches `until`; each record is rewritten in place when its pair is in."""
    records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    for i, rec in enumerate(records):
        if time.time() >= until:
            break
        if "peak" in rec or rescore(rec).get("verdict") != "ran":
            continue
        rec["peak"] = _peak_parity(rec["job"]["trainer"], rec["shrunk"]["settings"], rec["shrunk"]["config"])
        path.write_text("".join(json.dumps(r, default=str) + "\n" for r in records))
        print(rec["id"], rec["peak"]["verdict"], rec["peak"].get("delta_pct", ""), flush=True)


if __name__ == "__main__":       # python -m hpcmem.validate.random_trainer SEED START STOP OUT [PEAK_EVERY]
    # python -m hpcmem.validate.random_trainer peaks OUT SECONDS
    import sys

    if sys.argv[1] == "peaks":
        add_peaks(Path(sys.argv[2]), time.time() + float(sys.argv[3]))
        sys.exit(0)
    run_many(int(sys.argv[1]), range(int(sys.argv[2]), int(sys.argv[3])), Path(sys.argv[4]),
             int(sys.argv[5]) if len(sys.argv) > 5 else 1)
