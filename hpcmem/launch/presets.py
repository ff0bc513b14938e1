"""Site presets: one YAML per cluster (or partition), owned by its admins, validated strictly.

Search order for `--preset NAME` (a path to a file is read as is):
`$HPCMEM_PRESETS` (colon-separated folders), `/etc/hpcmem/presets`, `~/.config/hpcmem/presets`, then the examples
shipped in `hpcmem/presets`. NAME is a file's stem (`mycluster-h100` for `mycluster-h100.yaml`).

Precedence when a job is built: hpcmem's defaults < the preset's `defaults` < the user's TRL YAML < CLI flags.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Mapping

from hpcmem.errors import HpcmemError, Problems, SpecError
from hpcmem.gpus.catalog import catalog_entry
from hpcmem.gpus.describe import parse
from hpcmem.gpus.lookup import gpu_spec
from hpcmem.inputs import values as v
from hpcmem.inputs.files import is_file, load_yaml_file, user_path
from hpcmem.inputs.values import InputError, shown
from hpcmem.job.jobspec import JobSpec
from hpcmem.job.settings import check_settings
from hpcmem.job.spec import ParallelSpec, TrainSpec, field_names
from hpcmem.launch import slurm_time
from hpcmem.launch.slurm_time import TimeLimit

ENV_PRESETS = "HPCMEM_PRESETS"
SYSTEM_DIR = Path("/etc/hpcmem/presets")
SHIPPED_DIR = Path(__file__).resolve().parent.parent / "presets"
GRES_TYPE = re.compile(r"[A-Za-z0-9_.-]+")
GPU_REQUEST_FORMS = ("gres", "gpus_per_node")
CONTAINER_KINDS = ("pyxis", "apptainer")
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")     # what bash's `export` takes (POSIX portable names)


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
    gpu: str                                 # a GPU catalog name (hpcmem gpus), or a GPU the site describes (a
                                             # mapping {name, memory_gb, usable_gb, compute_capability, bf16_tflops}
                                             # or a size such as 96GB; hpcmem.gpus.describe), kept as its text form
    gpus_per_node: int
    cpus_per_node: int
    max_time: str                            # a SLURM time limit (hpcmem.launch.slurm_time), e.g. "2-00:00:00"
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
    def max_time_limit(self) -> TimeLimit:
        return slurm_time.parse(self.max_time)

    def gpu_spec(self):
        """The GPU `gpu` names: a catalog entry or the site's description (hpcmem.gpus.catalog), with its
        calibration."""
        return gpu_spec(self.gpu)


def preset_settings(preset: Preset, gpu_flag: str | None = None) -> dict[str, Any]:
    """The job settings a preset brings: its `defaults` and its GPU. A --gpu naming another GPU is refused: the job
    runs on the preset's."""
    if gpu_flag and not same_gpu(gpu_flag, preset.gpu):
        raise HpcmemError(f"--gpu {gpu_flag} disagrees with preset {preset.name} ({preset.gpu}): the job runs on the "
                          "preset's GPU; drop --gpu or choose another preset")
    return {**preset.defaults, "gpu": preset.gpu}


def same_gpu(a: str, b: str) -> bool:
    """Whether two --gpu values name one GPU: the same catalog entry (a name or an alias, any case, as
    hpcmem.gpus.catalog reads --gpu), else the same text up to case and surrounding spaces."""
    left, right = catalog_entry(a), catalog_entry(b)
    if left is not None or right is not None:
        return left is right
    return a.strip().lower() == b.strip().lower()


YAML_KEYS: tuple[str, ...] = tuple(f.name for f in fields(Preset) if f.name != "source")
CONTAINER_KEYS: tuple[str, ...] = tuple(f.name for f in fields(Container))
_REQUIRED = ("partition", "gpu", "gpus_per_node", "cpus_per_node", "max_time")
_INT = ("gpus_per_node", "cpus_per_node", "memory_per_node_gb", "max_nodes", "signal_lead_s", "max_array_size")
# Upper bounds no real partition reaches (the largest nodes hold 16 GPUs, a few thousand cores, tens of TB), so a
# typo is refused before it reaches an #SBATCH line; sbatch itself would queue `--gres=gpu:1000000000` forever.
_INT_MAX = {"gpus_per_node": 64, "cpus_per_node": 16384, "memory_per_node_gb": 1 << 20, "max_nodes": 1 << 20,
            "signal_lead_s": 86400, "max_array_size": 4_000_000}
_STR = ("name", "partition", "gpu", "max_time", "gpu_request", "gres_type", "account", "qos", "constraint",
        "description")


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
    path = user_path(ref)
    if is_file(path):
        return path
    _refuse_if_there(path)
    for d in search_dirs():
        for suffix in (".yaml", ".yml"):
            candidate = d / f"{ref}{suffix}"
            if is_file(candidate):
                return candidate
            _refuse_if_there(candidate)
    names = ", ".join(p.stem for p in available()) or "(none)"
    looked = ", ".join(str(d) for d in search_dirs())
    raise HpcmemError(f"preset {shown(str(ref))} not found; looked in {looked}; available: {names}")


