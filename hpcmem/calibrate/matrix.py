"""The campaign's cases for one preset's GPU, made from the GPU kit's own case generation (stdlib + the estimator).

Four families, every case a hpcmem.probe.matrix.Case (one probe run) plus how many GPUs and nodes it takes:
  kit       the kit's representative matrix (hpcmem.probe.matrix.CASES): trainers SFT/DPO/Reward/GRPO/RLOO, full/LoRA/
            QLoRA, GC off/full/selective, packing, expandable segments, activation offloading; kept when predicted
            below OVER (the rest would only run out of memory, said so)
  sized     SWEEP_MODELS × SWEEP_TECHNIQUES (and DPO/Reward on the small models), each sized by the kit's boundary
            sizing (hpcmem.probe.boundary.size_for: batch, then max_length) to one of SPAN, so the predicted peaks
            span ~20–95 % of the GPU's usable capacity
  boundary  the kit's OOM-boundary sweep (hpcmem.probe.boundary.sweep): 88–105 % of capacity, Latin-square order
  multi     DDP, ZeRO-1/2/3 (ZeRO-2/3 also with CPU offload) and FSDP2 on 2 GPUs and on every GPU of a node, and one
            ZeRO-3 run on 2 nodes when the preset allows 2 nodes; sized to MULTI_TARGET of each GPU; recorded per rank
  long      context / sequence parallelism and HSDP on one node of 8 GPUs, as written (hpcmem.calibrate.long_context)
`tiny` (CPU rehearsals: `--device cpu --tiny`) shrinks every model as the kit does (hpcmem.probe.matrix.tiny_config)
and sizes against the kit's simulated capacity (TINY_CAPACITY bytes of tracked tensors).
"""

from __future__ import annotations

import dataclasses
import fnmatch
from pathlib import Path
from typing import Any, Callable

from hpcmem.calibrate import long_context
from hpcmem.calibrate.case import CampaignCase
from hpcmem.errors import HpcmemError
from hpcmem.estimate import estimate
from hpcmem.estimate.workspaces import tensor_bytes
from hpcmem.gpus.spec import GpuSpec
from hpcmem.job.lora_task_rules import planned_task_type
from hpcmem.job.trainers import entry
from hpcmem.job.trl_config import accelerate_settings, build_job
from hpcmem.probe import boundary
from hpcmem.probe.fixtures import hf_config
from hpcmem.probe.matrix import CASES, TINY_LENGTHS, Case, tiny_config

SPAN = (0.2, 0.35, 0.5, 0.65, 0.8, 0.95)
OVER = 1.05
MULTI_TARGET = 0.6
TINY_CAPACITY = 24 * 1024**2            # the GPU kit's simulated device in --tiny runs (hpcmem.lab.kit)
NOGC = {"dtype": "bfloat16", "gradient_checkpointing": False}
BF16 = {"dtype": "bfloat16"}
SWEEP_MODELS = {"q05": "Qwen/Qwen2.5-0.5B", "l1b": "meta-llama/Llama-3.2-1B", "l3b": "meta-llama/Llama-3.2-3B",
                "l8b": "meta-llama/Llama-3.1-8B"}
SWEEP_TECHNIQUES: dict[str, dict[str, Any]] = {
    "full+gc": dict(BF16), "full+nogc": dict(NOGC), "full+sac": {**BF16, "gradient_checkpointing_kwargs":
                                                                 {"selective": True}},
    "lora+gc": {**BF16, "use_peft": True}, "lora+nogc": {**NOGC, "use_peft": True},
    "full+gc+pack": {**BF16, "packing": True}, "full+gc+offload": {**BF16, "activation_offloading": True},
    "full+gc+expandable": {**BF16, "expandable_segments": True},
}
PREFERENCE = (("dpo", "q05"), ("dpo", "l1b"), ("reward", "q05"), ("reward", "l1b"))
LAYOUTS: dict[str, dict[str, Any]] = {
    "ddp": {"accelerate_config": "multi_gpu"}, "zero1": {"accelerate_config": "zero1"},
    "zero2": {"accelerate_config": "zero2"}, "zero2+offload": {"accelerate_config": "zero2",
                                                               "offload_optimizer_device": "cpu"},
    "zero3": {"accelerate_config": "zero3"}, "zero3+offload": {"accelerate_config": "zero3",
                                                               "offload_optimizer_device": "cpu",
                                                               "offload_param_device": "cpu"},
    "fsdp2": {"accelerate_config": "fsdp2"},
}
MULTI_MODEL = "l1b"



