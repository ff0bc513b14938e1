"""Why each knob of a plan is on, why faster alternatives lost, and the table / JSON the CLI prints.

A knob's reason is read off its neighbour — the same combination with that knob off: it does not fit (memory),
TRL refuses it (rules), or it fits but is slower (speed). Neighbours the search did not walk are estimated here with
the same `hpcmem.estimate.estimate`.
"""

from __future__ import annotations

from hpcmem.errors import SpecError
from hpcmem.estimate import estimate
from hpcmem.plan.best_first import GIB, Plan, PlanReport, comfortable, not_fitting
from hpcmem.plan.fixed import axis_fixed
from hpcmem.plan.flags import changed_flags, flags_line
from hpcmem.plan.knobs import GIVEN, Knobs, apply
from hpcmem.plan.throughput import THROUGHPUT_UNCERTAINTY

FASTER_SHOWN = 8        # rejected faster alternatives listed by --explain


def _neighbours(k: Knobs, per_gpu: int) -> list[tuple[str, Knobs]]:
    out = []
    if k.gc != "off":
        out.append((f"gradient_checkpointing {k.gc}", k._replace(gc="off")))
    if k.activation_offloading:
        out.append(("activation_offloading", k._replace(activation_offloading=False)))
    if k.pack != "padded":
        out.append((k.pack, k._replace(pack="padded")))
    if k.sharding not in ("ddp", GIVEN):
        out.append((k.sharding, k._replace(sharding="ddp")))
    if k.peft not in ("none", GIVEN):
        out.append((k.peft, k._replace(peft="none")))
    if k.expandable_segments:
        out.append(("expandable_segments", k._replace(expandable_segments=False)))
    if k.batch < per_gpu:
        out.append((f"per_device_train_batch_size {k.batch} × accumulation {k.accum}",
                    k._replace(batch=per_gpu, accum=1)))
    return out


def _verdict(report: PlanReport, k: Knobs) -> tuple[str, float | None]:
    """('fits' | 'needs X GiB' | TRL's refusal, tokens/s or None)."""
    speed = report.speeds.get(k)
    tps = speed.tokens_per_s_per_gpu if speed else None
    try:
        job = apply(report.base, k)
    except SpecError as exc:
        return f"TRL refuses it: {exc.problems[0]}", tps
    est = estimate(job)
    if est.fits:
        return "fits", tps
    return not_fitting(est), tps


def reasons(report: PlanReport, p: Plan) -> list[str]:
    """One line per knob that is on: what happens without it."""
    per_gpu = report.global_batch_size // p.job.parallel.layout.data_parallel     # rows per data-parallel rank
    out = []
    for name, off in _neighbours(p.knobs, per_gpu):
        if _fixed(report, name):
            out.append(f"{name}: given (fixed)")
            continue
        verdict, tps = _verdict(report, off)
        mine = p.speed.tokens_per_s_per_gpu
        if verdict != "fits":
            out.append(f"{name}: {'rules' if verdict.startswith('TRL') else 'memory'} — without it {verdict}")
        elif tps is not None and tps < mine * 0.9995:
            out.append(f"{name}: speed — {100 * (mine / tps - 1):+.1f} % tokens/s over the same without it")
        else:
            out.append(f"{name}: not needed — without it fits at the same or better speed (alternative)")
    out += _tie_note(report, p)
    return out or ["nothing on: the job fits as TRL's defaults with gradient checkpointing off"]


def _tie_note(report: PlanReport, p: Plan) -> list[str]:
    """Say so when faster plans were put below this one because the throughput model cannot tell them apart."""
    mine = p.speed.tokens_per_s_per_gpu
    faster = [q for q in report.plans if q.rank > p.rank and q.speed.tokens_per_s_per_gpu > mine]
    if not faster:
        return []
    best = max(faster, key=lambda q: q.speed.tokens_per_s_per_gpu)
    why = ("it leaves room for the margin once more, that one does not" if comfortable(p) else
           f"{(p.headroom_bytes - best.headroom_bytes) / GIB:.1f} GiB more headroom")
    return [f"headroom: ranked above #{best.rank} ({100 * (best.speed.tokens_per_s_per_gpu / mine - 1):+.1f} % "
            f"tokens/s, within the throughput model's ±{100 * THROUGHPUT_UNCERTAINTY:.0f} %): {why}"]


def _fixed(report: PlanReport, name: str) -> bool:
    axis = {"gradient_checkpointing": "gc", "activation_offloading": "activation_offloading",
            "expandable_segments": "expandable_segments"}.get(name.split(" ")[0])
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
            lines.append(f"{v.knobs.label():58s} {v.speed.tokens_per_s_per_gpu:9.0f} tok/s  ✗ {v.why}")
    if refused:
        lines.append(f"… and {refused} faster combinations TRL's rules refuse (hpcmem.job.rules)")
    return lines


