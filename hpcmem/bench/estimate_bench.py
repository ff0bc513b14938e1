"""Cold `hpcmem estimate` wall time vs `python -c "import torch, transformers"`, in one run.

Target: median cold estimate ≤ 0.25 s and ≥ 20× faster than importing torch + transformers.
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
IMPORT_TORCH = [sys.executable, "-c", "import torch, transformers"]


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
    try:
        ref = _median_seconds(IMPORT_TORCH, max(3, args.runs // 2))
    except subprocess.CalledProcessError:
        ref = float("nan")
    print(f"cold hpcmem estimate: median {est:.3f} s over {args.runs} runs (target ≤ 0.25 s)")
    print(f"import torch, transformers: median {ref:.3f} s")
    print(f"ratio: {ref / est:.1f}× (target ≥ 20×)")


if __name__ == "__main__":
    main()
