"""CampaignCase: one probe run of a calibration campaign."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hpcmem.probe.matrix import Case


@dataclass(frozen=True)
class CampaignCase:
    """One probe run of a campaign: the kit's Case, its GPUs per node and nodes, and what the estimate predicts."""

    case: Case
    family: str                          # kit | sized | boundary | multi | long | site
    gpus: int = 1                        # GPUs (ranks) per node
    nodes: int = 1
    target: float | None = None          # the fraction of capacity it was sized to
    predicted_bytes: int | None = None   # the estimate's device peak per GPU (tracked tensors in --tiny)
    capacity_bytes: int = 0

    @property
    def name(self) -> str:
        return self.case.name

    @property
    def fraction(self) -> float | None:
        return None if not self.predicted_bytes or not self.capacity_bytes else self.predicted_bytes / self.capacity_bytes

    def to_json(self) -> dict[str, Any]:
        c = self.case
        return {"name": c.name, "trainer": c.trainer, "model": c.model, "flags": c.flags, "env": c.env,
                "family": self.family, "gpus": self.gpus, "nodes": self.nodes, "target": self.target,
                "predicted_bytes": self.predicted_bytes, "capacity_bytes": self.capacity_bytes,
                "simulated_capacity_bytes": c.capacity_bytes, "cost_s": c.cost_s, "requires": list(c.requires)}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> CampaignCase:
        case = Case(d["name"], d["trainer"], d["model"], dict(d["flags"]), float(d.get("cost_s", 25.0)),
                    env=dict(d.get("env") or {}), requires=tuple(d.get("requires") or ()), sized=True,
                    capacity_bytes=d.get("simulated_capacity_bytes"))
        return cls(case=case, family=d["family"], gpus=int(d["gpus"]), nodes=int(d["nodes"]), target=d.get("target"),
                   predicted_bytes=d.get("predicted_bytes"), capacity_bytes=int(d.get("capacity_bytes") or 0))
