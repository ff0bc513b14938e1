"""The order the planner walks combinations in — fastest first — produced lazily, one speed at a time.

A knob space is a product: the head (the seven fields the throughput model reads: checkpointing, activation
offloading, packing, batch, accumulation, sharding, PEFT) × the tail (allocator setting, load dtype, optimizer). Every
head gets its throughput once; heads of one speed are expanded into their combinations only when the walk reaches that
speed. The walk stops long before the slowest combinations (hpcmem.plan.best_first, step 4), so most are never built.

The order is the one a full sort gives: fastest first (speeds rounded to 6 decimals), then fewer techniques
(Knobs.techniques), then the enumeration order of `combinations` (hpcmem.plan.knobs).
"""

from __future__ import annotations

from itertools import groupby
from operator import itemgetter
from typing import Iterator, Sequence

from hpcmem.plan.knobs import Knobs, Space
from hpcmem.plan.speed import Speeds
from hpcmem.plan.throughput import Throughput

_new = tuple.__new__        # a Knobs from its fields in order, without the generated __new__'s frame


def fastest_first(spaces: Sequence[Space], speeds: Speeds, par_fields: dict) -> Iterator[tuple[Throughput, Knobs]]:
    """(throughput, knobs) over every combination of `spaces` (enumerated one after the other), fastest first.
    `par_fields`: sharding name → its ParallelSpec fields (hpcmem.plan.speed.Speeds.__call__)."""
    heads = []      # (−speed, head techniques, index of the head's first combination, speed, head, space)
    start = 0
    for sp in spaces:
        width = len(sp.tails)
        first_tail = sp.tails[0] if sp.tails else None
        for h, head in enumerate(sp.heads):
            k = _new(Knobs, head + first_tail)
            speed = speeds(k, par_fields[k.sharding])
            heads.append((-round(speed.tokens_per_s_per_gpu, 6), k.speed_techniques(), start + h * width, speed,
                          head, sp))
        start += sp.size()
    heads.sort(key=itemgetter(0))         # stable: equal speeds keep the enumeration order
    other = {}                            # tail → its techniques (Knobs.other_techniques)
    for _, group in groupby(heads, key=itemgetter(0)):
        rows = []
        for _, techniques, first, speed, head, sp in group:
            for t, tail in enumerate(sp.tails):
                more = other.get(tail)
                if more is None:
                    more = other[tail] = _new(Knobs, head + tail).other_techniques()
                rows.append((techniques + more, first + t, speed, head + tail))
        rows.sort(key=itemgetter(0, 1))     # the index is unique: no tie reaches the speed
        for _, _, speed, fields in rows:
            yield speed, _new(Knobs, fields)


class SpeedTable:
    """Knobs → Throughput for every combination of the search's spaces, worked out on demand (the same memoised
    model the walk ordered by); None / KeyError outside them."""

    def __init__(self, speeds: Speeds, par_fields: dict, spaces: Sequence[Space]) -> None:
        self.speeds, self.par_fields, self.spaces = speeds, par_fields, tuple(spaces)

    def __contains__(self, k: object) -> bool:
        return isinstance(k, tuple) and len(k) == len(Knobs._fields) and any(sp.has(k) for sp in self.spaces)

    def get(self, k: Knobs, default: Throughput | None = None) -> Throughput | None:
        return self.speeds(k, self.par_fields[k.sharding]) if k in self else default

    def __getitem__(self, k: Knobs) -> Throughput:
        if k not in self:
            raise KeyError(k)
        return self.speeds(k, self.par_fields[k.sharding])
