"""Multi-process probes on one machine: start one worker per rank the way torchrun does (RANK, LOCAL_RANK,
WORLD_SIZE, MASTER_ADDR/PORT in the environment), let each measure itself, and merge the per-rank results.

On CPU the ranks talk over gloo (accelerate picks it for MULTI_CPU; DeepSpeed's CPU accelerator likewise), so
ZeRO-1/2/3 and FSDP2 sharding can be measured without a GPU. `python -m hpcmem.probe.dist PAYLOAD OUT_DIR` is the
worker entry point; a calibration campaign starts the same worker on several nodes (one SLURM task per rank, the
same variables from SLURM's) through `rank_worker`, and merges what the ranks wrote with `merge_ranks`.
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

from hpcmem.probe.rank_exit import end_rank
from hpcmem.probe.runner import measure, quiet
from hpcmem.record import job_from_dict, job_to_dict

WORKER_TIMEOUT_S = 1800
PEER_GRACE_S = 20.0  # how long the other ranks may still finish after one failed


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run_ranks(job: Any, *, device: str, steps: int, warmup_steps: int, capacity_bytes: int | None,
              timeout_s: float = WORKER_TIMEOUT_S, after: tuple[str, ...] = ()) -> dict[str, Any]:
    """Measure every rank of `job.parallel.num_processes` local processes; return the merged measurement."""
    world = job.parallel.num_processes
    with tempfile.TemporaryDirectory(prefix="hpcmem-ranks-") as tmp:
        payload = write_payload(Path(tmp), job, device=device, steps=steps, warmup_steps=warmup_steps,
                                capacity_bytes=capacity_bytes, after=after)
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
        codes, stopped = supervise([proc for proc, _ in procs], Path(tmp), timeout_s=timeout_s)
        for _, log in procs:
            log.close()
        ranks = []
        for rank, code in enumerate(codes):
            out = Path(tmp) / f"rank{rank}.json"
            if out.is_file():
                ranks.append(json.loads(out.read_text()))
            elif rank in stopped:
                ranks.append({"status": "aborted", "rank": rank, "exit_code": code, "reason": stopped[rank]})
            else:
                tail = (Path(tmp) / f"rank{rank}.log").read_bytes()[-4000:].decode(errors="replace")
                ranks.append({"status": "error", "rank": rank, "exit_code": code, "log_tail": tail})
    return merge_ranks(ranks)


def write_payload(folder: Path, job: Any, **run: Any) -> Path:
    """What every rank reads: the job and how to run it (device, steps, warmup_steps, capacity_bytes, after)."""
    path = Path(folder) / "payload.json"
    path.write_text(json.dumps({"job": job_to_dict(job), **run}))
    return path


def read_ranks(folder: Path, world: int) -> list[dict[str, Any]]:
    """The per-rank results a world of ranks left in `folder`. A rank that wrote none was stopped (its launcher ends
    every rank once one ends badly, an OOM included) or crashed: "aborted", its log is the job's."""
    out = []
    for rank in range(world):
        path = Path(folder) / f"rank{rank}.json"
        out.append(json.loads(path.read_text()) if path.is_file() else
                   {"status": "aborted", "rank": rank, "reason": f"rank {rank} left no result (stopped after another "
                                                                  "rank ended, or crashed: see the job's log)"})
    return out


def supervise(procs: list[subprocess.Popen], out_dir: Path, *, timeout_s: float,
              grace_s: float = PEER_GRACE_S, poll_s: float = 0.2) -> tuple[list[int], dict[int, str]]:
    """Wait for every rank; return (exit codes, {rank: why it was stopped}).

    A rank that ran out of memory (or failed) leaves its peers blocked in the next collective until the process
    group's timeout (30 min for gloo and NCCL). Once a rank has finished with anything but "ok", the others get
    `grace_s` to finish on their own and are then killed, so one rank's OOM is a record in seconds, not a hang."""
    deadline = time.monotonic() + timeout_s
    failed: tuple[int, str] | None = None
    failed_at = 0.0
    stopped: dict[int, str] = {}
    while True:
        now = time.monotonic()
        running = [rank for rank, proc in enumerate(procs) if proc.poll() is None]
        if not running:
            break
        if failed is None:
            failed = _first_failure(procs, out_dir)
            failed_at = now
        limit = deadline if failed is None else min(deadline, failed_at + grace_s)
        if now >= limit:
            why = (f"stopped after rank {failed[0]} finished with {failed[1]!r} and this rank was still waiting "
                   f"{grace_s:.0f} s later" if failed is not None else f"no result within {timeout_s:.0f} s")
            for rank in running:
                procs[rank].kill()
                stopped[rank] = why
            break
        time.sleep(poll_s)
    return [proc.wait() for proc in procs], stopped


def _first_failure(procs: list[subprocess.Popen], out_dir: Path) -> tuple[int, str] | None:
    for rank, proc in enumerate(procs):
        code = proc.poll()
        if code is None:
            continue
        out = out_dir / f"rank{rank}.json"
        status = json.loads(out.read_text()).get("status", "error") if out.is_file() else "error"
        if status != "ok" or code != 0:
            return rank, status if status != "ok" else f"exit code {code}"
    return None


def merge_ranks(ranks: list[dict[str, Any]]) -> dict[str, Any]:
    """One measurement for the run: each peak is the worst rank's (what must fit on every GPU); ranks kept whole."""
    order = {"error": 3, "oom": 2, "aborted": 1, "ok": 0}
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
    timed = [r for r in ranks if r.get("status") == "ok" and r.get("step_times_s")]
    if timed and len({len(r["step_times_s"]) for r in timed}) == 1:
        # a step ends for the job when its slowest rank ends it; tokens are per GPU (each rank's own micro-batches)
        merged["step_times_s"] = [max(times) for times in zip(*(r["step_times_s"] for r in timed))]
        merged["tokens_per_step"] = [round(sum(t) / len(t)) for t in zip(*(r.get("tokens_per_step") or
                                                                         [0] * len(r["step_times_s"]) for r in timed))]
    ooms = [r["oom"] for r in ranks if r.get("oom")]
    if ooms:
        merged["oom"] = ooms[0]
    return merged


def rank_worker(payload_path: str | Path, out_dir: str | Path) -> int:
    """One rank: measure the payload's job as RANK / LOCAL_RANK of the environment, write rank<N>.json."""
    quiet()
    payload = json.loads(Path(payload_path).read_text())
    rank = int(os.environ["RANK"])
    job = job_from_dict(payload["job"])
    result = measure(job, device=payload["device"], steps=payload["steps"], warmup_steps=payload["warmup_steps"],
                     capacity_bytes=payload["capacity_bytes"], local_rank=int(os.environ["LOCAL_RANK"]), shards=True,
                     after=tuple(payload.get("after", ())))
    result["rank"] = rank
    tmp = Path(out_dir) / f".rank{rank}.json"
    tmp.write_text(json.dumps(result, default=str))
    tmp.rename(Path(out_dir) / f"rank{rank}.json")
    return 0


if __name__ == "__main__":
    end_rank(rank_worker(sys.argv[1], sys.argv[2]))
