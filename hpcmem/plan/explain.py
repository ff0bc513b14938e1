"""Why each knob of a plan is on, why faster alternatives lost, and the table / JSON the CLI prints.

A knob's reason is read off its neighbour — the same combination with that knob off: it does not fit (memory),
TRL refuses it (rules), or it fits but is slower (speed). Neighbours the search did not walk are estimated here with
the same `hpcmem.estimate.estimate`. A memory reason names the mechanism that saves the memory
(hpcmem.plan.mechanism: a cast, a shard, an offload, recompute …) beside the counterfactual's numbers.
"""

from __future__ import annotations

from hpcmem.errors import SpecError
from hpcmem.estimate import estimate
from hpcmem.estimate.verdict import device_margin
from hpcmem.plan.best_first import GIB, Plan, PlanReport, not_fitting
from hpcmem.plan.fixed import axis_fixed
from hpcmem.plan.flags import flags_line
from hpcmem.plan.knobs import GIVEN, Knobs, apply
from hpcmem.plan.mechanism import mechanism
from hpcmem.plan.sync_batch import base, is_sync
from hpcmem.plan.ranking import headroom_share
from hpcmem.plan.throughput import THROUGHPUT_UNCERTAINTY
from hpcmem.plan.twins import difference

FASTER_SHOWN = 8        # rejected faster alternatives listed by --explain


def _neighbours(k: Knobs, per_gpu: int) -> list[tuple[str, Knobs]]:
    out = []
    if k.gc != "off":
        out.append((f"gradient_checkpointing {k.gc}", k._replace(gc="off")))
    if k.activation_offloading:
        out.append(("activation_offloading", k._replace(activation_offloading=False)))
    if k.pack != "padded":
        out.append((k.pack, k._replace(pack="padded")))
    if is_sync(k.sharding):
        out.append(("sync_each_batch", k._replace(sharding=base(k.sharding))))
    if k.sharding not in ("ddp", GIVEN):
        out.append((base(k.sharding), k._replace(sharding="ddp")))
    if k.peft not in ("none", GIVEN):
        out.append((k.peft, k._replace(peft="none")))
    if k.expandable_segments:
        out.append(("expandable_segments", k._replace(expandable_segments=False)))
    if k.dtype == "bfloat16":
        out.append(("dtype bfloat16", k._replace(dtype="float32")))
    if k.optim == "adamw_8bit":
        out.append(("optim adamw_8bit", k._replace(optim="adamw_torch_fused")))
    if k.batch < per_gpu:
        out.append((f"per_device_train_batch_size {k.batch} × accumulation {k.accum}",
                    k._replace(batch=per_gpu, accum=1)))
    return out


def _verdict(report: PlanReport, k: Knobs) -> tuple[str, float | None, float]:
    """('fits' | 'needs X GiB' | TRL's refusal, tokens/s or None, GiB free when it fits)."""
    speed = report.speeds.get(k)
    tps = speed.tokens_per_s_per_gpu if speed else None
    try:
        job = apply(report.base, k)
    except SpecError as exc:
        return f"TRL refuses it: {exc.problems[0]}", tps, 0.0
    est = estimate(job)
    if est.fits:
        return "fits", tps, (est.headroom_bytes or 0) / GIB
    return not_fitting(est), tps, 0.0


def reasons(report: PlanReport, p: Plan) -> list[str]:
    """One line per knob that is on: what happens without it."""
    per_gpu = report.global_batch_size // p.job.parallel.layout.data_parallel     # rows per data-parallel rank
    out = []
    for name, off in _neighbours(p.knobs, per_gpu):
        if _fixed(report, name):
            out.append(f"{name}: given (fixed)")
            continue
        verdict, tps, free = _verdict(report, off)
        mine = p.speed.tokens_per_s_per_gpu
        if verdict.startswith("TRL"):
            out.append(f"{name}: rules — without it {verdict}")
        elif verdict != "fits":
            out.append(f"{name}: memory, {mechanism(name, p.job)} — without it: {verdict}" +
                       _cast_alone(report, p, off))
        elif tps is not None and tps < mine * 0.9995:
            out.append(f"{name}: speed — {100 * (mine / tps - 1):+.1f} % tokens/s over the same without it")
        elif tps is not None and free < p.headroom_bytes / GIB - 0.05:
            out.append(f"{name}: headroom, {mechanism(name, p.job)} — without it: fits with {free:.1f} GiB free "
                       f"(vs {p.headroom_bytes / GIB:.1f}) at {100 * (tps / mine - 1):+.1f} % tokens/s, within the "
                       f"throughput model's ±{100 * THROUGHPUT_UNCERTAINTY:.0f} %")
        else:
            out.append(f"{name}: not needed — without it fits at the same speed with {free:.1f} GiB free")
    out += _tie_note(report, p)
    return out or ["nothing on: the job fits as TRL's defaults with gradient checkpointing off"]