def _refuse_if_there(path: Path) -> None:
    """A name on the path that is not a regular file (a folder, a FIFO — never opened: reading one blocks —, a
    dangling or looping link) is said to be so, not skipped: `available()` lists it, and a lower folder's file of the
    same name would silently stand in for it."""
    try:
        there = path.is_symlink() or path.exists()
    except (OSError, ValueError):
        return
    if not there:
        return
    kind = "a folder" if path.is_dir() else "a link to nothing readable" if path.is_symlink() and not \
        _resolves(path) else "a FIFO, socket or device"
    raise HpcmemError(f"preset {shown(str(path), 400)} is not a regular file ({kind}); a preset is a YAML file")


def _resolves(path: Path) -> bool:
    try:
        return path.exists()
    except (OSError, ValueError):      # a link that loops raises on some Pythons
        return False


def load(ref: str | os.PathLike) -> Preset:
    """Find and read a preset; every problem in the file is reported at once, each naming the file."""
    path = find(ref)
    data = load_yaml_file(path, "preset")
    return from_dict({} if data is None else data, source=str(path), default_name=path.stem)


class _Checked:
    """Runs hpcmem.inputs checkers on a preset's values, gathering each refusal as a problem naming the file."""

    def __init__(self, source: str) -> None:
        self.source, self.problems = source, Problems()

    def add(self, message: str) -> None:
        self.problems.add(f"preset {self.source}: {message}")

    def __call__(self, check, *args: Any, **kw: Any) -> Any:
        try:
            return check(*args, **kw)
        except InputError as exc:
            self.add(exc.problems[0])
            return None


def from_dict(data: Any, *, source: str, default_name: str) -> Preset:
    if not isinstance(data, dict):
        raise SpecError(f"preset {source}: must be a YAML mapping of keys to values, got {type(data).__name__}")
    c = _Checked(source)
    data = {**data, "gpu": _gpu_text(data.get("gpu"), c)}
    for key in sorted(set(data) - set(YAML_KEYS), key=repr):
        c.add(f"unknown key {shown(key)}; allowed keys: {', '.join(YAML_KEYS)}")
    for key in _REQUIRED:
        c.problems.check(data.get(key) is not None, f"preset {source}: {key} is required")
    for key in _INT:
        if data.get(key) is not None:
            c(v.integer, key, data[key], lo=1, hi=_INT_MAX[key], text_ok=False)
    for key in _STR:
        if data.get(key) is not None and key != "max_time":
            # every one but the description can reach an #SBATCH line or the script: no control characters
            c(v.text, key, data[key], max_len=4096 if key == "description" else 256, numbers_ok=True,
              controls=key == "description")
    if data.get("gpu_request") is not None:
        c(v.choice, "gpu_request", data["gpu_request"], GPU_REQUEST_FORMS)
    if isinstance(data.get("gres_type"), str) and not GRES_TYPE.fullmatch(data["gres_type"]):
        # sbatch reads --gres as name[:type][:count] items split at ','; a ':' or ',' in the type asks for another
        # count or another resource
        c.add(f"gres_type {shown(data['gres_type'])} must be one gres type name (letters, digits and ._-), as "
              "gres.conf's Type= names it")
    _check_time(data.get("max_time"), c)
    _check_lists(data, c)
    _check_gpu(data.get("gpu"), source, c.problems)
    container = _container(data.get("container"), c)
    c(v.text, "name (the file's name without .yaml)", default_name, max_len=256)
    if data.get("defaults") is not None and c(check_settings, data["defaults"], "defaults") is not None:
        _check_defaults(data["defaults"], source, c.problems)
    c.problems.raise_if_any()
    kwargs = {k: v for k, v in data.items() if k in YAML_KEYS and k != "container" and v is not None}
    for key in ("modules", "setup"):
        kwargs[key] = tuple(data.get(key) or ())
    kwargs["env"] = {str(k): str(x) for k, x in (data.get("env") or {}).items()}
    for key in ("partition", "gpu", "max_time", "account", "qos", "constraint", "gres_type"):
        if kwargs.get(key) is not None:
            kwargs[key] = str(kwargs[key])
    kwargs.setdefault("name", default_name)
    return Preset(source=source, container=container, **kwargs)


def _check_time(value: Any, c: _Checked) -> None:
    if value is None:
        return
    if not isinstance(value, str):
        # YAML 1.1 reads an unquoted 12:00:00 as the base-60 integer 43200: refuse numbers rather than guess.
        c.add(f"max_time must be quoted text such as \"12:00:00\" or \"2-00:00:00\" (got the number "
              f"{shown(value)}; unquoted H:M:S is read by YAML as base 60)")
        return
    try:
        slurm_time.parse(value)
    except ValueError as exc:
        c.add(f"max_time: {exc}")


