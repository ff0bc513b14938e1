"""The job a record ran, as data: JobSpec ↔ dict, the allocator environment, installed versions (stdlib only)."""

from __future__ import annotations

import json
import os
import platform
from dataclasses import asdict, fields, is_dataclass, replace
from pathlib import Path
from typing import Any

from hpcmem.errors import SpecError
from hpcmem.gpus.spec import GpuSpec, PeakMargin
from hpcmem.job.job_env import ALLOC_VARS, allocator_expandable
from hpcmem.job.jobspec import JobSpec
from hpcmem.job.spec import ParallelSpec, TrainSpec
from hpcmem.models.profile import profile_from_record, profile_to_dict
from hpcmem.models.spec import ModelSpec
from hpcmem.models.vision import vision_spec_from_config

PACKAGES = ("torch", "transformers", "trl", "peft", "accelerate", "deepspeed", "datasets", "nvidia-ml-py", "hpcmem")
SHARED_ENV = "HPCMEM_PROBE_SHARED_GPU"    # "1": the probe shared its GPU with other probes (hpcmem.probe.concurrent)
ENV_KEYS = ALLOC_VARS + ("CUDA_VISIBLE_DEVICES", "NCCL_BUFFSIZE", "NCCL_NVLS_ENABLE", "OMP_NUM_THREADS", SHARED_ENV)


def expandable_in_env(env: dict[str, str] | None) -> bool:
    """Whether the recorded allocator settings ran expandable segments (read as torch reads them:
    hpcmem.job.job_env.allocator_expandable)."""
    return allocator_expandable(env or {})


def ran_expandable(job_data: Any, env: Any) -> bool:
    """Whether a recorded run had expandable segments: its spec asked for them or its allocator environment set them."""
    return bool((job_data or {}).get("expandable_segments", False)) or expandable_in_env(env)


def package_versions() -> dict[str, str | None]:
    """Installed versions read from package metadata (nothing is imported)."""
    from importlib import metadata      # stdlib, but ~20 ms of imports (email, zipfile): only a record needs it

    out: dict[str, str | None] = {"python": platform.python_version()}
    for name in PACKAGES:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


def relevant_env(environ: dict[str, str] | None = None) -> dict[str, str]:
    env = os.environ if environ is None else environ
    return {k: env[k] for k in ENV_KEYS if k in env}


def job_to_dict(job: Any) -> dict[str, Any]:
    """The job as JSON; a learned model's profile in its file's form (hpcmem.models.profile), which reads back."""
    learned = getattr(job.model, "learned", None) if job.model is not None else None
    if learned is None:
        return json.loads(json.dumps(asdict(job), default=_jsonable))
    # the job's fields one by one (a JobSpec rebuilt without the profile would be checked again, and fail), the
    # model's without its profile, which `asdict` would otherwise walk only to be replaced
    parts = {f.name: getattr(job, f.name) for f in fields(job)}
    parts["model"] = replace(job.model, learned=None)
    data = json.loads(json.dumps({k: asdict(v) if is_dataclass(v) else v for k, v in parts.items()},
                                 default=_jsonable))
    data["model"]["learned"] = json.loads(json.dumps(profile_to_dict(learned), default=_jsonable))
    return data


def job_from_dict(data: Any, env: Any = None, model_config: dict[str, Any] | None = None) -> Any:
    """Rebuild a JobSpec from `job_to_dict`; keys the current specs no longer have are dropped. `env` is the record's
    allocator environment: a run made under expandable_segments:True is such a job, whatever its spec said. A
    vision-language model's tower spec is rebuilt from `model_config` (the record's config.json), as the estimate
    built it (hpcmem.models.vision `vision_spec_from_config`); without one such a job cannot be rebuilt."""
    def build(cls: type, d: dict[str, Any] | None) -> Any:
        if d is None:
            return None
        names = {f.name for f in fields(cls)}
        kw = {k: (tuple(v) if isinstance(v, list) else v) for k, v in d.items() if k in names}
        if cls is ModelSpec and isinstance(kw.get("learned"), dict):
            kw["learned"] = profile_from_record(kw["learned"])
        if cls is ModelSpec and isinstance(kw.get("vision"), dict):
            if not model_config:
                raise SpecError(f"model {kw.get('name')!r}: a vision-language job is rebuilt from its config.json "
                                "(the record's model_config), and none was given")
            kw["vision"] = vision_spec_from_config(model_config, str(kw.get("name", "")))
        if cls is GpuSpec and kw.get("margins"):
            kw["margins"] = tuple(PeakMargin(**m) if isinstance(m, dict) else m for m in kw["margins"])
        for key in ("multi_gpu_margin", "single_gpu_margin"):
            if cls is GpuSpec and isinstance(kw.get(key), dict):
                kw[key] = PeakMargin(**kw[key])
        return cls(**kw)

    return JobSpec(model=build(ModelSpec, data["model"]), train=build(TrainSpec, data["train"]),
                   parallel=build(ParallelSpec, data.get("parallel") or {}), gpu=build(GpuSpec, data.get("gpu")),
                   expandable_segments=ran_expandable(data, env),
                   tokens_per_micro_batch=data.get("tokens_per_micro_batch"),
                   label_tokens_per_micro_batch=data.get("label_tokens_per_micro_batch"),
                   assumed=tuple(data.get("assumed") or ()))


def _jsonable(obj: Any) -> Any:
    if isinstance(obj, (set, frozenset, tuple)):
        return list(obj)
    if isinstance(obj, Path):
        return str(obj)
    return str(obj)
