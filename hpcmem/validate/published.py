"""Published measurements (estimator/published/*.yaml): peak GPU memory others measured and published, read and checked.

One file per source: a `source` block (citation, the training loop, the peak it measured and its unit), `defaults`
(trainer, TRL settings, GPU) and `rows`, each row overriding the defaults with its own settings and carrying the
measured value and the outcome (ran / oom). The schema is estimator/published/README.md. Every problem is one line
naming the file, the row and the field."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from hpcmem.datapath import estimator_dir
from hpcmem.estimate.nccl import layout, parse_version
from hpcmem.errors import HpcmemError
from hpcmem.job.trl_config import read_yaml

PEAKS = {"allocated": "peak_allocated_bytes", "reserved": "peak_reserved_bytes", "device": "device_peak_bytes"}
UNITS = {"B": 1, "MiB": 2**20, "GiB": 2**30, "MB": 10**6, "GB": 10**9}
LOOPS = {"trl": "TRL trainer", "hf-trainer": "transformers Trainer", "peft": "plain loop over a PEFT model",
         "accelerate": "plain accelerate loop", "other": "another framework"}
OUTCOMES = ("ran", "oom")
SOURCE_KEYS = {"id", "title", "citation", "loop", "loop_name", "software", "peak", "unit", "notes", "loss",
               "keeps_output", "adapters", "nccl"}
# how the loop takes its loss when not through TRL 1.16's fused head (hpcmem.validate.published_loop LOOP_LOSSES)
LOOP_LOSS_KINDS = ("model-loss", "model-loss-4.4x")
# the adapters' dtype where the loop's peft kept them otherwise than TRL 1.16's (hpcmem.validate.published_adapters)
ADAPTER_DTYPES = ("base-dtype",)
ROW_KEYS = {"id", "where", "settings", "gpu", "peak", "measured", "outcome", "scored", "reason", "cause",
            "gpu_assumed", "trainer", "reserved_at_reset"}
CITATION_KEYS = {"repo", "path", "commit", "url", "paper", "table"}


class PublishedError(HpcmemError):
    """A published-measurements file that does not follow the schema: one line, the file, the row and the field."""


@dataclass(frozen=True)
class Row:
    id: str
    source: str
    file: str
    citation: str
    loop: str
    loop_name: str
    trainer: str
    settings: dict[str, Any]
    gpu: str
    peak: str
    unit: str
    measured: float | None       # None: an outcome row (the source says only whether the job ran or ran out of memory)
    outcome: str
    scored: bool
    where: str = ""
    reason: str = ""
    cause: str = ""
    gpu_assumed: str = ""
    software: str = ""
    loss: str = ""              # the loop's full-logits loss (LOOP_LOSS_KINDS), "" when it is TRL 1.16's fused head
    keeps_output: bool = False  # the loop holds the model's output (its logits) through the backward
    reserved_at_reset: float | None = None   # in `unit`: reserved when the loop reset its peak stats (the source's)
    adapters: str = ""          # ADAPTER_DTYPES: the loop's peft kept the adapters in the base dtype; "" as TRL 1.16
    nccl: tuple[int, int] | None = None   # the NCCL release of the run's torch, where its NVLS buffers differ (nccl.py)

    @property
    def measured_bytes(self) -> int | None:
        return None if self.measured is None else round(self.measured * UNITS[self.unit])

    @property
    def reserved_at_reset_bytes(self) -> int | None:
        return None if self.reserved_at_reset is None else round(self.reserved_at_reset * UNITS[self.unit])

    @property
    def gpus(self) -> int:
        return int(self.settings.get("num_processes", 1) or 1)

    @property
    def raw(self) -> bool:
        """The loop is not TRL's: the estimate models TRL's trainers, so its error here is 'raw'."""
        return self.loop != "trl"


@dataclass
class Loaded:
    rows: list[Row] = field(default_factory=list)
    files: list[str] = field(default_factory=list)


def published_dir() -> Path:
    return estimator_dir() / "published"


def load(folder: str | Path | None = None) -> Loaded:
    """Every *.yaml of the folder (default estimator/published/), checked row by row."""
    base = Path(folder) if folder is not None else published_dir()
    files = sorted(base.glob("*.yaml")) if base.is_dir() else [base]
    if not files:
        raise PublishedError(f"no published-measurement files (*.yaml) in {base}")
    loaded = Loaded()
    seen: dict[str, str] = {}
    for path in files:
        for row in read_file(path):
            if row.id in seen:
                raise PublishedError(f"{path}: row {row.id}: id already used in {seen[row.id]}")
            seen[row.id] = str(path)
            loaded.rows.append(row)
        loaded.files.append(str(path))
    return loaded


def read_file(path: str | Path) -> list[Row]:
    path = Path(path)
    data = read_yaml(path, "config")
    where = str(path)
    _only(data, {"source", "defaults", "rows"}, where)
    source = _mapping(data.get("source"), where, "source")
    _only(source, SOURCE_KEYS, f"{where}: source")
    for key in ("id", "citation", "loop", "loop_name", "peak", "unit"):
        if source.get(key) in (None, ""):
            raise PublishedError(f"{where}: source: {key} is required")
    citation = _citation(source["citation"], where)
    loop = _choice(source["loop"], LOOPS, f"{where}: source: loop")
    loss = _choice(source["loss"], LOOP_LOSS_KINDS, f"{where}: source: loss") if source.get("loss") else ""
    keeps_output = source.get("keeps_output", False)
    if not isinstance(keeps_output, bool) or (keeps_output and not loss):
        raise PublishedError(f"{where}: source: keeps_output {keeps_output!r}: true or false, and true only with "
                             "`loss:` (the output's logits are the loss's)")
    adapters = (_choice(source["adapters"], ADAPTER_DTYPES, f"{where}: source: adapters") if source.get("adapters")
                else "")
    if adapters and not loss:
        raise PublishedError(f"{where}: source: adapters {adapters!r}: only with `loss:` (it enters the loop-adjusted "
                             "estimate)")
    nccl = _nccl(source.get("nccl"), f"{where}: source: nccl")
    defaults = _mapping(data.get("defaults") or {}, where, "defaults")
    _only(defaults, {"trainer", "settings", "gpu"}, f"{where}: defaults")
    base_settings = _mapping(defaults.get("settings") or {}, where, "defaults: settings")
    rows = data.get("rows")
    if not isinstance(rows, list) or not rows:
        raise PublishedError(f"{where}: rows must be a non-empty list")
    out = []
    for i, item in enumerate(rows, 1):
        head = read_row_head(item, f"{where}: row {i}", ROW_KEYS, base_settings, str(source["unit"]),
                             lambda model: path.parent / model, outcome_only=True)
        rid, at, item, settings, measured, scored = head
        gpu = item.get("gpu", defaults.get("gpu"))
        reset = item.get("reserved_at_reset")
        if reset is not None and (isinstance(reset, bool) or not isinstance(reset, (int, float)) or reset <= 0
                                  or item.get("peak", source["peak"]) != "reserved" or not loss):
            raise PublishedError(f"{at}: reserved_at_reset {reset!r}: a positive number in {source['unit']}, only on "
                                 "a reserved peak of a source with `loss:` (it enters the loop-adjusted estimate)")
        if not isinstance(gpu, str) or not gpu:
            raise PublishedError(f"{at}: gpu is required (a catalog GPU: `hpcmem gpus`), in the row or the defaults")
        out.append(Row(
            id=rid, source=str(source["id"]), file=path.name, citation=citation, loop=loop,
            loop_name=str(source["loop_name"]), trainer=str(item.get("trainer", defaults.get("trainer", "sft"))),
            settings=settings, gpu=gpu,
            peak=_choice(item.get("peak", source["peak"]), PEAKS, f"{at}: peak"),
            unit=_choice(source["unit"], UNITS, f"{where}: source: unit"), measured=measured,
            outcome=_choice(item.get("outcome"), OUTCOMES, f"{at}: outcome"), scored=scored,
            where=str(item.get("where", "")), reason=str(item.get("reason", "")), cause=str(item.get("cause", "")),
            gpu_assumed=str(item.get("gpu_assumed", "")), software=str(source.get("software", "")), loss=loss,
            keeps_output=keeps_output, reserved_at_reset=None if reset is None else float(reset), adapters=adapters,
            nccl=nccl))
    return out


def read_row_head(item: Any, at: str, row_keys: set[str], base_settings: dict[str, Any], unit: str,
                  config_path: Callable[[str], Path], outcome_only: bool = False,
                  ) -> tuple[str, str, dict[str, Any], dict[str, Any], float | None, bool]:
    """What every published row has, memory or speed: (id, where it is, the row, its settings over the file's
    defaults — a `configs/…` model resolved by `config_path` —, measured > 0 in `unit`, scored; unscored rows need a
    reason). With `outcome_only`, a row may leave `measured` out when it states its `outcome` and `where` says what
    the source reports (a longest length that ran, a size that ran out of memory): measured is then None."""
    item = _mapping(item, at, "row")
    rid = item.get("id")
    if not isinstance(rid, str) or not rid.strip():
        raise PublishedError(f"{at}: id is required (a short unique name)")
    at = f"{at} ({rid})"
    _only(item, row_keys, at)
    settings = {**base_settings, **_mapping(item.get("settings") or {}, at, "settings")}
    model = settings.get("model_name_or_path")
    if isinstance(model, str) and model.startswith("configs/"):
        settings["model_name_or_path"] = str(config_path(model))
    measured = item.get("measured")
    if measured is None and outcome_only and item.get("outcome") in OUTCOMES and item.get("where"):
        return rid, at, item, settings, None, _scored(item, at)
    if isinstance(measured, bool) or not isinstance(measured, (int, float)) or measured <= 0:
        also = " (or left out on an outcome row that gives outcome and where)" if outcome_only else ""
        raise PublishedError(f"{at}: measured must be a positive number in {unit}{also}, got {measured!r}")
    return rid, at, item, settings, float(measured), _scored(item, at)


def _scored(item: dict[str, Any], at: str) -> bool:
    scored = item.get("scored", True)
    if not isinstance(scored, bool):
        raise PublishedError(f"{at}: scored must be true or false, got {scored!r}")
    if not scored and not item.get("reason"):
        raise PublishedError(f"{at}: a row with scored: false needs a reason")
    return scored


def _nccl(value: Any, where: str) -> tuple[int, int] | None:
    """The run's NCCL release ('2.19'), known from 2.18 on (hpcmem.estimate.nccl); None when the source gives none."""
    if value in (None, ""):
        return None
    if not isinstance(value, str):      # YAML reads 2.20 as the float 2.2
        raise PublishedError(f"{where}: {value!r}: a quoted release, e.g. \"2.20\" (unquoted, YAML reads a number)")
    try:
        version = parse_version(value)
        layout(version, "9.0", False)
    except ValueError as exc:
        raise PublishedError(f"{where}: {exc}") from None
    return version


