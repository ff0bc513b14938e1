"""Several small probes at once on the one GPU of a lease, when their safe bounds sum below its capacity.

Each probe is its own process with its own CUDA context; torch's allocator counters are per process already, and
with HPCMEM_PROBE_SHARED_GPU=1 the probe reads the device level from NVML's per-process used memory instead of the
device total (hpcmem.probe.meters). Before the kit packs anything, `compare` holds the idea to the records: the same
COMPARE cases run solo and then all together must record the same peaks — allocated within ALLOCATED_TOL, reserved
and device within RESERVED_TOL (or SLACK_BYTES for small runs) — and every shared record must have read NVML per
process. Only then are the remaining cases packed (`pack`: first-fit decreasing on the safe bounds, groups whose sum
stays ≤ the capacity); otherwise everything runs solo.
"""

from __future__ import annotations

import os
import subprocess
import time
from typing import Any, Callable

from hpcmem.estimate import estimate
from hpcmem.job.trl_config import build_job
from hpcmem.record.job import SHARED_ENV

COMPARE = ("sft-qwen05-lora", "dpo-qwen05-lora")
SHARED_SUFFIX = "+shared"
ALLOCATED_TOL = 0.005
RESERVED_TOL = 0.02
SLACK_BYTES = 64 * 1024**2
MAX_GROUP = 4               # processes at once: CPU cores and host RAM of one lease node are shared too


def pack(bounds: dict[str, int], capacity: int, max_group: int = MAX_GROUP) -> list[list[str]]:
    """Cases (name → safe bound) in groups whose safe bounds sum ≤ capacity, largest first (first-fit decreasing)."""
    groups: list[list[str]] = []
    room: list[int] = []
    for name in sorted(bounds, key=lambda n: -bounds[n]):
        need = bounds[name]
        slot = next((i for i, r in enumerate(room) if need <= r and len(groups[i]) < max_group), None)
        if slot is None:
            groups.append([name])
            room.append(capacity - need)
        else:
            groups[slot].append(name)
            room[slot] -= need
    return groups


def run_group(commands: dict[str, tuple[list[str], dict[str, str]]], timeout_s: float) -> dict[str, dict[str, Any]]:
    """Start every probe of a group at once (name → (argv, env)), wait for all; one result per name."""
    t0 = time.monotonic()
    procs = {name: subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for name, (argv, env) in commands.items()}
    out = {}
    for name, proc in procs.items():
        try:
            text, _ = proc.communicate(timeout=max(1.0, timeout_s - (time.monotonic() - t0)))
            status = "ok" if proc.returncode == 0 else f"exit {proc.returncode}"
        except subprocess.TimeoutExpired:
            proc.kill()
            text, status = proc.communicate()[0] or "", "timeout"
        out[name] = {"case": name, "status": status, "seconds": round(time.monotonic() - t0, 1),
                     **({"tail": text[-1500:]} if status != "ok" else {})}
    return out


def shared_env(base: dict[str, str]) -> dict[str, str]:
    return {**base, SHARED_ENV: "1"}


def _close(a: float | None, b: float | None, rel: float) -> bool:
    if not a or not b:
        return False
    return abs(a - b) <= max(rel * max(a, b), SLACK_BYTES if rel > ALLOCATED_TOL else 0)


def compare(records: list[Any], names: tuple[str, ...] = COMPARE, device: str = "cuda") -> dict[str, Any]:
    """Solo vs shared peaks of the COMPARE cases (records by `case`: NAME and NAME+shared, the newest of each)."""
    by_case = {r.case: r for r in records}                # later records win (hpcmem.record.Record)
    rows, agree = [], True
    for name in names:
        solo, shared = by_case.get(name), by_case.get(name + SHARED_SUFFIX)
        if not solo or not shared or solo.status != "ok" or shared.status != "ok":
            rows.append({"case": name, "agree": False, "why": "a run is missing or did not finish"})
            agree = False
            continue
        m1, m2 = solo.measured.to_json(), shared.measured.to_json()
        row = {"case": name}
        checks = [("peak_allocated_bytes", ALLOCATED_TOL)]
        if device == "cuda":
            checks += [("peak_reserved_bytes", RESERVED_TOL), ("device_peak_bytes", RESERVED_TOL)]
        ok = True
        for key, tol in checks:
            row[key] = [m1.get(key), m2.get(key)]
            ok &= _close(m1.get(key), m2.get(key), tol)
        if device == "cuda" and m1.get("device_peak_bytes") and m2.get("device_peak_bytes"):
            # what the per-process reading leaves out of the device level; on the 2026-12-04 H200 lease the same
            # 654,180,352 bytes in both cases (estimator/LOG.md) — a constant would be a context term, not noise
            row["device_offset_bytes"] = m1["device_peak_bytes"] - m2["device_peak_bytes"]
        nvml = (m2.get("totals") or {}).get("nvml", "")
        if device == "cuda" and nvml != "nvml per-process":
            ok, row["why"] = False, f"the shared run read {nvml or 'no NVML'}, not NVML per process"
        row["agree"] = ok
        agree &= ok
        rows.append(row)
    return {"agree": agree, "rows": rows}


def safe_bounds(cases: list[Any], gpu: Any, resolve: Callable[[Any], str]) -> dict[str, int]:
    """Each case's safe bound on `gpu` (hpcmem.estimate.verdict), from its flags as the probe will run them."""
    out = {}
    for case in cases:
        settings = {"model_name_or_path": resolve(case), **case.flags}
        if any("expandable_segments:True" in v for v in case.env.values()):
            settings["expandable_segments"] = True
        job, _ = build_job(case.trainer, settings, gpu=gpu)
        out[case.name] = estimate(job).verdict.safe_device_peak_bytes
    return out


def child_env(case_name: str, extra: dict[str, str]) -> dict[str, str]:
    return {**os.environ, "HF_HUB_OFFLINE": "1", "HPCMEM_PROBE_CASE": case_name, **extra}
