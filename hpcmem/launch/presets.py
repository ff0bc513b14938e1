"""Site presets: one YAML per cluster (or partition), owned by its admins, validated strictly.

Search order for `--preset NAME` (a path to a file is read as is):
`$HPCMEM_PRESETS` (colon-separated folders), `/etc/hpcmem/presets`, `~/.config/hpcmem/presets`, then the examples
shipped in `hpcmem/presets`. NAME is a file's stem (`mycluster-h100` for `mycluster-h100.yaml`).

Precedence when a job is built: hpcmem's defaults < the preset's `defaults` < the user's TRL YAML < CLI flags.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Mapping

from hpcmem.errors import HpcmemError, Problems, SpecError

ENV_PRESETS = "HPCMEM_PRESETS"
SYSTEM_DIR = Path("/etc/hpcmem/presets")
SHIPPED_DIR = Path(__file__).resolve().parent.parent / "presets"
GPU_REQUEST_FORMS = ("gres", "gpus_per_node")
CONTAINER_KINDS = ("pyxis", "apptainer")


@dataclass(frozen=True, kw_only=True)
class Container:
    """pyxis (`srun --container-image`) or apptainer (`apptainer exec --nv IMAGE`)."""

    kind: str
    image: str
    mounts: tuple[str, ...] = ()
    options: tuple[str, ...] = ()     # extra srun (pyxis) or `apptainer exec` (apptainer) arguments


@dataclass(frozen=True, kw_only=True)
class Preset:
    """What a site's admin knows about a partition; keys of the YAML are exactly these field names."""

    name: str
    source: str                              # the file it came from (not a YAML key)
    partition: str
    gpu: str                                 # a GPU catalog name (hpcmem gpus): memory and speed come from there
    gpus_per_node: int
    cpus_per_node: int
    max_time: str                            # SLURM time format: "MM", "HH:MM:SS", "D-HH[:MM[:SS]]"
    memory_per_node_gb: int | None = None    # None → no --mem line (the partition's default)
    gpu_request: str = "gres"                # "gres" → --gres=gpu[:type]:G ; "gpus_per_node" → --gpus-per-node
    gres_type: str | None = None             # e.g. "h100" → --gres=gpu:h100:8
    account: str | None = None
    qos: str | None = None
    constraint: str | None = None
    max_nodes: int | None = None
    modules: tuple[str, ...] = ()            # `module load` each, in order
    setup: tuple[str, ...] = ()              # shell lines run before the launch (venv/conda activation); trusted
    env: Mapping[str, str] = field(default_factory=dict)   # NCCL/GLOO interfaces, IB/EFA, HF_HOME, HF_HUB_OFFLINE…
    container: Container | None = None
    signal_lead_s: int = 300                 # --signal=B:USR1@lead for requeue; one checkpoint save must fit
    max_array_size: int | None = None        # the cluster's MaxArraySize (probe arrays stay below it)
    defaults: Mapping[str, Any] = field(default_factory=dict)  # TRL/spec field defaults for this site
    description: str = ""

    @property
    def memory_per_node_bytes(self) -> int | None:
        """`--mem=<n>G` in bytes: SLURM's G suffix is 1024 megabytes of 1024² bytes (sbatch(1) --mem)."""
        return None if self.memory_per_node_gb is None else self.memory_per_node_gb * 1024**3

    @property
    def max_time_min(self) -> int:
        return parse_time_min(self.max_time)

    def gpu_spec(self):
        """The catalog entry for `gpu` (hpcmem.gpus)."""
        from hpcmem.gpus import gpu_spec

        return gpu_spec(self.gpu)


def preset_settings(preset: Preset, gpu_flag: str | None = None) -> dict[str, Any]:
    """The job settings a preset brings: its `defaults` and its GPU. A --gpu naming another GPU is refused: the job
    runs on the preset's."""
    if gpu_flag and gpu_flag.lower() != preset.gpu.lower():
        raise HpcmemError(f"--gpu {gpu_flag} disagrees with preset {preset.name} ({preset.gpu}): the job runs on the "
                          "preset's GPU; drop --gpu or choose another preset")
    return {**preset.defaults, "gpu": preset.gpu}


YAML_KEYS: tuple[str, ...] = tuple(f.name for f in fields(Preset) if f.name != "source")
CONTAINER_KEYS: tuple[str, ...] = tuple(f.name for f in fields(Container))
_REQUIRED = ("partition", "gpu", "gpus_per_node", "cpus_per_node", "max_time")
_INT = ("gpus_per_node", "cpus_per_node", "memory_per_node_gb", "max_nodes", "signal_lead_s", "max_array_size")
_STR = ("name", "partition", "gpu", "max_time", "gpu_request", "gres_type", "account", "qos", "constraint",
        "description")


