"""A campaign folder: what `hpcmem calibrate` planned and submitted, and what its tasks recorded (stdlib only).

```
<campaign>/
  campaign.json        site, preset, GPU, device, where the calibration installs, every case (model, flags,
                       GPUs, nodes, predicted peak) and every job submitted (group → job id, its cases)
  scripts/             <group>.sbatch: one per job array (cases of one GPU count), per multi-node case, per collect
  records/<gpu>.jsonl  one hpcmem.record line per finished run (ok or out of memory), ranks inside; named after the
                       preset's GPU, so the fit calibrates that GPU
  status/<case>.json   the attempts of a case that failed (job id, restart, exit status, reason); state "failed"
                       once its one retry failed too
  logs/                SLURM's output (array-%A_%a.log, <group>-%j.log, collect-%j.log) and tasks/<case>.log
  work/<case>/         a multi-node case's payload and per-rank results
  models/              the shrunk configs of a --tiny rehearsal
  report/              report.md, report.json, accuracy.png and the calibration as installed (<gpu>.json)
```
Only the submitting command writes campaign.json; tasks append records (atomically, hpcmem.record.files) and
replace their own status file, so tasks never race on shared state.
"""

from __future__ import annotations

import datetime as dt
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hpcmem.calibrate.case import CampaignCase
from hpcmem.errors import HpcmemError
from hpcmem.gpus.catalog import gpu_slug
from hpcmem.record import Record, read_records

SCHEMA = 1
FILE = "campaign.json"
FOLDERS = ("scripts", "records", "status", "logs", "logs/tasks", "work", "report")


def now() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")


@dataclass
class Campaign:
    root: Path
    data: dict[str, Any] = field(default_factory=dict)

    # -- the folder -----------------------------------------------------------------------------------------------
    @classmethod
    def load(cls, root: str | os.PathLike) -> Campaign:
        path = Path(root).absolute() / FILE
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise HpcmemError(f"{Path(root)} is not a campaign folder (no {FILE}); `hpcmem calibrate --preset NAME` "
                              "makes one") from None
        except (OSError, ValueError) as exc:
            raise HpcmemError(f"cannot read {path}: {exc}") from None
        if not isinstance(data, dict) or data.get("schema") != SCHEMA:
            raise HpcmemError(f"{path}: not a campaign file this hpcmem reads (schema {SCHEMA})")
        return cls(Path(root).absolute(), data)

    @classmethod
    def create(cls, root: str | os.PathLike, **fields: Any) -> Campaign:
        camp = cls(Path(root).absolute(), {"schema": SCHEMA, "name": Path(root).absolute().name, "created": now(),
                                           "cases": {}, "groups": {}, "notes": [], **fields})
        return camp

    def save(self) -> None:
        for sub in FOLDERS:
            (self.root / sub).mkdir(parents=True, exist_ok=True)
        tmp = self.root / f".{FILE}.tmp"
        tmp.write_text(json.dumps(self.data, indent=1, sort_keys=True) + "\n", encoding="utf-8")
        tmp.replace(self.root / FILE)

    # -- what it holds --------------------------------------------------------------------------------------------
    @property
    def name(self) -> str:
        return str(self.data["name"])

    @property
    def gpu_name(self) -> str:
        return str(self.data["gpu_name"])

    @property
    def records_file(self) -> Path:
        return self.root / "records" / f"{gpu_slug(self.gpu_name)}.jsonl"

    def cases(self) -> dict[str, CampaignCase]:
        return {n: CampaignCase.from_json(d) for n, d in self.data["cases"].items()}

    def case(self, name: str) -> CampaignCase:
        if name not in self.data["cases"]:
            raise HpcmemError(f"campaign {self.name} has no case {name!r}")
        return CampaignCase.from_json(self.data["cases"][name])

    def group_case(self, group: str, index: int) -> CampaignCase:
        g = self.data["groups"].get(group)
        if g is None or not 0 <= index < len(g["cases"]):
            raise HpcmemError(f"campaign {self.name}: no task {index} in group {group!r}")
        return self.case(g["cases"][index])

    def records(self) -> list[Record]:
        files = sorted((self.root / "records").glob("*.jsonl"))
        return [r for f in files for r in read_records(f)]

    def done(self) -> set[str]:
        """Cases with a finished run recorded (it ran, or ran out of memory: both are measurements)."""
        return {r.case for r in self.records() if r.finished and r.case}

    def status(self, name: str) -> dict[str, Any]:
        path = self.status_file(name)
        try:
            return json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return {"case": name, "state": "new", "attempts": []}

    def status_file(self, name: str) -> Path:
        return self.root / "status" / f"{name}.json"

    def failed(self) -> dict[str, str]:
        """Case → the reason of its last failed attempt, for cases whose retry failed too."""
        out = {}
        for path in sorted((self.root / "status").glob("*.json")):
            st = self.status(path.stem)
            if st.get("state") == "failed":
                out[path.stem] = (st.get("attempts") or [{}])[-1].get("reason", "?")
        return out

    def write_status(self, name: str, status: dict[str, Any]) -> None:
        path = self.status_file(name)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(status, indent=1) + "\n", encoding="utf-8")
        tmp.replace(path)

    def submitted_jobs(self) -> dict[str, list[str]]:
        """Job id → the cases of that job, for every job this campaign submitted."""
        return {str(g["job_id"]): list(g.get("cases") or []) for g in self.data["groups"].values()
                if g.get("job_id") and g.get("kind") != "collect"}