def plan_cases(gpu: GpuSpec, *, gpus_per_node: int, max_nodes: int | None, tiny: bool = False,
               models_dir: Path | None = None, extra: list[CampaignCase] = (), only: str | None = None
               ) -> tuple[list[CampaignCase], list[str]]:
    """Every case of the campaign for `gpu` (each predicted), and a note per case left out and why."""
    resolve = _resolver(tiny, models_dir)
    capacity = TINY_CAPACITY if tiny else gpu.usable_bytes
    peak = "tensors" if tiny else "device"
    sized_gpu = dataclasses.replace(gpu, capacity_bytes=capacity)
    notes: list[str] = []
    patterns = [p.strip() for p in (only or "*").split(",") if p.strip()]

    def wanted(name: str) -> bool:          # checked before a case is sized: --only makes small campaigns cheap
        return any(fnmatch.fnmatchcase(name, p) for p in patterns)

    cases = (_kit(sized_gpu, resolve, peak, tiny, notes, wanted)
             + _sized(sized_gpu, resolve, peak, tiny, notes, wanted)
             + _boundary(sized_gpu, resolve, peak, tiny, wanted)
             + _multi(sized_gpu, resolve, peak, tiny, gpus_per_node, max_nodes, notes, wanted)
             + long_context.cases(sized_gpu, resolve, peak, tiny, gpus_per_node, notes, wanted, _predicted)
             + [_predicted(c, sized_gpu, resolve, peak) for c in extra if wanted(c.name)])
    names = [c.name for c in cases]
    if only is not None and not cases:
        raise HpcmemError(f"--only {only!r} matches no case of this campaign; `hpcmem calibrate --preset NAME "
                          "--dry-run` lists them all")
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise HpcmemError(f"campaign case names must be unique; repeated: {', '.join(dupes)}")
    return cases, notes


def _resolver(tiny: bool, models_dir: Path | None) -> Callable[[str], str]:
    """What a probe loads for a catalog model: itself, or its tiny config written under `models_dir`."""
    cache: dict[str, str] = {}

    def resolve(model: str) -> str:
        if not tiny or Path(model).exists():
            return model
        if model not in cache:
            assert models_dir is not None, "tiny campaigns write their shrunk configs into the campaign folder"
            models_dir.mkdir(parents=True, exist_ok=True)
            cache[model] = str(Path(tiny_config(model, models_dir)).resolve())
        return cache[model]

    return resolve


def job_settings(case: Case) -> dict[str, Any]:
    """A case's settings as build_job takes them: the model, the flags, an accelerate_config name expanded into its
    parallel fields (as `hpcmem probe --accelerate_config` does)."""
    flags = dict(case.flags)
    layout = flags.pop("accelerate_config", None)
    return {"model_name_or_path": case.model, **(accelerate_settings(layout) if layout else {}), **flags}


def _predicted(cc: CampaignCase, gpu: GpuSpec, resolve: Callable[[str], str], peak: str) -> CampaignCase:
    """The case with its model resolved and the estimate's peak per GPU on `gpu` (None when it cannot build)."""
    case = dataclasses.replace(cc.case, model=resolve(cc.case.model), sized=True)
    try:
        job, _ = build_job(case.trainer, job_settings(case), gpu=gpu)
        est = estimate(job)
        value = est.device_peak_bytes if peak == "device" else tensor_bytes(est.peak_phase)
    except Exception:  # noqa: BLE001 - a case the estimator refuses is still run: its record says what happened
        value = None
    return dataclasses.replace(cc, case=case, predicted_bytes=value, capacity_bytes=gpu.usable_bytes)


def _tiny_flags(case: Case, tiny: bool) -> Case:
    """The kit's tiny lengths for a fixed-size case (hpcmem.probe.matrix.command_line does the same)."""
    if not tiny:
        return case
    flags = {**case.flags, **{k: v for k, v in TINY_LENGTHS.items() if k in case.flags or k == "max_length"}}
    if not entry(case.trainer).declares("max_length"):      # GRPO/RLOO/Distillation: prompt + completion lengths
        flags.pop("max_length", None)
    capacity = TINY_CAPACITY // 6 if case.capacity_gib is not None else case.capacity_bytes
    return dataclasses.replace(case, flags=flags, capacity_gib=None, capacity_bytes=capacity)


def _kit(gpu, resolve, peak, tiny, notes, wanted) -> list[CampaignCase]:
    out = []
    for case in (c for c in CASES if wanted(c.name)):
        cc = _predicted(CampaignCase(case=_tiny_flags(case, tiny), family="kit"), gpu, resolve, peak)
        simulated = case.capacity_gib is not None
        if cc.fraction is not None and cc.fraction > OVER and not simulated:
            notes.append(f"{case.name}: left out, predicted {100 * cc.fraction:.0f} % of the capacity")
            continue
        if simulated and not tiny:
            cc = dataclasses.replace(cc, case=dataclasses.replace(cc.case, capacity_gib=None,
                                                                  capacity_bytes=int(case.capacity_gib * 1024**3)))
        out.append(cc)
    return out


