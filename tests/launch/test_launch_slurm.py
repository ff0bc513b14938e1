"""The slurm tier: hpcmem's scripts on a real SLURM 22.05 (slurmctld + slurmd n1/n2 on 127.0.0.1, fake GPUs).

Run: `pytest -m slurm tests/launch/test_launch_slurm.py` (root; `make slurm-deps` installs slurm-wlm). Skipped only when
slurmctld is missing AND we are not root; as root a missing SLURM is installed the way `make slurm-deps` does.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.slurm import jobs
from tests.slurm.cluster import SlurmCluster, running_cluster

pytestmark = [pytest.mark.slurm, pytest.mark.torch, pytest.mark.slow]


@pytest.fixture(scope="module")
def cluster():
    yield from running_cluster()


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from tests.slurm.tiny import write_dataset, write_model

    root = tmp_path_factory.mktemp("tiny")
    write_model(root / "model")
    write_dataset(root / "data")
    return root


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    folder = tmp_path_factory.mktemp("presets")
    jobs.write_preset(folder)
    return folder


def _runner(cluster: SlurmCluster):
    return lambda argv: subprocess.run(argv, env=cluster.env, capture_output=True, text=True, timeout=60)


def _prepare(site: Path, tiny: Path, tmp: Path, trainer: str = "sft", preset: str = "testcluster", **flags):
    from hpcmem.cli.options import job_from_cli
    from hpcmem.launch import LaunchOptions, load_preset, prepare
    from hpcmem.launch import runfolder

    pre = load_preset(site / f"{preset}.yaml")
    vllm = flags.pop("vllm_placement", "node")
    fields = {"model_name_or_path": str(tiny / "model"), "dataset_name": str(tiny / "data"), "use_cpu": True}
    job, _ = job_from_cli(trainer, {"model_name_or_path": str(tiny / "model"), **flags}, preset={"gpu": pre.gpu})
    prepared = prepare(job, pre, LaunchOptions(trl_fields=fields, vllm_placement=vllm, requeue=True),
                       runs_root=tmp / "runs")
    runfolder.write(Path(prepared.files.run_dir), prepared.contents)
    return prepared


@pytest.mark.parametrize("case", [
    pytest.param({}, id="single-node"),
    pytest.param({"num_machines": 2, "num_processes": 4}, id="multi-node"),
    pytest.param({"trainer": "grpo", "use_vllm": True, "vllm_mode": "server", "per_device_train_batch_size": 8},
                 id="vllm-node"),
    pytest.param({"trainer": "grpo", "use_vllm": True, "vllm_mode": "server", "per_device_train_batch_size": 8,
                  "vllm_placement": "split"}, id="vllm-split"),
    pytest.param({"num_machines": 2, "num_processes": 2, "distributed_type": "DEEPSPEED", "zero_stage": 3},
                 id="zero3-multi-node"),
])
def test_sbatch_test_only_accepts_generated_scripts(cluster, site, tiny, tmp_path, case):
    from hpcmem.launch.backends import Sbatch

    prepared = _prepare(site, tiny, tmp_path, **case)
    said = Sbatch(runner=_runner(cluster)).test_only(prepared)
    assert re.search(r"Job \d+ to start at .* on nodes", said), said


def test_oversized_request_is_rejected_with_a_clear_hpcmem_error(cluster, site, tiny, tmp_path):
    from hpcmem.launch.backends import Sbatch, SubmitError

    jobs.write_preset(site, name="claims4gpus", gpus_per_node=4)
    prepared = _prepare(site, tiny, tmp_path, preset="claims4gpus", num_processes=4)
    with pytest.raises(SubmitError) as err:
        Sbatch(runner=_runner(cluster)).submit(prepared)
    text = str(err.value)
    assert "sbatch --test-only rejected the job" in text
    assert "Requested node configuration is not available" in text
    assert "1 node(s) × 4 GPU(s)" in text and "hpcmem presets check claims4gpus" in text
    assert cluster.run("squeue", "-h").stdout.strip() == ""        # nothing was queued


def test_presets_check_against_the_cluster(cluster, site):
    from hpcmem.launch.preset_check import check
    from hpcmem.launch.presets import load

    good = check(load(site / "testcluster.yaml"), runner=_runner(cluster))
    assert all(c.ok for c in good), good
    jobs.write_preset(site, name="wrong", gpus_per_node=4, cpus_per_node=64, max_time="2-00:00:00")
    bad = {c.what.split()[0]: c for c in check(load(site / "wrong.yaml"), runner=_runner(cluster)) if not c.ok}
    assert set(bad) == {"gpus_per_node", "cpus_per_node", "max_time"}, bad
    assert bad["max_time"].cluster == "01:00:00"


def test_two_node_sft_runs_end_to_end(cluster, site, tiny, tmp_path):
    """The generated multi-node script + accelerate launch (torchrun, c10d, gloo on CPU): two ranks, loss, model."""
    trl_yaml = jobs.write_trl_yaml(tmp_path / "sft.yaml", tiny, tmp_path / "out")
    done = jobs.hpcmem_submit(cluster, "sft", "--config", str(trl_yaml), "--preset", str(site / "testcluster.yaml"),
                              "--num_machines", "2", "--num_processes", "2", "--entry", str(jobs.ENTRY),
                              "--job-name", "e2e", cwd=tmp_path)
    info = jobs.submitted(done)
    state = cluster.wait_job(info["job_id"], timeout_s=240)
    logs = jobs.run_logs(info["run_dir"])
    assert state == "COMPLETED", logs
    idents = [json.loads(m) for m in re.findall(r"hpcmem-test identity (\{.*\})", logs)]
    # c10d numbers the nodes itself (torch dynamic_rendezvous: sorted by host, then pid), so rank 0 may be on
    # either node; what matters is two distinct ranks, one per SLURM node, in one world.
    assert sorted(i["SLURM_NODEID"] for i in idents) == ["0", "1"], logs
    assert sorted(i["RANK"] for i in idents) == ["0", "1"] and all(i["GROUP_RANK"] == i["RANK"] for i in idents), logs
    assert {i["WORLD_SIZE"] for i in idents} == {"2"} and len({i["MASTER_PORT"] for i in idents}) == 1
    assert len(re.findall(r"'loss': '?[0-9.]+", logs)) >= 6, logs
    assert (tmp_path / "out" / "model.safetensors").is_file() and (tmp_path / "out" / "checkpoint-6").is_dir()
    env = {**cluster.env, "PYTHONPATH": str(jobs.ROOT)}
    status = subprocess.run([sys.executable, "-m", "hpcmem", "status", info["run_dir"], "--json"], env=env,
                            capture_output=True, text=True)
    st = json.loads(status.stdout)
    assert (st["state"], st["source"], st["JobName"]) == ("COMPLETED", "scontrol", "e2e"), status.stderr
    assert [Path(c).name for c in st["checkpoints"]] == ["checkpoint-3", "checkpoint-6"]
    tail = subprocess.run([sys.executable, "-m", "hpcmem", "logs", info["run_dir"], "-n", "3"], env=env,
                          capture_output=True, text=True)
    assert "node0.log <==" in tail.stdout and "node1.log <==" in tail.stdout and "batch-" in tail.stdout


def test_requeue_resumes_from_its_own_newest_checkpoint(cluster, site, tiny, tmp_path):
    """USR1 to the batch shell → scontrol requeue → restart resumes from checkpoint-K; steps continue at K+1.

    output_dir already holds another run's complete checkpoint-5000: submit refuses it until --reuse-output-dir, and
    the restart resumes from this run's own checkpoint-K, not from the higher-numbered foreign one."""
    out = tmp_path / "out"
    foreign = out / "checkpoint-5000"
    foreign.mkdir(parents=True)
    (foreign / "trainer_state.json").write_text(json.dumps({"global_step": 5000, "log_history": []}))
    trl_yaml = jobs.write_trl_yaml(tmp_path / "sft.yaml", tiny, out, max_steps=16, save_steps=4)
    args = ("sft", "--config", str(trl_yaml), "--preset", str(site / "testcluster.yaml"), "--num_machines", "2",
            "--num_processes", "2", "--entry", str(jobs.ENTRY), "--requeue", "--time", "10", "--env",
            "HPCMEM_TEST_STEP_SLEEP=0.6")
    refused = jobs.hpcmem_submit(cluster, *args, cwd=tmp_path, check=False)
    assert refused.returncode == 2 and "already holds checkpoint-5000 from another run" in refused.stderr, refused
    done = jobs.hpcmem_submit(cluster, *args, "--reuse-output-dir", cwd=tmp_path)
    info = jobs.submitted(done)
    jobs.wait_for(lambda: (out / "checkpoint-4" / "trainer_state.json").is_file(), 180, "checkpoint-4", cluster)
    cluster.run("scancel", "--batch", "--signal=USR1", info["job_id"])
    state = cluster.wait_job(info["job_id"], timeout_s=300)
    logs = jobs.run_logs(info["run_dir"])
    assert state == "COMPLETED", logs
    assert "requeueing job" in logs and "Restarts=1" in cluster.run("scontrol", "show", "job", info["job_id"]).stdout
    resumed = re.search(r"restart 1 of job \d+; resuming from (\S+/checkpoint-(\d+))", logs)
    assert resumed, logs
    k = int(resumed.group(2))
    assert 4 <= k < 16
    # Rank 0 (whichever node c10d made it) logs each step; count its loss lines after the restart's identity line.
    node_logs = [p.read_text() for p in (Path(info["run_dir"]) / "logs").glob("node*.log")]
    second_run = "".join(text.split("hpcmem-test identity")[-1] for text in node_logs)
    assert len(re.findall(r"'loss': '?[0-9.]+", second_run)) == 16 - k, second_run
    final = json.loads((out / "checkpoint-16" / "trainer_state.json").read_text())
    assert final["global_step"] == 16
    assert [e["step"] for e in final["log_history"] if "loss" in e] == list(range(1, 17))


