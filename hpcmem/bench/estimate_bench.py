"""Cold `hpcmem estimate` wall time vs `python -c "import torch, transformers"`, in one run.

Targets: median cold estimate ≤ 0.25 s and ≥ 20× faster than importing torch + transformers; a model estimated from a
learned profile (a shipped one: openai/gpt-oss-20b) as fast as a derived one, and hpcmem's own part of it (import,
resolve, profile read, estimate, in a fresh interpreter, interpreter start-up left out) ≤ 0.1 s.
Run: python -m hpcmem.bench.estimate_bench [--runs 7]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

ESTIMATE = [sys.executable, "-m", "hpcmem", "estimate", "sft", "--model_name_or_path", "meta-llama/Llama-3.1-8B",
            "--max_length", "4096", "--json"]
ESTIMATE_LEARNED = [*ESTIMATE[:6], "openai/gpt-oss-20b", *ESTIMATE[7:]]
IMPORT_TORCH = [sys.executable, "-c", "import torch, transformers"]
IN_PROCESS = [sys.executable, "-c", (
    "import time; t, c = time.perf_counter(), time.process_time(); from hpcmem.job.trl_config import build_job; "
    "from hpcmem.estimate import estimate; "
    "estimate(build_job('sft', {'model_name_or_path': 'openai/gpt-oss-20b', 'max_length': 4096})[0]); "
    "print(time.perf_counter() - t, time.process_time() - c)")]


def _median_inner(runs: int) -> tuple[float, float]:
    """Medians of what IN_PROCESS prints: hpcmem's own wall and CPU time in a fresh interpreter (on a shared machine
    the CPU time is the part that is hpcmem's own work)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    out = [tuple(map(float, subprocess.run(IN_PROCESS, check=True, capture_output=True, text=True,
                                           env=env).stdout.split())) for _ in range(runs + 1)]
    return statistics.median(w for w, _ in out[1:]), statistics.median(c for _, c in out[1:])


def _median_seconds(cmd: list[str], runs: int) -> float:
    """Median wall time of fresh processes. One unmeasured run first writes the bytecode caches, as any installed
    package has them (PYTHONDONTWRITEBYTECODE is dropped for the children)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--runs", type=int, default=7)
    args = ap.parse_args()
    est = _median_seconds(ESTIMATE, args.runs)
    learned = _median_seconds(ESTIMATE_LEARNED, args.runs)
    inner, inner_cpu = _median_inner(args.runs)
    try:
        ref = _median_seconds(IMPORT_TORCH, max(3, args.runs // 2))
    except subprocess.CalledProcessError:
        ref = float("nan")
    print(f"cold hpcmem estimate: median {est:.3f} s over {args.runs} runs (target ≤ 0.25 s)")
    print(f"import torch, transformers: median {ref:.3f} s")
    print(f"ratio: {ref / est:.1f}× (target ≥ 20×)")
    print(f"cold hpcmem estimate, learned profile (openai/gpt-oss-20b): median {learned:.3f} s, "
          f"{learned / est:.2f}× the derived model's (target ≤ 1.1×)")
    print(f"  of which hpcmem's own (import, resolve, read the profile, estimate): median {inner:.3f} s "
          f"(target ≤ 0.1 s), {inner_cpu:.3f} s of CPU; load average {os.getloadavg()[0]:.1f} on "
          f"{os.cpu_count()} CPUs")


if __name__ == "__main__":
    main()