def _size(base: Case, target: float, gpu: GpuSpec, resolve, peak: str, tiny: bool) -> boundary.Sized | None:
    model = resolve(base.model)
    positions = int(hf_config(model).get("max_position_embeddings") or boundary.MAX_LENGTH)
    top = boundary.LENGTH_STEP if tiny else boundary.MAX_LENGTH
    return boundary.size_for(dataclasses.replace(base, model=model), model, target, gpu, gpu.usable_bytes, peak,
                             positions, top)


def _as_case(sized: boundary.Sized, name: str, family: str, gpu: GpuSpec, tiny: bool, gpus: int = 1,
             nodes: int = 1) -> CampaignCase:
    # a rehearsal's multi-rank case runs uncapped: on CPU the ranks' tensors outgrow the GPU estimate it was sized
    # by, and the run is there to exercise the ranks (one record, per-rank peaks), not the boundary
    capped = tiny and family != "multi"
    case = dataclasses.replace(sized.base, name=name, flags=sized.flags, sized=True,
                               capacity_bytes=TINY_CAPACITY if capped else None)
    return CampaignCase(case=case, family=family, gpus=gpus, nodes=nodes, target=sized.target,
                        predicted_bytes=sized.predicted_bytes, capacity_bytes=gpu.usable_bytes)


def _sized(gpu, resolve, peak, tiny, notes, wanted) -> list[CampaignCase]:
    bases = [("sft", m, t) for m in SWEEP_MODELS for t in SWEEP_TECHNIQUES]
    bases += [(trainer, m, t) for trainer, m in PREFERENCE for t in ("full+gc", "lora+gc")]
    out = []
    for i, (trainer, short, technique) in enumerate(bases):
        target = SPAN[i % len(SPAN)]
        name = f"{trainer}-{short}-{technique}-{round(100 * target)}"
        if not wanted(name):
            continue
        flags = dict(SWEEP_TECHNIQUES[technique])
        if flags.get("use_peft"):
            flags["lora_task_type"] = planned_task_type(trainer)     # a reward model's LoRA runs as SEQ_CLS only
        base = Case(name, trainer, SWEEP_MODELS[short], flags)
        sized = _size(base, target, gpu, resolve, peak, tiny)
        if sized is None:
            notes.append(f"{name}: left out, cannot be sized to {round(100 * target)} % of {gpu.name} (its states alone pass it, or no batch × max_length reaches it)")
            continue
        out.append(_as_case(sized, name, "sized", gpu, tiny))
    return out


def _boundary(gpu, resolve, peak, tiny, wanted) -> list[CampaignCase]:
    names = [f"boundary-{b.name}-{round(100 * t)}" for b in boundary.BASES for t in boundary.TARGETS]
    if not any(map(wanted, names)):
        return []
    models = {b.model: resolve(b.model) for b in boundary.BASES}
    top = boundary.LENGTH_STEP if tiny else boundary.MAX_LENGTH
    return [_as_case(s, s.name, "boundary", gpu, tiny)
            for s in boundary.sweep(gpu, gpu.usable_bytes, peak=peak, models=models, max_length=top) if wanted(s.name)]


def _expanded(flags: dict[str, Any]) -> dict[str, Any]:
    settings = job_settings(Case("", "sft", "", flags))
    settings.pop("model_name_or_path")
    return settings


def _multi(gpu, resolve, peak, tiny, gpus_per_node, max_nodes, notes, wanted) -> list[CampaignCase]:
    layouts = [(n, 1) for n in sorted({2, gpus_per_node}) if 2 <= n <= gpus_per_node]
    if max_nodes is None or max_nodes >= 2:
        layouts.append((gpus_per_node, 2))
    out = []
    for per_node, nodes in layouts:
        for layout, flags in LAYOUTS.items():
            if nodes == 2 and layout != "zero3":
                continue
            ranks = per_node * nodes
            where = f"{nodes}node-x{ranks}" if nodes > 1 else f"x{ranks}"
            name = f"{layout}-{where}-{MULTI_MODEL}"
            if not wanted(name):
                continue
            layout_flags = {**BF16, **_expanded(flags), "num_processes": ranks, "num_machines": nodes}
            base = Case(name, "sft", SWEEP_MODELS[MULTI_MODEL], layout_flags, 60.0, solo=True)
            sized = _size(base, MULTI_TARGET, gpu, resolve, peak, tiny)
            if sized is None:
                notes.append(f"{name}: left out, cannot reach {round(100 * MULTI_TARGET)} % per GPU")
                continue
            out.append(_as_case(sized, name, "multi", gpu, tiny, gpus=per_node, nodes=nodes))
    return out
