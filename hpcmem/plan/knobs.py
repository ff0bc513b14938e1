"""The knobs the planner turns, the values each may take, and how one combination becomes a JobSpec.

A flag the user gave is fixed (its axis holds the job's own value); every other knob is searched. Turning knobs into
a JobSpec goes through the spec constructors, so TRL's rules (hpcmem.job.rules.check_job) prune invalid combinations —
the planner holds no copy of them.
"""

from __future__ import annotations

from dataclasses import replace
from functools import lru_cache
from itertools import product
from typing import Collection, Mapping, NamedTuple

from hpcmem.errors import SpecError
from hpcmem.job.jobspec import JobSpec
from hpcmem.job.lora_task_rules import planned_task_type
from hpcmem.job.spec import ParallelSpec, TrainSpec
from hpcmem.plan.fixed import MAX_SEARCHED_BATCH, _divisors, axis_fixed
from hpcmem.plan.sequence_split import layout_fields, split, train_changes
from hpcmem.plan.sync_batch import FSDP_BASES, SYNC, base, is_sync, own_sharding, sync_changes

GC_VALUES = ("off", "selective", "full")
PACK_VALUES = ("padded", "packing", "padding_free")
PEFT_VALUES = ("none", "lora", "qlora")
# The load dtype (TRL's ModelConfig.dtype, handed to from_pretrained): float32 is TRL's default, bfloat16 halves the
# weights, gradients and AdamW states (torch/optim/adamw.py keeps the states in the parameter dtype).
DTYPE_VALUES = ("float32", "bfloat16")
# The optimizer (TrainingArguments.optim), searched only when allowed (it changes the update's numerics): TRL's default
# fused AdamW, or bitsandbytes' 8-bit AdamW — 1 byte per state + a block-wise fp32 scale (Dettmers et al. 2022,
# "8-bit Optimizers via Block-wise Quantization"; hpcmem.estimate.states models both).
OPTIM_VALUES = ("adamw_torch_fused", "adamw_8bit")
# name → ParallelSpec fields (accelerate's names); "ddp" is NO on one GPU, MULTI_GPU on more.
SHARDINGS: dict[str, dict] = {
    "ddp": {},
    "zero1": {"distributed_type": "DEEPSPEED", "zero_stage": 1},
    "zero2": {"distributed_type": "DEEPSPEED", "zero_stage": 2},
    "zero2+offload_opt": {"distributed_type": "DEEPSPEED", "zero_stage": 2, "offload_optimizer_device": "cpu"},
    "zero3": {"distributed_type": "DEEPSPEED", "zero_stage": 3},
    "zero3+offload_opt": {"distributed_type": "DEEPSPEED", "zero_stage": 3, "offload_optimizer_device": "cpu"},
    "zero3+offload_all": {"distributed_type": "DEEPSPEED", "zero_stage": 3, "offload_optimizer_device": "cpu",
                          "offload_param_device": "cpu"},
    "fsdp2": {"distributed_type": "FSDP", "fsdp_version": 2},
    "fsdp2+offload": {"distributed_type": "FSDP", "fsdp_version": 2, "fsdp_offload_params": True},
}
# the same layouts with accelerator_config's sync_each_batch (hpcmem.plan.sync_batch)
SHARDINGS.update({name + SYNC: SHARDINGS[name] for name in FSDP_BASES})
GIVEN = "given"          # axis value meaning "the job's own setting" (a fixed flag outside the named choices)


