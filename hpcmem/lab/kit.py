"""The GPU kit for one short lease: the OOM-boundary sweep first, then the cells no GPU has measured, then the rest of
the matrix — several small probes at once once a solo-vs-shared check on this GPU agreed. ≤ 8 minutes in all.

    python -m hpcmem.lab.kit --out $OUT/probes.jsonl            # on the GPU node (estimator/gpu/run_matrix.sh)
    python -m hpcmem.lab.kit --dry-run --gpu H200               # the schedule for that GPU; runs nothing
    python -m hpcmem.lab.kit --device cpu --tiny                # the whole kit on a CPU, models shrunk (tests)

Order, each step taking what the budget (--budget-s, default 420 s: the lease's 8 minutes less the allocator
replay) has left, a case starting only when its expected cost fits:
1. the GPU: a subprocess asks torch for its name and total memory — the kit's own process never creates a CUDA
   context, which would sit in every device reading; the total is the capacity the boundary is sized against;
2. the boundary sweep (hpcmem.probe.boundary), solo, up to BOUNDARY_SHARE of the budget;
3. the new cells (Case.new in hpcmem.probe.matrix), solo, up to NEW_SHARE more;
4. the solo-vs-shared check (hpcmem.probe.concurrent.COMPARE: solo, then all at once);
5. the rest of the matrix: packed into groups whose safe bounds sum below the capacity if step 4 agreed, else solo.
`--tiny` shrinks every model, simulates a TINY_CAPACITY-byte device for the boundary (tracked tensor bytes are the
peak) and shares the CPU instead of a GPU. A summary JSON goes next to the records (`<out>.summary.json`).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import click

from hpcmem.cli.options import job_from_cli
from hpcmem.cli.probe import command, probe_model
from hpcmem.errors import HpcmemError
from hpcmem.gpus.calibration import default_margins
from hpcmem.gpus.lookup import gpu_for_device, gpu_spec
from hpcmem.gpus.spec import GpuSpec
from hpcmem.probe import boundary, concurrent
from hpcmem.probe.matrix import CASES, Case, command_line, missing, run_case, tiny_config
from hpcmem.record import read_records, records_path
from hpcmem.trace.pieces import auto_config, config_dict

BOUNDARY_SHARE = 0.6      # of the ~285 s budget (estimator/gpu/run_matrix.sh): 5-6 boundary runs of ~32 s
NEW_SHARE = 0.35          # then ~100 s: the first two new cells (a 30 B MoE load among them)
TINY_CAPACITY = 24 * 1024**2
DETECT = ("import json, torch; p = torch.cuda.get_device_properties(0); "
          "print(json.dumps({'name': p.name, 'total': int(p.total_memory)}))")


PROBE_ONLY = ("device", "steps", "warmup_steps", "capacity_bytes", "out", "after", "no_record", "as_json")


def refusal(argv: list[str]) -> str | None:
    """Why `hpcmem probe` would refuse this command line before it touches a device — its option parsing
    (hpcmem.cli.probe `command`) and the job it builds (hpcmem.cli.options `job_from_cli`), what the probe process
    does first — or None. A refusal on the GPU node costs a probe's start-up from the lease; here it costs nothing."""
    try:
        with command.make_context("probe", list(argv[argv.index("probe") + 1:])) as ctx:
            params = {k: v for k, v in ctx.params.items() if k not in PROBE_ONLY}
            trainer = params.pop("trainer")
            job_from_cli(trainer, params, model=probe_model(params))
    except click.ClickException as exc:
        return exc.format_message()
    except (HpcmemError, ValueError) as exc:
        return str(exc).splitlines()[0]
    return None


