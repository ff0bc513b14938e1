"""The order of the plans offered, and the headroom floor below which a plan is not offered.

The throughput model is uncalibrated and cannot tell apart plans whose tokens/s differ by less than
THROUGHPUT_UNCERTAINTY (hpcmem.plan.throughput, 10 %). So the fastest plan and every plan within 10 % of it form a
band; the next band starts at the fastest plan left, and so on. Bands are ranked fastest first; inside a band the plan
with more headroom (capacity − safe bound, hpcmem.estimate.verdict) ranks first, up to ENOUGH_HEADROOM of the
capacity — more free memory than that buys nothing the speed would pay for, so plans past it are ranked by speed;
equal in both, the plan with fewer memory techniques on (Knobs.techniques: fewer changes to the user's job), then the
one needing less host RAM per node. A plan ≥ 10 % faster always comes first; among plans the model cannot separate, the one further from running out of
memory wins.

The headroom floor (`hpcmem plan --headroom`): plans that leave less than it free are not offered. Given in GiB
(`4`) or as a share of the usable capacity (`10%`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import Any, Sequence

from hpcmem.inputs.values import fail
from hpcmem.plan.throughput import THROUGHPUT_UNCERTAINTY

GIB = 1024**3
# Free memory past which more is not worth speed: a judgment, not a measurement. The safe bound's margin was fitted on
# single-GPU H200 runs whose device peaks stay below half the capacity (README, What "fits" means: device error −2.1 %
# to +3.0 % over 20 runs, none near capacity); 10 % of capacity is three times the largest error seen, room for a
# regime the records do not cover (multi-GPU, offloading, near-capacity fragmentation).
ENOUGH_HEADROOM = 0.10
_FLOOR = re.compile(r"\s*(\d+(?:\.\d+)?)\s*(%|gib|g)?\s*", re.IGNORECASE)


@dataclass(frozen=True)
class HeadroomFloor:
    """At least `gib` GiB, or `percent` % of the usable capacity, left above a plan's safe bound."""

    gib: float = 0.0
    percent: float = 0.0

    def bytes_for(self, capacity_bytes: int) -> int:
        return int(self.gib * GIB) if not self.percent else int(capacity_bytes * self.percent / 100)

    def text(self) -> str:
        return f"{self.percent:g} % of capacity" if self.percent else f"{self.gib:g} GiB"


def parse_headroom(value: str) -> HeadroomFloor:
    """`4` / `4GiB` → 4 GiB; `10%` → 10 % of the usable capacity. Anything else: one line naming flag, value, rule."""
    m = _FLOOR.fullmatch(str(value))
    number = float(m.group(1)) if m else -1.0
    if m and m.group(2) == "%":
        if number < 100:
            return HeadroomFloor(percent=number)
    elif m and number < 1024 ** 2:
        return HeadroomFloor(gib=number)
    raise fail("--headroom", value, "GiB as a number ≥ 0 (e.g. 4) or a share of the capacity below 100 % (e.g. 10%)")


def headroom_bytes(p: Any) -> int:
    """Usable capacity left above a plan's safe bound."""
    return p.estimate.headroom_bytes or 0


def headroom_share(p: Any) -> float:
    """The headroom as a share of the usable capacity."""
    v = p.estimate.verdict
    return headroom_bytes(p) / v.capacity_bytes if v.capacity_bytes else 0.0


def host_bytes(p: Any) -> int:
    """Host RAM per node the plan's estimate needs (0 when it has none)."""
    host = getattr(p.estimate, "host", None)
    return host.per_node_bytes if host is not None else 0


def _techniques(p: Any) -> int:
    techniques = getattr(p.knobs, "techniques", None)
    return techniques() if techniques else 0


def rank_plans(plans: Sequence[Any]) -> list[Any]:
    """Speed bands, then most headroom (up to ENOUGH_HEADROOM) first inside each, then speed, fewer techniques, less
    host RAM (module docstring); ranks renumbered from 1."""
    rest = sorted(plans, key=lambda p: -p.speed.tokens_per_s_per_gpu)
    out: list[Any] = []
    while rest:
        floor = (1 - THROUGHPUT_UNCERTAINTY) * rest[0].speed.tokens_per_s_per_gpu
        band = [p for p in rest if p.speed.tokens_per_s_per_gpu >= floor]
        rest = rest[len(band):]
        out += sorted(band, key=lambda p: (-min(headroom_share(p), ENOUGH_HEADROOM), -p.speed.tokens_per_s_per_gpu,
                                           _techniques(p), host_bytes(p)))
    return [replace(p, rank=i) for i, p in enumerate(out, 1)]


def band_start(plans: Sequence[Any], i: int) -> float:
    """Tokens/s of the fastest plan in the band of plans[i] (plans in walk order: fastest first)."""
    start = plans[0].speed.tokens_per_s_per_gpu
    for p in plans[1:i + 1]:
        if p.speed.tokens_per_s_per_gpu < (1 - THROUGHPUT_UNCERTAINTY) * start:
            start = p.speed.tokens_per_s_per_gpu
    return start


def same_band(fast: Any, slow: Any) -> bool:
    """Whether the throughput model can tell two plans apart (within its stated uncertainty or not)."""
    return slow.speed.tokens_per_s_per_gpu >= (1 - THROUGHPUT_UNCERTAINTY) * fast.speed.tokens_per_s_per_gpu
