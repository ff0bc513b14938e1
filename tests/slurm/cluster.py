"""A private SLURM 22.05 cluster on 127.0.0.1 for the slurm test tier: slurmctld + slurmd n1/n2, fake GPUs.

What works here (a real scheduler in the tests): auth/none + cred/none (no munge),
proctrack/linuxproc, task/none, select/cons_tres, two `slurmd -N` on distinct ports with NodeAddr=127.0.0.1, gres
`File=` pointing at character devices (links to /dev/null when mknod is not allowed), no cgroup.conf. The daemons run
as the invoking user (root in CI; an unprivileged user with SLURM installed works too). Every daemon starts under `setsid` (so killing the caller's
process group leaves them alone) and is stopped by its own PID; ports and state live under one private folder.

A requeued job waits BeginTime = now + cred_expire (120 s by default) and then for the main scheduler's next pass
(sched_interval, 60 s by default). Both are documented slurm.conf(5) knobs, lowered here (`AuthInfo=cred_expire=5`,
`SchedulerParameters=sched_interval=1`): requeue → running again took 57 s before and 6 s after, measured here.
"""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

NODES = ("n1", "n2")
CPUS_PER_NODE = 4
GPUS_PER_NODE = 2
MEMORY_MB = 4000
PARTITION = "gpu"
CRED_EXPIRE_S = 5


def slurm_available() -> bool:
    return shutil.which("slurmctld") is not None and shutil.which("slurmd") is not None


def _free_ports(count: int) -> list[int]:
    socks = []
    for _ in range(count):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        socks.append(s)
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def _fake_gpu(path: Path, minor: int) -> None:
    """gres `File=` must be a character device: an NVIDIA-like node (major 195), else a link to /dev/null."""
    try:
        os.mknod(path, 0o666 | 0o020000, os.makedev(195, minor))
    except (PermissionError, OSError):
        path.symlink_to("/dev/null")