def render(report: PlanReport, explain: bool = False) -> str:
    s = report.stats
    base = report.base
    head = (f"plan: {base.model.name} · {base.train.trainer.upper()} · {base.parallel.world_size}×{report.gpu.name}"
            f" ({base.parallel.num_machines} node{'s' if base.parallel.num_machines > 1 else ''}) · global batch "
            f"{report.global_batch_size} · fixed: {', '.join(report.fixed) or 'nothing'}")
    lines = [head, _capacity_line(report),
             f"{'#':>2} {'knobs':58s} {'alloc':>7} {'device':>7} {'safe':>7} {'free':>6} {'tok/s/GPU':>9} "
             f"{'step s':>7}"]
    for p in report.plans:
        lines.append(f"{p.rank:>2} {p.knobs.label():58s} {p.peak_allocated_bytes / GIB:6.1f}G "
                     f"{p.device_peak_bytes / GIB:6.1f}G {p.safe_device_peak_bytes / GIB:6.1f}G "
                     f"{p.headroom_bytes / GIB:5.1f}G {p.speed.tokens_per_s_per_gpu:9.0f} {p.speed.step_s:7.2f}")
    if not report.plans and not report.note:
        low = report.least
        closest = (f"the least-memory combination estimated, {low[0].label()}, "
                   f"{not_fitting(low[1])}; " if low else "")
        peft = "" if report.peft_tried else "allow PEFT (--allow_peft), "
        # a layout the user fixed is not searched: ZeRO/FSDP sharding, offloading and CP/SP may fit where it does not
        layout = "let the planner pick the layout (drop --accelerate_config), " \
            if "accelerate_config" in report.fixed else ""
        lines.append(f"   nothing fits: {closest}{layout}{peft}shorten max_length, add GPUs or pick a larger GPU")
    lines += host_lines(report)
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
                 f"{100 * THROUGHPUT_UNCERTAINTY:.0f} %: within it, plans short of headroom rank last), memory is "
                 "`hpcmem estimate`'s")
    return "\n".join(lines)


def _margin(report: PlanReport) -> dict:
    """The safe-bound rule every plan was judged by (hpcmem.estimate.verdict), from the GPU's calibration."""
    m = report.gpu.margin("device")
    if m is None:
        return {"margin": 0.0, "status": "none", "calibrated_on": None, "n": 0, "coverage": None}
    return {"margin": m.margin, "status": "default" if m.default else "calibrated", "calibrated_on": m.calibrated_on,
            "n": m.n, "coverage": None if m.default else m.coverage}


def _capacity_line(report: PlanReport) -> str:
    m = _margin(report)
    how = {"calibrated": f"calibrated on {m['calibrated_on']}, n = {m['n']}, {100 * (m['coverage'] or 0):.1f} % "
                         "coverage",
           "default": f"{report.gpu.name} uncalibrated: default margin from {m['calibrated_on']}'s records",
           "none": "no calibration: margin 0"}[m["status"]]
    return (f"capacity {report.gpu.usable_bytes / GIB:.1f} GiB usable per GPU · safe = (device peak + half its reserved "
            f"spread) + {100 * m['margin']:.1f} % ({how}) · free = capacity − safe; tight plans are not offered")


def host_lines(report: PlanReport) -> list[str]:
    """Host RAM per node against what a node grants, when a preset said (estimate/host.py)."""
    cap = report.host_capacity_bytes
    if cap is None:
        return []
    if report.note:
        return [f"   {report.note}"]
    out = [f"host RAM per node checked against {cap / GIB:.1f} GiB (preset memory_per_node_gb)" +
           (f": #1 needs {report.plans[0].estimate.host.per_node_bytes / GIB:.1f} GiB" if report.plans else "")]
    host = [v for v in report.walked if v.how == "host"]
    if host:
        least = min(host, key=lambda v: v.host_per_node_bytes or 0)
        out.append(f"   {len(host)} combinations fit the GPU but not the node's host RAM, e.g. "
                   f"{least.knobs.label()}: {least.why}")
    return out


def to_json(report: PlanReport) -> dict:
    s = report.stats
    low = report.least
    return {
        "gpu": report.gpu.name,
        "capacity_bytes": report.gpu.usable_bytes,
        "margin": _margin(report),
        "ranking": f"bands of plans within {100 * THROUGHPUT_UNCERTAINTY:.0f} % tokens/s of the band's fastest "
                   "(the throughput model's stated uncertainty); inside a band, plans whose headroom holds the "
                   "margin once more first (fastest first), then the rest (most headroom first)",
        "world_size": report.base.parallel.world_size,
        "global_batch_size": report.global_batch_size,
        "fixed": list(report.fixed),
        "note": report.note or None,
        "host_capacity_bytes": report.host_capacity_bytes,
        "plans": [{
            "rank": p.rank,
            "knobs": p.knobs._asdict(),
            "peak_allocated_bytes": p.peak_allocated_bytes,
            "device_peak_bytes": p.device_peak_bytes,
            "safe_device_peak_bytes": p.safe_device_peak_bytes,
            "capacity_bytes": report.gpu.usable_bytes,
            "headroom_bytes": p.headroom_bytes,
            "host_per_node_bytes": p.estimate.host.per_node_bytes if p.estimate.host else None,
            "tokens_per_s_per_gpu": p.speed.tokens_per_s_per_gpu,
            "step_s": p.speed.step_s,
            "mfu": p.speed.mfu,
            "reasons": reasons(report, p),
            "flags": changed_flags(report.base, p.job),
        } for p in report.plans],
        # no plan fits: the combination estimated in full with the lowest device peak (those the monotone bound
        # rejected unestimated are not in it: their bound says only that they do not fit)
        "least": None if low is None else {
            "knobs": low[0]._asdict(), "device_peak_bytes": low[1].device_peak_bytes, "why": not_fitting(low[1]),
            "flags": changed_flags(report.base, apply(report.base, low[0]))},
        "rejected_faster": [{"knobs": v.knobs._asdict(), "tokens_per_s_per_gpu": v.speed.tokens_per_s_per_gpu,
                             "why": v.why, "how": v.how}
                            for v in report.walked if not v.fits and report.plans and
                            v.speed.tokens_per_s_per_gpu > report.plans[0].speed.tokens_per_s_per_gpu],
        "stats": {"combinations": s.combinations, "full_estimates": s.full_estimates,
                  "bound_rejected": s.bound_rejected, "rule_rejected": s.rule_rejected,
                  "rank_pruned": s.rank_pruned, "seconds": s.seconds},
    }