def test_time_limits_mean_to_slurm_what_hpcmem_reads(cluster):
    """Real sbatch/slurmctld 22.05 against hpcmem.launch.slurm_time: the limit a held job gets (scontrol's TimeLimit)
    is the one hpcmem computed, in every format; what hpcmem refuses, sbatch refuses too."""
    from hpcmem.launch import slurm_time
    from hpcmem.launch.monitor import parse_scontrol

    for text in ("30", "5:30", "0:59", "1:2:3", "1-2", "1-02:30", "1-2:3:4", "5-", "0", "-0", "-1", "UNLIMITED",
                 "infinite"):
        done = cluster.run("sbatch", "--parsable", "--hold", f"--time={text}", "--output=/dev/null", "--wrap=true",
                           check=False)
        assert done.returncode == 0, (text, done.stderr)
        job_id = done.stdout.strip().split(";")[0]
        applied = parse_scontrol(cluster.run("scontrol", "show", "job", "-o", job_id).stdout)["TimeLimit"]
        cluster.run("scancel", job_id)
        assert slurm_time.parse(applied).minutes == slurm_time.parse(text).minutes, (text, applied)
    for text in ("0-0:-5", "1:2:3:4", "1--5", "garbage", "5:"):
        refused = cluster.run("sbatch", "--test-only", f"--time={text}", "--wrap=true", check=False)
        assert refused.returncode != 0 and "Invalid --time" in refused.stderr, (text, refused.stderr)
        with pytest.raises(ValueError):
            slurm_time.parse(text)


