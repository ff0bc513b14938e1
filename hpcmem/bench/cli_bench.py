"""Whole-process wall time of `hpcmem estimate` and `hpcmem plan` against a bare interpreter, interleaved in one run.

Targets: cold `estimate` ≤ 6× a bare interpreter (`python -c pass`) and ≤ 60 ms on a machine where the interpreter
starts in ~10 ms; `plan` for Llama-3.1-8B on one H100 ≤ 120 ms. The ratios are the fair figures on a shared machine.
Run: python -m hpcmem.bench.cli_bench [--runs 15]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

COMMANDS = {
    "bare": [sys.executable, "-c", "pass"],
    "estimate": [sys.executable, "-m", "hpcmem", "estimate", "sft", "--model_name_or_path", "Qwen/Qwen2.5-7B",
                 "--gpu", "H200"],
    "plan": [sys.executable, "-m", "hpcmem", "plan", "sft", "--model_name_or_path", "meta-llama/Llama-3.1-8B",
             "--gpu", "H100-80GB"],
}


def medians(runs: int) -> dict[str, float]:
    """Median seconds per command over `runs` rounds, the commands interleaved so that load hits all alike. One
    unmeasured round first writes the bytecode caches, as an installed package has them."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    times: dict[str, list[float]] = {name: [] for name in COMMANDS}
    for round_ in range(runs + 1):
        for name, cmd in COMMANDS.items():
            start = time.perf_counter()
            subprocess.run(cmd, check=True, capture_output=True, env=env)
            if round_:
                times[name].append(time.perf_counter() - start)
    return {name: statistics.median(t) for name, t in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=15)
    med = medians(parser.parse_args().runs)
    for name, seconds in med.items():
        print(f"{name:9s} median {seconds * 1000:7.1f} ms  ({seconds / med['bare']:.1f}× bare)")


if __name__ == "__main__":
    main()