def _cast_alone(report: PlanReport, p: Plan, off: Knobs) -> str:
    """Beside a DeepSpeed layout's reason on a float32 load: the same job loaded in bfloat16 without it — how much of
    the saving is the cast and not the layout."""
    k = p.knobs
    if off.sharding == k.sharding or k.dtype != "float32" or not p.job.parallel.deepspeed or \
            _fixed(report, "dtype"):
        return ""
    verdict, _, free = _verdict(report, off._replace(dtype="bfloat16"))
    if verdict == "fits":
        verdict = f"fits with {free:.1f} GiB free"
    return f"; the cast alone (dtype bfloat16 without DeepSpeed): {verdict}"


def _tie_note(report: PlanReport, p: Plan) -> list[str]:
    """Say so when faster plans were put below this one because the throughput model cannot tell them apart."""
    mine = p.speed.tokens_per_s_per_gpu
    faster = [q for q in report.plans if q.rank > p.rank and q.speed.tokens_per_s_per_gpu > mine]
    if not faster:
        return []
    best = max(faster, key=lambda q: q.speed.tokens_per_s_per_gpu)
    return [f"headroom: ranked above #{best.rank} ({100 * (best.speed.tokens_per_s_per_gpu / mine - 1):+.1f} % "
            f"tokens/s, within the throughput model's ±{100 * THROUGHPUT_UNCERTAINTY:.0f} %): "
            f"{(p.headroom_bytes - best.headroom_bytes) / GIB:.1f} GiB more free"]


def _fixed(report: PlanReport, name: str) -> bool:
    axis = {"gradient_checkpointing": "gc", "activation_offloading": "activation_offloading",
            "expandable_segments": "expandable_segments", "dtype": "dtype", "optim": "optim"}.get(name.split(" ")[0])
    if name == "sync_each_batch":       # an accelerator_config key (hpcmem.plan.sync_batch)
        return "accelerator_config" in report.fixed
    if axis is None:
        axis = ("peft" if name in ("lora", "qlora") else "pack" if name in ("packing", "padding_free")
                else "batch" if name.startswith("per_device") else "sharding")
    return axis_fixed(axis, report.fixed)


def faster_rejected(report: PlanReport) -> list[str]:
    best = report.plans[0].speed.tokens_per_s_per_gpu if report.plans else 0.0
    lines, refused = [], 0
    for v in report.walked:
        if v.fits or v.speed.tokens_per_s_per_gpu <= best:
            continue
        if v.how == "rules":
            refused += 1
        elif len(lines) < FASTER_SHOWN:
            lines.append(f"{v.knobs.label(_one(report)):62s} {v.speed.tokens_per_s_per_gpu:9.0f} tok/s  ✗ {v.why}")
    if refused:
        lines.append(f"… and {refused} faster combinations TRL's rules refuse (hpcmem.job.rules)")
    return lines


def render(report: PlanReport, explain: bool = False) -> str:
    s = report.stats
    base = report.base
    head = (f"plan: {base.model.name} · {base.train.trainer.upper()} · {base.parallel.world_size}×{report.gpu.name}"
            f" ({base.parallel.num_machines} node{'s' if base.parallel.num_machines > 1 else ''}) · global batch "
            f"{report.global_batch_size} · fixed: {', '.join(report.fixed) or 'nothing'}")
    lines = [head, _capacity_line(report), *_table(report)]
    if not report.plans and not report.note:
        low = report.least
        closest = (f"the least-memory combination estimated, {low[0].label(_one(report))}, "
                   f"{not_fitting(low[1])}; " if low else "")
        peft = "" if report.peft_tried else "allow PEFT (--allow_peft), "
        # a layout the user fixed is not searched: ZeRO/FSDP sharding, offloading and CP/SP may fit where it does not
        layout = "let the planner pick the layout (drop --accelerate_config), " \
            if "accelerate_config" in report.fixed else ""
        lines.append(f"   nothing fits: {closest}{layout}{peft}shorten max_length, add GPUs or pick a larger GPU")
    lines += host_lines(report) + headroom_lines(report)
    for p in report.plans[:1] if not explain else report.plans:
        lines.append(f"why #{p.rank}: " + "; ".join(reasons(report, p)))
        lines.append(f"#{p.rank} as flags: {flags_line(base, p.job)}")
    if explain:
        faster = faster_rejected(report)
        if faster:
            lines.append("faster combinations that lost:")
            lines.extend("   " + x for x in faster)
    if report.note:
        lines.append(f"searched none of {s.combinations} combinations: the host-RAM floor above rules them all out")
    else:
        lines.append(f"searched {s.combinations} combinations in {s.seconds * 1000:.0f} ms: {s.full_estimates} full "
                     f"estimates, {s.bound_rejected} rejected by a monotone bound, {s.rule_rejected} refused by TRL "
                     f"rules or the model's learned profile, {s.rank_pruned} slower than the plans shown")
    lines.append(f"speed is a ranking model (hpcmem/plan/throughput.py, uncalibrated constants, ±"
                 f"{100 * THROUGHPUT_UNCERTAINTY:.0f} %: within it, more free memory ranks first), memory is "
                 "`hpcmem estimate`'s")
    return "\n".join(lines)


