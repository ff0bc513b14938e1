"""A pure-Python model of PyTorch's CUDA caching allocator (one device, one stream), to turn the trace's sequence of
storage births and deaths into `torch.cuda.max_memory_reserved()` — not only `max_memory_allocated()`.

Source read: pytorch/pytorch c10/cuda/CUDACachingAllocator.cpp (`DeviceCachingAllocator`: `malloc`, `round_size`,
`get_pool`, `get_allocation_size`, `get_free_block`, `should_split`, `alloc_found_block`, `alloc_block`, `free_block`,
`try_merge_blocks`, `release_cached_blocks`, `release_blocks`; expandable segments: Note [Expandable Segments],
`ExpandableSegment::map/unmap`, `find_expandable_block`, `map_block`, `try_allocate_expandable_block`,
`unmap_block`) and, for torch 2.13, the constants in c10/core/AllocatorConfig.h (`kMinBlockSize`, `kSmallSize`,
`kSmallBuffer`, `kMinLargeAlloc`, `kRoundLarge`; `large_segment_size_` 20 MiB = `kLargeBuffer`). The code here is a
re-statement of those rules, not a translation.

Rules modelled
- Every request is rounded up to a multiple of 512 B (`kMinBlockSize`, `round_size`); a 0-byte request allocates
  nothing (the allocator hands out a null pointer for size 0) and its handle 0 frees nothing.
- Rounded size ≤ 1 MiB (`kSmallSize`) → small pool, else large pool (`get_pool`). A new segment (`cudaMalloc`) is
  2 MiB for the small pool (`kSmallBuffer`), 20 MiB for large requests < 10 MiB (`kLargeBuffer`, `kMinLargeAlloc`),
  else the request rounded up to 2 MiB (`kRoundLarge`) (`get_allocation_size`).
- Best fit (`get_free_block`): the cached free block of the request's pool with the smallest size ≥ the request,
  ties broken by address (`BlockComparatorSize`).
- Split (`should_split`): small pool when the remainder ≥ 512 B; large pool when the remainder > 1 MiB. An unsplit
  block is handed out whole and `allocated` counts its whole size (`alloc_found_block` adds `block->size`), so
  `allocated` can exceed the sum of rounded requests by up to 1 MiB per large block; `requested` is that sum
  (torch's `requested_bytes`, of the sizes passed in).
- A freed block merges with free neighbours of the same segment (`free_block` → `try_merge_blocks`).
- No cached block fits → new segment (`alloc_block`). If that would take the reserve past `capacity_bytes`: free
  every cached segment that is entirely free (`release_cached_blocks`), count a retry (`num_alloc_retries`) and try
  once more; still no room → `num_ooms` += 1 and `AllocatorOutOfMemory`.

Defaults assumed (PYTORCH_CUDA_ALLOC_CONF unset apart from expandable_segments): `max_split_size_mb` unlimited (so
`release_available_cached_blocks` never frees anything and no oversize rules apply), no
`garbage_collection_threshold`, no `roundup_power2_divisions`, no CUDA graphs / private pools, no cross-stream
`record_stream` events, no free-memory callbacks.

expandable_segments:True (Note [Expandable Segments]): one virtual segment per pool (and stream) reserves a large
address range and maps physical pages on demand: 2 MiB pages for the small pool (`kSmallBuffer`), 20 MiB pages for
the large pool (`kLargeBuffer`; torch ≥ 2.8 `large_segment_size_mb`, default 20) — not 2 MiB for both. Reserved =
mapped pages. A request no free mapped block fits takes the lowest address where free and unmapped space together
fit it (`find_expandable_block`: the first unmapped range, preceded by the free block in front of it if any) and maps
just the pages it needs (`map_block`); the new pages merge with that free block. Blocks split whenever the remainder
≥ 512 B in both pools (`should_split`). Best fit ranks a free block that borders unmapped space by its size plus the
unmapped space (it can grow), so other blocks that fit are preferred to it. Pages are unmapped only by
`release_cached_blocks` (capacity pressure, `empty_cache()`), and only pages that no live block touches
(`ExpandableSegment::unmap`).

Capacity: `capacity_bytes` models a device with that much memory for the allocator: a `cudaMalloc` or a page map
that would take the reserve past it fails (as a full GPU does). `torch.cuda.set_per_process_memory_fraction` differs
slightly under expandable segments: it checks `get_allocation_size(size)` before mapping, not the pages mapped.

Stdlib only (no torch): the estimator side may import it.
"""

