"""Launch, fast tier (no torch, no SLURM): presets, pure renderers, quoting, run folder, backends with a recorder."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from hpcmem.errors import HpcmemError, SpecError
from hpcmem.job.trainers import MODEL_CONFIG_FIELDS, REGISTRY
from hpcmem.launch import presets
from hpcmem.launch.configs import accelerate_config, deepspeed_config
from hpcmem.launch.sbatch import environment, render_sbatch
from hpcmem.launch.trl_yaml import HPCMEM_ONLY, trl_config
from tests.helpers.launch_helpers import Recorder, files, job, launch, preset

# ---- pure renderers -------------------------------------------------------------------------------------------

def test_accelerate_config_multi_node_is_c10d_with_an_endpoint():
    cfg = accelerate_config(job(num_machines=2, num_processes=16))
    assert cfg["distributed_type"] == "MULTI_GPU" and cfg["num_machines"] == 2 and cfg["num_processes"] == 16
    # same_network false is what makes accelerate pass --rdzv_endpoint (c10d ignores master_addr/port)
    assert cfg["rdzv_backend"] == "c10d" and cfg["same_network"] is False
    assert "machine_rank" not in cfg and "main_process_ip" not in cfg      # per task, on the launcher's command line
    assert cfg["mixed_precision"] == "bf16"


def test_accelerate_config_single_node_is_static_and_fp16_maps():
    cfg = accelerate_config(job(num_processes=4, bf16=False, fp16=True))
    assert (cfg["rdzv_backend"], cfg["same_network"], cfg["mixed_precision"]) == ("static", True, "fp16")
    assert accelerate_config(job())["distributed_type"] == "NO"


def test_deepspeed_config_lives_in_its_file():
    j = job(num_processes=8, distributed_type="DEEPSPEED", zero_stage=3, offload_optimizer_device="cpu",
            offload_param_device="cpu")
    cfg = accelerate_config(j, deepspeed_config_file="/r/deepspeed.json")
    assert cfg["deepspeed_config"] == {"deepspeed_config_file": "/r/deepspeed.json",
                                       "deepspeed_multinode_launcher": "standard", "zero3_init_flag": True}
    assert "mixed_precision" not in cfg            # accelerate refuses it next to a deepspeed_config_file
    ds = deepspeed_config(j)
    zero = ds["zero_optimization"]
    assert zero["stage"] == 3 and zero["offload_optimizer"]["device"] == "cpu" and zero["offload_param"]["device"] == "cpu"
    assert zero["stage3_gather_16bit_weights_on_model_save"] is True and zero["reduce_bucket_size"] == "auto"
    assert ds["bf16"] == {"enabled": True} and ds["train_micro_batch_size_per_gpu"] == "auto"
    with pytest.raises(ValueError):
        accelerate_config(j)


def test_fsdp_blocks():
    two = accelerate_config(job(num_processes=8, distributed_type="FSDP", fsdp_offload_params=True))["fsdp_config"]
    assert two["fsdp_version"] == 2 and two["fsdp_offload_params"] is True and two["fsdp_reshard_after_forward"] is True
    one = accelerate_config(job(num_processes=8, distributed_type="FSDP", fsdp_version=1))["fsdp_config"]
    assert one["fsdp_reshard_after_forward"] == "FULL_SHARD" and one["fsdp_sync_module_states"] is True


def test_trl_yaml_keeps_user_fields_and_pins_chosen_spec_fields():
    user = {"model_name_or_path": "Qwen/Qwen2.5-0.5B", "learning_rate": 2e-4, "lora_target_modules": "all-linear",
            "per_device_train_batch_size": 8, "gpu": "H100-80GB", "accelerate_config": "zero3", "use_peft": True}
    j = job(use_peft=True, lora_target_modules=("all-linear",), per_device_train_batch_size=2, packing=True)
    out = trl_config(j, user, output_dir="/r/output")
    assert out["learning_rate"] == 2e-4 and out["lora_target_modules"] == "all-linear"
    assert out["per_device_train_batch_size"] == 2 and out["packing"] is True      # CLI beat the YAML
    assert "gpu" not in out and "accelerate_config" not in out and out["output_dir"] == "/r/output"
    assert "beta" not in out and "max_prompt_length" not in out                    # defaults are not written


def test_trl_yaml_writes_only_fields_the_trainer_declares():
    out = trl_config(job("dpo", max_length=2048, beta=0.2), {}, output_dir="o")
    assert out["beta"] == 0.2 and "packing" not in out and "num_generations" not in out
    out = trl_config(job("rloo"), {}, output_dir="o")
    assert out["num_generations"] == 2 and out["beta"] == 0.05 and "max_length" not in out


def test_one_name_per_setting_across_spec_trl_yaml_and_cli():
    from hpcmem.cli.options import spec_options
    from hpcmem.job.spec import ParallelSpec, TrainSpec, field_names

    spec = set(field_names(TrainSpec)) | set(field_names(ParallelSpec))
    written = set(MODEL_CONFIG_FIELDS).union(*(e.fields for e in REGISTRY.values()))
    assert written <= spec and set(HPCMEM_ONLY) - {"gpu", "accelerate_config", "lengths"} <= spec | {
        "expandable_segments", "tokens_per_micro_batch", "label_tokens_per_micro_batch"}     # JobSpec's own
    assert (set(field_names(TrainSpec)) - {"trainer"}) <= written | set(HPCMEM_ONLY)
    flags = {o.name for o in spec_options()}
    assert written <= flags and set(presets.default_keys()) <= flags | {"expandable_segments", "tokens_per_micro_batch",
                                                                          "label_tokens_per_micro_batch"}


# ---- the sbatch script ----------------------------------------------------------------------------------------

def _srun_line(script: str) -> list[str]:
    line = next(line for line in script.splitlines() if line.startswith("srun "))
    return shlex.split(line.rstrip(" &"))


def test_per_task_variables_expand_inside_each_task():
    lnch = launch(job(num_machines=4, num_processes=32))
    argv = _srun_line(render_sbatch(lnch, files(lnch)))
    assert argv[:7] == ["srun", "--nodes=4", "--ntasks=4", "--ntasks-per-node=1", "--kill-on-bad-exit=1",
                        "--wait=60", f"--output={lnch.run_dir}/logs/node%n.log"]
    body = argv[argv.index("-c") + 1]                          # the whole launcher is ONE quoted argument
    assert '--machine_rank "$SLURM_NODEID"' in body and '--main_process_ip "$MASTER_ADDR"' in body
    assert "--num_machines 4 --num_processes 32" in body and "--rdzv_backend c10d" in body
    assert '"is_host=$(( SLURM_NODEID == 0 ))"' in body and "--module trl.scripts.sft" in body
    assert not any("SLURM_NODEID" in a for a in argv[: argv.index("-c")])


def test_environment_and_directives():
    lnch = launch(job(num_processes=8, expandable_segments=True), requeue=True, env={"WANDB_PROJECT": "x y"})
    script = render_sbatch(lnch, files(lnch))
    for line in ("export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True",
                 "export PYTORCH_ALLOC_CONF=expandable_segments:True", "export TORCH_NCCL_ASYNC_ERROR_HANDLING=1",
                 "export SRUN_CPUS_PER_TASK=64", "export OMP_NUM_THREADS=8", "export HF_HUB_OFFLINE=1",
                 "export WANDB_PROJECT='x y'", "module load cuda/12.4", "source /shared/venvs/trl/bin/activate",
                 "#SBATCH --gres=gpu:8", "#SBATCH --signal=B:USR1@300", "#SBATCH --requeue", "#SBATCH --mem=500G",
                 "#SBATCH --account=ml", "#SBATCH --chdir=/home/user/project", "#SBATCH --open-mode=append",
                 "trap hpcmem_requeue USR1", "scontrol requeue \"$(hpcmem_this_job)\""):
        assert line in script, line
    names = [v.name for v in environment(lnch)]
    assert names.index("NCCL_SOCKET_IFNAME") > names.index("OMP_NUM_THREADS")   # the preset can override hpcmem


def test_an_allocator_setting_in_the_presets_env_is_the_only_one_exported():
    """torch 2.13 reads generic allocator keys from PYTORCH_ALLOC_CONF first and CUDA keys from PYTORCH_CUDA_ALLOC_CONF
    first: hpcmem adding its pair beside the preset's would split the settings, so the preset's stands alone."""
    from hpcmem.cli.options import job_from_cli

    site = preset(env={"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True,pinned_use_cuda_host_register:True"})
    built, _ = job_from_cli("sft", {"model_name_or_path": "Qwen/Qwen2.5-0.5B", "num_processes": 8},
                            preset={"gpu": "H100-80GB"}, env=site.env)
    assert built.expandable_segments is True
    lnch = launch(built, site)
    assert lnch.problems == []
    exported = [(v.name, v.value) for v in environment(lnch) if "ALLOC_CONF" in v.name]
    assert exported == [("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True,pinned_use_cuda_host_register:True")]


def test_a_job_estimated_without_its_environment_is_not_launched():
    lnch = launch(job(num_processes=8), preset(env={"NCCL_NVLS_ENABLE": "0"}))
    assert any("estimated without the environment" in p for p in lnch.problems), lnch.problems
    bad = launch(job(num_processes=8), preset(), env={"PYTORCH_ALLOC_CONF": "expandable_segments:on"})
    assert any("expandable_segments:on" in p for p in bad.problems), bad.problems


def test_gpus_per_node_form_and_typed_gres():
    lnch = launch(job(num_processes=4), preset(gpu_request="gpus_per_node", gres_type="h100"))
    assert "#SBATCH --gpus-per-node=h100:4" in render_sbatch(lnch, files(lnch))
    lnch = launch(job(num_processes=4), preset(gres_type="h100"))
    assert "#SBATCH --gres=gpu:h100:4" in render_sbatch(lnch, files(lnch))


def test_vllm_server_gets_vllm_server_host_not_server_ip():
    j = job("grpo", num_machines=2, num_processes=16, use_vllm=True, vllm_mode="server", vllm_tensor_parallel_size=2)
    lnch = launch(j)
    script = render_sbatch(lnch, files(lnch))
    assert lnch.nodes == 3 and "#SBATCH --nodes=3" in script
    assert "trl vllm-serve --model Qwen/Qwen2.5-0.5B --tensor_parallel_size 2" in script
    assert '--vllm_server_host "$VLLM_ADDR"' in script and "--server_ip" not in script
    assert '--exclude="$VLLM_NODE"' in script and '--nodelist="$VLLM_NODE"' in script
    split = launch(job("grpo", num_processes=6, use_vllm=True, vllm_mode="server", vllm_tensor_parallel_size=2,
                       per_device_train_batch_size=4), vllm_placement="split")
    text = render_sbatch(split, files(split))
    assert split.gpus_per_node == 8 and "#SBATCH --gres=gpu:8" in text and 'CUDA_VISIBLE_DEVICES="$TRAIN_GPUS"' in text


def test_launch_problems_are_gathered_with_numbers():
    lnch = launch(job(num_processes=16), preset(max_nodes=1), time="3-00:00:00", job_name="a\nb", requeue=True,
                  max_restarts=0)
    with pytest.raises(SpecError) as err:
        lnch.check()
    text = str(err.value)
    assert "16 GPUs per node requested (16 training processes per node), but site nodes have 8" in text
    assert "time 3-00:00:00 exceeds site's max_time 1-00:00:00" in text
    assert "job name must be text without control characters" in text and "max_restarts must be ≥ 1" in text
    bad = launch(job(num_processes=8))
    bad = type(bad)(job=bad.job, preset=bad.preset, options=bad.options, run_dir="/a\\b")
    with pytest.raises(SpecError, match="backslash"):
        bad.check()


def test_requeue_warns_when_nothing_can_resume():
    lnch = launch(job(), requeue=True, trl_fields={"save_strategy": "no", "save_only_model": True})
    assert len(lnch.warnings) == 2 and "save_strategy is 'no'" in lnch.warnings[0]
    assert launch(job(), requeue=True).warnings == []


HOSTILE = "$(touch {m}) `touch {m}` 'q' \"d\" ; touch {m} & \\ %\nline2"
STUBS = {
    # srun: run the command once per task, with that task's SLURM_NODEID/SLURM_PROCID (as srun does on each node)
    "srun": "import os, subprocess, sys\n"
            "args = sys.argv[1:]; n = int(next(a for a in args if a.startswith('--ntasks=')).split('=')[1])\n"
            "cmd = args[args.index('bash'):]\n"
            "sys.exit(max(subprocess.run(cmd, env={**os.environ, 'SLURM_NODEID': str(i), 'SLURM_PROCID': str(i),"
            " 'SLURM_NNODES': str(n)}).returncode for i in range(n)))\n",
    "scontrol": "import sys\nprint('n1\\nn2' if sys.argv[1:3] == ['show', 'hostnames'] else 'NodeName=n1 "
                "NodeAddr=10.1.2.3 NodeHostName=n1')\n",
    "accelerate": "import json, os, sys\nwith open(os.environ['STUB_OUT'], 'a') as fh:\n"
                  "    fh.write(json.dumps({'argv': sys.argv[1:], 'value': os.environ.get('HOSTILE_VALUE'),"
                  " 'master': os.environ['MASTER_ADDR']}) + '\\n')\n",
}


def test_the_script_runs_with_stub_slurm_and_keeps_values_data(tmp_path):
    """The whole script under bash with fake srun/scontrol/accelerate: one launcher per node, each with its own
    machine_rank; a hostile env value and job name arrive intact and nothing in them runs."""
    mark = tmp_path / "pwned"
    value = HOSTILE.format(m=mark)
    for name, code in STUBS.items():
        (tmp_path / name).write_text(f"#!{sys.executable}\n{code}")
        (tmp_path / name).chmod(0o755)
    lnch = launch(job(num_machines=2, num_processes=16), env={"HOSTILE_VALUE": value},
                  job_name=f"x $(touch {mark}) ;", workdir=str(tmp_path))
    script = render_sbatch(lnch, files(lnch)).replace("module load", ": module load").replace("source /", ": /")
    env = {"PATH": f"{tmp_path}:/usr/bin:/bin", "STUB_OUT": str(tmp_path / "calls.jsonl"), "SLURM_JOB_ID": "123",
           "SLURM_JOB_NODELIST": "n[1-2]"}
    done = subprocess.run(["bash", "-c", script], env=env, capture_output=True, text=True, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    calls = [json.loads(line) for line in (tmp_path / "calls.jsonl").read_text().splitlines()]
    ranks = sorted(c["argv"][c["argv"].index("--machine_rank") + 1] for c in calls)
    assert ranks == ["0", "1"] and {c["value"] for c in calls} == {value} and {c["master"] for c in calls} == {
        "10.1.2.3"}
    assert "--main_process_port" in calls[0]["argv"] and calls[0]["argv"][-2:] == ["--config", files(lnch).trl_config]
    assert not mark.exists()
    assert "hpcmem: job 123 on n1 n2; master 10.1.2.3:20123" in done.stdout


def test_a_restart_resumes_only_from_its_own_checkpoints(tmp_path):
    """Another run's newer-numbered checkpoint-5000 sits in output_dir: the first start marks the folder, the
    restart resumes from checkpoint-4 that this run wrote after its mark, never from checkpoint-5000."""
    import os

    for name, code in STUBS.items():
        (tmp_path / name).write_text(f"#!{sys.executable}\n{code}")
        (tmp_path / name).chmod(0o755)
    out = tmp_path / "out"
    (out / "checkpoint-5000").mkdir(parents=True)
    (out / "checkpoint-5000" / "trainer_state.json").write_text("{}")
    os.utime(out / "checkpoint-5000" / "trainer_state.json", (1, 1))
    lnch = launch(job(), requeue=True, workdir=str(tmp_path))
    script = render_sbatch(lnch, files(lnch, output_dir=str(out)))
    script = script.replace("module load", ": module load").replace("source /", ": /")
    env = {"PATH": f"{tmp_path}:/usr/bin:/bin", "STUB_OUT": str(tmp_path / "calls.jsonl"), "SLURM_JOB_ID": "77",
           "SLURM_JOB_NODELIST": "n1"}

    def resumed_from(restart: int) -> list[str]:
        (tmp_path / "calls.jsonl").unlink(missing_ok=True)
        done = subprocess.run(["bash", "-c", script], env={**env, "SLURM_RESTART_COUNT": str(restart)},
                              capture_output=True, text=True, cwd=tmp_path)
        assert done.returncode == 0, done.stderr
        argv = json.loads((tmp_path / "calls.jsonl").read_text().splitlines()[0])["argv"]
        return argv[argv.index("--resume_from_checkpoint") + 1:] if "--resume_from_checkpoint" in argv else []

    assert resumed_from(0) == [] and (out / ".hpcmem-run-77").is_file()
    assert resumed_from(1) == []                                   # only the other run's checkpoint: start over
    (out / "checkpoint-4").mkdir()
    (out / "checkpoint-4" / "trainer_state.json").write_text("{}")
    mark = (out / ".hpcmem-run-77").stat().st_mtime
    os.utime(out / "checkpoint-4" / "trainer_state.json", (mark + 5, mark + 5))
    assert resumed_from(1) == [str(out / "checkpoint-4")]


def test_submit_refuses_an_output_dir_with_another_runs_checkpoints(tmp_path):
    from hpcmem.launch import LaunchOptions, submit

    out = tmp_path / "shared-out"
    (out / "checkpoint-5000").mkdir(parents=True)
    (out / ".hpcmem-run-12").write_text("hpcmem run /old/run, job 12\n")
    options = LaunchOptions(workdir=str(tmp_path), trl_fields={"output_dir": "shared-out"})   # relative to workdir
    with pytest.raises(HpcmemError) as err:
        submit(job(), preset(), options, backend="dry-run", runs_root=tmp_path / "runs", estimator=_fake_estimator(1))
    text = str(err.value)
    assert f"output_dir {out} already holds checkpoint-5000 from another run" in text
    assert "hpcmem run /old/run, job 12" in text and "--reuse-output-dir" in text
    assert not (tmp_path / "runs").exists()                        # nothing written
    reuse = LaunchOptions(workdir=str(tmp_path), trl_fields={"output_dir": "shared-out"}, reuse_output_dir=True)
    done = submit(job(), preset(), reuse, backend="dry-run", runs_root=tmp_path / "runs",
                  estimator=_fake_estimator(1))
    assert Path(done.run_dir).is_dir()


# ---- run folder, backends, submit ----------------------------------------------------------------------------

def _fake_estimator(peak_gib: float):
    class Est:
        device_peak_bytes = int(peak_gib * 2**30)
        peak_allocated_bytes = int(peak_gib * 0.9 * 2**30)
        peak_reserved_bytes = int(peak_gib * 0.95 * 2**30)

        def to_json(self):
            return {"per_gpu": {"device_peak_bytes": self.device_peak_bytes}}
    return lambda job: Est()


def test_submit_writes_the_run_folder_and_parses_the_job_id(tmp_path):
    from hpcmem.launch import LaunchOptions, submit

    rec = Recorder({("sbatch", "--test-only"): (0, "", "sbatch: Job 7 to start at 2025-01-01T00:00:00 using 64 "
                                                "processors on nodes n1 in partition gpu"),
                    ("sbatch", "--parsable"): (0, "4242;cluster\n", "")})
    done = submit(job(num_processes=8), preset(), LaunchOptions(workdir=str(tmp_path)), runs_root=tmp_path / "runs",
                  runner=rec, estimator=_fake_estimator(10))
    run = Path(done.run_dir)
    assert done.job_id == "4242" and (run / "job_id").read_text() == "4242\n"
    assert [c[:2] for c in rec.calls] == [["sbatch", "--test-only"], ["sbatch", "--parsable"]]
    assert rec.calls[1][2] == str(run / "job.sbatch")
    assert sorted(p.name for p in run.iterdir()) == ["accelerate.yaml", "backend", "estimate.json", "job.sbatch",
                                                     "job_id", "logs", "spec.json", "trl.yaml"]
    assert json.loads((run / "spec.json").read_text())["job"]["parallel"]["num_processes"] == 8
    with pytest.raises(HpcmemError, match="already exists; hpcmem never overwrites"):
        submit(job(num_processes=8), preset(), LaunchOptions(), run_dir=run, runner=rec,
               estimator=_fake_estimator(10))


def test_refuses_what_does_not_fit_unless_forced(tmp_path):
    from hpcmem.launch import DoesNotFit, LaunchOptions, submit

    rec = Recorder({("sbatch",): (0, "1\n", "")})
    with pytest.raises(DoesNotFit) as err:
        submit(job(num_processes=8), preset(), LaunchOptions(), runs_root=tmp_path, runner=rec,
               estimator=_fake_estimator(120))
    assert "does not fit: device peak 120.0 GiB > 79.1 GiB usable on H100-80GB" in str(err.value)
    assert not list(tmp_path.iterdir()) and rec.calls == []
    done = submit(job(num_processes=8), preset(), LaunchOptions(), runs_root=tmp_path, runner=rec, force=True,
                  estimator=_fake_estimator(120))
    assert done.job_id == "1"


def test_sbatch_refusal_is_a_clear_hpcmem_error(tmp_path):
    from hpcmem.launch import LaunchOptions, prepare
    from hpcmem.launch.backends import Sbatch, SubmitError

    prepared = prepare(job(num_processes=8), preset(), LaunchOptions(), runs_root=tmp_path,
                       estimator=_fake_estimator(1))
    rec = Recorder({("sbatch",): (1, "", "sbatch: error: Batch job submission failed: Requested node configuration "
                                  "is not available")})
    with pytest.raises(SubmitError) as err:
        Sbatch(runner=rec).submit(prepared)
    assert "Requested node configuration is not available" in str(err.value)
    assert "1 node(s) × 8 GPU(s) × 64 CPUs" in str(err.value) and "hpcmem presets check site" in str(err.value)


def test_refusal_fixes_are_flags_that_fit_when_pasted_back(tmp_path):
    """The refusal's changes are the planner's plans written as flags: appended to the refused command they must
    parse (the real CLI) and the estimate must then fit with exactly the peak the refusal printed."""
    from click.testing import CliRunner

    from hpcmem.cli import cli
    from hpcmem.launch.submission import DoesNotFit

    base = ["sft", "--model_name_or_path", "Qwen/Qwen2.5-7B", "--use_peft", "false", "--max_length", "4096",
            "--per_device_train_batch_size", "8", "--num_processes", "4"]
    refused = CliRunner().invoke(cli, ["submit", *base, "--preset", "example-l40s", "--dry-run",
                                       "--runs-dir", str(tmp_path / "runs")])
    assert isinstance(refused.exception, DoesNotFit), refused.output
    message = str(refused.exception)
    assert "changes whose safe bound fits, best first" in message, message
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())   # nothing written
    lines = [ln for ln in message.splitlines() if ln.startswith("  --")]
    assert not any("--packing" in ln for ln in lines)           # a refusal does not change what a batch holds
    assert lines
    for line in lines:
        flags, peaks = line.split("   → ")
        peak, safe = peaks.split(", safe ")
        out = CliRunner().invoke(cli, ["estimate", *base, "--gpu", "L40S", *shlex.split(flags), "--json"])
        assert out.exit_code == 0, out.output
        est = json.loads(out.output)
        assert est["fits"] is True, line
        assert f"{est['per_gpu']['device_peak_bytes'] / 1024**3:.1f} GiB" == peak, line
        assert f"{est['verdict']['safe_device_peak_bytes'] / 1024**3:.1f} GiB" == safe.split(" (")[0], line


def test_submitit_gets_the_same_allocation_and_setup(tmp_path):
    from hpcmem.launch import LaunchOptions, prepare
    from hpcmem.launch.backends import Submitit

    prepared = prepare(job(num_machines=2, num_processes=16), preset(gres_type="h100"), LaunchOptions(),
                       runs_root=tmp_path, estimator=_fake_estimator(1))
    params = Submitit.parameters(prepared, "slurm")
    assert (params["nodes"], params["tasks_per_node"], params["cpus_per_task"]) == (2, 1, 64)
    assert params["slurm_additional_parameters"]["gres"] == "gpu:h100:8" and params["timeout_min"] == 1440
    assert 'MASTER_ADDR=$(hpcmem_node_addr "${HPCMEM_NODES[0]}")' in params["slurm_setup"][0]
    assert Submitit.parameters(prepared, "local") == {k: params[k] for k in
                                                      ("name", "timeout_min", "nodes", "tasks_per_node",
                                                       "cpus_per_task")}


def test_status_from_scontrol_then_sacct(tmp_path):
    from hpcmem.launch.monitor import status

    (tmp_path / "job_id").write_text("12\n")
    rec = Recorder({("scontrol",): (0, "JobId=12 JobName=a b JobState=RUNNING Reason=None Restarts=1 "
                                       "RunTime=00:01:02 NodeList=n[1-2]\n", "")})
    st = status(tmp_path, runner=rec)
    assert (st.state, st.source, st.fields["JobName"], st.fields["Restarts"]) == ("RUNNING", "scontrol", "a b", "1")
    gone = Recorder({("sacct",): (1, "", "Slurm accounting storage is disabled")})
    st = status(tmp_path, runner=gone)
    assert st.state == "UNKNOWN" and "MinJobAge" in st.note


def test_cli_dry_run_and_refusal(tmp_path):
    env_cmd = [sys.executable, "-m", "hpcmem", "submit", "sft", "--model_name_or_path", "Qwen/Qwen2.5-0.5B",
               "--preset", "example-h100", "--num_processes", "8", "--runs-dir", str(tmp_path)]
    done = subprocess.run(env_cmd + ["--dry-run"], capture_output=True, text=True, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "#SBATCH --partition=gpu-h100" in done.stdout and "dry run: nothing submitted" in done.stdout
    refused = subprocess.run(env_cmd[:-4] + ["--preset", "example-l40s", "--model_name_or_path", "Qwen/Qwen2.5-7B",
                                             "--use_peft", "false", "--max_length", "8192", "--num_processes", "4",
                                             "--dry-run"], capture_output=True, text=True, cwd=tmp_path)
    assert refused.returncode != 0 and "does not fit" in refused.stderr and "GiB" in refused.stderr


@pytest.mark.parametrize("sbatch, says", [
    (None, "sbatch not found"),
    ("echo 'sbatch: error: invalid partition specified: gpu-h100' >&2; exit 1", "sbatch --test-only rejected the job"),
])
def test_a_submission_that_fails_names_the_run_folder_it_wrote_and_keeps(tmp_path, sbatch, says):
    """No sbatch on PATH, or one that refuses the job: nothing is submitted, and the error names the run folder this
    call wrote (kept, never removed: it holds the script SLURM refused), the only thing under --runs-dir."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    if sbatch:
        (bin_dir / "sbatch").write_text(f"#!/bin/sh\n{sbatch}\n")
        (bin_dir / "sbatch").chmod(0o755)
    runs = tmp_path / "runs"
    done = subprocess.run([sys.executable, "-m", "hpcmem", "submit", "sft", "--model_name_or_path",
                           "Qwen/Qwen2.5-0.5B", "--preset", "example-h100", "--runs-dir", str(runs)],
                          capture_output=True, text=True, cwd=tmp_path, env={**os.environ, "PATH": str(bin_dir)})
    assert done.returncode == 2, done.stderr
    [run] = list(runs.iterdir())
    assert says in done.stderr and (run / "job.sbatch").is_file() and not (run / "job_id").exists()
    assert f"run folder {run} kept, nothing submitted" in done.stderr, done.stderr


