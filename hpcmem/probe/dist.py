"""Multi-process probes on one machine: start one worker per rank the way torchrun does (RANK, LOCAL_RANK,
WORLD_SIZE, MASTER_ADDR/PORT in the environment), let each measure itself, and merge the per-rank results.

On CPU the ranks talk over gloo (accelerate picks it for MULTI_CPU; DeepSpeed's CPU accelerator likewise), so
ZeRO-1/2/3 and FSDP2 sharding can be measured without a GPU. `python -m hpcmem.probe.dist PAYLOAD OUT_DIR` is the
worker entry point.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

WORKER_TIMEOUT_S = 1800


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run_ranks(job: Any, *, device: str, steps: int, warmup_steps: int, capacity_bytes: int | None,
              timeout_s: float = WORKER_TIMEOUT_S) -> dict[str, Any]:
    """Measure every rank of `job.parallel.num_processes` local processes; return the merged measurement."""
    from hpcmem.probe.record import job_to_dict

    world = job.parallel.num_processes
    with tempfile.TemporaryDirectory(prefix="hpcmem-ranks-") as tmp:
        payload = Path(tmp) / "payload.json"
        payload.write_text(json.dumps({"job": job_to_dict(job), "device": device, "steps": steps,
                                       "warmup_steps": warmup_steps, "capacity_bytes": capacity_bytes}))
        port = free_port()
        procs = []
        for rank in range(world):
            env = dict(os.environ, RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world),
                       LOCAL_WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
            if device == "cpu":
                env.setdefault("OMP_NUM_THREADS", "1")
            log = open(Path(tmp) / f"rank{rank}.log", "wb")
            procs.append((subprocess.Popen([sys.executable, "-m", "hpcmem.probe.dist", str(payload), tmp], env=env,
                                           stdout=log, stderr=subprocess.STDOUT), log))
        deadline = time.monotonic() + timeout_s
        codes = []
        for proc, log in procs:
            try:
                codes.append(proc.wait(timeout=max(1.0, deadline - time.monotonic())))
            except subprocess.TimeoutExpired:
                proc.kill()
                codes.append(proc.wait())
            log.close()
        ranks = []
        for rank, code in enumerate(codes):
            out = Path(tmp) / f"rank{rank}.json"
            if out.is_file():
                ranks.append(json.loads(out.read_text()))
            else:
                tail = (Path(tmp) / f"rank{rank}.log").read_bytes()[-4000:].decode(errors="replace")
                ranks.append({"status": "error", "rank": rank, "exit_code": code, "log_tail": tail})
    return merge_ranks(ranks)


def merge_ranks(ranks: list[dict[str, Any]]) -> dict[str, Any]:
    """One measurement for the run: each peak is the worst rank's (what must fit on every GPU); ranks kept whole."""
    order = {"error": 2, "oom": 1, "ok": 0}
    status = max((r.get("status", "error") for r in ranks), key=lambda s: order.get(s, 2))
    merged: dict[str, Any] = {"status": status, "ranks": ranks}
    for key in ("peak_allocated_bytes", "peak_reserved_bytes", "device_peak_bytes", "device_sampled_peak_bytes",
                "rss_bytes"):
        values = [r[key] for r in ranks if r.get(key) is not None]
        merged[key] = max(values) if values else None
    worst = max((r for r in ranks if r.get("peak_allocated_bytes") is not None),
                key=lambda r: r["peak_allocated_bytes"], default=None)
    if worst is not None:
        for key in ("peak_phase", "phases", "device_info", "timings", "not_applied"):
            merged[key] = worst.get(key)
        merged["worst_rank"] = ranks.index(worst)
    ooms = [r["oom"] for r in ranks if r.get("oom")]
    if ooms:
        merged["oom"] = ooms[0]
    return merged


def _worker(payload_path: str, out_dir: str) -> int:
    from hpcmem.probe.record import job_from_dict
    from hpcmem.probe.runner import measure, quiet

    quiet()
    payload = json.loads(Path(payload_path).read_text())
    rank = int(os.environ["RANK"])
    job = job_from_dict(payload["job"])
    result = measure(job, device=payload["device"], steps=payload["steps"], warmup_steps=payload["warmup_steps"],
                     capacity_bytes=payload["capacity_bytes"], local_rank=int(os.environ["LOCAL_RANK"]), shards=True)
    result["rank"] = rank
    tmp = Path(out_dir) / f".rank{rank}.json"
    tmp.write_text(json.dumps(result, default=str))
    tmp.rename(Path(out_dir) / f"rank{rank}.json")
    return 0


if __name__ == "__main__":
    sys.exit(_worker(sys.argv[1], sys.argv[2]))