def _check_lists(data: dict, c: _Checked) -> None:
    """modules (each `module load`ed as a quoted word), setup (the admin's own shell lines: trusted shell, but no NUL
    fits in a script) and env (NAME: value pairs the script exports, each value a quoted word)."""
    for key in ("modules", "setup"):
        value = data.get(key)
        if value is None:
            continue
        if not isinstance(value, list) or not all(isinstance(x, str) for x in value):
            c.add(f"{key} must be a list of strings, got {shown(value)}")
            continue
        for i, line in enumerate(value):
            if key == "modules":
                c(v.text, f"{key}[{i}]", line, max_len=256)
            else:
                c(v.no_nul, f"{key}[{i}]", line)
    env = data.get("env")
    if env is None:
        return
    if not isinstance(env, dict):
        c.add(f"env must be a mapping NAME: value, got {shown(env)}")
        return
    for name, value in env.items():
        if not (isinstance(name, str) and ENV_NAME.fullmatch(name)):
            c.add(f"env name {shown(name)} is not a shell variable name ([A-Za-z_][A-Za-z0-9_]*)")
        elif not isinstance(value, (str, int, float, bool)):
            c.add(f"env {name} must be a scalar, got {shown(value)}")
        else:
            c(v.no_nul, f"env {name}", str(value))


def _gpu_text(value: Any, c: _Checked) -> Any:
    """A described GPU (a mapping) as the one-line form every reader parses (hpcmem.gpus.describe); else as given."""
    if not isinstance(value, dict):
        return value

    described = c(parse, value)
    return described.text if described is not None else ""     # the refusal is already a problem


def _check_gpu(name: Any, source: str, p: Problems) -> None:
    """The GPU must be in the catalog (hpcmem.gpus.catalog) or a GPU description."""
    if not isinstance(name, str) or not name:
        return
    try:
        gpu_spec(name)
    except (KeyError, ValueError, HpcmemError) as exc:
        p.add(f"preset {source}: gpu {name!r} is not in the GPU catalog nor a GPU description ({exc}); "
              "`hpcmem gpus` lists the names")


def _container(value: Any, c: _Checked) -> Container | None:
    if value is None:
        return None
    if not isinstance(value, dict):
        c.add(f"container must be a mapping with keys {', '.join(CONTAINER_KEYS)}")
        return None
    for key in sorted(set(value) - set(CONTAINER_KEYS), key=repr):
        c.add(f"unknown container key {shown(key)}; allowed keys: {', '.join(CONTAINER_KEYS)}")
    kind = c(v.choice, "container kind", value.get("kind"), CONTAINER_KINDS)
    image = c(v.text, "container image", value.get("image"), max_len=1024) if value.get("image") else None
    if not image:
        c.add("container image is required")
    lists = {}
    for key in ("mounts", "options"):
        items = value.get(key)
        if items is not None and not isinstance(items, list):
            c.add(f"container {key} must be a list of strings")
        lists[key] = c(v.text_list, f"container {key}", items or []) or ()
    if kind is None or not image:
        return None
    return Container(kind=kind, image=image, mounts=lists["mounts"], options=lists["options"])


def default_keys() -> tuple[str, ...]:
    """Field names a preset may give defaults for: the spec's own names (one name per setting)."""
    # teacher: resolved from teacher_model_name_or_path; assumed: what the estimate takes, not a setting;
    # model_dropout_off: the learner's own traces (hpcmem.trace.learn), not a setting; env: read from the preset's
    # own `env` (hpcmem.job.job_env), not a default
    skip = {"trainer", "model", "train", "parallel", "gpu", "teacher", "assumed", "model_dropout_off", "env"}
    names = field_names(TrainSpec) + field_names(ParallelSpec) + field_names(JobSpec)
    return tuple(n for n in dict.fromkeys(names) if n not in skip)


def _check_defaults(value: dict, source: str, p: Problems) -> None:
    allowed = default_keys()
    for key in sorted(set(value) - set(allowed), key=repr):
        p.add(f"preset {source}: defaults has unknown field {shown(key)}; allowed fields: {', '.join(allowed)}")
    # the ranges and choices the specs check on construction (max_length ≥ 1, a known optim …), now rather than
    # when a user's job is first built on this preset
    for cls in (TrainSpec, ParallelSpec):
        own = {k: value[k] for k in field_names(cls) if k in value and k != "trainer"}
        try:
            cls(**({"trainer": "sft"} if cls is TrainSpec else {}), **own)
        except SpecError as exc:
            p.add(f"preset {source}: defaults: {'; '.join(exc.problems)}")
        except (TypeError, ValueError) as exc:
            p.add(f"preset {source}: defaults: {exc}")