def test_admin_template_override(tmp_path, monkeypatch):
    """$HPCMEM_TEMPLATES goes first; files it lacks still come from the shipped templates."""
    (tmp_path / "sbatch").mkdir()
    (tmp_path / "sbatch" / "single.sh.j2").write_text('{% extends "sbatch/base.sh.j2" %}\n'
                                                      '{% block topology %}\n# site hook\n{% endblock %}\n')
    monkeypatch.setenv("HPCMEM_TEMPLATES", str(tmp_path))
    lnch = launch(job(num_processes=8))
    script = render_sbatch(lnch, files(lnch))
    assert "# site hook" in script and "#SBATCH --partition=gpu" in script


def test_logs_command_tails_each_log(tmp_path):
    from click.testing import CliRunner

    from hpcmem.cli.logs import command

    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "node0.log").write_text("".join(f"line {i}\n" for i in range(50)))
    (tmp_path / "logs" / "batch-7.log").write_text("hpcmem: job 7\n")
    out = CliRunner().invoke(command, [str(tmp_path), "-n", "2"]).output
    assert "==> " in out and "line 48\nline 49" in out and "line 47" not in out and "hpcmem: job 7" in out
    only = CliRunner().invoke(command, [str(tmp_path), "--node", "0", "-n", "1"]).output
    assert "batch-7" not in only and "line 49" in only


def test_launch_core_stays_light():
    code = ("import sys, hpcmem.launch, hpcmem.cli.submit, hpcmem.launch.monitor, hpcmem.launch.preset_check;"
            "assert not {'torch', 'transformers', 'trl', 'submitit'} & set(sys.modules), sys.modules.keys()")
    assert subprocess.run([sys.executable, "-c", code], capture_output=True).returncode == 0
