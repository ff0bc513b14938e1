"""The result of an estimate: named components, phases, three peaks. Totals are derived from parts, never stored."""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property

from hpcmem.estimate.verdict import FitVerdict, judge
from hpcmem.gpus.spec import GpuSpec

GIB = 1024**3


@dataclass(frozen=True, kw_only=True)
class HostPhase:
    """Host bytes of one phase: the writing / loading rank (rank 0) and each other rank of its node."""

    name: str
    rank0: tuple[Component, ...]
    other: tuple[Component, ...]

    @property
    def rank0_bytes(self) -> int:
        return sum(c.bytes for c in self.rank0)

    @property
    def other_bytes(self) -> int:
        return sum(c.bytes for c in self.other)


@dataclass(frozen=True, kw_only=True)
class HostEstimate:
    ranks_per_node: int
    phases: tuple[HostPhase, ...]
    workers: Component                   # the node's dataloader worker processes
    offloaded_bytes: int                 # per rank while training: offloaded states + activations
    notes: tuple[str, ...] = ()

    def node_bytes(self, phase: HostPhase) -> int:
        return phase.rank0_bytes + (self.ranks_per_node - 1) * phase.other_bytes + self.workers.bytes

    @property
    def peak_phase(self) -> HostPhase:
        return max(self.phases, key=self.node_bytes)

    @property
    def per_node_bytes(self) -> int:
        return self.node_bytes(self.peak_phase)

    @property
    def per_rank_bytes(self) -> int:
        """The largest single process (rank 0 at its worst phase)."""
        return max(max(p.rank0_bytes, p.other_bytes) for p in self.phases)

    def to_json(self) -> dict:
        peak = self.peak_phase
        return {"per_node_bytes": self.per_node_bytes, "per_rank_bytes": self.per_rank_bytes, "phase": peak.name,
                "ranks_per_node": self.ranks_per_node,
                "rank0_components": {c.name: c.bytes for c in peak.rank0},
                "other_rank_components": {c.name: c.bytes for c in peak.other},
                "dataloader_workers_bytes": self.workers.bytes,
                "phases": {p.name: self.node_bytes(p) for p in self.phases},
                "calibrated": False, "notes": list(self.notes)}


@dataclass(frozen=True, kw_only=True)
class Component:
    """Bytes one GPU holds for one reason. `note` says the formula's inputs in words the user knows."""

    name: str
    bytes: int
    note: str = ""

    def __post_init__(self) -> None:
        # Bytes are counted, never made up by subtraction: a negative part is an estimator bug, stopped here.
        if self.bytes < 0:
            raise ValueError(f"component {self.name!r} has {self.bytes} bytes; every component is ≥ 0")


@dataclass(frozen=True, kw_only=True)
class Phase:
    """The live bytes at the worst instant of one phase of the step: resident components + this phase's own ones."""

    name: str
    components: tuple[Component, ...]

    @cached_property        # frozen: summed once (the allocator rules, the verdict and the planner read it often)
    def bytes(self) -> int:
        return sum(c.bytes for c in self.components)


