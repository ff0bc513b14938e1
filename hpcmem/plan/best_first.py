"""Best-first search over knob combinations: the fastest ones that fit, found with few full estimates.

1. Every combination gets a throughput (hpcmem.plan.throughput; microseconds, memoised per distinct setting).
2. Walk them fastest first. A combination is fully estimated (hpcmem.estimate.estimate, the same function as
   `hpcmem estimate`) unless a monotone lower bound already rejects it: within one (sharding, peft, packing) group,
   the tensor floor (`_tensor_floor`: the largest phase's tensors + the device terms outside the allocator, without
   the allocator's slack and spread, which are not monotone) never falls when the micro-batch grows, or activation
   offloading / expandable_segments are turned off, and falls by less than the checkpoint boundaries when
   checkpointing goes full → selective → off (tests/plan/test_plan.py checks the estimator obeys this). So one
   combination that does not fit rejects every combination that dominates it, and the group's floor (smallest batch,
   full checkpointing, offloading and expandable_segments on) rejects the whole group at once.
3. Combinations TRL refuses are skipped: `hpcmem.plan.knobs.apply` builds a JobSpec, whose rules raise SpecError.
4. Stop when `top` plans fit and every combination not yet walked is slower, by more than the throughput model's
   stated uncertainty (THROUGHPUT_UNCERTAINTY in hpcmem.plan.throughput), than the band the top-th plan falls in
   (rank bound: no such combination can be ranked into the top, see below).

Fit is `hpcmem estimate`'s verdict (hpcmem.estimate.verdict): a combination fits when its safe bound — the device
peak plus half its reserved spread, widened by the GPU's calibrated margin — fits the capacity torch can use; "tight"
combinations are not offered.

Order of the plans: speed bands of THROUGHPUT_UNCERTAINTY, most headroom first inside a band
(hpcmem.plan.ranking). Twins — the same job on this hardware, hpcmem.plan.twins — are one plan naming the others.
A headroom floor (`headroom`) drops plans that leave less free.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from typing import Callable, Collection, Iterable, Mapping

from hpcmem.errors import SpecError
from hpcmem.estimate import Estimate, SharedStep, estimate, shared_step
from hpcmem.estimate.host import fixed_node_bytes
from hpcmem.estimate.names import ACTIVATIONS, OPTIMIZER_STEP
from hpcmem.estimate.verdict import safe_bound
from hpcmem.estimate.workspaces import tensor_bytes
from hpcmem.gpus.spec import GpuSpec
from hpcmem.job.jobspec import JobSpec
from hpcmem.plan import sequence_split
from hpcmem.plan.knobs import GC_VALUES, Applier, Knobs, _parallel, axes, job_knobs, space
from hpcmem.plan.order import SpeedTable, fastest_first
from hpcmem.plan.ranking import HeadroomFloor, band_start, rank_plans
from hpcmem.plan.speed import Speeds
from hpcmem.plan.throughput import THROUGHPUT_UNCERTAINTY, Throughput
from hpcmem.plan.twins import twin_key

GIB = 1024**3
_GC_SAVING = {g: i for i, g in enumerate(GC_VALUES)}       # off 0 < selective 1 < full 2 (more saving)


@dataclass(frozen=True, kw_only=True)
class Plan:
    rank: int
    knobs: Knobs
    job: JobSpec
    estimate: Estimate
    speed: Throughput
    equivalents: tuple[Knobs, ...] = ()      # twins: the same job on this hardware (hpcmem.plan.twins)

    @property
    def peak_allocated_bytes(self) -> int:
        return self.estimate.peak_allocated_bytes

    @property
    def device_peak_bytes(self) -> int:
        return self.estimate.device_peak_bytes

    @property
    def safe_device_peak_bytes(self) -> int:
        return self.estimate.verdict.safe_device_peak_bytes

    @property
    def headroom_bytes(self) -> int:
        """Usable capacity left above the safe bound."""
        return self.estimate.headroom_bytes or 0


@dataclass(frozen=True, kw_only=True)
class Verdict:
    """What the search learned about one walked combination."""

    knobs: Knobs
    speed: Throughput
    how: str                    # estimate | bound | rules | host | headroom
    fits: bool
    device_peak_bytes: int | None = None
    spread_bytes: int = 0                       # the estimate's reserved spread (hpcmem.estimate.verdict)
    shapes_bytes: int = 0                       # what varying batch shapes add to the safe bound (estimate/shapes.py)
    why: str = ""
    host_per_node_bytes: int | None = None      # set when host RAM refused it (how == "host")


@dataclass(frozen=True, kw_only=True)
class SearchStats:
    combinations: int           # enumerated; each got a throughput and a verdict (below) or was rank-pruned
    full_estimates: int
    bound_rejected: int
    rule_rejected: int
    rank_pruned: int
    seconds: float

    @property
    def per_second(self) -> float:
        return self.combinations / self.seconds if self.seconds else float("inf")


@dataclass(frozen=True, kw_only=True)
class PlanReport:
    plans: tuple[Plan, ...]
    walked: tuple[Verdict, ...]         # in throughput order, fits or not
    stats: SearchStats
    gpu: GpuSpec
    global_batch_size: int
    base: JobSpec
    speeds: SpeedTable       # Knobs → Throughput, every enumerated combination (worked out on demand)
    fixed: tuple[str, ...] = ()
    host_capacity_bytes: int | None = None      # host RAM a node grants, if known (hpcmem.plan.host_ram)
    host_capacity_source: str = ""              # where that figure comes from (preset, flag, catalog assumption)
    headroom: HeadroomFloor | None = None       # the floor a plan's free memory had to clear
    note: str = ""                              # why nothing was walked (a floor no knob can lower), if so
    least: tuple[Knobs, Estimate] | None = None     # no plan fits: the lowest device peak any full estimate found
    peft_tried: bool = False                    # LoRA was in the search (--allow_peft, or the job's own LoRA)


# Sharding chains, most memory first: each step shards or offloads one more state (ZeRO §5: P_os ⊂ P_os+g ⊂ P_os+g+p;
# offloading moves a GPU state to the host). Checked on the estimator by tests/plan/test_plan.py.
SHARDING_CHAINS = (("zero1", "zero2", "zero2+offload_opt"), ("zero3", "zero3+offload_opt", "zero3+offload_all"),
                   ("fsdp2", "fsdp2+offload"), ("fsdp2+sync", "fsdp2+offload+sync"))
_CHAIN = {name: (i, pos) for i, chain in enumerate(SHARDING_CHAINS) for pos, name in enumerate(chain)}


def _chain_bottom(sharding: str) -> str:
    if sharding not in _CHAIN:
        return sharding
    i, _ = _CHAIN[sharding]
    return SHARDING_CHAINS[i][-1]


def _sharding_geq(hi: str, lo: str) -> bool:
    if hi == lo:
        return True
    a, b = _CHAIN.get(hi), _CHAIN.get(lo)
    return a is not None and b is not None and a[0] == b[0] and a[1] <= b[1]


def _group(k: Knobs) -> tuple:
    """Combinations whose memory the bound compares. Gradient accumulation > 1 keeps gradients across micro-batches
    (estimate/step.py), so accum 1 and > 1 are separate groups."""
    return (_chain_bottom(k.sharding), k.peft, k.pack, k.accum > 1, k.optim)


def _dominates(hi: Knobs, lo: Knobs) -> bool:
    """hi needs at least the memory of lo (same group assumed): a larger micro-batch or expandable_segments off never
    needs less, nor a float32 load than a bfloat16 one (4-byte weights, and under autocast their 16-bit copies,
    against 2-byte ones; DeepSpeed and FSDP2 cast or upcast to the same bytes: equal). Checkpointing orders memory
    only without activation offloading: offloading with checkpointing off moves every saved tensor to the host
    (estimate/activations.py). tests/plan/test_plan.py checks this on the estimator."""
    if hi.dtype != lo.dtype and (hi.dtype, lo.dtype) != ("float32", "bfloat16"):
        return False
    if hi.batch < lo.batch or hi.expandable_segments > lo.expandable_segments or \
            not _sharding_geq(hi.sharding, lo.sharding):
        return False
    if hi.activation_offloading != lo.activation_offloading:
        return False        # offloading with checkpointing on adds staging buffers: no order either way
    if hi.activation_offloading:
        return hi.gc == lo.gc
    return _GC_SAVING[hi.gc] <= _GC_SAVING[lo.gc]


def search(base: JobSpec, gpu: GpuSpec, *, fixed: Collection[str] = (), global_batch_size: int | None = None,
           allow_peft: bool = False, top: int | None = 10,
           exclude: Mapping[str, Collection] | None = None,
           host_memory_per_node_bytes: int | None = None, host_source: str = "",
           headroom: HeadroomFloor | None = None, allow_optim: bool = False) -> PlanReport:
    """Rank the combinations of free knobs that fit `gpu`, fastest first (see the module docstring).

    `top=None` walks every combination (no rank bound): each gets a fit verdict, for the benchmark and tests.
    `host_memory_per_node_bytes`: a combination whose host RAM per node (estimate/host.py) exceeds it does not fit
    either (it is not used as a memory bound: offloading trades GPU bytes for host bytes); `host_source` says where
    that figure comes from. `headroom`: a combination that fits but leaves less free is not offered either.
    `allow_optim`: the optimizer is searched too (hpcmem.plan.knobs.OPTIM_VALUES)."""
    start = time.perf_counter()
    base = replace(base, gpu=gpu) if base.gpu != gpu else base
    own = job_knobs(base)
    gbs = global_batch_size or own.batch * own.accum * base.parallel.layout.data_parallel
    spaces = [space(axes(base, fixed, gbs, allow_peft, exclude, allow_optim))]
    speeds = Speeds(base, gpu)
    par_fields = {name: _parallel_fields(base, name) for name in {h[5] for h in spaces[0].heads}}
    walker = _Walker(base, host_memory_per_node_bytes, headroom, any(t[1] == "bfloat16" for t in spaces[0].tails))
    note = _host_floor_note(base, host_memory_per_node_bytes)
    plans: list[Plan] = []
    walked: list[Verdict] = []
    if not note:        # else no combination can fit the node: do not estimate them one by one
        _walk(fastest_first(spaces, speeds, par_fields), spaces[0].has, walker, top, plans, walked)
    if not note and sequence_split.wanted(plans, fixed):
        # context / sequence parallelism (hpcmem.plan.sequence_split): one more walk over the layouts, ranked together
        names = sequence_split.layout_names(base)
        extra = [space(ax) for ax in sequence_split.batch_axes(axes(base, fixed, gbs, allow_peft, exclude, allow_optim),
                                                                base, fixed, gbs, names)]
        par_fields.update({name: _parallel_fields(base, name) for name in names})
        spaces += extra
        _walk(fastest_first(extra, speeds, par_fields), lambda k: any(sp.has(k) for sp in extra), walker, top, plans,
              walked)
    if not plans and not note:
        walker.lowest([k for sp in spaces for k in sp.knobs()])
    plans = rank_plans(plans)[:top] if top is not None else rank_plans(plans)
    total = sum(sp.size() for sp in spaces)
    stats = SearchStats(combinations=total, full_estimates=walker.full, bound_rejected=walker.bound,
                        rule_rejected=walker.rules, rank_pruned=total - len(walked),
                        seconds=time.perf_counter() - start)
    return PlanReport(plans=tuple(plans), walked=tuple(walked), stats=stats, gpu=gpu, global_batch_size=gbs,
                      base=base, speeds=SpeedTable(speeds, par_fields, spaces), fixed=tuple(sorted(fixed)),
                      host_capacity_bytes=host_memory_per_node_bytes, host_capacity_source=host_source, note=note,
                      headroom=headroom,
                      least=None if plans else walker.least, peft_tried=allow_peft or base.train.use_peft)


def _walk(scored: Iterable[tuple[Throughput, Knobs]], in_walk: Callable[[Knobs], bool], walker: "_Walker",
          top: int | None, plans: list[Plan], walked: list[Verdict]) -> None:
    """Walk `scored` (fastest first), appending what fits to `plans` and every verdict to `walked` (module docstring,
    steps 2–4). `in_walk`: whether a combination is one `scored` holds."""
    accepted = {p.knobs for p in plans}
    twins = {twin_key(p.knobs, p.estimate, p.speed): i for i, p in enumerate(plans)}
    own = job_knobs(walker.base)
    start = len(plans)
    for speed, k in scored:
        fresh = plans[start:]
        if top is not None and len(fresh) >= top and \
                speed.tokens_per_s_per_gpu < (1 - THROUGHPUT_UNCERTAINTY) * band_start(fresh, top - 1):
            break       # every plan left is slower than the band the top-th plan ranks in: nothing can move up
        twin = k._replace(expandable_segments=True)
        if not k.expandable_segments and in_walk(twin):
            walker.judge(twin, speed)       # same speed, less memory: if it does not fit, neither does k (bound)
        v, job, est = walker.judge(k, speed)
        walked.append(v)
        if v.fits:
            accepted.add(k)
            if k.expandable_segments and k._replace(expandable_segments=False) in accepted:
                continue        # same speed, one more setting: not worth a row
            key = twin_key(k, est, speed)
            if key in twins:        # the same job on this hardware: one row, the twin closest to the user's job
                i = twins[key]
                old = plans[i]
                if _closeness(k, own) > _closeness(old.knobs, own):
                    plans[i] = Plan(rank=old.rank, knobs=k, job=job, estimate=est, speed=speed,
                                    equivalents=(*old.equivalents, old.knobs))
                else:
                    plans[i] = replace(old, equivalents=(*old.equivalents, k))
                continue
            twins[key] = len(plans)
            plans.append(Plan(rank=len(plans) + 1, knobs=k, job=job, estimate=est, speed=speed))


def _closeness(k: Knobs, own: Knobs) -> int:
    """How many of the twin axes (load dtype, sharding, optimizer) keep the job's own value: of twins, the plan shown
    changes least of what the user wrote (a bfloat16 load stays one)."""
    return (k.dtype == own.dtype) + (k.sharding == own.sharding) + (k.optim == own.optim)


def _host_floor_note(base: JobSpec, capacity: int | None) -> str:
    """Why nothing can fit a node's host RAM whatever the knobs (baseline per rank + dataloader workers), or ""."""
    if capacity is None:
        return ""

    host = estimate(base).host
    floor = fixed_node_bytes(host) if host is not None else 0
    if floor <= capacity:
        return ""
    return (f"host RAM per node is at least {floor / GIB:.1f} GiB whatever the memory techniques (process baselines "
            f"of {host.ranks_per_node} rank(s) + {host.workers.note}) > {capacity / GIB:.1f} GiB: lower "
            "dataloader_num_workers or use fewer GPUs per node")