class Knobs(NamedTuple):
    """One combination. A tuple (hashable, cheap): the planner evaluates tens of thousands per second."""

    gc: str
    activation_offloading: bool
    pack: str
    batch: int                  # per_device_train_batch_size
    accum: int                  # gradient_accumulation_steps
    sharding: str
    peft: str
    expandable_segments: bool
    dtype: str = "float32"      # the load dtype (ModelConfig.dtype)
    optim: str = "adamw_torch_fused"       # TrainingArguments.optim

    def techniques(self) -> int:
        """How many memory techniques are on (ties in speed go to fewer); a bfloat16 load counts as one."""
        return self.speed_techniques() + self.other_techniques()

    def speed_techniques(self) -> int:
        """The techniques among the first seven fields (those the throughput model reads: hpcmem.plan.speed)."""
        return ((self.gc != "off") + self.activation_offloading + (self.sharding not in ("ddp", GIVEN)) +
                (self.peft not in ("none", GIVEN)))

    def other_techniques(self) -> int:
        """The techniques among the fields after them (allocator setting, load dtype, optimizer)."""
        return self.expandable_segments + (self.dtype == "bfloat16") + (self.optim == "adamw_8bit")

    def label(self, one_process: bool = False) -> str:
        """Short text of the knobs; `one_process`: "ddp" is left out (one process runs no data parallelism)."""
        bits = [f"b{self.batch}×ga{self.accum}", f"GC {self.gc}"]
        if self.dtype != "float32":
            bits.append("bf16-load" if self.dtype == "bfloat16" else f"load {self.dtype}")
        if self.activation_offloading:
            bits.append("act-offload")
        if self.pack != "padded":
            bits.append(self.pack)
        if not (one_process and self.sharding == "ddp"):
            bits.append(self.sharding)
        if self.peft != "none":
            bits.append(self.peft)
        if self.expandable_segments:
            bits.append("expandable")
        if self.optim != "adamw_torch_fused":
            bits.append(self.optim)
        return " ".join(bits)


def job_knobs(job: JobSpec) -> Knobs:
    """The knobs a job already has (the fixed axes take these)."""
    t, par = job.train, job.parallel
    gc = "off" if not t.gradient_checkpointing else ("selective" if t.selective_checkpointing else "full")
    pack = "packing" if t.packing else ("padding_free" if t.padding_free else "padded")
    peft = ("qlora" if t.load_in_4bit else "lora") if t.use_peft and not t.load_in_8bit else \
        ("none" if not t.use_peft else GIVEN)
    sharding = next((k for k in SHARDINGS if not is_sync(k) and _parallel(par, k) == par), GIVEN)
    return Knobs(gc, t.activation_offloading, pack, t.per_device_train_batch_size, t.gradient_accumulation_steps,
                 own_sharding(sharding, t), peft, job.expandable_segments, t.dtype, t.optim)




def axes(job: JobSpec, fixed: Collection[str], global_batch_size: int, allow_peft: bool,
         exclude: Mapping[str, Collection] | None = None, allow_optim: bool = False) -> dict[str, list]:
    """The values each knob may take. Batch and accumulation are tied: batch × accum × world = global batch.
    `exclude` removes values from a free axis (e.g. {"pack": ["packing"]}: do not change what a batch holds); the
    job's own value always stays. `allow_optim`: the optimizer is searched too (OPTIM_VALUES)."""
    own = job_knobs(job)
    world = job.parallel.layout.data_parallel       # ranks training different batches (world / (tp·cp·sp))
    if global_batch_size < world or global_batch_size % world:
        raise SpecError(f"global_batch_size {global_batch_size} is not a positive multiple of the {world} "
                        "data-parallel ranks (num_processes / (cp × sp × tp))")
    per_gpu = global_batch_size // world

    def axis(name: str, values) -> list:
        if axis_fixed(name, fixed):
            return [getattr(own, name)]
        drop = set((exclude or {}).get(name, ())) - {getattr(own, name)}
        return [v for v in values if v not in drop]

    own_batch = [own.batch] if per_gpu % own.batch == 0 and own.batch > MAX_SEARCHED_BATCH else []
    batches = axis("batch", _divisors(per_gpu) + own_batch)
    if "gradient_accumulation_steps" in fixed:
        batches = [b for b in batches if b * own.accum == per_gpu]
    batches = [b for b in batches if per_gpu % b == 0]
    if not batches:
        given = " × ".join(f"{name} {value}" for name, value, axis_name in
                           (("per_device_train_batch_size", own.batch, "batch"),
                            ("gradient_accumulation_steps", own.accum, "accum"))
                           if axis_fixed(axis_name, fixed))
        raise SpecError(f"global_batch_size {global_batch_size} is {per_gpu} rows per data-parallel rank "
                        f"({world} ranks), which {given} (given) cannot make: batch × accumulation × ranks must equal "
                        "it exactly")
    return {
        "gc": axis("gc", GC_VALUES),
        "activation_offloading": axis("activation_offloading", (False, True)),
        "pack": axis("pack", PACK_VALUES),
        "batch": batches,
        "sharding": _shardings(axis("sharding", SHARDINGS), own.sharding, fixed, world),
        # without allow_peft the job keeps its own choice (full or LoRA): PEFT changes what is trained
        "peft": axis("peft", PEFT_VALUES) if allow_peft else [own.peft],
        # an allocator setting in the job's environment fixes it: the job runs what the variable says
        "expandable_segments": [own.expandable_segments] if job.env.allocator_value is not None
        else axis("expandable_segments", (False, True)),
        "dtype": axis("dtype", (own.dtype, *(d for d in DTYPE_VALUES if d != own.dtype))),   # the job's own first
        "optim": axis("optim", (own.optim, *(o for o in OPTIM_VALUES if o != own.optim))) if allow_optim
        else [own.optim],
        "_per_gpu": [per_gpu],
    }