def parse_time_min(text: str | int) -> int:
    """SLURM's time formats (sbatch(1) --time) → whole minutes, seconds rounded up. "UNLIMITED" → a large number."""
    s = str(text).strip()
    if s.upper() in ("UNLIMITED", "INFINITE"):
        return 10**9
    days = 0
    if "-" in s:
        d, s = s.split("-", 1)
        days = int(d)
        parts = [int(p) for p in s.split(":")]
        h, m, sec = (parts + [0, 0])[:3]
    else:
        parts = [int(p) for p in s.split(":")]
        if len(parts) == 1:
            h, m, sec = 0, parts[0], 0
        elif len(parts) == 2:
            h, m, sec = 0, parts[0], parts[1]
        else:
            h, m, sec = parts[:3]
    return days * 1440 + h * 60 + m + (1 if sec else 0)


def format_time(minutes: int) -> str:
    """Minutes → SLURM's D-HH:MM:SS."""
    d, rest = divmod(int(minutes), 1440)
    h, m = divmod(rest, 60)
    return f"{d}-{h:02d}:{m:02d}:00" if d else f"{h:02d}:{m:02d}:00"


def search_dirs() -> list[Path]:
    dirs = [Path(p).expanduser() for p in os.environ.get(ENV_PRESETS, "").split(":") if p]
    dirs += [SYSTEM_DIR, Path("~/.config/hpcmem/presets").expanduser(), SHIPPED_DIR]
    return dirs


def available() -> list[Path]:
    """Every preset file on the search path; a name found twice keeps its first (highest-priority) file."""
    seen: dict[str, Path] = {}
    for d in search_dirs():
        if d.is_dir():
            for path in sorted(d.glob("*.y*ml")):
                seen.setdefault(path.stem, path)
    return list(seen.values())


def find(ref: str | os.PathLike) -> Path:
    """A file path as given, else the first `NAME.yaml`/`NAME.yml` on the search path."""
    path = Path(ref).expanduser()
    if path.is_file():
        return path
    for d in search_dirs():
        for suffix in (".yaml", ".yml"):
            candidate = d / f"{ref}{suffix}"
            if candidate.is_file():
                return candidate
    names = ", ".join(p.stem for p in available()) or "(none)"
    looked = ", ".join(str(d) for d in search_dirs())
    raise HpcmemError(f"preset {str(ref)!r} not found; looked in {looked}; available: {names}")


def load(ref: str | os.PathLike) -> Preset:
    """Find and read a preset; every problem in the file is reported at once, each naming the file."""
    import yaml

    path = find(ref)
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as exc:
        raise SpecError(f"preset {path}: not valid YAML: {exc}") from None
    return from_dict(data, source=str(path), default_name=path.stem)


def from_dict(data: Any, *, source: str, default_name: str) -> Preset:
    p = Problems()
    if not isinstance(data, dict):
        raise SpecError(f"preset {source}: must be a YAML mapping of keys to values, got {type(data).__name__}")
    for key in sorted(set(data) - set(YAML_KEYS)):
        p.add(f"preset {source}: unknown key {key!r}; allowed keys: {', '.join(YAML_KEYS)}")
    for key in _REQUIRED:
        p.check(data.get(key) is not None, f"preset {source}: {key} is required")
    for key in _INT:
        value = data.get(key)
        p.check(value is None or (isinstance(value, int) and not isinstance(value, bool) and value > 0),
                f"preset {source}: {key} must be a positive integer, got {value!r}")
    for key in _STR:
        value = data.get(key)
        p.check(value is None or isinstance(value, (str, int)), f"preset {source}: {key} must be text, got {value!r}")
    p.check(data.get("gpu_request", "gres") in GPU_REQUEST_FORMS,
            f"preset {source}: gpu_request must be one of {', '.join(GPU_REQUEST_FORMS)}, got {data.get('gpu_request')!r}")
    _check_time(data.get("max_time"), source, p)
    _check_lists(data, source, p)
    _check_gpu(data.get("gpu"), source, p)
    container = _container(data.get("container"), source, p)
    _check_defaults(data.get("defaults") or {}, source, p)
    p.raise_if_any()
    kwargs = {k: v for k, v in data.items() if k in YAML_KEYS and k != "container"}
    for key in ("modules", "setup"):
        kwargs[key] = tuple(str(v) for v in data.get(key) or ())
    kwargs["env"] = {str(k): str(v) for k, v in (data.get("env") or {}).items()}
    for key in ("partition", "gpu", "max_time", "account", "qos", "constraint", "gres_type"):
        if kwargs.get(key) is not None:
            kwargs[key] = str(kwargs[key])
    kwargs.setdefault("name", default_name)
    return Preset(source=source, container=container, **kwargs)