def detect_gpu(device: str, gpu: str | None, tiny: bool) -> tuple[Any, str | None]:
    """The GpuSpec to size against — its capacity what torch reports on this machine (the catalog's for --gpu) —
    and the driver's name for the GPU (None on CPU), which names the records file."""
    if gpu:
        spec = gpu_spec(gpu)
        return (dataclasses.replace(spec, capacity_bytes=TINY_CAPACITY) if tiny else spec), None
    if device == "cpu":
        spec = gpu_spec("H100-80GB")            # kernels and margins of some GPU; the capacity is simulated
        return dataclasses.replace(spec, name="cpu (simulated)", capacity_bytes=TINY_CAPACITY), None
    found = json.loads(subprocess.run([sys.executable, "-c", DETECT], capture_output=True, text=True,
                                      check=True, timeout=120).stdout)
    spec = gpu_for_device(found["name"], found["total"])
    if spec is None:
        margins = default_margins()
        spec = GpuSpec(name=found["name"], memory_bytes=found["total"], bf16_tflops=0.0,
                       margins=tuple(margins[p] for p in sorted(margins)))
    return dataclasses.replace(spec, capacity_bytes=found["total"]), found["name"]


class Kit:
    def __init__(self, args: argparse.Namespace, tmp: Path) -> None:
        self.args, self.tmp = args, tmp
        self.start = time.monotonic()
        self.results: list[dict[str, Any]] = []
        self.models: dict[str, str] = {}

    def left(self) -> float:
        return self.args.budget_s - (time.monotonic() - self.start)

    def resolve(self, case: Case) -> str:
        """What the probe loads: the catalog id, a tiny config (--tiny), or a random checkpoint (4-bit bases)."""
        key = case.model + ("#weights" if case.flags.get("load_in_4bit") else "")
        if key not in self.models:
            if self.args.tiny:
                self.models[key] = tiny_config(case.model, self.tmp)
            elif case.flags.get("load_in_4bit"):
                self.models[key] = random_checkpoint(case.model, self.tmp / case.model.replace("/", "--"))
            else:
                self.models[key] = case.model
        return self.models[key]

    def solo(self, cases: list[Case], until: float) -> None:
        """Run cases one at a time while `until` seconds of the budget remain unspent (and the budget lasts)."""
        for case in cases:
            why = missing(case, self.args.device)
            spendable = self.left() - until
            if why or spendable < case.cost_s:
                self._note({"case": case.name, "status": "skipped", "why": why or f"{spendable:.0f} s < {case.cost_s}"})
                continue
            self._note(run_case(case, device=self.args.device, out=self.args.out, model=self.resolve(case),
                                tiny=self.args.tiny, steps=self.args.steps,
                                timeout_s=min(self.args.case_timeout_s, self.left() - until)))

    def shared(self, group: list[Case], suffix: str = "") -> None:
        """Run a group at once on the one GPU (each probe reads its own per-process device peak)."""
        if not group:                                       # every case of it had a record already (--skip-done)
            return
        cost = max(c.cost_s for c in group) * 1.5          # they share the GPU's time as well
        if self.left() < cost:
            for c in group:
                self._note({"case": c.name + suffix, "status": "skipped", "why": f"{self.left():.0f} s < {cost}"})
            return

        commands = {}
        for c in group:
            name = c.name + suffix
            argv = command_line(c, device=self.args.device, out=self.args.out, model=self.resolve(c),
                                tiny=self.args.tiny, steps=self.args.steps)
            commands[name] = (argv, concurrent.shared_env(concurrent.child_env(name, c.env)))
        for result in concurrent.run_group(commands, min(self.args.case_timeout_s * 1.5, self.left())).values():
            self._note({**result, "shared_with": [c.name for c in group]})

    def _note(self, result: dict[str, Any]) -> None:
        self.results.append(result)
        print(json.dumps(result), flush=True)


def random_checkpoint(model: str, folder: Path) -> str:
    """A local bf16 checkpoint of `model` with random weights (bitsandbytes quantizes real files on load)."""
    import torch
    from transformers import AutoModelForCausalLM

    if not (folder / "config.json").is_file():
        config = auto_config(config_dict(model), str(folder))
        AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16).save_pretrained(folder)
    return str(folder)