@dataclass(frozen=True, kw_only=True)
class Estimate:
    model_name: str
    num_params: int
    summary: str
    phases: tuple[Phase, ...]
    reserved_extra_bytes: int           # allocator: reserved − allocated at the peak
    reserved_pool_bytes: int = 0        # of that, FSDP's all-gather stream pool (estimate/fsdp_units.py)
    reserved_spread_bytes: int = 0      # a block reserved may or may not hold (estimate/allocator.py placement_spread)
    reserved_spread_note: str = ""      # which block that is (estimate/allocator.py spread_block)
    reserved_shapes_bytes: int = 0      # varying batch shapes may add this to reserved (estimate/shapes.py)
    reserved_shapes_note: str = ""
    shapes_needed_bytes: int = 0        # of that, what a GPU must hold: the safe bound adds it (estimate/shapes.py)
    device_extra_bytes: int             # CUDA context, libraries, NCCL, vLLM pool outside PyTorch's allocator
    device_note: str
    gpu_name: str | None = None
    gpu_memory_bytes: int | None = None
    host_bytes: int = 0                 # CPU RAM per process for offloaded states / activations
    host: HostEstimate | None = None    # host RAM of the whole job per rank and per node (estimate/host.py)
    warnings: tuple[str, ...] = ()
    # of the warnings, those saying the number is outside where a learned profile was held (learned_range)
    not_held: tuple[str, ...] = ()
    not_modelled: tuple[str, ...] = ()
    calibrated: bool = False
    extra: dict = field(default_factory=dict)
    made: str = "derived"               # how the layers' terms were made: derived formulas, or a learned profile
    gpu: GpuSpec | None = None          # the GPU judged against (capacity, margins); None: no verdict
    assumed: tuple[dict, ...] = ()      # values assumed rather than read (hpcmem.job.assumptions.describe)
    world_size: int = 1                 # processes of the job: a multi-GPU job's verdict takes the multi-GPU margin

    @cached_property        # frozen: found once
    def peak_phase(self) -> Phase:
        return max(self.phases, key=lambda p: p.bytes)

    @property
    def peak_allocated_bytes(self) -> int:
        return self.peak_phase.bytes

    @property
    def peak_reserved_bytes(self) -> int:
        return self.peak_allocated_bytes + self.reserved_extra_bytes

    @property
    def device_peak_bytes(self) -> int:
        return self.peak_reserved_bytes + self.device_extra_bytes

    @cached_property        # frozen: judged once (fits, headroom_bytes and to_json each read it)
    def verdict(self) -> FitVerdict | None:
        """Fits · tight · does not fit, on the safe bound (hpcmem.estimate.verdict); None without a GPU."""
        return None if self.gpu is None else judge(self.device_peak_bytes, self.gpu, self.reserved_spread_bytes,
                                                 world_size=self.world_size, shapes_bytes=self.shapes_needed_bytes)

    @property
    def fits(self) -> bool | None:
        v = self.verdict
        return None if v is None else v.fits

    @property
    def headroom_bytes(self) -> int | None:
        """Usable capacity left above the safe bound."""
        v = self.verdict
        return None if v is None else v.headroom_bytes

    def to_json(self) -> dict:
        """The stable contract scripts and `hpcmem validate` rely on (README, Estimate: `--json`)."""
        peak = self.peak_phase
        verdict = self.verdict
        return {
            "model": {"name": self.model_name, "num_params": self.num_params, "made": self.made},
            "summary": self.summary,
            "per_gpu": {
                "peak_allocated_bytes": self.peak_allocated_bytes,
                "peak_reserved_bytes": self.peak_reserved_bytes,
                "reserved_spread_bytes": self.reserved_spread_bytes,
                "reserved_shapes_bytes": self.reserved_shapes_bytes, "shapes_needed_bytes": self.shapes_needed_bytes,
                "device_peak_bytes": self.device_peak_bytes,
                "phase": peak.name,
                "components": {c.name: c.bytes for c in peak.components},
                "notes": {c.name: c.note for c in peak.components if c.note},
                "host_bytes": self.host_bytes,
                "calibrated": self.calibrated,
            },
            "phases": {p.name: p.bytes for p in self.phases},
            "host": self.host.to_json() if self.host is not None else None,
            "gpu": None if self.gpu_name is None else {"name": self.gpu_name, "memory_bytes": self.gpu_memory_bytes,
                                                       "capacity_bytes": verdict.capacity_bytes if verdict else None},
            "fits": self.fits,
            "verdict": verdict.to_json() if verdict else None,
            "headroom_bytes": self.headroom_bytes,
            "warnings": list(self.warnings),
            "not_held": list(self.not_held),
            "assumed": [dict(a) for a in self.assumed],
            "not_modelled": list(self.not_modelled),
            "layout": self.extra.get("layout"),         # the parallelism_config in force (hpcmem.job.mesh), or null
            **({"vision": self.extra["vision"]} if self.extra.get("vision") else {}),   # hpcmem.estimate.vision
        }