HOSTILE = "$(touch pwned) `touch pwned` 'single' \"double\" ; touch pwned & \\ 100%"


def test_hostile_names_paths_and_values_stay_data(cluster, site, tiny, tmp_path):
    """A job name, working directory, run folder and env value full of shell syntax: values intact, nothing run.

    The run folder has no backslash: SLURM drops backslashes from --output paths, and hpcmem refuses such a folder.
    """
    weird = tmp_path / f"work dir {HOSTILE}"
    runs = tmp_path / "runs 100% $(touch pwned) 'q' \"d\" ; touch pwned &"
    weird.mkdir()
    echo = tmp_path / "echo.json"
    value = f"{HOSTILE} $(touch {tmp_path}/pwned)\nsecond line\ttab $HOME"
    trl_yaml = jobs.write_trl_yaml(weird / "sft.yaml", tiny, weird / "out")
    done = jobs.hpcmem_submit(cluster, "sft", "--config", str(trl_yaml), "--preset", str(site / "testcluster.yaml"),
                              "--entry", str(jobs.ENTRY), "--job-name", HOSTILE, "--runs-dir", str(runs),
                              "--env", f"HPCMEM_TEST_VALUE={value}", "--env", f"HPCMEM_TEST_ECHO_FILE={echo}",
                              cwd=weird)
    info = jobs.submitted(done)
    state = cluster.wait_job(info["job_id"], timeout_s=120)
    assert state == "COMPLETED", jobs.run_logs(info["run_dir"]) + cluster.logs()
    seen = json.loads(echo.read_text())
    assert (seen["value"], seen["job_name"], seen["cwd"]) == (value, HOSTILE, str(weird))
    assert not list(tmp_path.rglob("pwned")) and not Path("pwned").exists()
    assert list((Path(info["run_dir"]) / "logs").glob("batch-*.log")), "the % in the path was not escaped"
    assert str(runs) in info["run_dir"]