def _shardings(names: list[str], own: str, fixed: Collection[str], world: int) -> list[str]:
    """The sharding axis with FSDP's sync_each_batch (hpcmem.plan.sync_batch): an accelerator_config the user gave
    keeps its choice; a fixed FSDP layout still weighs the two, since sync_each_batch is not a layout flag; over one
    data-parallel rank there is nothing to reduce-scatter, so only the job's own."""
    if world <= 1:
        return [s for s in names if not is_sync(s) or s == own]
    if "accelerator_config" in fixed:
        return [s for s in names if base(s) not in FSDP_BASES or is_sync(s) == is_sync(own)]
    if names == [own] and base(own) in FSDP_BASES:
        return [base(own), base(own) + SYNC]
    return names


class Space:
    """The combinations of one set of axes, as a product: `heads` (Knobs' first seven fields, those the throughput
    model reads) × `tails` (the other three), enumerated head by head."""

    __slots__ = ("heads", "tails", "_head_set")

    def __init__(self, heads: tuple[tuple, ...], tails: tuple[tuple, ...]) -> None:
        self.heads, self.tails = heads, tails
        self._head_set = frozenset(heads)

    def size(self) -> int:
        return len(self.heads) * len(self.tails)

    def knobs(self) -> list[Knobs]:
        # tuple.__new__ builds the NamedTuple from its fields in field order without the generated __new__'s Python
        # frame (half the time; the planner enumerates tens of thousands)
        new = tuple.__new__
        return [new(Knobs, h + t) for h in self.heads for t in self.tails]

    def has(self, k: tuple) -> bool:
        return k[:7] in self._head_set and k[7:] in self.tails


