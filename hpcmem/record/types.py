"""The probe record: one typed, versioned dataclass, read from and written to one JSON line (stdlib only).

A record carries the job spec as it ran, the estimate made BEFORE the run, what was measured (per rank for
multi-process runs), the versions and the allocator environment, and timings. `Record.from_json` checks every part
the readers use (naming the file, the line and the field on a refusal) and upgrades older lines; `to_json` always
writes the current SCHEMA. Keys the record does not know are kept (`extra`) and written back unchanged.

Versions
  1  the H200 records of 2026-11-29 and the CPU records: no per-step times, `excluded` may be a bool
  2  measured.step_times_s / tokens_per_step (each optimizer step after step 0, per rank), `campaign`
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Mapping

from hpcmem.errors import SpecError
from hpcmem.record.cells import cell_of
from hpcmem.record.job import SHARED_ENV, job_from_dict, ran_expandable

SCHEMA = 2
PEAK_KEYS = {"allocated": "peak_allocated_bytes", "reserved": "peak_reserved_bytes", "device": "device_peak_bytes"}


class RecordError(SpecError, ValueError):
    """A records file or record hpcmem cannot read, naming the file, the line and the field."""


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:59] + "…"


class _Reader:
    """Typed access to one JSON object of a record; a wrong type is a RecordError naming `where` and the field."""

    def __init__(self, data: Any, where: str, path: str) -> None:
        if not isinstance(data, dict):
            raise RecordError(f"{where}: {path or 'a record'} must be an object; got {_shown(data)}")
        self.data, self.where, self.path, self.used = data, where, path, set()

    def bad(self, key: str, value: Any, rule: str) -> RecordError:
        return RecordError(f"{self.where}: {self.path + '.' if self.path else ''}{key} must be {rule}; "
                           f"got {_shown(value)}")

    def get(self, key: str, kinds: tuple[type, ...], rule: str, default: Any = None) -> Any:
        self.used.add(key)
        value = self.data.get(key)
        if value is None:
            return default
        if not isinstance(value, kinds) or (isinstance(value, bool) and bool not in kinds):
            raise self.bad(key, value, rule)
        return value

    def text(self, key: str, default: str | None = None) -> str | None:
        return self.get(key, (str,), "text or null", default)

    def count(self, key: str) -> int | None:
        value = self.get(key, (int, float), "a byte count (a number ≥ 0) or null")
        if value is not None and not (math.isfinite(value) and 0 <= value < 2**63):
            raise self.bad(key, value, "a byte count (a number ≥ 0) or null")
        return None if value is None else int(value)

    def obj(self, key: str) -> _Reader | None:
        value = self.get(key, (dict,), "an object or null")
        return None if value is None else _Reader(value, self.where, f"{self.path}.{key}" if self.path else key)

    def numbers(self, key: str, integer: bool = False) -> tuple:
        values = self.get(key, (list,), "a list of numbers ≥ 0", [])
        rule = "a list of " + ("whole numbers" if integer else "numbers") + " ≥ 0"
        for v in values:
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0 \
                    or (integer and v != int(v)):
                raise self.bad(key, values, rule)
        return tuple(int(v) if integer else float(v) for v in values)

    def rest(self) -> dict[str, Any]:
        return {k: v for k, v in self.data.items() if k not in self.used}


@dataclass(frozen=True, kw_only=True)
class Oom:
    """An out-of-memory result: the run needed at least the capacity it ran against."""

    message: str = ""
    step: int | None = None
    phase: str | None = None
    need_at_least_bytes: int | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def read(cls, r: _Reader) -> Oom:
        step = r.get("step", (int,), "a step number or null")
        return cls(message=r.text("message", "") or "", step=step, phase=r.text("phase"),
                   need_at_least_bytes=r.count("need_at_least_bytes"), extra=r.rest())

    def to_json(self) -> dict[str, Any]:
        return {**self.extra, "message": self.message, "step": self.step, "phase": self.phase,
                "need_at_least_bytes": self.need_at_least_bytes}


@dataclass(frozen=True, kw_only=True)
class Measured:
    """What one process (a rank) or the whole run measured. A run's peaks are its worst rank's (what must fit on
    every GPU); `ranks` keeps each rank whole. Step times and tokens are per optimizer step after step 0 (step 0
    creates the optimizer states, initialises cuBLAS and the allocator: not the steady state)."""

    status: str = "ok"                                  # ok | oom | error | aborted
    peak_allocated_bytes: int | None = None
    peak_reserved_bytes: int | None = None
    device_peak_bytes: int | None = None
    device_sampled_peak_bytes: int | None = None
    rss_bytes: int | None = None
    peak_phase: str | None = None
    oom: Oom | None = None
    step_times_s: tuple[float, ...] = ()
    tokens_per_step: tuple[int, ...] = ()
    rank: int | None = None
    ranks: tuple[Measured, ...] = ()
    extra: Mapping[str, Any] = field(default_factory=dict)   # phases, setup, totals, device_info, timings, shards…

    @classmethod
    def from_json(cls, data: Any, where: str = "measured") -> Measured:
        return cls.read(_Reader(data, where, "measured"))

    @classmethod
    def read(cls, r: _Reader) -> Measured:
        oom = r.obj("oom")
        ranks = r.get("ranks", (list,), "a list of rank objects", [])
        out = cls(status=r.text("status", "ok") or "ok", peak_allocated_bytes=r.count("peak_allocated_bytes"),
                  peak_reserved_bytes=r.count("peak_reserved_bytes"), device_peak_bytes=r.count("device_peak_bytes"),
                  device_sampled_peak_bytes=r.count("device_sampled_peak_bytes"), rss_bytes=r.count("rss_bytes"),
                  peak_phase=r.text("peak_phase"), oom=Oom.read(oom) if oom else None,
                  step_times_s=r.numbers("step_times_s"), tokens_per_step=r.numbers("tokens_per_step", integer=True),
                  rank=r.get("rank", (int,), "a rank number or null"),
                  ranks=tuple(cls.read(_Reader(x, r.where, f"{r.path}.ranks[{i}]")) for i, x in enumerate(ranks)),
                  extra=r.rest())
        if len(out.step_times_s) != len(out.tokens_per_step) and out.tokens_per_step:
            raise r.bad("tokens_per_step", list(out.tokens_per_step), "one count per timed step")
        return out

    def peak(self, name: str) -> int | None:
        return getattr(self, PEAK_KEYS[name])

    @property
    def tokens_per_s(self) -> float | None:
        """Tokens this process trained on per second over the timed steps (None without timed steps or tokens)."""
        seconds = sum(self.step_times_s)
        if not self.tokens_per_step or seconds <= 0:
            return None
        return sum(self.tokens_per_step) / seconds

    def to_json(self) -> dict[str, Any]:
        out = {**self.extra, "status": self.status, **{k: getattr(self, k) for k in (
            "peak_allocated_bytes", "peak_reserved_bytes", "device_peak_bytes", "device_sampled_peak_bytes",
            "rss_bytes", "peak_phase")}, "step_times_s": list(self.step_times_s),
            "tokens_per_step": list(self.tokens_per_step)}
        if self.oom is not None:
            out["oom"] = self.oom.to_json()
        if self.rank is not None:
            out["rank"] = self.rank
        if self.ranks:
            out["ranks"] = [r.to_json() for r in self.ranks]
        return out


@dataclass(frozen=True, kw_only=True)
class GpuInfo:
    """The GPU as the driver and torch reported it (None for a CPU run)."""

    gpu_name: str | None = None
    memory_bytes: int | None = None
    driver: str | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)     # cuda, cudnn, capability, device …

    @classmethod
    def read(cls, r: _Reader) -> GpuInfo:
        driver = r.get("driver", (str, int, float), "text or null")
        return cls(gpu_name=r.text("gpu_name"), memory_bytes=r.count("memory_bytes"),
                   driver=None if driver is None else str(driver), extra=r.rest())

    def to_json(self) -> dict[str, Any]:
        return {**self.extra, "gpu_name": self.gpu_name, "memory_bytes": self.memory_bytes, "driver": self.driver}


@dataclass(frozen=True, kw_only=True)
class RunInfo:
    steps: int | None = None
    warmup_steps: int | None = None
    capacity_bytes: int | None = None       # a simulated capacity (--capacity-bytes); None: the device's own
    num_processes: int = 1
    extra: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def read(cls, r: _Reader) -> RunInfo:
        whole = (int,), "a whole number or null"
        return cls(steps=r.get("steps", *whole), warmup_steps=r.get("warmup_steps", *whole),
                   capacity_bytes=r.count("capacity_bytes"), num_processes=r.get("num_processes", *whole, 1),
                   extra=r.rest())

    def to_json(self) -> dict[str, Any]:
        return {**self.extra, "steps": self.steps, "warmup_steps": self.warmup_steps,
                "capacity_bytes": self.capacity_bytes, "num_processes": self.num_processes}


def _job(r: _Reader) -> dict[str, Any]:
    """The job spec the record ran (hpcmem.record.job.job_to_dict's shape): the parts readers rebuild a JobSpec from."""
    job = r.obj("job")
    if job is None:
        raise r.bad("job", r.data.get("job"), "an object (the job spec the record ran)")
    for part in ("model", "train"):
        if not isinstance(job.data.get(part), dict):
            raise job.bad(part, job.data.get(part), "an object")
    for part in ("parallel", "gpu"):
        job.obj(part)
    if not isinstance(job.data["train"].get("trainer"), str):
        raise RecordError(f"{r.where}: job.train.trainer must be a trainer name; got "
                          f"{_shown(job.data['train'].get('trainer'))}")
    return job.data


def _estimate(r: _Reader) -> dict[str, Any] | None:
    est = r.obj("estimate")
    if est is None:
        return None
    per_gpu = est.obj("per_gpu")
    if per_gpu is not None:
        for key in PEAK_KEYS.values():
            per_gpu.count(key)
    return est.data


@dataclass(frozen=True, kw_only=True)
class Record:
    """One probe run (see the module docstring); `job` is the spec as a dict, `job_spec()` rebuilds the JobSpec."""

    id: str
    job: Mapping[str, Any]
    status: str                                   # ok | oom (a failed run leaves no record)
    measured: Measured
    schema: int = SCHEMA
    source: str = "probe"
    case: str | None = None                       # the probe kit's or a campaign's case name
    campaign: str | None = None                   # the campaign that ran it (hpcmem calibrate)
    created: str | None = None                    # ISO time the run started
    device: str = "cuda"                          # cuda | cpu
    gpu: GpuInfo | None = None
    run: RunInfo = field(default_factory=RunInfo)
    env: Mapping[str, str] = field(default_factory=dict)      # allocator and NCCL settings the run had
    versions: Mapping[str, Any] = field(default_factory=dict)
    estimate: Mapping[str, Any] | None = None     # Estimate.to_json() made before the run
    estimate_error: str | None = None
    timings: Mapping[str, float] = field(default_factory=dict)
    excluded: str | None = None                   # why the record is kept but left out of the accuracy
    repeat_of: str | None = None                  # the record whose peaks this run repeated byte for byte: its
    #                                               memory counts once in the accuracy, its step times still count
    model_config: Mapping[str, Any] | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def from_json(cls, data: Any, where: str = "record") -> Record:
        """Check and read one record (any schema up to SCHEMA; older ones are upgraded: what they lack is empty)."""
        r = _Reader(data, where, "")
        schema = r.get("schema", (int,), "a schema version", 1)
        if schema > SCHEMA:
            raise RecordError(f"{where}: schema {schema} is newer than this hpcmem reads ({SCHEMA}); upgrade hpcmem")
        ident = r.get("id", (str, int), "text")
        env = r.get("env", (dict,), "an object", {})
        for name, value in env.items():
            if not isinstance(value, str):
                raise r.bad(f"env.{name}", value, "text")
        excluded = r.get("excluded", (str, bool), "text (the reason) or a boolean")
        gpu, run, measured = r.obj("gpu"), r.obj("run"), r.obj("measured")
        status = r.text("status", "ok") or "ok"
        return cls(
            schema=SCHEMA, id=str(ident if ident is not None else ""), job=_job(r), status=status,
            measured=Measured.read(measured) if measured else Measured(status=status),
            source=r.text("source", "probe") or "probe", case=r.text("case"), campaign=r.text("campaign"),
            created=r.text("created"), device=r.text("device", "cuda") or "cuda",
            gpu=GpuInfo.read(gpu) if gpu else None, run=RunInfo.read(run) if run else RunInfo(),
            env=dict(env), versions=r.get("versions", (dict,), "an object", {}), estimate=_estimate(r),
            estimate_error=r.text("estimate_error"), timings=r.get("timings", (dict,), "an object", {}),
            excluded=(excluded or None) if not isinstance(excluded, bool) else ("excluded" if excluded else None),
            repeat_of=r.text("repeat_of"),
            model_config=r.get("model_config", (dict,), "an object or null"), extra=_rest(r))

    def to_json(self) -> dict[str, Any]:
        out = {**self.extra, "schema": SCHEMA, "id": self.id, "source": self.source, "case": self.case,
               "campaign": self.campaign, "created": self.created, "device": self.device,
               "gpu": self.gpu.to_json() if self.gpu else None, "cell": dict(zip(("trainer", "technique"), self.cell)),
               "job": dict(self.job), "model_config": self.model_config, "run": self.run.to_json(),
               "versions": dict(self.versions), "env": dict(self.env), "estimate": self.estimate,
               "estimate_error": self.estimate_error, "status": self.status, "measured": self.measured.to_json(),
               "timings": dict(self.timings)}
        if self.excluded:
            out["excluded"] = self.excluded
        if self.repeat_of:
            out["repeat_of"] = self.repeat_of
        return out

    # -- what readers ask of a record ---------------------------------------------------------------------------------
    @property
    def gpu_name(self) -> str | None:
        return self.gpu.gpu_name if self.gpu else None

    @property
    def cell(self) -> tuple[str, str]:
        return cell_of(self.job)

    @property
    def finished(self) -> bool:
        """A measurement to hold the estimate to: it ran (ok) or ran out of memory (oom)."""
        return self.source == "probe" and self.status in ("ok", "oom")

    @property
    def expandable(self) -> bool:
        return ran_expandable(self.job, self.env)

    @property
    def shared_gpu(self) -> bool:
        """The probe ran beside other probes on its GPU (hpcmem.probe.concurrent): its step times include their work,
        and its device level is NVML's per-process used memory, which leaves out part of the CUDA context that a solo
        run's device-wide reading holds — its allocated and reserved peaks are its own."""
        return self.env.get(SHARED_ENV) == "1"

    def predicted(self, peak: str) -> int | None:
        """The stored estimate's peak ("allocated", "reserved", "device"), None when the record has none."""
        per_gpu = (self.estimate or {}).get("per_gpu") or {}
        value = per_gpu.get(PEAK_KEYS[peak])
        return None if value is None else int(value)

    def job_spec(self) -> Any:
        """The JobSpec as it ran: the record's spec and its allocator environment (hpcmem.record.job)."""
        return job_from_dict(self.job, self.env, self.model_config)


def _rest(r: _Reader) -> dict[str, Any]:
    return {k: v for k, v in r.rest().items() if k not in ("cell",)}     # the cell is derived from the job