STUB_TRL = """#!/bin/sh
# stands in for `trl vllm-serve`: reports where it runs and with which GPUs, then serves until killed
printf '{"node": "%s", "gpus": "%s", "argv": "%s"}' "$SLURMD_NODENAME" "$CUDA_VISIBLE_DEVICES" "$*" > "$HPCMEM_TEST_VLLM_FILE"
exec sleep 120
"""


@pytest.mark.parametrize("placement", ["node", "split"])
def test_vllm_server_placement_on_real_nodes(cluster, site, tiny, tmp_path, placement):
    """GRPO with vllm_mode server: the server step lands on the last node (or GPU 0 of the one node), the trainer
    on the others (GPU 1), and the trainer is handed --vllm_server_host with the server's NodeAddr."""
    stub = tmp_path / "bin"
    stub.mkdir()
    (stub / "trl").write_text(STUB_TRL)
    (stub / "trl").chmod(0o755)
    venv = jobs.yaml.safe_load((site / "testcluster.yaml").read_text())["setup"]
    jobs.write_preset(site, name="withstub", setup=[*venv, f"export PATH={stub}:\"$PATH\""])   # stub trl first
    grpo = jobs.write_trl_yaml(tmp_path / "grpo.yaml", tiny, tmp_path / "out", max_length=None)
    echo, served = tmp_path / "trainer.json", tmp_path / "server.json"
    done = jobs.hpcmem_submit(cluster, "grpo", "--config", str(grpo), "--preset", str(site / "withstub.yaml"),
                              "--use_vllm", "true", "--vllm_mode", "server", "--per_device_train_batch_size", "8",
                              "--vllm-placement", placement, "--entry", str(jobs.ENTRY),
                              "--env", f"HPCMEM_TEST_ECHO_FILE={echo}", "--env", f"HPCMEM_TEST_VLLM_FILE={served}",
                              cwd=tmp_path)
    info = jobs.submitted(done)
    state = cluster.wait_job(info["job_id"], timeout_s=120)
    assert state == "COMPLETED", jobs.run_logs(info["run_dir"]) + cluster.logs()
    trainer, server = json.loads(echo.read_text()), json.loads(served.read_text())
    assert trainer["argv"][trainer["argv"].index("--vllm_server_host") + 1] == "127.0.0.1"
    assert "--server_ip" not in trainer["argv"] and "vllm-serve --model" in server["argv"]
    if placement == "node":
        assert (trainer["node"], server["node"]) == ("n1", "n2")
    else:
        assert trainer["node"] == server["node"] and (server["gpus"], trainer["gpus"]) == ("0", "1")


def test_submitit_backend_runs_the_same_launcher(cluster, site, tiny, tmp_path, monkeypatch):
    """hpcmem.launch.submit(..., backend="submitit") returns a submitit Job; both tasks see their own node id."""
    from hpcmem.cli.options import job_from_cli
    from hpcmem.launch import LaunchOptions, load_preset, submit

    monkeypatch.setenv("SLURM_CONF", cluster.env["SLURM_CONF"])
    monkeypatch.chdir(tmp_path)
    pre = load_preset(site / "testcluster.yaml")
    echo = tmp_path / "echo.json"
    job, _ = job_from_cli("sft", {"model_name_or_path": str(tiny / "model"), "num_machines": 2, "num_processes": 2},
                          preset={"gpu": pre.gpu})
    options = LaunchOptions(trl_fields={"model_name_or_path": str(tiny / "model"), "use_cpu": True},
                            entry=str(jobs.ENTRY), env={"HPCMEM_TEST_ECHO_FILE": str(echo)})
    handle = submit(job, pre, options, backend="submitit", runs_root=tmp_path / "runs")
    outputs = handle.results() if hasattr(handle, "results") else [handle.result()]
    text = "\n".join(str(o) for o in outputs)
    idents = [json.loads(m) for m in re.findall(r"hpcmem-test identity (\{.*\})", text)]
    assert sorted(i["SLURM_NODEID"] for i in idents) == ["0", "1"], text
