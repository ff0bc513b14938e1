"""Count live tensor bytes, storage by storage, as every aten op runs — for real and fake tensors alike.

A `TorchDispatchMode` sees the output of every op below autograd. Each output's `untyped_storage()` is registered
once (views share their base's storage, so a view adds nothing) and a weak reference with a callback takes its bytes
off the count when the storage dies. PyTorch keeps one Python object per storage (PyObject preservation), so the
callback fires when the C++ storage is freed, not when a Python name goes away. Feasibility notes in
Checked when it was written: this matched `torch.distributed._tools.mem_tracker.MemTracker` to the byte and ran ~10× faster.

What it counts: the bytes of storages born as op outputs while the tracker is active, plus those handed to `tag()`.
What it cannot see: allocations inside a kernel (workspaces, internal upcasts) — the same blind spot on a real CPU run
and on a fake one, which is what makes the self-check meaningful; CUDA-side workspaces are added by
`hpcmem.trace.kernels` as explicit `reserve()` calls.

Observing changes one thing, which the tracker undoes: autograd's input buffer sums two gradients of one tensor in
place when it holds the last reference to the first (torch/csrc/autograd/input_buffer.cpp `accumulate`,
`can_accumulate_inplace`), and under any `TorchDispatchMode` that check fails, so the sum is made out of place. For
a tied [V, H] weight that is V × H more bytes at the embedding's backward than a real step holds (CPU profiler without
a mode: `aten::add_`, 0 B; with a mode that only forwards the call: `aten::add`, V × H × 2 B; the H200 records of
2026-11-29 read the in-place step). `accumulation_op()` turns that one sum — the one made while EmbeddingBackward0 is
the running node, whose own formula is a single op — back into `add_` when the first gradient is a dense, non-view
tensor, as it is from TRL's fused LM head. The same check turns the gradient of an indexing (`x[idx]`, IndexBackward0)
from an in-place scatter into the zeros it allocated into an out-of-place `index_put`: `accumulation_op()` turns it
back into `index_put_`.

`round_to=512` reproduces the CUDA caching allocator's rounding of every request to 512 bytes (c10/cuda/
CUDACachingAllocator.cpp, `kMinBlockSize`); `round_to=1` counts exact bytes as a CPU run allocates them.

`allocator=` (default None: off) is a listener with `malloc(nbytes) -> handle` / `free(handle)`, e.g.
`hpcmem.estimate.caching_allocator.CachingAllocator`: every counted birth, death, resize and `reserve()`/`release()` of
device bytes reaches it in the order the tracker counts them, so it can replay the caching allocator (reserved bytes).
A listener with `bind(tracker)` is handed the tracker (to read the phase); one with `op(func, args)` is called after
every op has registered its outputs (hpcmem.trace.events marks the GEMMs where cuBLAS takes its workspaces).
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

# a collated batch the data loader made ahead of its step: host memory until the step takes it (hpcmem.trace.fakeenv)
WAITING_BATCH = "batch (host, waiting)"

CATEGORIES: tuple[str, ...] = ("param", "grad", "optimizer", "activation", "temporary")
CUDA_BLOCK_BYTES = 512
ACCUMULATE_IN_PLACE_UNDER = frozenset({"EmbeddingBackward0"})   # nodes whose formula makes no add of its own
INDEX_PUT_IN_PLACE_UNDER = frozenset({"IndexBackward0"})         # index_backward's scatter into its own zeros


@dataclass(frozen=True)
class TimelinePoint:
    """One change of the live total: the op count when it happened, the phase, and the bytes live after it."""

    seq: int
    phase: str
    current_bytes: int


def round_up(nbytes: int, multiple: int) -> int:
    if multiple <= 1 or nbytes == 0:
        return nbytes
    return -(-nbytes // multiple) * multiple


class StorageTracker:
    """Live and peak tensor bytes by category, with the phase of the peak.

    Use as a context manager around the code to measure. Storages born inside `label(category)` take that category,
    otherwise `default_category`; `tag(tensors, category)` registers or relabels existing ones (parameters before
    the step, a gradient once it lands in `.grad`, optimizer states after `step()`); relabelling a storage that was
    alive at the peak instant moves its bytes in `peak_by_category` too (a gradient born just before the peak is
    counted as a gradient, not as a temporary). `phase(name)` names what is
    running; the innermost names are joined with " / " in `peak_phase`. Categories in `uncounted` (default "host":
    activation-offloading copies in pinned host memory; WAITING_BATCH: a collated batch not yet taken for a step) are
    tracked in `by_category` but left out of the device total; `peak_uncounted_bytes` is the offloaded copies' peak.
    """

    def __init__(self, *, round_to: int = 1, timeline: bool = False, default_category: str = "temporary",
                 uncounted: tuple[str, ...] = ("host", WAITING_BATCH), allocator: Any = None) -> None:
        if round_to < 1:
            raise ValueError(f"round_to must be ≥ 1 (512 for the CUDA mapping, 1 for cpu); got {round_to}")
        self.round_to = round_to
        self.default_category = default_category
        self.current_bytes = 0
        self.peak_bytes = 0
        self.peak_phase = ""
        self.peak_by_category: dict[str, int] = {}
        self.by_category: dict[str, int] = {}
        self.timeline: list[TimelinePoint] | None = [] if timeline else None
        self.num_ops = 0
        self.uncounted = uncounted          # categories kept apart from the device total (offloaded host copies)
        self.peak_uncounted_bytes = 0
        self._live: dict[int, list[Any]] = {}   # id(storage) -> [weakref, bytes, category, op count at birth]
        self._peak_seq = -1
        self._labels: list[str] = []
        self._phases: list[str] = []
        self._detail: str | None = None
        self._mode: Any = None
        import torch

        self._tensor_type: Any = torch.Tensor
        self._aten_add, self._aten_add_ = torch.ops.aten.add.Tensor, torch.ops.aten.add_.Tensor   # accumulation_op
        self._aten_index_put = torch.ops.aten.index_put.default                                  # accumulation_op
        self._aten_index_put_ = torch.ops.aten.index_put_.default
        # op -> fn(args, kwargs, out) -> bytes a kernel allocates internally while it runs (CUDA mapping)
        self.workspace: dict[Any, Any] = {}
        self.allocator = allocator           # optional malloc/free listener (see the module docstring)
        self._reserved_handles: dict[tuple[str, int], list[Any]] = {}
        self._op_listener = getattr(allocator, "op", None)     # hpcmem.trace.events.EventLog: sees every op
        if hasattr(allocator, "bind"):
            allocator.bind(self)                # it reads the phase from the tracker

    # -- autograd's in-place accumulation (see the module docstring) ---------------------------------------------
    def accumulation_op(self, func: Any, args: Any, kwargs: Any) -> Any:
        """`aten.add_.Tensor` for the input buffer's sum of a tied weight's two gradients, `aten.index_put_` for
        index_backward's scatter into its zeros, else `func` unchanged. Called for every op the trace sees: anything
        but `add.Tensor` and `index_put` leaves at the first comparisons."""
        if func is self._aten_index_put:
            return self._index_put_in_place(func, args, kwargs)
        if func is not self._aten_add:
            return func
        import torch

        if kwargs or len(args) != 2 or torch.is_grad_enabled():
            return func
        node = torch._C._current_autograd_node()
        if node is None or node.name() not in ACCUMULATE_IN_PLACE_UNDER:
            return func
        first, second = args
        if not (isinstance(first, torch.Tensor) and isinstance(second, torch.Tensor)):
            return func
        if (first._base is not None or first.shape != second.shape or first.dtype != second.dtype
                or not first.is_contiguous()):
            return func
        return self._aten_add_

    def _index_put_in_place(self, func: Any, args: Any, kwargs: Any) -> Any:
        """The gradient of `x[idx]` (IndexBackward0): torch/csrc/autograd/FunctionsManual.cpp `index_backward`
        scatters the gradient into the zeros it was handed with `_index_put_impl_` in place, unless a tensor
        subclass or a Python dispatch mode is about (`areAnyTensorSubclassLike`) — then with `index_put`, out of
        place: one more tensor of x's size (an MoE layer's [tokens·k, H] routed states, a loss's masked hidden
        states) that a run without the tracker never makes (profiler without a mode: `aten::_index_put_impl_`)."""
        import torch

        accumulate = args[3] if len(args) > 3 else (kwargs or {}).get("accumulate", False)
        if not accumulate or torch.is_grad_enabled():
            return func
        node = torch._C._current_autograd_node()
        if node is None or node.name() not in INDEX_PUT_IN_PLACE_UNDER:
            return func
        zeros = args[0]
        if not isinstance(zeros, torch.Tensor) or zeros._base is not None or not zeros.is_contiguous():
            return func
        return self._aten_index_put_

    # -- context management ------------------------------------------------------------------------------------
    def __enter__(self) -> StorageTracker:
        self._mode = _make_mode(self)
        self._mode.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        mode, self._mode = self._mode, None
        mode.__exit__(*exc)

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Name what runs inside (nested names join: "step 2 / backward"); entering or leaving clears the detail."""
        self.push_phase(name)
        try:
            yield
        finally:
            self.pop_phase()

    def push_phase(self, name: str) -> None:
        """`phase()` without a `with` block, for hooks that see only the start and the end."""
        self._phases.append(name)
        self._detail = None

    def pop_phase(self) -> None:
        self._phases.pop()
        self._detail = None

    def set_detail(self, name: str | None) -> None:
        """Name the part of the current phase that runs now (e.g. "layer 31"), until the next detail or phase."""
        self._detail = name

    @property
    def current_phase(self) -> str:
        parts = self._phases + [self._detail] if self._detail else self._phases
        return " / ".join(parts)

    @contextlib.contextmanager
    def label(self, category: str) -> Iterator[None]:
        """Storages born inside take `category`."""
        self._labels.append(category)
        try:
            yield
        finally:
            self._labels.pop()

    def push_label(self, category: str) -> None:
        """`label()` without a `with` block (for pre/post hook pairs)."""
        self._labels.append(category)

    def pop_label(self) -> None:
        self._labels.pop()

    def tag(self, tensors: Any, category: str) -> None:
        """Register (if unseen) and relabel the storages of a tensor, or of every tensor in a nested structure."""
        for t in _iter_tensors(tensors):
            self._register(t, category, relabel=True)

    def reserve(self, nbytes: int, category: str = "temporary") -> None:
        """Count bytes that no tensor holds (a kernel's workspace); pair with `release()`."""
        nbytes = round_up(nbytes, self.round_to)
        self._add(nbytes, category)
        if self.allocator is not None:
            handle = self._malloc(nbytes, category)
            if handle is not None:
                self._reserved_handles.setdefault((category, nbytes), []).append(handle)

    def release(self, nbytes: int, category: str = "temporary") -> None:
        nbytes = round_up(nbytes, self.round_to)
        self._sub(nbytes, category)
        if self.allocator is not None:
            stack = self._reserved_handles.get((category, nbytes))
            if stack:
                self.allocator.free(stack.pop())

    def reset_peak(self) -> None:
        """Start a new peak from what is live now."""
        self.peak_bytes = self.current_bytes
        self.peak_phase = self.current_phase
        self.peak_by_category = {k: v for k, v in self.by_category.items() if v and k not in self.uncounted}
        self._peak_seq = self.num_ops

    def live_bytes_of(self, category: str) -> int:
        return self.by_category.get(category, 0)

    def live_by_birth_phase(self, skip: tuple[str, ...] = ("param", "grad", "optimizer")) -> dict[str, int]:
        """Device bytes alive now, by the phase each storage was born in (categories in `skip` left out); needs the
        timeline (a storage's birth is the timeline point of its op count), else {}."""
        import bisect

        if not self.timeline:
            return {}
        seqs = [p.seq for p in self.timeline]
        out: dict[str, int] = {}
        for ref, nbytes, category, born, *_ in list(self._live.values()):
            if ref() is None or category in skip or category in self.uncounted or not nbytes:
                continue
            i = bisect.bisect_left(seqs, born)
            phase = self.timeline[min(i, len(seqs) - 1)].phase
            out[phase] = out.get(phase, 0) + nbytes
        return out

    # -- bookkeeping ---------------------------------------------------------------------------------------------
    def _category_for_birth(self) -> str:
        return self._labels[-1] if self._labels else self.default_category

    def _register(self, t: Any, category: str | None, relabel: bool = False) -> None:
        st = t.untyped_storage()
        key = id(st)
        entry = self._live.get(key)
        if entry is not None and entry[0]() is st:
            nbytes = round_up(st.nbytes(), self.round_to)
            if nbytes != entry[1]:          # resized in place (resize_, set_)
                self._sub(entry[1], entry[2])
                entry[1] = nbytes
                self._add(nbytes, entry[2])
                if self.allocator is not None:  # the same order as the count: old block freed, new one taken
                    self._free(entry[4])
                    entry[4] = self._malloc(nbytes, entry[2])
            if relabel and category is not None and category != entry[2]:
                self._move(entry[1], entry[2], category)
                if self.allocator is not None and (entry[2] in self.uncounted) != (category in self.uncounted):
                    self._free(entry[4])       # moved between device and host categories
                    entry[4] = self._malloc(entry[1], category)
                if entry[3] <= self._peak_seq and entry[2] not in self.uncounted and category not in self.uncounted:
                    # alive at the peak instant: what it is now is what it was for (a gradient not yet in .grad)
                    self._move_peak(entry[1], entry[2], category)
                entry[2] = category
            return
        nbytes = round_up(st.nbytes(), self.round_to)
        category = category or self._category_for_birth()
        entry = [None, nbytes, category, self.num_ops, None]   # [.., allocator handle]
        entry[0] = weakref.ref(st, self._on_free(key, entry))
        self._live[key] = entry
        self._add(nbytes, category)
        if self.allocator is not None:
            entry[4] = self._malloc(nbytes, category)

    def _on_free(self, key: int, entry: list[Any]) -> Any:
        def free(_ref: Any) -> None:
            if self._live.get(key) is entry:
                del self._live[key]
            self._sub(entry[1], entry[2])
            if self.allocator is not None:
                self._free(entry[4])
        return free

    # -- allocator listener (off unless `allocator=` is given) ----------------------------------------------------
    def _malloc(self, nbytes: int, category: str) -> Any:
        """The listener's handle for device bytes; None for host categories and empty storages (nothing to free)."""
        if not nbytes or category in self.uncounted:
            return None
        return self.allocator.malloc(nbytes)

    def _free(self, handle: Any) -> None:
        if handle is not None:
            self.allocator.free(handle)

    def _add(self, nbytes: int, category: str) -> None:
        if not nbytes:
            return
        self.by_category[category] = self.by_category.get(category, 0) + nbytes
        if category in self.uncounted:
            self.peak_uncounted_bytes = max(self.peak_uncounted_bytes, self._uncounted_now())
            return
        self.current_bytes += nbytes
        if self.current_bytes > self.peak_bytes:
            self.peak_bytes = self.current_bytes
            self.peak_phase = self.current_phase
            self.peak_by_category = {k: v for k, v in self.by_category.items() if v and k not in self.uncounted}
            self._peak_seq = self.num_ops
        self._note()

    def _sub(self, nbytes: int, category: str) -> None:
        if not nbytes:
            return
        self.by_category[category] = self.by_category.get(category, 0) - nbytes
        if category in self.uncounted:
            return
        self.current_bytes -= nbytes
        self._note()

    def _move(self, nbytes: int, old: str, new: str) -> None:
        self._sub(nbytes, old)
        self._add(nbytes, new)

    def _move_peak(self, nbytes: int, old: str, new: str) -> None:
        self.peak_by_category[old] = self.peak_by_category.get(old, 0) - nbytes
        self.peak_by_category[new] = self.peak_by_category.get(new, 0) + nbytes
        self.peak_by_category = {k: v for k, v in self.peak_by_category.items() if v}

    def _uncounted_now(self) -> int:
        """Host bytes of offloaded copies: the collated batches waiting for their step (WAITING_BATCH) are host
        memory too, but not what `peak_uncounted_bytes` reports."""
        return sum(self.by_category.get(c, 0) for c in self.uncounted if c != WAITING_BATCH)

    def _note(self) -> None:
        if self.timeline is not None:
            self.timeline.append(TimelinePoint(self.num_ops, self.current_phase, self.current_bytes))

    def observe(self, func: Any, args: Any, kwargs: Any, out: Any) -> None:
        """Count the storages `func` returned (and its workspace, if one is registered). The tracker's own mode calls
        this for every op; another dispatch mode already on the stack may call it instead of entering the tracker."""
        self._track_outputs(out, self._tensor_type)
        if self._op_listener is not None:
            self._op_listener(func, args)
        if self.workspace:
            extra = self.workspace.get(func)
            if extra is not None:
                nbytes = extra(args, kwargs or {}, out)
                self.reserve(nbytes, "temporary")
                self.release(nbytes, "temporary")

    def _track_outputs(self, out: Any, tensor_type: type) -> None:
        self.num_ops += 1
        if isinstance(out, tensor_type):
            self._register(out, None)
        elif isinstance(out, (list, tuple)):
            for t in out:
                if isinstance(t, tensor_type):
                    self._register(t, None)
                elif isinstance(t, (list, tuple)):
                    self._track_nested(t, tensor_type)

    def _track_nested(self, out: Any, tensor_type: type) -> None:
        for t in _iter_tensors(out):
            self._register(t, None)


def _iter_tensors(obj: Any) -> Iterable[Any]:
    import torch

    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, (list, tuple)):
        for o in obj:
            yield from _iter_tensors(o)
    elif isinstance(obj, Mapping):       # a dict, or transformers' BatchFeature / BatchEncoding (a UserDict)
        for o in obj.values():
            yield from _iter_tensors(o)


def _make_mode(tracker: StorageTracker) -> Any:
    from torch.utils._python_dispatch import TorchDispatchMode

    class _StorageMode(TorchDispatchMode):
        @classmethod
        def _should_skip_dynamo(cls) -> bool:
            return False    # nothing is compiled under the tracker; skips a per-op dynamo-disable wrapper

        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            func = tracker.accumulation_op(func, args, kwargs)
            out = func(*args, **(kwargs or {}))
            tracker.observe(func, args, kwargs, out)
            return out

    return _StorageMode()