from __future__ import annotations

import bisect
from dataclasses import asdict, dataclass
from typing import Any

MIB = 1024**2
K_MIN_BLOCK_SIZE = 512              # kMinBlockSize: all sizes are rounded to at least 512 bytes
K_SMALL_SIZE = 1 * MIB              # kSmallSize: largest "small" allocation
K_SMALL_BUFFER = 2 * MIB            # kSmallBuffer: small-pool segment; small-pool expandable page
K_LARGE_BUFFER = 20 * MIB           # kLargeBuffer: segment for 1–10 MiB requests; large-pool expandable page
K_MIN_LARGE_ALLOC = 10 * MIB        # kMinLargeAlloc: requests below it (and > 1 MiB) get a kLargeBuffer segment
K_ROUND_LARGE = 2 * MIB             # kRoundLarge: larger segments are rounded up to 2 MiB
EXPANDABLE_PAGES = 1 << 27          # address space of one expandable segment, in pages (never the limit here)
MODES: tuple[str, ...] = ("default", "expandable")


class AllocatorOutOfMemory(MemoryError):
    """The simulated allocator could not reserve a segment (or map pages) within `capacity_bytes`."""


# -- the size rules, as pure functions ----------------------------------------------------------------------------
def round_size(nbytes: int) -> int:
    """`round_size`: up to a multiple of kMinBlockSize, at least kMinBlockSize (default: no power-of-2 divisions)."""
    if nbytes < K_MIN_BLOCK_SIZE:
        return K_MIN_BLOCK_SIZE
    return -(-nbytes // K_MIN_BLOCK_SIZE) * K_MIN_BLOCK_SIZE


def is_small(size: int) -> bool:
    """`get_pool`: a rounded size ≤ kSmallSize goes to the small pool."""
    return size <= K_SMALL_SIZE


def allocation_size(size: int) -> int:
    """`get_allocation_size`: the bytes one new `cudaMalloc` segment gets for a rounded request of `size`."""
    if size <= K_SMALL_SIZE:
        return K_SMALL_BUFFER
    if size < K_MIN_LARGE_ALLOC:
        return K_LARGE_BUFFER
    return -(-size // K_ROUND_LARGE) * K_ROUND_LARGE


def should_split(block_size: int, size: int, small: bool, expandable: bool) -> bool:
    """`should_split` with max_split_size unlimited: small pool or expandable segments split a remainder ≥ 512 B,
    the large pool only a remainder > 1 MiB."""
    remaining = block_size - size
    if small or expandable:
        return remaining >= K_MIN_BLOCK_SIZE
    return remaining > K_SMALL_SIZE


def page_size(small: bool) -> int:
    """Page of an expandable segment: kSmallBuffer for the small pool, kLargeBuffer for the large pool."""
    return K_SMALL_BUFFER if small else K_LARGE_BUFFER


# -- state -----------------------------------------------------------------------------------------------------------
class _Block:
    """A contiguous range of one segment: allocated, free (cached) or — in an expandable segment — unmapped."""

    __slots__ = ("addr", "size", "small", "allocated", "mapped", "prev", "next", "base")

    def __init__(self, addr: int, size: int, small: bool, *, mapped: bool = True, base: int | None = None) -> None:
        self.addr = addr
        self.size = size
        self.small = small          # the pool it belongs to
        self.allocated = False
        self.mapped = mapped
        self.prev: _Block | None = None
        self.next: _Block | None = None
        self.base = base            # start of the expandable segment; None for a cudaMalloc segment


def _splice_after(block: _Block, new: _Block) -> None:
    new.prev, new.next = block, block.next
    if block.next is not None:
        block.next.prev = new
    block.next = new


def _splice_before(block: _Block, new: _Block) -> None:
    new.prev, new.next = block.prev, block
    if block.prev is not None:
        block.prev.next = new
    block.prev = new


class _Pool:
    """One BlockPool: its cached free blocks sorted by (size, address), its unmapped ranges sorted by address."""

    def __init__(self, small: bool) -> None:
        self.small = small
        self.free: list[tuple[int, int]] = []
        self.free_at: dict[int, _Block] = {}
        self.unmapped: list[int] = []
        self.unmapped_at: dict[int, _Block] = {}

    def add_free(self, b: _Block) -> None:
        bisect.insort(self.free, (b.size, b.addr))
        self.free_at[b.addr] = b

    def remove_free(self, b: _Block) -> None:
        i = bisect.bisect_left(self.free, (b.size, b.addr))
        del self.free[i]
        del self.free_at[b.addr]

    def add_unmapped(self, b: _Block) -> None:
        bisect.insort(self.unmapped, b.addr)
        self.unmapped_at[b.addr] = b

    def remove_unmapped(self, b: _Block) -> None:
        del self.unmapped[bisect.bisect_left(self.unmapped, b.addr)]
        del self.unmapped_at[b.addr]

    def remove(self, b: _Block) -> None:
        (self.remove_free if b.mapped else self.remove_unmapped)(b)


@dataclass
class AllocatorStats:
    """The counters of `torch.cuda.memory_stats()` this model reproduces (aggregate over both pools)."""

    expandable_segments: bool
    allocated_bytes: int = 0            # allocated_bytes.all.current: sizes of the blocks handed out
    reserved_bytes: int = 0             # reserved_bytes.all.current: cudaMalloc'd segments + mapped pages
    requested_bytes: int = 0            # requested_bytes.all.current: the sizes passed to malloc
    peak_allocated_bytes: int = 0
    peak_reserved_bytes: int = 0
    peak_requested_bytes: int = 0
    num_segments: int = 0               # segment.all.current: live cudaMalloc segments (expandable: live segments)
    peak_segments: int = 0
    num_device_alloc: int = 0           # cudaMalloc calls / page-map calls
    num_device_free: int = 0            # cudaFree calls / unmap calls
    num_alloc_retries: int = 0
    num_ooms: int = 0
    num_mallocs: int = 0

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


class CachingAllocator:
    """`malloc(nbytes) -> handle`, `free(handle)`, `empty_cache()`; `stats` holds the counters.

    `expandable_segments` selects PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True; `capacity_bytes` the memory the
    allocator may reserve (None: unlimited, nothing ever fails).
    """

    def __init__(self, expandable_segments: bool = False, capacity_bytes: int | None = None) -> None:
        self.expandable = expandable_segments
        self.capacity_bytes = capacity_bytes
        self.stats = AllocatorStats(expandable_segments=expandable_segments)
        self._pools = {True: _Pool(True), False: _Pool(False)}
        self._live: dict[int, tuple[_Block, int]] = {}      # handle -> (block, requested bytes)
        self._next_handle = 1
        self._next_addr = 1 << 20           # segments are laid out in creation order (address ties → older first)

    # -- public API --------------------------------------------------------------------------------------------------
    def malloc(self, nbytes: int) -> int:
        """Allocate `nbytes`; returns a handle for `free` (0 for a 0-byte request)."""
        if nbytes < 0:
            raise ValueError(f"cannot allocate {nbytes} bytes")
        if nbytes == 0:
            return 0
        size = round_size(nbytes)
        pool = self._pools[is_small(size)]
        block = self._get_free_block(pool, size)
        if block is None:
            block = self._alloc_block(pool, size, retry=False)
            if block is None:
                self.release_cached_blocks()
                block = self._alloc_block(pool, size, retry=True)
            if block is None:
                self.stats.num_ooms += 1
                raise AllocatorOutOfMemory(
                    f"simulated CUDA allocator out of memory: tried to allocate {allocation_size(size)} B for a "
                    f"{nbytes} B request; capacity {self.capacity_bytes} B, reserved {self.stats.reserved_bytes} B, "
                    f"allocated {self.stats.allocated_bytes} B")
        block = self._alloc_found_block(pool, block, size)
        handle = self._next_handle
        self._next_handle += 1
        self._live[handle] = (block, nbytes)
        st = self.stats
        st.num_mallocs += 1
        st.allocated_bytes += block.size
        st.requested_bytes += nbytes
        st.peak_allocated_bytes = max(st.peak_allocated_bytes, st.allocated_bytes)
        st.peak_requested_bytes = max(st.peak_requested_bytes, st.requested_bytes)
        return handle

    def free(self, handle: int) -> None:
        """Return a block to its pool's cache (`free_block`): it merges with free neighbours; nothing is released."""
        if handle == 0:
            return
        block, nbytes = self._live.pop(handle)
        self.stats.allocated_bytes -= block.size
        self.stats.requested_bytes -= nbytes
        block.allocated = False
        pool = self._pools[block.small]
        self._merge(pool, block, block.prev)
        self._merge(pool, block, block.next)
        pool.add_free(block)

    def empty_cache(self) -> None:
        """`torch.cuda.empty_cache()`: release everything cached that can be released."""
        self.release_cached_blocks()

    def release_cached_blocks(self) -> None:
        """`release_cached_blocks` → `release_blocks` per pool: cudaFree every cached segment that is one free block;
        in expandable segments unmap every page that free blocks cover entirely."""
        for pool in (self._pools[False], self._pools[True]):
            to_unmap = []
            for size, addr in list(pool.free):
                b = pool.free_at[addr]
                if b.base is not None:
                    to_unmap.append(b)
                elif b.prev is None and b.next is None:
                    pool.remove_free(b)
                    self._release_reserve(size, segment=True)
            for b in to_unmap:
                self._unmap_block(pool, b)

    @property
    def live_handles(self) -> int:
        return len(self._live)

    def segments(self) -> list[tuple[bool, tuple[tuple[int, str], ...]]]:
        """The segments in address order, each (small pool?, its blocks in address order as (size, state)), state
        "allocated", "free" or "unmapped" — what `torch.cuda.memory_snapshot()` lists per segment (c10/cuda/
        CUDACachingAllocator.cpp `snapshot`: a segment's blocks with their size and state). Under expandable segments
        one segment is a pool's whole address range, its unmapped ranges included."""
        blocks = [b for b, _ in self._live.values()]
        for pool in self._pools.values():
            blocks += list(pool.free_at.values()) + list(pool.unmapped_at.values())
        # every block is live, free or unmapped, so each segment's head (no block before it) is among them: walk
        # forward from the heads only, each block once
        heads = {b.addr: b for b in blocks if b.prev is None}
        out = []
        for addr in sorted(heads):
            parts, b = [], heads[addr]
            while b is not None:
                state = "allocated" if b.allocated else "free" if b.mapped else "unmapped"
                parts.append((b.size, state))
                b = b.next
            out.append((heads[addr].small, tuple(parts)))
        return out

    # -- search, split, merge ----------------------------------------------------------------------------------------
    def _get_free_block(self, pool: _Pool, size: int) -> _Block | None:
        """`get_free_block`: best fit by (size, address); under expandable segments a block that borders unmapped
        space is ranked by the size it could grow to, so a larger block that does not is taken first."""
        free = pool.free
        i = bisect.bisect_left(free, (size, -1))
        if i == len(free):
            return None
        if self.expandable:
            while i + 1 < len(free) and (self._growable(pool.free_at[free[i + 1][1]])
                                         < self._growable(pool.free_at[free[i][1]])):
                i += 1
        b = pool.free_at[free[i][1]]
        pool.remove_free(b)
        return b

    @staticmethod
    def _growable(b: _Block) -> int:
        return b.size + (b.next.size if b.next is not None and not b.next.mapped else 0)

    def _alloc_found_block(self, pool: _Pool, block: _Block, size: int) -> _Block:
        """`alloc_found_block`: hand out the front `size` bytes and cache the rest, or the whole block unsplit."""
        if should_split(block.size, size, pool.small, self.expandable):
            used = _Block(block.addr, size, pool.small, base=block.base)
            _splice_before(block, used)
            block.addr += size
            block.size -= size
            pool.add_free(block)
            block = used
        block.allocated = True
        return block

    def _merge(self, pool: _Pool, dst: _Block, src: _Block | None) -> None:
        """`try_merge_blocks`: absorb a free neighbour with the same mapped state into `dst` (not in any set)."""
        if src is None or src.allocated or src.mapped != dst.mapped:
            return
        pool.remove(src)
        if src is dst.prev:
            dst.addr = src.addr
            dst.prev = src.prev
            if dst.prev is not None:
                dst.prev.next = dst
        else:
            dst.next = src.next
            if dst.next is not None:
                dst.next.prev = dst
        dst.size += src.size

    # -- reserving memory ---------------------------------------------------------------------------------------------
    def _fits(self, nbytes: int) -> bool:
        return self.capacity_bytes is None or self.stats.reserved_bytes + nbytes <= self.capacity_bytes

    def _add_reserve(self, nbytes: int, segment: bool) -> None:
        st = self.stats
        st.reserved_bytes += nbytes
        st.peak_reserved_bytes = max(st.peak_reserved_bytes, st.reserved_bytes)
        st.num_device_alloc += 1
        if segment:
            st.num_segments += 1
            st.peak_segments = max(st.peak_segments, st.num_segments)

    def _release_reserve(self, nbytes: int, segment: bool) -> None:
        st = self.stats
        st.reserved_bytes -= nbytes
        st.num_device_free += 1
        if segment:
            st.num_segments -= 1

    def _alloc_block(self, pool: _Pool, size: int, *, retry: bool) -> _Block | None:
        """`alloc_block`: a new cudaMalloc segment of `allocation_size(size)`, or (expandable) new pages mapped."""
        if retry:
            self.stats.num_alloc_retries += 1
        if self.expandable:
            return self._try_allocate_expandable(pool, size)
        nbytes = allocation_size(size)
        if not self._fits(nbytes):
            return None
        block = _Block(self._take_addresses(nbytes), nbytes, pool.small)
        self._add_reserve(nbytes, segment=True)
        return block

    def _take_addresses(self, nbytes: int) -> int:
        addr = self._next_addr
        self._next_addr += nbytes
        return addr

    # -- expandable segments -----------------------------------------------------------------------------------------
    def _find_expandable_block(self, pool: _Pool, size: int) -> _Block:
        """`find_expandable_block`: the lowest unmapped range (with the free block in front of it) where free and
        unmapped space together hold `size`; a new segment if none does."""
        for addr in pool.unmapped:
            c = pool.unmapped_at[addr]
            if c.prev is not None and not c.prev.allocated:
                c = c.prev
            room, b = 0, c
            while b is not None and not b.allocated and room < size:
                room += b.size
                b = b.next
            if room >= size:
                return c
        span = EXPANDABLE_PAGES * page_size(pool.small)
        base = self._take_addresses(span)
        c = _Block(base, span, pool.small, mapped=False, base=base)
        pool.add_unmapped(c)
        self.stats.num_segments += 1
        self.stats.peak_segments = max(self.stats.peak_segments, self.stats.num_segments)
        return c

    def _map_block(self, pool: _Pool, block: _Block, size: int) -> bool:
        """`map_block`: map the pages covering the first `size` bytes of an unmapped range; they join the free block
        before or after them. False (nothing mapped) if the pages do not fit in the capacity."""
        page = page_size(pool.small)
        assert block.base is not None and (block.addr - block.base) % page == 0 and size <= block.size
        nbytes = -(-size // page) * page
        if not self._fits(nbytes):
            return False
        pool.remove_unmapped(block)
        block.mapped = True
        if nbytes < block.size:
            rest = _Block(block.addr + nbytes, block.size - nbytes, pool.small, mapped=False, base=block.base)
            _splice_after(block, rest)
            pool.add_unmapped(rest)
            block.size = nbytes
        self._merge(pool, block, block.prev)
        self._merge(pool, block, block.next)
        pool.add_free(block)
        self._add_reserve(nbytes, segment=False)
        return True

    def _try_allocate_expandable(self, pool: _Pool, size: int) -> _Block | None:
        """`try_allocate_expandable_block`: map pages until the candidate free block holds `size`."""
        c = self._find_expandable_block(pool, size)
        if not c.mapped and not self._map_block(pool, c, min(c.size, size)):
            return None
        while c.size < size:
            nxt = c.next
            assert nxt is not None and not nxt.mapped
            if not self._map_block(pool, nxt, min(size - c.size, nxt.size)):
                return None
            c = nxt
        pool.remove_free(c)
        return c

    def _unmap_block(self, pool: _Pool, block: _Block) -> None:
        """`unmap_block`: unmap the pages a free block covers entirely; the slivers before and after stay mapped."""
        page = page_size(pool.small)
        base = block.base
        assert base is not None
        first = base + -(-(block.addr - base) // page) * page
        last = base + (block.addr + block.size - base) // page * page
        if first >= last:
            return
        pool.remove_free(block)
        if first > block.addr:
            before = _Block(block.addr, first - block.addr, pool.small, base=base)
            _splice_before(block, before)
            pool.add_free(before)
        end = block.addr + block.size
        if end > last:
            after = _Block(last, end - last, pool.small, base=base)
            _splice_after(block, after)
            pool.add_free(after)
        block.addr, block.size, block.mapped = first, last - first, False
        self._merge(pool, block, block.prev)
        self._merge(pool, block, block.next)
        pool.add_unmapped(block)
        self._release_reserve(last - first, segment=False)


class AllocatorSet:
    """Several simulated allocators fed the same event stream (one trace gives default and expandable numbers)."""

    def __init__(self, modes: tuple[str, ...] = MODES, capacity_bytes: int | None = None) -> None:
        for m in modes:
            if m not in MODES:
                raise ValueError(f"allocator mode must be one of {', '.join(MODES)}; got {m!r}")
        self.allocators = {m: CachingAllocator(m == "expandable", capacity_bytes) for m in modes}

    def malloc(self, nbytes: int) -> tuple[int, ...]:
        return tuple(a.malloc(nbytes) for a in self.allocators.values())

    def free(self, handles: tuple[int, ...]) -> None:
        for a, h in zip(self.allocators.values(), handles, strict=True):
            a.free(h)

    def stats(self) -> dict[str, dict[str, Any]]:
        return {m: a.stats.to_json() for m, a in self.allocators.items()}


def allocator_modes(choice: bool | str | None) -> tuple[str, ...]:
    """`run_trace(allocator=...)`: False/None → off; True or "default" → default; "expandable"; "both"."""
    if choice is None or choice is False:
        return ()
    if choice is True or choice == "default":
        return ("default",)
    if choice == "expandable":
        return ("expandable",)
    if choice == "both":
        return MODES
    raise ValueError(f"allocator must be False, True, 'default', 'expandable' or 'both'; got {choice!r}")
