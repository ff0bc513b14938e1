"""The capacity a drawn sequence of batch shapes needs, against the reserved it reaches unbounded.

`hpcmem.lab.shape_sequences` replays each stored stream on an allocator model without a capacity: its reserved keeps
every segment an earlier shape mapped. A GPU has a capacity, and when a request cannot be met the caching allocator
frees its cached blocks and tries again (c10/cuda/CUDACachingAllocator.cpp `malloc`: `release_cached_blocks`, then a
new cudaMalloc; hpcmem.estimate.caching_allocator models it), so what the sequence costs a job is the smallest
capacity above which its replay never runs out — found here on a grid of STEP bytes — less the constant worst
batch's reserved. Per stored stream (drawn order, default allocator, no torch_empty_cache_steps), the share
needed / unbounded excess is what hpcmem.estimate.shapes.NEEDED_SHARE holds per group:

    python -m hpcmem.lab.shape_capacity
"""

from __future__ import annotations

from typing import Any

from hpcmem.estimate.caching_allocator import AllocatorOutOfMemory
from hpcmem.lab.shape_sequences import stored_streams
from hpcmem.trace.replay import replay

GIB = 1024**3
STEP = 64 * 1024**2


def runs_within(events: list[Any], capacity_bytes: int) -> bool:
    """Whether the stream replays without running out at this capacity."""
    try:
        replay(events, capacity_bytes=capacity_bytes)
    except AllocatorOutOfMemory:
        return False
    return True


def needed_capacity(events: list[Any], low: int, high: int) -> int:
    """The capacity above which the stream never ran out on a grid of STEP from `low` to `high` (which must be
    enough): one step above the largest capacity that failed. A grid, not a bisection — running out is not monotone
    in the capacity (a larger one can leave a block split where a smaller one freed the cache)."""
    failed = None
    for capacity in range(low, high + 1, STEP):
        if not runs_within(events, capacity):
            failed = capacity
    return low if failed is None else failed + STEP


def unbounded_reserved(events: list[Any]) -> int:
    """The reserved peak over the stream's steps with no capacity (nothing is ever given back)."""
    return max(v[1] for s, v in replay(events).step_peaks.items() if s)


def measure(data: dict[str, Any]) -> dict[str, int]:
    """Unbounded reserved, needed capacity and the constant worst batch's reserved of one stored stream (bytes)."""
    events = data["events"]
    unbounded = unbounded_reserved(events)
    low = min(data["constant_reserved_bytes"], unbounded) - 8 * STEP
    needed = needed_capacity(events, low, unbounded + STEP)
    return {"constant": data["constant_reserved_bytes"], "unbounded": unbounded, "needed": needed}


def main() -> None:
    for name, data in stored_streams().items():
        m = measure(data)
        grown, needed = m["unbounded"] - m["constant"], m["needed"] - m["constant"]
        share = max(0.0, needed) / grown if grown > 0 else 0.0
        print(f"{name:28} constant {m['constant'] / GIB:6.2f}  unbounded {m['unbounded'] / GIB:6.2f} "
              f"({grown / GIB:+.2f})  needed {m['needed'] / GIB:6.2f} ({needed / GIB:+.2f})  share {share:.3f}")


if __name__ == "__main__":
    main()
