"""Published training speeds (estimator/published/speed/*.yaml): tokens/s per GPU others measured and published, read
and checked.

One file per source, as the published memory files (hpcmem.validate.published): a `source` block (citation, the
training loop, the unit of `measured`), `defaults` (trainer, TRL settings, GPU) and `rows`, each overriding the
defaults with its own settings and carrying the measured speed. Units: `tokens/s/GPU` as the source prints it, or
`s/run`, the wall time of a run over `run_rows` rows of exactly max_length tokens split over the GPUs (tokens/s per
GPU = run_rows × max_length / (time × GPUs)). A row names what it runs that the throughput model does not model
(`unmodelled`: torch.compile, a power limit, …) so the table can say which misses have a named cause. The schema is
estimator/published/README.md ('Speed'). Every problem is one line naming the file, the row and the field."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hpcmem.job.trl_config import read_yaml
from hpcmem.validate.published import (LOOPS, PublishedError, _choice, _citation, _mapping, _only, published_dir,
                                      read_row_head)

UNITS = ("tokens/s/GPU", "s/run")
SOURCE_KEYS = {"id", "title", "citation", "loop", "loop_name", "software", "unit", "run_rows", "notes"}
ROW_KEYS = {"id", "where", "settings", "gpu", "gpu_assumed", "measured", "unmodelled", "scored", "reason", "trainer"}


@dataclass(frozen=True)
class SpeedRow:
    id: str
    source: str
    file: str
    citation: str
    loop: str
    loop_name: str
    trainer: str
    settings: dict[str, Any]
    gpu: str
    unit: str
    measured: float             # in `unit`, as the source prints it
    scored: bool
    where: str = ""
    reason: str = ""
    gpu_assumed: str = ""
    unmodelled: tuple[str, ...] = ()
    run_rows: int = 0

    @property
    def gpus(self) -> int:
        return int(self.settings.get("num_processes", 1) or 1)

    @property
    def tokens_per_s(self) -> float:
        """Measured tokens/s per GPU (module docstring: an `s/run` time converted)."""
        if self.unit == "s/run":
            return self.run_rows * int(self.settings["max_length"]) / (self.measured * self.gpus)
        return self.measured

    @property
    def raw(self) -> bool:
        """The loop is not TRL's: the throughput model is the planner's for TRL's trainers."""
        return self.loop != "trl"


def speed_dir() -> Path:
    return published_dir() / "speed"


def load(folder: str | Path | None = None) -> tuple[list[SpeedRow], list[str]]:
    """Every *.yaml of the folder (default estimator/published/speed/), checked row by row; (rows, files)."""
    base = Path(folder) if folder is not None else speed_dir()
    files = sorted(base.glob("*.yaml")) if base.is_dir() else [base]
    if not files:
        raise PublishedError(f"no published-speed files (*.yaml) in {base}")
    rows: list[SpeedRow] = []
    seen: dict[str, str] = {}
    for path in files:
        for row in read_file(path):
            if row.id in seen:
                raise PublishedError(f"{path}: row {row.id}: id already used in {seen[row.id]}")
            seen[row.id] = str(path)
            rows.append(row)
    return rows, [str(p) for p in files]


def read_file(path: str | Path) -> list[SpeedRow]:
    path = Path(path)
    data = read_yaml(path, "config")
    where = str(path)
    _only(data, {"source", "defaults", "rows"}, where)
    source = _source(_mapping(data.get("source"), where, "source"), where)
    defaults = _mapping(data.get("defaults") or {}, where, "defaults")
    _only(defaults, {"trainer", "settings", "gpu"}, f"{where}: defaults")
    base = _mapping(defaults.get("settings") or {}, where, "defaults: settings")
    items = data.get("rows")
    if not isinstance(items, list) or not items:
        raise PublishedError(f"{where}: rows must be a non-empty list")
    return [_row(path, i, item, source, defaults, base) for i, item in enumerate(items, 1)]


def _source(source: dict[str, Any], where: str) -> dict[str, Any]:
    _only(source, SOURCE_KEYS, f"{where}: source")
    for key in ("id", "citation", "loop", "loop_name", "unit"):
        if source.get(key) in (None, ""):
            raise PublishedError(f"{where}: source: {key} is required")
    _choice(source["loop"], LOOPS, f"{where}: source: loop")
    _choice(source["unit"], UNITS, f"{where}: source: unit")
    runs = source.get("run_rows")
    if source["unit"] == "s/run" and (isinstance(runs, bool) or not isinstance(runs, int) or runs <= 0):
        raise PublishedError(f"{where}: source: unit s/run needs run_rows, the rows one run trains on; got {runs!r}")
    return {**source, "citation": _citation(source["citation"], where)}


def _row(path: Path, i: int, item: Any, source: dict[str, Any], defaults: dict[str, Any],
         base: dict[str, Any]) -> SpeedRow:
    rid, at, item, settings, measured, scored = read_row_head(
        item, f"{path}: row {i}", ROW_KEYS, base, str(source["unit"]), lambda model: _config_path(path, model))
    if source["unit"] == "s/run" and not isinstance(settings.get("max_length"), int):
        raise PublishedError(f"{at}: settings: max_length (tokens per row) is needed to turn s/run into tokens/s")
    unmodelled = item.get("unmodelled") or []
    if not isinstance(unmodelled, list) or not all(isinstance(u, str) for u in unmodelled):
        raise PublishedError(f"{at}: unmodelled must be a list of short phrases, got {unmodelled!r}")
    gpu = item.get("gpu", defaults.get("gpu"))
    if not isinstance(gpu, str) or not gpu:
        raise PublishedError(f"{at}: gpu is required (a catalog GPU: `hpcmem gpus`, or a described one)")
    return SpeedRow(
        id=rid, source=str(source["id"]), file=path.name, citation=source["citation"], loop=str(source["loop"]),
        loop_name=str(source["loop_name"]), trainer=str(item.get("trainer", defaults.get("trainer", "sft"))),
        settings=settings, gpu=gpu, unit=str(source["unit"]), measured=float(measured), scored=scored,
        where=str(item.get("where", "")), reason=" ".join(str(item.get("reason", "")).split()),
        gpu_assumed=str(item.get("gpu_assumed", "")), unmodelled=tuple(unmodelled),
        run_rows=int(source.get("run_rows") or 0))


def _config_path(path: Path, model: str) -> Path:
    """`configs/<file>.json` beside the rows' file, else in estimator/published/configs/ (shared with memory rows)."""
    here = path.parent / model
    return here if here.exists() else path.parent.parent / model