def _one(report: PlanReport) -> bool:
    return report.base.parallel.world_size == 1


def _table(report: PlanReport) -> list[str]:
    """The plans' rows: memory, free (GiB and % of capacity), host RAM per node, speed; twins under their plan."""
    one = _one(report)
    w = max([len(p.knobs.label(one)) for p in report.plans] + [40])
    out = [f"{'#':>2} {'knobs':{w}s} {'alloc':>7} {'device':>7} {'safe':>7} {'free':>6} {'free%':>5} "
           f"{'host/node':>9} {'tok/s/GPU':>9} {'step s':>7}"]
    for p in report.plans:
        host = p.estimate.host.per_node_bytes / GIB if p.estimate.host else float("nan")
        out.append(f"{p.rank:>2} {p.knobs.label(one):{w}s} {p.peak_allocated_bytes / GIB:6.1f}G "
                   f"{p.device_peak_bytes / GIB:6.1f}G {p.safe_device_peak_bytes / GIB:6.1f}G "
                   f"{p.headroom_bytes / GIB:5.1f}G {100 * headroom_share(p):4.1f}% {host:8.1f}G "
                   f"{p.speed.tokens_per_s_per_gpu:9.0f} {p.speed.step_s:7.2f}")
        if p.equivalents:
            out.append(f"{'':>3}≡ the same job on this hardware (same estimate and speed): " +
                       "; ".join(difference(p.knobs, q, one) for q in p.equivalents))
    return out


def headroom_lines(report: PlanReport) -> list[str]:
    """The headroom floor, when one was asked for, and how many fitting combinations it dropped."""
    if report.headroom is None:
        return []
    dropped = sum(v.how == "headroom" for v in report.walked)
    floor = report.headroom.bytes_for(report.gpu.usable_bytes)
    return [f"headroom floor {report.headroom.text()} ({floor / GIB:.1f} GiB): {dropped} combinations that fit "
            "were dropped for leaving less free"]


def margin_info(report: PlanReport) -> dict:
    """The safe-bound rule every plan was judged by (hpcmem.estimate.verdict), from the GPU's calibration."""
    m = device_margin(report.gpu, report.base.parallel.world_size)
    if m is None:
        return {"margin": 0.0, "status": "none", "calibrated_on": None, "n": 0, "coverage": None}
    status = "published" if m.evidence else "default" if m.default else "calibrated"
    return {"margin": m.margin, "status": status, "calibrated_on": m.calibrated_on, "n": m.n,
            "coverage": None if m.default or m.evidence else m.coverage,
            "held_out": f"{m.held_out_covered}/{m.held_out_n}" if m.held_out_n else None}


def _capacity_line(report: PlanReport) -> str:
    m = margin_info(report)
    how = {"calibrated": f"calibrated on {m['calibrated_on']}, n = {m['n']}, {100 * (m['coverage'] or 0):.1f} % "
                         "coverage",
           "default": f"{report.gpu.name} uncalibrated: default margin from {m['calibrated_on']}'s records",
           "published": f"from {m['calibrated_on']}, n = {m['n']}, "
                        + (f"held-out coverage {m['held_out']}" if m["held_out"] else "in-sample"),
           "none": "no calibration: margin 0"}[m["status"]]
    return (f"capacity {report.gpu.usable_bytes / GIB:.1f} GiB usable per GPU · safe = (device peak + half its reserved "
            f"spread) + {100 * m['margin']:.1f} % ({how}) · free = capacity − safe; tight plans are not offered")


def host_lines(report: PlanReport) -> list[str]:
    """Host RAM per node against what a node grants (estimate/host.py; hpcmem.plan.host_ram says where from)."""
    cap = report.host_capacity_bytes
    if cap is None:
        return [f"host RAM per node {report.host_capacity_source or 'not checked'}"] if report.plans else []
    if report.note:
        return [f"   {report.note}"]
    need = (f": #1 needs {report.plans[0].estimate.host.per_node_bytes / GIB:.1f} GiB"
            if report.plans and report.plans[0].estimate.host else "")
    out = [f"host RAM per node ≤ {cap / GIB:.1f} GiB, {report.host_capacity_source or 'given'} — plans over it are "
           f"not offered{need}"]
    host = [v for v in report.walked if v.how == "host"]
    if host:
        least = min(host, key=lambda v: v.host_per_node_bytes or 0)
        out.append(f"   {len(host)} combinations fit the GPU but not the node's host RAM, e.g. "
                   f"{least.knobs.label(_one(report))}: {least.why}")
    return out