def _parallel_fields(base: JobSpec, sharding: str) -> dict:
    p = _parallel(base.parallel, sharding)
    return {f: getattr(p, f) for f in ("distributed_type", "zero_stage", "offload_optimizer_device",
                                       "offload_param_device", "fsdp_offload_params", "cp_size", "sp_size")}


def _states_floor(est: Estimate) -> int:
    """A lower bound on the device peak of every combination with the same sharding, PEFT and load dtype: the optimizer-step phase
    (weights, gradients, optimizer states; estimate/step.py) plus the device terms outside the allocator do not depend
    on checkpointing, offloading of activations, packing or the micro-batch; the allocator slack is ≥ 0."""
    step = next((p.bytes for p in est.phases if p.name == OPTIMIZER_STEP), 0)
    return step + est.device_extra_bytes


def _tensor_floor(est: Estimate) -> tuple[int, int]:
    """(floor, held): the domination bound of one estimate. floor = the largest phase's tensor bytes
    (hpcmem.estimate.workspaces.tensor_bytes: without the cuBLAS workspaces, whose count checkpointing changes by a
    thread's, and the block tails) + the device terms outside the allocator. The allocator slack (≥ 0) and the
    reserved spread are left out: their terms come and go with the knobs (Reward, Gemma-3-1B, 1,024 tokens,
    accumulation: 2 × 4 is estimated 541 MiB below 1 × 8 because `beside` drops to 0 once the layer block passes the
    largest weight; the spread appears with full checkpointing and not with selective). held = that phase's
    checkpoint boundaries (its "activations" under checkpointing): at a layer's backward, checkpointing holds every
    layer's input and the recomputed layer, the same job without it holds the layers' saved tensors — at short
    sequences up to a boundary more than those (Phi-3-mini, 8 × 128 packed: full 13 MiB over off at layer 0), so
    across checkpointing settings only floor − held bounds the other."""
    phase = max(est.phases, key=tensor_bytes)
    held = sum(c.bytes for c in phase.components if c.name == ACTIVATIONS)
    return tensor_bytes(phase) + est.device_extra_bytes, held


