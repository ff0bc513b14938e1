"""`hpcmem calibrate` on a real SLURM 22.05 (the slurm tier's private cluster), rehearsed on CPU with tiny models.

One campaign: a job array of three single-GPU cases (two from the generated matrix, one of the site's that fails on
purpose: flash-attention is not installed here), a 2-node ZeRO-3 case as its own job (one rank per node, gloo), and
the collect job after all of them (afterany). While the array runs, one task is requeued with `scontrol requeue`
and must finish; the failing case is retried once and then recorded as failed with its reason. Collect fits and
installs into a temporary $HPCMEM_DATA; an estimate on the preset then names the campaign. Running the same command
again submits nothing.

A second, faster test pins the retry's aim: the array task that fails is the one whose SLURM_JOB_ID is the array's own
id, and its retry must restart it alone, not its siblings.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from hpcmem.calibrate.scripts import RETRY, Job, render_job
from hpcmem.launch.presets import load as load_preset
from tests.slurm import jobs
from tests.slurm.cluster import PARTITION, SlurmCluster, running_cluster

pytestmark = [pytest.mark.slurm, pytest.mark.torch, pytest.mark.slow]

CASES = "sft-q05-full+gc-20,sft-qwen05-lora,zero3-2node-x2-l1b,site-*"
REQUEUED = "sft-qwen05-lora"
FAILING = "site-no-flash-attn"


@pytest.fixture(scope="module")
def cluster():
    yield from running_cluster()


def _site(tmp: Path) -> dict:
    preset = {"description": "campaign rehearsal: 2 nodes × 1 fake GPU", "partition": PARTITION,
              "gpu": {"name": "TestGPU", "memory_gb": 4, "usable_gb": 3.5, "compute_capability": "8.9",
                      "bf16_tflops": 100},
              "gpus_per_node": 1, "cpus_per_node": 2, "max_time": "00:30:00", "max_nodes": 2, "max_array_size": 10,
              "setup": [f"export PATH={shlex.quote(str(Path(sys.executable).parent))}:\"$PATH\""],
              "env": {"OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
                      "HF_HOME": str(tmp / "hf-home")}}
    (tmp / "testcal.yaml").write_text(yaml.safe_dump(preset, sort_keys=False))
    cases = [{"name": FAILING, "trainer": "sft", "model": "Qwen/Qwen2.5-0.5B",
              "flags": {"attn_implementation": "flash_attention_2", "max_length": 32,
                        "per_device_train_batch_size": 2}}]
    (tmp / "cases.yaml").write_text(yaml.safe_dump(cases, sort_keys=False))
    return {"HPCMEM_DATA": str(tmp / "site-data")}


def _hpcmem(cluster: SlurmCluster, env: dict, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    # DeepSpeed's CPU ranks JIT-build a shared-memory op on first use (minutes on a loaded 2-core machine), and
    # rebuild it whenever the compile command differs, as it does between SLURM's task environment and a shell: the
    # jobs get their own cache next to the Makefile's, so neither evicts the other's build
    ext = str(Path(os.environ.get("TORCH_EXTENSIONS_DIR") or jobs.ROOT / ".torch_extensions") / "slurm-jobs")
    full = {**cluster.env, **env, "PYTHONPATH": str(jobs.ROOT), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
            "TORCH_EXTENSIONS_DIR": ext}
    done = subprocess.run([sys.executable, "-m", "hpcmem", *args], env=full, capture_output=True, text=True,
                          timeout=300)
    if check and done.returncode != 0:
        raise AssertionError(f"hpcmem {' '.join(args)} failed ({done.returncode}):\n{done.stdout}\n{done.stderr}")
    return done


def _array_ids(cluster: SlurmCluster, job_id: str) -> tuple[set[int], set[str]]:
    """The task ids SLURM lists for an array (pending ranges and running tasks) and its throttles."""
    out = cluster.run("scontrol", "show", "job", "-o", job_id, check=False).stdout
    ids, throttles = set(), set(re.findall(r"ArrayTaskThrottle=(\d+)", out))
    for spec in re.findall(r"ArrayTaskId=(\S+)", out):
        for part in spec.split("%")[0].split(","):
            lo, _, hi = part.partition("-")
            ids |= set(range(int(lo), int(hi or lo) + 1))
    return ids, throttles


def test_a_campaign_runs_retries_collects_and_installs(cluster, tmp_path):
    env = _site(tmp_path)
    camp_dir = tmp_path / "campaign"
    args = ("calibrate", "--preset", str(tmp_path / "testcal.yaml"), "--device", "cpu", "--tiny", "--steps", "2",
            "--max-parallel", "2", "--only", CASES, "--cases", str(tmp_path / "cases.yaml"), "--campaign",
            str(camp_dir), "--site", "rehearsal-cluster", "--install-dir", env["HPCMEM_DATA"], "--json")
    first = json.loads(_hpcmem(cluster, env, *args).stdout)
    kinds = {s["kind"]: s for s in first["submitted"]}
    assert set(kinds) == {"array", "multi", "collect"} and len(first["submitted"]) == 3, first["submitted"]
    array = next(j for j in first["jobs"] if j["kind"] == "array")
    assert sorted(array["cases"]) == sorted(["sft-q05-full+gc-20", REQUEUED, FAILING])
    assert "#SBATCH --array=0-2%2" in array["script"]
    ids, throttles = _array_ids(cluster, kinds["array"]["job_id"])
    assert ids == {0, 1, 2} and throttles == {"2"}, (ids, throttles)
    multi = next(j for j in first["jobs"] if j["kind"] == "multi")
    assert multi["cases"] == ["zero3-2node-x2-l1b"] and multi["nodes"] == 2

    # requeue the chosen task while its probe runs: it restarts (SLURM_RESTART_COUNT 1) and finishes
    task = f"{kinds['array']['job_id']}_{array['cases'].index(REQUEUED)}"
    log = camp_dir / "logs" / "tasks" / f"{REQUEUED}.log"
    jobs.wait_for(lambda: log.is_file() and cluster.job_state(task) == "RUNNING", 240, f"{task} running", cluster)
    cluster.run("scontrol", "requeue", task)
    # read the restart count now: slurmctld forgets a finished job MinJobAge (300 s) after it ends, and the collect
    # job can end later than that after this task under load (the 2-node case JIT-builds DeepSpeed's op first)
    jobs.wait_for(lambda: "Restarts=1" in cluster.run("scontrol", "show", "job", "-o", task, check=False).stdout, 30,
                  f"{task} Restarts=1", cluster)
    state = cluster.wait_job(kinds["collect"]["job_id"], timeout_s=420)
    logs = "\n".join(p.read_text(errors="replace") for p in sorted((camp_dir / "logs").rglob("*.log")))
    assert state == "COMPLETED", logs[-6000:]
    assert log.read_text().count("==== ") == 2, log.read_text()[-3000:]        # killed once, run again

    status = json.loads(_hpcmem(cluster, env, "calibrate", "--status", str(camp_dir), "--json").stdout)
    assert status["cases"][REQUEUED] == "recorded" and status["cases"]["sft-q05-full+gc-20"] == "recorded"
    assert status["cases"]["zero3-2node-x2-l1b"] == "recorded"
    assert status["cases"][FAILING].startswith("failed:") and "FlashAttention2" in status["cases"][FAILING]
    failed = json.loads((camp_dir / "status" / f"{FAILING}.json").read_text())
    assert [a["restart"] for a in failed["attempts"]] == [0, 1] and failed["state"] == "failed"

    from hpcmem.record import read_records

    records = {r.case: r for r in read_records(camp_dir / "records" / "testgpu.jsonl")}
    assert set(records) == {"sft-q05-full+gc-20", REQUEUED, "zero3-2node-x2-l1b"}
    zero3 = records["zero3-2node-x2-l1b"]
    assert zero3.job["parallel"]["zero_stage"] == 3 and [r.rank for r in zero3.measured.ranks] == [0, 1]
    assert zero3.status == "ok" and all(r.peak_allocated_bytes and r.step_times_s for r in zero3.measured.ranks)
    assert all(r.campaign == "campaign" for r in records.values())

    cal = json.loads((Path(env["HPCMEM_DATA"]) / "calibrations" / "testgpu.json").read_text())
    assert cal["campaign"]["site"] == "rehearsal-cluster" and cal["campaign"]["n"] == 3
    assert cal["campaign"]["cases"] == {"planned": 4, "done": 3, "failed": 1, "missing": []}
    assert (camp_dir / "report" / "report.md").is_file() and (camp_dir / "report" / "accuracy.png").is_file()

    est = json.loads(_hpcmem(cluster, env, "estimate", "sft", "--model_name_or_path", "Qwen/Qwen2.5-0.5B",
                             "--preset", str(tmp_path / "testcal.yaml"), "--json").stdout)
    named = est["verdict"]["calibration"]["campaign"]
    assert (named["name"], named["site"], named["n"], named["device"]) == ("campaign", "rehearsal-cluster", 3, "cpu")

    again = json.loads(_hpcmem(cluster, env, *args).stdout)        # a finished campaign: nothing new
    assert again["submitted"] == [] and again["jobs"] == []
    assert cluster.run("squeue", "-h").stdout.strip() == ""


# Stands in for `hpcmem` in the array's script: the script, its retry and SLURM are real; what a case does is not
# under test here. Every start is logged as "index restart job-id array-id"; task 2 fails its first attempt.
_STUB = """#!/bin/bash
[[ ${1:-} == --version ]] && exit 0
index="" stage=""
while (( $# )); do
  case $1 in --index) index=$2; shift;; --stage) stage=$2; shift;; esac
  shift