def space(ax: dict[str, list]) -> Space:
    per_gpu = ax["_per_gpu"][0]
    batches = [(b, max(1, per_gpu // b)) for b in ax["batch"]]
    # "+sync" with one micro-batch a window is its base sharding's job (hpcmem.plan.sync_batch): not searched twice
    heads = tuple((gc, off, pack, b, accum, sh, peft) for gc, off, pack, (b, accum), sh, peft in
                  product(ax["gc"], ax["activation_offloading"], ax["pack"], batches, ax["sharding"], ax["peft"])
                  if accum > 1 or not is_sync(sh))
    tails = tuple(product(ax["expandable_segments"], ax.get("dtype", [GIVEN]), ax.get("optim", [GIVEN])))
    return Space(heads, tails)


def combinations(ax: dict[str, list]) -> list[Knobs]:
    return space(ax).knobs()


@lru_cache(maxsize=256)
def _parallel(par: ParallelSpec, sharding: str) -> ParallelSpec:
    if sharding == GIVEN:
        return par
    plain = {"distributed_type": "MULTI_GPU" if par.world_size > 1 else "NO"}
    data_parallel, _, _ = split(sharding)           # fsdp2+cp4: FSDP2's fields + the layout's (hpcmem.plan.sequence_split)
    return ParallelSpec(num_processes=par.num_processes, num_machines=par.num_machines,
                        **{**plain, **SHARDINGS[data_parallel], **layout_fields(sharding, par.world_size)})


def apply(job: JobSpec, k: Knobs) -> JobSpec:
    """The JobSpec for a combination; raises SpecError where TRL's rules (hpcmem.job.rules) refuse it."""
    return Applier(job)(k)


class Applier:
    """`apply` for many combinations of one job: the TrainSpec of a combination depends on fewer knobs than the
    JobSpec (not the allocator setting, not the sharding beyond the padding a sequence split asks), so each distinct
    one is built once — a search builds tens of TrainSpecs for hundreds of JobSpecs. TRL's rules still run on every
    JobSpec (its constructor)."""

    def __init__(self, job: JobSpec) -> None:
        self.job = job
        self.trains: dict[tuple, TrainSpec] = {}
        self.sharding_changes: dict[tuple[str, bool], dict] = {}

    def train(self, k: Knobs) -> TrainSpec:
        changes = self.sharding_changes.get((k.sharding, k.accum > 1))
        if changes is None:
            changes = self.sharding_changes[(k.sharding, k.accum > 1)] = {
                **train_changes(self.job, k.sharding), **sync_changes(self.job.train, k.sharding, k.accum)}
        key = (k.gc, k.activation_offloading, k.pack, k.batch, k.accum, k.peft, k.dtype, k.optim,
               repr(sorted(changes.items())))
        train = self.trains.get(key)
        if train is None:
            train = self.trains[key] = _train(self.job.train, k, changes)
        return train

    def __call__(self, k: Knobs) -> JobSpec:
        job = self.job
        train = self.train(k)
        par = _parallel(job.parallel, k.sharding)
        if par.sp_size > 1 and k.sharding != GIVEN:
            par = replace(par, sp_attn_implementation=train.attn_implementation)   # Ulysses wraps the model's kernel
        # replace keeps what no knob changes (the teacher, the job's environment, the length profile's tokens)
        return replace(job, train=train, parallel=par, expandable_segments=k.expandable_segments)


def _train(t: TrainSpec, k: Knobs, sharding_changes: dict) -> TrainSpec:
    """The job's TrainSpec with a combination's knobs (and what its sharding's layout asks of the TRL config)."""
    gc_kwargs = {k2: v for k2, v in t.gradient_checkpointing_kwargs.items() if k2 != "selective"}
    if k.gc == "selective":
        gc_kwargs["selective"] = True
    changes = dict(gradient_checkpointing=k.gc != "off", gradient_checkpointing_kwargs=gc_kwargs,
                   activation_offloading=k.activation_offloading, packing=k.pack == "packing",
                   padding_free=k.pack == "padding_free", per_device_train_batch_size=k.batch,
                   gradient_accumulation_steps=k.accum)
    if k.pack == "packing" and not t.packing:
        changes["packing_strategy"] = "bfd"
    if k.dtype != GIVEN:
        changes["dtype"] = k.dtype
    if k.optim != GIVEN:
        changes["optim"] = k.optim
    if k.peft != GIVEN:
        changes.update(use_peft=k.peft != "none", load_in_4bit=k.peft == "qlora", load_in_8bit=False)
        if k.peft != "none" and not t.use_peft:
            changes["lora_task_type"] = planned_task_type(t.trainer)   # a reward model's LoRA runs as SEQ_CLS only
    changes.update(sharding_changes)
    return replace(t, **changes)