def _check_time(value: Any, source: str, p: Problems) -> None:
    if value is None:
        return
    if not isinstance(value, str):
        # YAML 1.1 reads an unquoted 12:00:00 as the base-60 integer 43200: refuse numbers rather than guess.
        p.add(f"preset {source}: max_time must be quoted text such as \"12:00:00\" or \"2-00:00:00\" "
              f"(got the number {value!r}; unquoted H:M:S is read by YAML as base 60)")
        return
    try:
        parse_time_min(value)
    except ValueError:
        p.add(f"preset {source}: max_time {value!r} is not a SLURM time (MM, HH:MM:SS, D-HH:MM:SS)")


def _check_lists(data: dict, source: str, p: Problems) -> None:
    for key in ("modules", "setup"):
        value = data.get(key)
        p.check(value is None or (isinstance(value, list) and all(isinstance(v, str) for v in value)),
                f"preset {source}: {key} must be a list of strings, got {value!r}")
    env = data.get("env")
    if env is not None:
        if not isinstance(env, dict):
            p.add(f"preset {source}: env must be a mapping NAME: value, got {env!r}")
        else:
            for name, value in env.items():
                p.check(isinstance(name, str) and name.isidentifier(),
                        f"preset {source}: env name {name!r} is not a valid variable name")
                p.check(isinstance(value, (str, int, float, bool)),
                        f"preset {source}: env {name} must be a scalar, got {value!r}")


def _check_gpu(name: Any, source: str, p: Problems) -> None:
    """The GPU must be in the catalog (hpcmem.gpus); without the catalog any name is accepted here."""
    if not isinstance(name, str) or not name:
        return
    try:
        from hpcmem.gpus import gpu_spec
    except ImportError:
        return
    try:
        gpu_spec(name)
    except (KeyError, ValueError, HpcmemError) as exc:
        p.add(f"preset {source}: gpu {name!r} is not in the GPU catalog ({exc}); `hpcmem gpus` lists the names")


def _container(value: Any, source: str, p: Problems) -> Container | None:
    if value is None:
        return None
    if not isinstance(value, dict):
        p.add(f"preset {source}: container must be a mapping with keys {', '.join(CONTAINER_KEYS)}")
        return None
    for key in sorted(set(value) - set(CONTAINER_KEYS)):
        p.add(f"preset {source}: unknown container key {key!r}; allowed keys: {', '.join(CONTAINER_KEYS)}")
    p.check(value.get("kind") in CONTAINER_KINDS,
            f"preset {source}: container kind must be one of {', '.join(CONTAINER_KINDS)}, got {value.get('kind')!r}")
    p.check(isinstance(value.get("image"), str) and bool(value.get("image")), f"preset {source}: container image is required")
    for key in ("mounts", "options"):
        v = value.get(key)
        p.check(v is None or (isinstance(v, list) and all(isinstance(x, str) for x in v)),
                f"preset {source}: container {key} must be a list of strings")
    if value.get("kind") not in CONTAINER_KINDS or not isinstance(value.get("image"), str):
        return None
    return Container(kind=value["kind"], image=value["image"], mounts=tuple(value.get("mounts") or ()),
                     options=tuple(value.get("options") or ()))


def default_keys() -> tuple[str, ...]:
    """Field names a preset may give defaults for: the spec's own names (one name per setting)."""
    from hpcmem.spec import JobSpec, ParallelSpec, TrainSpec, field_names

    skip = {"trainer", "model", "train", "parallel", "gpu"}
    names = field_names(TrainSpec) + field_names(ParallelSpec) + field_names(JobSpec)
    return tuple(n for n in dict.fromkeys(names) if n not in skip)


def _check_defaults(value: Any, source: str, p: Problems) -> None:
    if not isinstance(value, dict):
        p.add(f"preset {source}: defaults must be a mapping of TRL/accelerate field names to values")
        return
    allowed = default_keys()
    for key in sorted(set(value) - set(allowed)):
        p.add(f"preset {source}: defaults has unknown field {key!r}; allowed fields: {', '.join(allowed)}")
