"""How many knob combinations `hpcmem plan` evaluates per second, and how long one full plan takes.

Targets: ≥ 50,000 evaluated combinations per second on one core; a full plan for one model/cluster in ≤ 1 s.
"Evaluated" = enumerated, given a throughput, and settled: by a full `hpcmem.estimate.estimate`, by the monotone
memory bound, by TRL's rules, or by the rank bound (slower than the `top` plans already found). The output shows how
many took each path, so the rate can be read honestly. CPU seconds (time.process_time) are reported next to wall
seconds because this machine may be shared: the CPU figure is the one-core rate.
Run: python -m hpcmem.bench.plan_bench [--repeat 5]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

from hpcmem.gpus.lookup import gpu_spec
from hpcmem.job.trl_config import build_job
from hpcmem.plan import search

LLAMA8B = "meta-llama/Llama-3.1-8B"
SCENARIOS = [  # (label, trainer, settings, gpu, allow_peft)
    ("8B SFT 1×RTX-4090 +peft", "sft", {"model_name_or_path": LLAMA8B}, "RTX-4090", True),
    ("8B SFT 1×H100-80GB", "sft", {"model_name_or_path": LLAMA8B}, "H100-80GB", False),
    ("8B SFT 8×H100-80GB +peft", "sft", {"model_name_or_path": LLAMA8B, "num_processes": 8}, "H100-80GB", True),
    ("8B SFT 4 nodes×8×H100 gbs 512 +peft", "sft",
     {"model_name_or_path": LLAMA8B, "num_processes": 32, "num_machines": 4}, "H100-80GB", True),
    ("8B DPO 8×A100-80GB +peft", "dpo", {"model_name_or_path": LLAMA8B, "num_processes": 8}, "A100-80GB", True),
    ("8B SFT 1×L40S +peft +8-bit AdamW", "sft", {"model_name_or_path": LLAMA8B}, "L40S", True),
]
OPTIM = {"8B SFT 1×L40S +peft +8-bit AdamW"}        # scenarios that search the optimizer too (--allow_optim)
GBS = {"8B SFT 4 nodes×8×H100 gbs 512 +peft": 512}


def _run(trainer, settings, gpu, allow_peft, gbs, repeat, allow_optim=False):
    job, _ = build_job(trainer, settings)
    spec = gpu_spec(gpu)
    kw = dict(allow_peft=allow_peft, global_batch_size=gbs, allow_optim=allow_optim)
    search(job, spec, **kw)        # warm imports and caches of the models
    walls, cpus, report = [], [], None
    for _ in range(repeat):
        w, c = time.perf_counter(), time.process_time()
        report = search(job, spec, **kw)
        walls.append(time.perf_counter() - w)
        cpus.append(time.process_time() - c)
    return report, statistics.median(walls), statistics.median(cpus)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"load average (1 min) {load:.2f} on {os.cpu_count()} cores; median of {args.repeat} runs")
    print(f"{'scenario':38s} {'combos':>6} {'estimate':>8} {'bound':>6} {'rules':>6} {'rank':>6} "
          f"{'wall ms':>8} {'cpu ms':>7} {'combos/cpu-s':>12}")
    total_c = total_cpu = 0.0
    worst_wall = 0.0
    for label, trainer, settings, gpu, allow in SCENARIOS:
        r, wall, cpu = _run(trainer, settings, gpu, allow, GBS.get(label), args.repeat, label in OPTIM)
        s = r.stats
        total_c += s.combinations
        total_cpu += cpu
        worst_wall = max(worst_wall, wall)
        print(f"{label:38s} {s.combinations:6d} {s.full_estimates:8d} {s.bound_rejected:6d} {s.rule_rejected:6d} "
              f"{s.rank_pruned:6d} {wall * 1e3:8.0f} {cpu * 1e3:7.0f} {s.combinations / cpu:12,.0f}")
    rate = total_c / total_cpu
    print(f"overall {rate:,.0f} evaluated combinations per CPU-second (target ≥ 50,000): "
          f"{'met' if rate >= 50_000 else 'NOT met'}")
    print(f"slowest full plan {worst_wall:.3f} s wall (target ≤ 1 s): {'met' if worst_wall <= 1 else 'NOT met'}")


if __name__ == "__main__":
    main()