done
echo "$index ${SLURM_RESTART_COUNT:-0} $SLURM_JOB_ID $SLURM_ARRAY_JOB_ID $stage" >> STARTS
[[ -n $stage ]] && exit 1
case $index in
  0) exit 0;;
  1) sleep 25; exit 0;;
  2) (( ${SLURM_RESTART_COUNT:-0} == 0 )) && exit RETRY; exit 0;;
esac
"""


def test_a_retry_requeues_its_own_array_task_only(cluster, tmp_path):
    """The last task SLURM starts from an array holds the array's id as its SLURM_JOB_ID, and `scontrol requeue` on
    that id requeues every task of the array (job_array.html): a failed case's retry then restarted cases that were
    running or done. Here task 2 is that task, fails once while task 1 runs, and only task 2 runs again."""
    _site(tmp_path)
    starts = tmp_path / "starts.log"
    stub = tmp_path / "fake-hpcmem"
    stub.write_text(_STUB.replace("STARTS", shlex.quote(str(starts))).replace("RETRY", str(RETRY)))
    stub.chmod(0o755)
    job = Job(group="g0", kind="array", cases=("a", "b", "c"), gpus=1, max_parallel=2)
    script = render_job(job, load_preset(tmp_path / "testcal.yaml"), campaign_dir=str(tmp_path / "campaign"),
                        campaign_name="aim", time="00:10:00", command=(str(stub),))
    (tmp_path / "campaign" / "logs").mkdir(parents=True)
    (tmp_path / "array.sh").write_text(script)
    array_id = cluster.run("sbatch", "--parsable", str(tmp_path / "array.sh")).stdout.strip().split(";")[0]
    for index in range(3):
        assert cluster.wait_job(f"{array_id}_{index}", timeout_s=180) == "COMPLETED", cluster.logs()
    rows = [line.split() for line in starts.read_text().splitlines()]
    by_task = {i: [r for r in rows if r[0] == str(i)] for i in range(3)}
    assert [r[2] for r in by_task[2]] == [array_id, array_id], rows       # task 2 carries the array's id
    assert [r[1] for r in by_task[2]] == ["0", "1"], rows                 # failed once, retried once
    assert [r[1] for r in by_task[0]] == ["0"] and [r[1] for r in by_task[1]] == ["0"], rows   # siblings left alone