class _Walker:
    """Decides fit for combinations: monotone bound first, then rules + the full estimate."""

    def __init__(self, base: JobSpec, host_capacity: int | None = None,
                 headroom: HeadroomFloor | None = None, bf16_searched: bool = False) -> None:
        self.base = base
        self.apply = Applier(base)
        self.bf16_searched = bf16_searched          # the dtype axis holds bfloat16: its floors bound float32's
        self.host_capacity = host_capacity
        self.infeasible: dict[tuple, list[tuple[Knobs, int, int]]] = {}
        self.floors: set[tuple] = set()
        self.full = self.bound = self.rules = 0
        self.refused: dict[Knobs, str] = {}
        self.states_floor: dict[tuple[str, str], int] = {}
        self.judged: dict[Knobs, tuple] = {}
        self.steps: dict[Knobs, SharedStep] = {}      # by the knobs less expandable_segments
        self.least: tuple[Knobs, Estimate] | None = None    # the lowest device peak estimated that does not fit
        self.gpu = base.gpu
        self.memory = base.gpu.usable_bytes if base.gpu else 0
        self.floor_bytes = headroom.bytes_for(self.memory) if headroom else 0

    def _estimate(self, k: Knobs) -> tuple[JobSpec | None, Estimate | None, str]:
        # check_job does not read expandable_segments (an allocator setting): one verdict serves both values.
        rule_key = k._replace(expandable_segments=False)
        if rule_key in self.refused:
            return None, None, self.refused[rule_key]
        try:
            job = self.apply(k)
            self.full += 1
            # SpecError too: a learned profile without this precision/technique's cell. The step's phases do not
            # depend on expandable_segments: the twin's are reused (hpcmem.estimate.SharedStep)
            shared = self.steps.get(rule_key)
            if shared is None:
                shared = self.steps[rule_key] = shared_step(job)
            est = estimate(job, shared)
        except SpecError as exc:
            self.refused[rule_key] = exc.problems[0]
            return None, None, exc.problems[0]
        self.states_floor.setdefault((k.sharding, k.peft, k.dtype, k.optim), _states_floor(est))
        if not est.fits and (self.least is None or est.device_peak_bytes < self.least[1].device_peak_bytes):
            self.least = (k, est)
        return job, est, ""

    def lowest(self, combos: Collection[Knobs]) -> None:
        """Nothing fits: estimate the combinations that need the least of their kind, so that `least` names one of
        them and not merely the first the walk estimated (a states bound can rule out every other combination after
        one estimate of the fastest, largest micro-batch). Per sharding, PEFT, packing and activation offloading: the
        smallest micro-batch (the rest of the per-GPU batch accumulated), expandable segments when offered, full
        checkpointing unless activations are offloaded (no order between checkpointing settings then: `_dominates`)."""
        smallest: dict[tuple, int] = {}
        for k in combos:
            key = (k.sharding, k.peft, k.pack, k.activation_offloading, k.dtype, k.optim)
            smallest[key] = min(smallest.get(key, k.batch), k.batch)
        expandable = any(k.expandable_segments for k in combos)
        most_gc = max((k.gc for k in combos), key=_GC_SAVING.__getitem__, default="off")
        for k in combos:
            if k.batch == smallest[(k.sharding, k.peft, k.pack, k.activation_offloading, k.dtype, k.optim)] and \
                    k.expandable_segments == expandable and (k.activation_offloading or k.gc == most_gc):
                self._estimate(k)

    def _record(self, k: Knobs, est: Estimate) -> None:
        """Keep k as a bound for what dominates it when its tensor floor, widened by the margin, is over the
        capacity (`_tensor_floor`; the safe bound's spread and the allocator slack are left out: they are not
        monotone in the knobs)."""
        floor, held = _tensor_floor(est)
        need = safe_bound(floor, self.gpu)
        if need > self.memory:
            self.infeasible.setdefault(_group(k), []).append((k, need, safe_bound(floor - held, self.gpu)))

    def _floor(self, k: Knobs) -> None:
        """Estimate the least-memory member of k's part of its group once: if it does not fit, none does. A float32
        load is bounded by the bfloat16 load's floor first, when the search has that dtype (`_dominates`)."""
        if k.dtype == "float32" and self.bf16_searched:
            self._floor_of(k._replace(dtype="bfloat16"))
            if self._bounded(k):
                return
        self._floor_of(k)

    def _floor_of(self, k: Knobs) -> None:
        key = (_group(k), k.sharding, k.activation_offloading, k.gc if k.activation_offloading else "", k.dtype)
        if key in self.floors:
            return
        self.floors.add(key)
        per_gpu = k.batch * k.accum
        floor = k._replace(batch=1 if k.accum > 1 else k.batch, accum=per_gpu if k.accum > 1 else k.accum,
                           gc=k.gc if k.activation_offloading else "full", expandable_segments=True)
        _, est, _ = self._estimate(floor)
        if est is not None and not est.fits:
            self._record(floor, est)

    def _bounded(self, k: Knobs) -> str:
        """Why a bound rules k out without its own estimate, or ""."""
        floor = max(self.states_floor.get((k.sharding, k.peft, d, k.optim), 0)
                    for d in {k.dtype, "bfloat16" if k.dtype == "float32" else k.dtype})   # `_dominates`' dtype order
        if floor and safe_bound(floor, self.gpu) > self.memory:
            return (f"safe bound ≥ {safe_bound(floor, self.gpu) / GIB:.1f} GiB at the optimizer step alone "
                    f"({k.sharding}, {k.peft}, {k.dtype} load)")
        for lo, need, other_gc in self.infeasible.get(_group(k), ()):
            if k.gc != lo.gc:
                need = other_gc
            if need > self.memory and _dominates(k, lo):
                return f"safe bound ≥ {need / GIB:.1f} GiB (as {lo.label()})"
        return ""

    def _bound(self, k: Knobs, speed: Throughput) -> Verdict | None:
        why = self._bounded(k)
        if not why:
            return None
        self.bound += 1
        return Verdict(knobs=k, speed=speed, how="bound", fits=False, device_peak_bytes=None, why=why)

    def judge(self, k: Knobs, speed: Throughput) -> tuple[Verdict, JobSpec | None, Estimate | None]:
        """The verdict on k, memoised (the walk may ask for a combination ahead of its turn)."""
        if k not in self.judged:
            self.judged[k] = self._judge(k, speed)
        return self.judged[k]

    def _judge(self, k: Knobs, speed: Throughput) -> tuple[Verdict, JobSpec | None, Estimate | None]:
        v = self._bound(k, speed)
        if v is None:
            self._floor(k)
            v = self._bound(k, speed)
        if v is not None:
            return v, None, None
        job, est, problem = self._estimate(k)
        if est is None:
            self.rules += 1
            return Verdict(knobs=k, speed=speed, how="rules", fits=False, why=problem), None, None
        if not est.fits:
            self._record(k, est)
            return Verdict(knobs=k, speed=speed, how="estimate", fits=False, device_peak_bytes=est.device_peak_bytes,
                           spread_bytes=est.reserved_spread_bytes, shapes_bytes=est.shapes_needed_bytes,
                           why=not_fitting(est)), job, est
        if self.host_capacity is not None and est.host is not None and est.host.per_node_bytes > self.host_capacity:
            return Verdict(knobs=k, speed=speed, how="host", fits=False, device_peak_bytes=est.device_peak_bytes,
                           spread_bytes=est.reserved_spread_bytes,
                           shapes_bytes=est.shapes_needed_bytes, host_per_node_bytes=est.host.per_node_bytes,
                           why=f"host RAM {est.host.per_node_bytes / GIB:.1f} GiB per node at "
                               f"{est.host.peak_phase.name} > {self.host_capacity / GIB:.1f} GiB"), job, est
        if (est.headroom_bytes or 0) < self.floor_bytes:
            return Verdict(knobs=k, speed=speed, how="headroom", fits=False, device_peak_bytes=est.device_peak_bytes,
                           spread_bytes=est.reserved_spread_bytes, shapes_bytes=est.shapes_needed_bytes,
                           why=f"leaves {(est.headroom_bytes or 0) / GIB:.1f} GiB free < the floor "
                               f"{self.floor_bytes / GIB:.1f} GiB"), job, est
        return Verdict(knobs=k, speed=speed, how="estimate", fits=True, device_peak_bytes=est.device_peak_bytes,
                       spread_bytes=est.reserved_spread_bytes, shapes_bytes=est.shapes_needed_bytes), job, est