def schedule(gpu: Any, kit: Kit | None, args: argparse.Namespace) -> dict[str, list[Any]]:
    """The cases of each step; the boundary ones sized for `gpu` by the estimate (their sizes under "sizes")."""
    peak = "tensors" if args.device == "cpu" else "device"
    models = {b.model: kit.resolve(b) for b in boundary.BASES} if kit else None
    targets = tuple(float(t) for t in args.targets.split(",")) if args.targets else boundary.TARGETS
    sized = boundary.sweep(gpu, gpu.usable_bytes, peak=peak, models=models, targets=targets,
                           max_length=boundary.LENGTH_STEP if args.device == "cpu" else boundary.MAX_LENGTH)
    sized = sized[:args.boundary]
    capacity = TINY_CAPACITY if args.device == "cpu" else None
    bound = [dataclasses.replace(s.base, name=s.name, flags=s.flags, solo=True, sized=True, capacity_bytes=capacity)
             for s in sized]
    compare = [c for c in CASES if c.name in concurrent.COMPARE]
    sizes = [{"case": s.name, "per_device_train_batch_size": s.batch, "max_length": s.max_length,
              "predicted_bytes": s.predicted_bytes, "predicted_fraction": round(s.fraction, 4)} for s in sized]
    return {"boundary": bound, "sizes": sizes, "new": [c for c in CASES if c.new], "compare": compare,
            "rest": [c for c in CASES if not c.new and c.name not in concurrent.COMPARE]}


def groups_for(rest: list[Case], gpu: Any, kit: Kit) -> list[list[Case]]:
    """Shareable cases packed by safe bound (hpcmem.probe.concurrent.pack); solo cases alone."""
    by_name = {c.name: c for c in rest}
    shareable = [c for c in rest if not c.solo and c.capacity_gib is None]
    bounds = concurrent.safe_bounds(shareable, gpu, kit.resolve)
    packed = concurrent.pack(bounds, gpu.usable_bytes)
    return [[by_name[n] for n in g] for g in packed] + [[c] for c in rest if c not in shareable]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m hpcmem.lab.kit", description=__doc__.splitlines()[0])
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    ap.add_argument("--out", default=None, help="records file (default estimator/probes/<gpu>.jsonl)")
    ap.add_argument("--budget-s", type=float, default=420.0, help="stop starting cases after this (default 7 min)")
    ap.add_argument("--case-timeout-s", type=float, default=180.0)
    ap.add_argument("--tiny", action="store_true", help="shrink every model, simulate a small device (CPU tests)")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--gpu", default=None, help="size for this catalog GPU instead of detecting one (--dry-run)")
    ap.add_argument("--dry-run", action="store_true", help="print the schedule and run nothing")
    ap.add_argument("--no-shared", action="store_true", help="never run probes at once")
    ap.add_argument("--boundary", type=int, default=None, help="at most this many boundary runs")
    ap.add_argument("--targets", default=None, help="boundary target fractions, comma-separated (default "
                    + ",".join(map(str, boundary.TARGETS)) + ")")
    ap.add_argument("--only-steps", default="boundary,new,compare,rest", help="steps to run, comma-separated")
    ap.add_argument("--skip-done", action="store_true", help="skip cases with an ok record in --out already "
                    "(a second lease continues the first)")
    args = ap.parse_args(argv)
    if args.dry_run and not args.tiny and not (args.gpu or "").strip():
        ap.error("--dry-run sizes the schedule for a catalog GPU: give --gpu NAME (hpcmem gpus lists them)")
    try:
        gpu, device_name = detect_gpu(args.device, args.gpu, args.tiny)
    except HpcmemError as exc:
        ap.error(str(exc).splitlines()[0])
    with tempfile.TemporaryDirectory(prefix="hpcmem-kit-") as tmp:
        kit = Kit(args, Path(tmp)) if args.tiny or not args.dry_run else None
        plan = schedule(gpu, kit, args)
        if args.dry_run:
            shown = dry_run(plan, gpu, args)
            print(json.dumps(shown, indent=1))
            return 1 if shown["refused"] else 0
        args.out = args.out or str(_default_out(device_name))
        summary = execute(kit, plan, gpu, args)
    print(json.dumps({k: summary[k] for k in ("records", "ran", "failed", "skipped", "shared_ok")}))
    return 1 if summary["failed"] else 0


