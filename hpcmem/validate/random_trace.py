"""The trace as the oracle of a random job (hpcmem.validate.random_jobs): what the trace measured is stored, the
estimate is not — `score` recomputes it from the stored job, so a fix to the estimate or a profile rescores every
record without tracing again.

`trace_record(job)` (a worker's task; imports torch) runs hpcmem.trace.run_trace(kernels="cuda", allocator="default")
on the job as hpcmem builds it. A job hpcmem refuses by TRL's rules (hpcmem.job.rules.check_job, raised while the
JobSpec is built) is traced with those rules off, so that the real TRL/peft/transformers code says itself whether it
runs: that is refusal parity. The trace builds TRL's trainer from hpcmem's JobSpec, not from the settings, so before
it TRL's own config classes are built from the job's settings (hpcmem.validate.trl_run.config_refusal, as
`trl <trainer>` parses them): a field the trainer's config has not (DistillationConfig's `packing`) or a check of its
__post_init__ is the real code's refusal (`refused: <line>`, origin `trl config`), and the job is not traced. An
exception the trace raises is sorted by where it was raised (`origin`):
- in trl/transformers/peft/accelerate: the real code refuses the job (`refused: <line>`);
- a SpecError of hpcmem.trace (fp16, a trainer or kernel it cannot run on CPU): `not traced: <line>` (the
  properties oracle still scores the estimate);
- anything else (torch's fake tensors, hpcmem's own trace code): `trace failed: <line>`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import time
import traceback
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import hpcmem.job.jobspec as jobspec_module
from hpcmem.datapath import PACKAGE_DIR
from hpcmem.errors import SpecError
from hpcmem.estimate import estimate, shared_step
from hpcmem.estimate.breakdown import Estimate
from hpcmem.estimate.trainers import is_generation_phase
from hpcmem.estimate.workspaces import tensor_bytes
from hpcmem.job.jobspec import JobSpec
from hpcmem.job.position_limits import position_problems
from hpcmem.job.trainers import entry
from hpcmem.trace import run_trace
from hpcmem.validate.oracle_data import scored_as_traced
from hpcmem.validate.random_jobs import RandomJob
from hpcmem.validate.random_model import job_spec
from hpcmem.validate.trace import model_reserved
from hpcmem.validate.trl_run import config_refusal

WITHIN_PCT = 3.0
POSITIONS_UNSEEN = "a position past the model's table, read on fake tensors, raises nothing"
OUTSIDE_HELD = "outside held range"
REAL_CODE = ("trl", "transformers", "peft", "accelerate")
MODULE_GETATTR = "torch/nn/modules/module.py:"
SHAPE_CHECK = "torch/__init__.py:"        # torch._check_with, under torch._check / _check_value / _check_index
# the trace's TorchDispatchModes (hpcmem/trace/oracle.py, tracker.py `__torch_dispatch__`): every op passes them
TRACE_DISPATCH = ("hpcmem/trace/oracle.py:", "hpcmem/trace/tracker.py:")
# the sources a stored trace depends on beside the job (which the record holds whole, config included): hpcmem's trace
DIGESTED = ("trace",)


def sources_digest() -> str:
    """sha256 (16 hex) over the sources a stored trace depends on: a record with another digest is stale."""
    h = hashlib.sha256()
    for name in DIGESTED:
        root = PACKAGE_DIR / name
        for f in sorted(root.rglob("*.py")) if root.is_dir() else [root]:
            h.update(str(f.relative_to(PACKAGE_DIR)).encode() + b"\0" + f.read_bytes())
    return h.hexdigest()[:16]


@contextlib.contextmanager
def trl_rules_off() -> Iterator[None]:
    """JobSpec built without hpcmem's verdicts on TRL's rules (hpcmem.job.rules.check_job), for the trace of a job
    hpcmem refuses: the real code then runs the job and refuses it or not. Only the trace worker uses this."""
    saved = jobspec_module.check_job
    jobspec_module.check_job = lambda job: None
    try:
        yield
    finally:
        jobspec_module.check_job = saved


def origin(exc: BaseException, depth: int = 1) -> str:
    """`package/file.py:line` of the frame that raised, site-packages or hpcmem relative; `depth` > 1: that many
    innermost frames, each followed by its caller (" < ")."""
    frames = traceback.extract_tb(exc.__traceback__)
    if not frames:
        return "?"
    return " < ".join(_where(f) for f in reversed(frames[-depth:]))


def _where(f: Any) -> str:
    path = Path(f.filename)
    parts = path.parts
    for anchor in ("site-packages", "hpcmem"):
        if anchor in parts:
            i = len(parts) - 1 - parts[::-1].index(anchor)
            rel = parts[i + 1:] if anchor == "site-packages" else parts[i:]
            return f"{'/'.join(rel)}:{f.lineno}"
    return f"{path.name}:{f.lineno}"


def caller_of_shape_check(exc: BaseException) -> str | None:
    """`package/file.py:line` of the code whose tensor op failed torch's own shape check (`torch._check*`,
    torch/__init__.py, which the meta functions and refs that give fake tensors their shapes call), past torch's
    frames and the trace's dispatch hook; None for any other exception. Shapes are values fake tensors carry, so a
    shape check fails on them exactly where it fails on a GPU's tensors: the real code's refusal."""
    frames = traceback.extract_tb(exc.__traceback__)
    if not frames or not _where(frames[-1]).startswith(SHAPE_CHECK):
        return None
    for f in reversed(frames):
        where = _where(f)
        if not where.startswith(("torch/", *TRACE_DISPATCH)):
            return where
    return None


def classify(exc: BaseException) -> str:
    where = origin(exc)
    if isinstance(exc, AttributeError) and where.startswith(MODULE_GETATTR):
        # torch's Module.__getattr__ only reports a missing attribute: the code that asked for it raised (peft's
        # PeftModelForCausalLM reading a sequence-classification model's prepare_inputs_for_generation)
        where = origin(exc, depth=2).split(" < ")[-1]
    where = caller_of_shape_check(exc) or where
    line = f"{type(exc).__name__}: {' '.join(str(exc).split())}"[:400]
    if where.split("/", 1)[0] in REAL_CODE:
        return f"refused: {line}"
    if isinstance(exc, SpecError) and where.startswith("hpcmem/trace"):
        return f"not traced: {line}"
    return f"trace failed: {line}"


def trace_record(job_dict: dict[str, Any]) -> dict[str, Any]:
    """Trace one random job; the record (job, trace result or outcome, versions, seconds, digest). Never raises."""
    job = RandomJob.from_dict(job_dict)
    start = time.perf_counter()
    rec: dict[str, Any] = {"id": job.id, "job": job.to_dict(), "sources": sources_digest()}
    try:
        trl_refuses = config_refusal(job.trainer, job.settings)
        spec = None
        try:
            spec = job_spec(job)
        except SpecError as refused:
            rec["hpcmem_refused"] = " ".join(str(refused).split())[:400]
        if trl_refuses:
            rec["outcome"], rec["origin"] = f"refused: {trl_refuses}"[:410], "trl config"
        else:
            with trl_rules_off():    # run_trace rebuilds the JobSpec (dataclasses.replace) on some paths
                r = run_trace(spec or job_spec(job), kernels="cuda", allocator="default")
            rec["trace"] = {"peak_allocated_bytes": r.peak_allocated_bytes, "phase": r.phase,
                            "components": r.components, "reserved": model_reserved(r.allocator),
                            "step_peaks": r.step_peaks, "warnings": list(r.warnings)}
            rec["versions"] = r.versions
    except Exception as exc:  # noqa: BLE001 — every outcome is a record
        rec["outcome"] = classify(exc)
        rec["origin"] = caller_of_shape_check(exc) or origin(exc)
        rec["stack"] = origin(exc, 8)
    rec["seconds"] = round(time.perf_counter() - start, 2)
    return rec


def as_traced(spec: JobSpec) -> tuple[Estimate, tuple[str, ...]]:
    """The estimate over the instants the trace runs, and the estimate's phases it leaves out. `trace_record` runs
    GRPO/RLOO/distillation with their generation replaced by fixed completions (hpcmem.trace.rl,
    hpcmem.trace.distillation: `run_trace(generation=False)`), so the estimate's generation instants
    (hpcmem.estimate.trainers `generation_instants`, held to the trace with generation on in
    tests/trace/test_trace_grpo.py) are dropped before the peak and the allocator's slack are worked out — else a
    generation peak is scored against a trace that never generated."""
    st = shared_step(spec)
    if not entry(spec.train.trainer).generates:
        return estimate(spec, shared=st), ()
    left = tuple(p.name for p in st.phases if is_generation_phase(p.name))
    kept = tuple(p for p in st.phases if not is_generation_phase(p.name))
    return estimate(spec, shared=dataclasses.replace(st, phases=kept)), left


def refused_by(job: RandomJob, exc: SpecError) -> str:
    """"positions" when the rules refuse the job only for a row past the model's position table
    (hpcmem.job.position_limits) — a refusal the fake-tensor trace cannot check where the table is indexed by value —,
    else "rules"."""
    try:
        with trl_rules_off():
            spec = job_spec(job)
    except SpecError:
        return "rules"
    return "positions" if exc.problems == position_problems(spec) else "rules"


def estimated(job: RandomJob) -> dict[str, Any]:
    """hpcmem's answer for the job now: {"refused": line, "by": "rules"|"estimate"} or the allocated tensor peak
    (cuBLAS workspaces and block tails left out, as `validate trace` compares it), the reserved peak and the phase,
    over the instants the trace runs (`as_traced`; `unscored`: the estimate's phases the trace does not run)."""
    try:
        spec = job_spec(job)
    except SpecError as exc:
        return {"refused": " ".join(str(exc).split())[:400], "by": refused_by(job, exc)}
    try:
        est, unscored = as_traced(scored_as_traced(spec))
    except SpecError as exc:
        return {"refused": " ".join(str(exc).split())[:400], "by": "estimate"}
    except Exception as exc:  # noqa: BLE001 — a crash of the estimate is a finding, not a refusal
        return {"crashed": f"{type(exc).__name__}: {exc}"[:400]}
    return {"allocated": max(tensor_bytes(p) for p in est.phases), "reserved": est.peak_reserved_bytes,
            "spread": est.reserved_spread_bytes, "phase": est.peak_phase.name, "made": est.made,
            "not_modelled": list(est.not_modelled), "not_held": list(est.not_held), "unscored": list(unscored)}


def score(rec: dict[str, Any]) -> dict[str, Any]:
    """One record against today's estimate: {"verdict": ..., "err_pct", "reserved_err_pct", ...}. Verdicts:
    within / over 3 % (both ran; allocated and reserved both within 3 % for "within"), parity (both refuse),
    missed refusal (hpcmem estimates, the real code raises), false refusal (hpcmem's TRL rules refuse, the real code
    runs), declined (the estimate cannot stand behind the job: a learned profile's cell, fp32 compute, and says so),
    outside held range (both ran, but the estimate warns that its number lies outside where the learned profile was
    held: hpcmem.estimate.learned_range; its errors are kept, and `held_within` says whether they are within 3 %),
    not traced, trace failed, estimate crashed."""
    est = estimated(RandomJob.from_dict(rec["job"]))
    out: dict[str, Any] = {"id": rec["id"], "estimate": est}
    trace, outcome = rec.get("trace"), rec.get("outcome", "")
    if "crashed" in est:
        return {**out, "verdict": "estimate crashed", "why": est["crashed"]}
    if outcome.startswith("not traced"):
        if "refused" not in est and "TRL's own rule" in outcome:     # the trace's check knows a rule the rules miss
            return {**out, "verdict": "missed refusal", "why": outcome}
        return {**out, "verdict": "not traced", "why": outcome}
    if outcome.startswith("trace failed"):
        return {**out, "verdict": "trace failed", "why": outcome}
    real_refuses = outcome.startswith("refused")
    if "refused" in est:
        if real_refuses:
            return {**out, "verdict": "parity", "why": outcome}
        if est["by"] == "positions":
            # an embedding read past its table runs on fake tensors (no values): the trace ran, a GPU would not;
            # the trainer oracle, on real values, holds this refusal (hpcmem.validate.random_trainer)
            return {**out, "verdict": "not traced", "why": f"not traced: {POSITIONS_UNSEEN}: {est['refused']}"}
        verdict = "false refusal" if est["by"] == "rules" else "declined"
        return {**out, "verdict": verdict, "why": est["refused"]}
    if real_refuses:
        return {**out, "verdict": "missed refusal", "why": outcome}
    traced = trace["peak_allocated_bytes"]
    err = 100.0 * (est["allocated"] - traced) / traced
    out |= {"err_pct": round(err, 3), "traced": traced, "traced_phase": trace["phase"]}
    model = (trace.get("reserved") or {}).get("default")
    if model:
        out["reserved_err_pct"] = round(100.0 * (est["reserved"] - model) / model, 3)
        # what lies outside the estimate ± half the block it says it cannot place (as `validate trace --reserved`)
        beyond = max(0.0, abs(est["reserved"] - model) - est["spread"] / 2)
        out["reserved_beyond_spread_pct"] = round(100.0 * beyond / model, 3)
    worst = max(abs(err), abs(out.get("reserved_err_pct", 0.0)))
    errors = (f"allocated {err:+.2f} % (estimate {est['phase']}, trace {trace['phase']})"
              + (f", reserved {out['reserved_err_pct']:+.2f} %" if "reserved_err_pct" in out else ""))
    if est["not_held"]:
        # the estimate said it cannot stand behind this number: neither agreement nor a discrepancy of the estimate
        return {**out, "verdict": OUTSIDE_HELD, "held_within": worst <= WITHIN_PCT,
                "why": f"{errors}; {est['not_held'][0]}"}
    return {**out, "verdict": "within 3 %" if worst <= WITHIN_PCT else "over 3 %",
            "why": "" if worst <= WITHIN_PCT else errors}