def not_fitting(est: Estimate) -> str:
    """Why an estimate is not offered, in numbers: the point estimate or, when tight, its safe bound."""
    v = est.verdict
    if v.device_peak_bytes > v.capacity_bytes:
        return f"needs {v.device_peak_bytes / GIB:.1f} GiB > {v.capacity_bytes / GIB:.1f} GiB usable"
    return (f"tight: safe bound {v.safe_device_peak_bytes / GIB:.1f} GiB > {v.capacity_bytes / GIB:.1f} GiB usable "
            f"(device peak {v.device_peak_bytes / GIB:.1f} GiB)")


def plan(job: JobSpec, gpu: GpuSpec, *, fixed: Collection[str] = (), global_batch_size: int | None = None,
         allow_peft: bool = False, top: int = 10, exclude: Mapping[str, Collection] | None = None,
         host_memory_per_node_bytes: int | None = None, headroom: HeadroomFloor | None = None) -> list[Plan]:
    """The `top` fastest combinations that fit, best first (for `hpcmem submit --plan` and the refusal's fixes)."""
    return list(search(job, gpu, fixed=fixed, global_batch_size=global_batch_size, allow_peft=allow_peft,
                       top=top, exclude=exclude, host_memory_per_node_bytes=host_memory_per_node_bytes,
                       headroom=headroom).plans)