def _citation(value: Any, where: str) -> str:
    """repo + path + commit, or a url, or a paper + table, as one string."""
    if isinstance(value, str) and value.strip():
        return value.strip()
    cit = _mapping(value, where, "source: citation")
    _only(cit, CITATION_KEYS, f"{where}: source: citation")
    if cit.get("repo"):
        missing = [k for k in ("path", "commit") if not cit.get(k)]
        if missing:
            raise PublishedError(f"{where}: source: citation: a repo needs {' and '.join(missing)}")
        return f"{cit['repo']} {cit['path']} @ {str(cit['commit'])[:12]}"
    if cit.get("url"):
        return str(cit["url"])
    if cit.get("paper") and cit.get("table"):
        return f"{cit['paper']}, {cit['table']}"
    raise PublishedError(f"{where}: source: citation needs repo+path+commit, a url, or paper+table")


def _mapping(value: Any, where: str, what: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise PublishedError(f"{where}: {what} must be a mapping, got {type(value).__name__}")
    return value


def _only(mapping: dict[str, Any], allowed: set[str], where: str) -> None:
    unknown = sorted(str(k) for k in mapping if k not in allowed)
    if unknown:
        raise PublishedError(f"{where}: unknown key {unknown[0]!r} (known: {', '.join(sorted(allowed))})")


def _choice(value: Any, allowed, where: str) -> str:
    if value not in allowed:
        raise PublishedError(f"{where} must be one of {', '.join(allowed)}; got {value!r}")
    return str(value)