def execute(kit: Kit, plan: dict[str, list[Any]], gpu: Any, args: argparse.Namespace) -> dict[str, Any]:
    """Run the steps in order; the summary (`<out>.summary.json`) is rewritten as each step ends, so a lease cut
    short still brings back what ran (the records themselves are appended by each probe as it ends)."""
    total, check, shared_ok = args.budget_s, None, None

    def save(step: str) -> dict[str, Any]:
        summary = _summary(kit, gpu, args, check, shared_ok, done_steps + [step])
        done_steps.append(step)
        Path(args.out + ".summary.json").write_text(json.dumps(summary, indent=1) + "\n")
        return summary

    done_steps: list[str] = []
    steps = set(args.only_steps.split(","))
    if args.skip_done:
        done = {r.case for r in read_records(args.out) if r.finished}
        plan = {k: [c for c in v if getattr(c, "name", None) not in done] if k != "sizes" else v
                for k, v in plan.items()}
    if "boundary" in steps:
        kit.solo(plan["boundary"], until=total * (1 - BOUNDARY_SHARE))
        save("boundary")
    if "new" in steps:
        kit.solo(plan["new"], until=total * (1 - BOUNDARY_SHARE - NEW_SHARE))
        save("new")
    need = sum(c.cost_s for c in plan["compare"]) + max((c.cost_s for c in plan["compare"]), default=0) * 1.5
    if "compare" in steps and not args.no_shared and kit.left() < need:
        for c in plan["compare"]:      # half a check (the solo runs without the shared one) would buy nothing
            kit._note({"case": c.name, "status": "skipped", "why": f"the check needs {need:.0f} s, "
                                                                     f"{kit.left():.0f} s left"})
    elif "compare" in steps and not args.no_shared:
        kit.solo(plan["compare"], until=0.0)
        kit.shared(plan["compare"], suffix=concurrent.SHARED_SUFFIX)
        check = concurrent.compare(read_records(args.out), device=args.device)
        shared_ok = check["agree"]
        print(json.dumps({"solo_vs_shared": check}), flush=True)
        save("compare")
    rest = plan["rest"] if "rest" in steps else []
    groups = groups_for(rest, gpu, kit) if shared_ok else [[c] for c in rest]
    for group in groups:
        kit.shared(group) if len(group) > 1 else kit.solo(group, until=0.0)
    return save("rest")


def _summary(kit: Kit, gpu: Any, args: argparse.Namespace, check: dict[str, Any] | None, shared_ok: bool | None,
             steps: list[str]) -> dict[str, Any]:
    done = [r for r in kit.results if r["status"] not in ("skipped",)]
    return {"records": args.out, "gpu": gpu.name, "capacity_bytes": gpu.usable_bytes, "steps_done": steps,
            "shared_ok": shared_ok, "solo_vs_shared": check,
            "ran": sum(r["status"] == "ok" for r in done), "failed": sum(r["status"] != "ok" for r in done),
            "skipped": sum(r["status"] == "skipped" for r in kit.results), "results": kit.results,
            "seconds": round(time.monotonic() - kit.start, 1)}


def dry_run(plan: dict[str, list[Any]], gpu: Any, args: argparse.Namespace) -> dict[str, Any]:
    """The schedule as data: each step's cases and expected costs, the boundary runs with their sizes, and the cases
    whose `hpcmem probe` command line today's CLI refuses (hpcmem.lab.kit.refusal: each is a probe that would
    start on the GPU only to fail)."""
    steps = {step: [{"case": c.name, "model": c.model, "cost_s": c.cost_s} for c in plan[step]]
             for step in ("boundary", "new", "compare", "rest")}
    refused = {}
    for c in (c for step in ("boundary", "new", "compare", "rest") for c in plan[step]):
        why = refusal(command_line(c, device=args.device, out="probes.jsonl", model=c.model, tiny=False,
                                   steps=args.steps))
        if why:
            refused[c.name] = why
    return {"gpu": gpu.name, "capacity_bytes": gpu.usable_bytes, "budget_s": args.budget_s,
            "shares": {"boundary": BOUNDARY_SHARE, "new": NEW_SHARE}, "boundary_sizes": plan["sizes"],
            "steps": steps, "refused": refused}


def _default_out(device_name: str | None) -> Path:
    return records_path(device_name)


if __name__ == "__main__":
    sys.exit(main())