@dataclass
class SlurmCluster:
    root: Path
    procs: dict[str, subprocess.Popen] = field(default_factory=dict)

    @property
    def conf(self) -> Path:
        return self.root / "etc" / "slurm.conf"

    @property
    def env(self) -> dict[str, str]:
        return {**os.environ, "SLURM_CONF": str(self.conf)}

    def write_config(self) -> None:
        ctld_port, *node_ports = _free_ports(1 + len(NODES))
        for sub in ("etc", "state", "log", "dev", *(f"spool/{n}" for n in NODES)):
            (self.root / sub).mkdir(parents=True, exist_ok=True)
        gres_lines = []
        for i, node in enumerate(NODES):
            for g in range(GPUS_PER_NODE):
                _fake_gpu(self.root / "dev" / f"{node}gpu{g}", i * GPUS_PER_NODE + g)
            gres_lines.append(f"NodeName={node} Name=gpu File={self.root}/dev/{node}gpu[0-{GPUS_PER_NODE - 1}]")
        r = self.root
        user = pwd.getpwuid(os.getuid()).pw_name     # root in CI; an unprivileged user runs jobs as itself
        lines = [
            "ClusterName=hpcmemtest",
            f"SlurmctldHost={socket.gethostname()}(127.0.0.1)",
            f"SlurmctldPort={ctld_port}",
            "AuthType=auth/none", "CredType=cred/none", f"AuthInfo=cred_expire={CRED_EXPIRE_S}",
            f"SlurmUser={user}", f"SlurmdUser={user}",
            f"StateSaveLocation={r}/state", f"SlurmdSpoolDir={r}/spool/%n",
            f"SlurmctldPidFile={r}/slurmctld.pid", f"SlurmdPidFile={r}/slurmd-%n.pid",
            f"SlurmctldLogFile={r}/log/slurmctld.log", f"SlurmdLogFile={r}/log/slurmd-%n.log",
            "ProctrackType=proctrack/linuxproc", "TaskPlugin=task/none",
            "SelectType=select/cons_tres", "SelectTypeParameters=CR_CPU",
            "SchedulerType=sched/backfill", "SchedulerParameters=sched_interval=1,bf_interval=1",
            "MpiDefault=none", "ReturnToService=2",
            "SlurmdParameters=config_overrides", "GresTypes=gpu",
            "MinJobAge=300", "KillWait=5", "InactiveLimit=0", "MessageTimeout=20",
            "JobRequeue=0",
        ]
        for node, port in zip(NODES, node_ports):
            lines.append(f"NodeName={node} NodeHostname={socket.gethostname()} NodeAddr=127.0.0.1 Port={port} "
                         f"CPUs={CPUS_PER_NODE} RealMemory={MEMORY_MB} Gres=gpu:{GPUS_PER_NODE} State=UNKNOWN")
        lines.append(f"PartitionName={PARTITION} Nodes={','.join(NODES)} Default=YES MaxTime=60 State=UP")
        self.conf.write_text("\n".join(lines) + "\n")
        (self.root / "etc" / "gres.conf").write_text("\n".join(gres_lines) + "\n")

    def _spawn(self, name: str, argv: list[str]) -> None:
        log = open(self.root / "log" / f"{name}.stdout", "ab")
        self.procs[name] = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                            env=self.env, start_new_session=True)
        log.close()

    def run(self, *argv: str, check: bool = True, timeout: float = 60) -> subprocess.CompletedProcess:
        return subprocess.run(list(argv), env=self.env, capture_output=True, text=True, check=check, timeout=timeout)

    def start(self, timeout_s: float = 60) -> None:
        self.write_config()
        self._spawn("slurmctld", ["slurmctld", "-D", "-i", "-f", str(self.conf)])
        self._wait(lambda: self.run("scontrol", "ping", check=False).stdout.count("UP") > 0, timeout_s, "slurmctld")
        for node in NODES:
            self._spawn(f"slurmd-{node}", ["slurmd", "-D", "-N", node, "-f", str(self.conf)])
        self._wait(self._nodes_idle, timeout_s, "slurmd n1/n2 idle")

    def _nodes_idle(self) -> bool:
        out = self.run("sinfo", "-h", "-N", "-o", "%N %t", check=False).stdout.split("\n")
        states = dict(line.split() for line in out if line.strip())
        return all(states.get(n, "").startswith("idle") for n in NODES)

    def _wait(self, ready, timeout_s: float, what: str) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            dead = [n for n, p in self.procs.items() if p.poll() is not None]
            if dead:
                raise RuntimeError(f"{', '.join(dead)} exited while waiting for {what}:\n{self.logs()}")
            if ready():
                return
            time.sleep(0.3)
        raise TimeoutError(f"waited {timeout_s:.0f} s for {what}:\n{self.logs()}")

    def logs(self, lines: int = 25) -> str:
        """The daemons' last lines (without the harmless PMIx plugin noise), for failure messages."""
        parts = []
        for path in sorted((self.root / "log").glob("*.log")):
            kept = [line for line in path.read_text(errors="replace").splitlines() if "pmix" not in line.lower()]
            parts.append(f"--- {path.name}\n" + "\n".join(kept[-lines:]))
        return "\n".join(parts)

    def stop(self) -> None:
        """Cancel what still runs (slurmstepd outlives its slurmd), then TERM every daemon we started, by PID."""
        if self.procs.get("slurmctld") and self.procs["slurmctld"].poll() is None:
            pending = self.run("squeue", "-h", "-o", "%i", check=False).stdout.split()
            if pending:
                self.run("scancel", *pending, check=False)
                deadline = time.monotonic() + 15
                while self.run("squeue", "-h", check=False).stdout.strip() and time.monotonic() < deadline:
                    time.sleep(0.5)
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 20
        for proc in self.procs.values():
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=5)
        self.procs.clear()

    def wait_job(self, job_id: str, timeout_s: float = 300, states=("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT",
                                                                    "NODE_FAIL", "OUT_OF_MEMORY")) -> str:
        """Poll `scontrol show job` until the job reaches one of `states`; returns that state."""
        deadline = time.monotonic() + timeout_s
        state = "?"
        while time.monotonic() < deadline:
            state = self.job_state(job_id)
            if state in states:
                return state
            time.sleep(0.5)
        raise TimeoutError(f"job {job_id} still {state} after {timeout_s:.0f} s:\n{self.logs()}")

    def job_state(self, job_id: str) -> str:
        out = self.run("scontrol", "show", "job", "-o", job_id, check=False).stdout
        for token in out.split():
            if token.startswith("JobState="):
                return token.split("=", 1)[1]
        return "UNKNOWN"


def require_slurm() -> None:
    """Skip without SLURM unless root, who installs it the way `make slurm-deps` does."""
    import pytest

    if slurm_available():
        return
    if os.geteuid() != 0:
        pytest.skip("slurmctld is not installed and we are not root (`make slurm-deps` installs it as root)")
    subprocess.run("apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq slurm-wlm",
                   shell=True, check=False, timeout=900, capture_output=True)
    if not slurm_available():
        pytest.fail("we are root but slurm-wlm did not install (see `make slurm-deps`)")


def running_cluster() -> Iterator[SlurmCluster]:
    """A started private cluster for a test module's fixture; stopped and removed afterwards."""
    require_slurm()
    root = Path(tempfile.mkdtemp(prefix="hpcmem-slurm-"))   # no spaces: slurm.conf paths are not quoted
    c = SlurmCluster(root)
    try:
        c.start()
        yield c
    finally:
        c.stop()
        shutil.rmtree(root, ignore_errors=True)
