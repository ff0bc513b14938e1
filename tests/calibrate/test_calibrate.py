"""`hpcmem calibrate` without a scheduler (fast tier, no torch): the dry run of a shipped preset (scripts bash
accepts, cases with predicted peaks that span the capacity, the collect job), array chunking, what a re-run skips,
site cases, and a GPU campaign's calibration reaching the verdict. The SLURM tier runs a whole campaign
(tests/calibrate/test_calibrate_slurm.py)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from hpcmem.calibrate import submit as sub
from hpcmem.calibrate.campaign import Campaign
from hpcmem.cli import cli
from tests.helpers.launch_helpers import Recorder, preset

GIB = 1024**3
NO_SLURM = Recorder({})          # every command answers "exit 1": no cluster, no jobs in flight


@pytest.fixture(scope="module")
def dry_run() -> dict:
    out = CliRunner().invoke(cli, ["calibrate", "--preset", "example-h100", "--dry-run", "--json"],
                             catch_exceptions=False)
    assert out.exit_code == 0, out.output
    return json.loads(out.output)


def test_dry_run_prints_every_script_and_bash_accepts_them(dry_run, tmp_path):
    kinds = [(j["kind"], j["gpus"], j["nodes"]) for j in dry_run["jobs"]]
    # example-h100: 8 GPUs per node, up to 16 nodes → arrays of 1-, 2- and 8-GPU cases, the 2-node ZeRO-3 job, collect
    assert kinds == [("array", 1, 1), ("array", 2, 1), ("array", 8, 1), ("multi", 8, 2), ("collect", 0, 1)]
    for job in dry_run["jobs"]:
        path = tmp_path / f"{job['group']}.sbatch"
        path.write_text(job["script"])
        done = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True)
        assert done.returncode == 0, (job["group"], done.stderr)
    singles = [c for c in dry_run["cases"] if c["nodes"] == 1 and c["gpus"] == 1]
    first = dry_run["jobs"][0]
    assert f"#SBATCH --array=0-{len(singles) - 1}%4" in first["script"]
    assert len(first["cases"]) == len(singles) <= 1000               # example-h100: max_array_size 1000
    assert "#SBATCH --gres=gpu:h100:1" in first["script"] and "#SBATCH --requeue" in first["script"]
    multi = dry_run["jobs"][3]["script"]
    assert "#SBATCH --nodes=2" in multi and "--ntasks=16 --ntasks-per-node=8" in multi
    assert "#SBATCH --no-requeue" in dry_run["jobs"][-1]["script"] and "--collect" in dry_run["jobs"][-1]["script"]


def test_dry_run_text_lists_cases_with_predicted_peaks_and_the_collect_job():
    out = CliRunner().invoke(cli, ["calibrate", "--preset", "example-h100", "--dry-run"], catch_exceptions=False)
    assert out.exit_code == 0
    assert "==== scripts/s1-g1-0.sbatch (array" in out.output and "==== scripts/s1-collect.sbatch" in out.output
    assert "zero3-2node-x16-l1b" in out.output and "GiB" in out.output
    assert "--dependency=afterany:<s1-g1-0>:<s1-g2-0>:<s1-g8-0>:<s1-m0> scripts/s1-collect.sbatch" in out.output


def test_predicted_peaks_span_the_capacity(dry_run):
    by = {}
    for c in dry_run["cases"]:
        by.setdefault(c["family"], []).append(c["fraction"])
    assert min(by["sized"]) <= 0.25 and max(by["sized"]) >= 0.9                  # ~20–95 % of the capacity
    assert all(0.88 <= f <= 1.065 for f in by["boundary"])                       # the OOM boundary sweep
    assert all(0.6 <= f <= 0.65 for f in by["multi"])                            # multi-GPU cases per GPU
    assert {c["case"] for c in dry_run["cases"] if c["family"] == "multi"} >= {
        "ddp-x2-l1b", "zero1-x8-l1b", "zero2+offload-x2-l1b", "zero3+offload-x8-l1b", "fsdp2-x8-l1b",
        "zero3-2node-x16-l1b"}


def test_a_listed_prediction_is_what_hpcmem_estimate_says(dry_run, tmp_path):
    """The case list's peak for a sized case equals `hpcmem estimate` run on the case's flags (the CLI path)."""
    camp = dry_run["cases"]
    case = next(c for c in camp if c["case"] == "sft-l1b-full+gc+pack-35")
    plan = sub.plan(preset(gpu="H100-80GB"), sub.Options(campaign_dir=tmp_path / "c", only=case["case"]), NO_SLURM)
    flags = plan.campaign.cases()[case["case"]].case.flags
    args = ["estimate", "sft", "--model_name_or_path", "meta-llama/Llama-3.2-1B", "--gpu", "H100-80GB", "--json"]
    for key, value in flags.items():
        args += [f"--{key}", str(value).lower() if isinstance(value, bool) else str(value)]
    out = CliRunner().invoke(cli, args, catch_exceptions=False)
    assert json.loads(out.output)["per_gpu"]["device_peak_bytes"] == case["predicted_bytes"]


def test_arrays_stay_below_max_array_size(tmp_path):
    pre = preset(gpus_per_node=1, max_nodes=1, max_array_size=10)
    plan = sub.plan(pre, sub.Options(campaign_dir=tmp_path / "c", only="boundary-*,sft-q05-*", max_parallel=3),
                    NO_SLURM)
    arrays = [j for j in plan.jobs if j.kind == "array"]
    n = len(plan.pending)
    assert n > 20 and [len(a.cases) for a in arrays] == [10] * (n // 10) + ([n % 10] if n % 10 else [])
    assert all(f"#SBATCH --array=0-{len(a.cases) - 1}%3" in plan.scripts[a.group] for a in arrays)
    assert not any(j.kind == "multi" for j in plan.jobs)                          # one node, one GPU: no layouts


def _record(case: str, status: str = "ok") -> dict:
    from hpcmem.job.trl_config import build_job
    from hpcmem.record import job_to_dict

    job, _ = build_job("sft", {"model_name_or_path": "Qwen/Qwen2.5-0.5B"})
    return {"schema": 2, "id": f"id-{case}", "case": case, "status": status, "device": "cuda", "job": job_to_dict(job)}


def test_a_rerun_submits_only_what_is_left(tmp_path):
    """Recorded cases and failed ones are skipped (failed ones again with --retry-failed); the jobs SLURM still
    lists count as in flight; nothing left: nothing submitted."""
    from hpcmem.record import append_record

    pre = preset(gpus_per_node=1, max_nodes=1)
    opt = sub.Options(campaign_dir=tmp_path / "c", only="sft-q05-*")
    first = sub.plan(pre, opt, NO_SLURM)
    sub.record(first)
    names = first.pending
    camp = Campaign.load(tmp_path / "c")
    append_record(camp.records_file, _record(names[0]))
    append_record(camp.records_file, _record(names[1], status="oom"))          # an OOM is a measurement too
    camp.write_status(names[2], {"state": "failed", "attempts": [{"reason": "ImportError: flash_attn"}]})
    camp.data["groups"]["s1-g1-0"]["job_id"] = "77"
    camp.save()
    squeue = Recorder({("squeue",): (0, "77 77_4\n77 77_[5-6%2]\n", "")})
    again = sub.plan(pre, opt, squeue)
    assert again.skipped[names[0]] == again.skipped[names[1]] == "recorded"
    assert again.skipped[names[2]] == "failed: ImportError: flash_attn"
    assert {again.skipped[n] for n in names[3:]} == {"in flight"}                 # job 77 still listed
    assert again.pending == [] and again.jobs == []
    retry = sub.plan(pre, sub.Options(campaign_dir=tmp_path / "c", only="sft-q05-*", retry_failed=True), NO_SLURM)
    assert sorted(retry.pending) == sorted(names[2:])                             # 77 gone from squeue: re-run


def test_a_campaign_folder_belongs_to_its_preset(tmp_path):
    from hpcmem.errors import HpcmemError

    sub.record(sub.plan(preset(gpus_per_node=1), sub.Options(campaign_dir=tmp_path / "c", only="sft-q05-full+gc-*"),
                        NO_SLURM))
    with pytest.raises(HpcmemError, match=r"was planned for preset site on H100-80GB \(cuda\)"):
        sub.plan(preset(gpus_per_node=1, gpu="L40S"), sub.Options(campaign_dir=tmp_path / "c"), NO_SLURM)


@pytest.mark.parametrize("item, message", [
    ({"name": "a b", "trainer": "sft", "model": "Qwen/Qwen2.5-0.5B"}, "name must be letters, digits"),
    ({"name": "x", "trainer": "ppo", "model": "Qwen/Qwen2.5-0.5B"}, "trainer must be one of sft, dpo"),
    ({"name": "x", "trainer": "sft", "model": "Qwen/Qwen2.5-0.5B", "gpus": 9}, "gpus must be an integer in 1..8"),
    ({"name": "x", "trainer": "sft", "model": "Qwen/Qwen2.5-0.5B", "oops": 1}, "unknown key oops"),
    ({"name": "x", "trainer": "sft", "model": "Qwen/Qwen2.5-0.5B", "flags": {"max_length": 1.5}}, "max_length"),
    ({"name": "x", "trainer": "sft", "model": "Qwen/Qwen2.5-0.5B", "flags": {"max_length": -5}}, "max_length must be"),
    ({"name": "x", "trainer": "sft", "model": "Qwen/Qwen2.5-0.5B", "flags": {"max_seq_length": 64}}, "max_length"),
    ({"name": "x", "trainer": "sft", "model": "/dev/null"}, "not a regular file"),
])
def test_site_cases_are_checked_where_they_enter(tmp_path, capsys, item, message):
    import yaml

    from hpcmem.cli import run

    path = tmp_path / "cases.yaml"
    path.write_text(yaml.safe_dump([item]))
    assert run(["calibrate", "--preset", "example-h100", "--cases", str(path), "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1 and f"cases {path} [0]" in err, err


def test_a_gpu_campaign_is_named_by_every_verdict_on_its_gpu(tmp_path, monkeypatch):
    """Collect on GPU records of an uncalibrated catalog GPU: the calibration installs with the campaign's name,
    site, date and n; the context is the records' device − reserved (500 MiB, by construction); estimates on that
    GPU — and on a preset naming it — are then calibrated and say where and when."""
    from hpcmem.calibrate.collect import collect
    from hpcmem.gpus.lookup import gpu_spec
    from hpcmem.job.trl_config import build_job
    from hpcmem.record import append_record, job_to_dict

    data = tmp_path / "site-data"
    monkeypatch.setenv("HPCMEM_DATA", str(data))
    camp = Campaign.create(tmp_path / "l40s-campaign", site="hpc-east", preset="l40s", preset_source="x",
                           gpu="L40S", gpu_name="L40S", device="cuda", tiny=False, steps=3, install_dir=str(data))
    camp.save()
    for i in range(12):
        job, _ = build_job("sft", {"model_name_or_path": "Qwen/Qwen2.5-0.5B", "dtype": "bfloat16",
                                   "max_length": 256 * (i + 1), "per_device_train_batch_size": 2},
                           gpu=gpu_spec("L40S"))
        alloc = (2 + i) * GIB
        append_record(camp.records_file, {
            "schema": 2, "id": f"r{i:03d}", "case": f"case-{i}", "campaign": camp.name, "status": "ok",
            "device": "cuda", "job": job_to_dict(job), "run": {"steps": 3, "warmup_steps": 1},
            "gpu": {"gpu_name": "NVIDIA L40S", "memory_bytes": 48305799168, "driver": "570.1"},
            "measured": {"peak_allocated_bytes": alloc, "peak_reserved_bytes": int(alloc * 1.05),
                         "device_peak_bytes": int(alloc * 1.05) + 500 * 2**20}})
    out = collect(camp, png=False)
    cal = json.loads(Path(out["calibration"]).read_text())
    assert Path(out["calibration"]) == data / "calibrations" / "l40s.json"
    assert cal["context_bytes"] == 500 * 2**20 and cal["campaign"]["site"] == "hpc-east"
    assert cal["campaign"]["n"] == 12 and cal["campaign"]["cases"]["done"] == 0      # no planned case ran here
    spec = gpu_spec("L40S")
    assert spec.calibrated and spec.context_bytes == 500 * 2**20 and spec.campaign.name == "l40s-campaign"
    m = cal["margins"]["device"]
    est = CliRunner().invoke(cli, ["estimate", "sft", "--model_name_or_path", "Qwen/Qwen2.5-0.5B", "--preset",
                                   "example-l40s", "--use_peft", "false", "--max_length", "512"],
                             catch_exceptions=False).output
    date = cal["campaign"]["date"]
    assert f"calibrated at hpc-east on {date}, n = {m['n']} (campaign l40s-campaign)" in est, est
    assert f"{100 * m['margin']:.1f} %" in est and (tmp_path / "l40s-campaign" / "report" / "report.md").is_file()


def test_planning_a_campaign_stays_light():
    """Planning and printing a campaign (on a login node) never imports torch, transformers, trl or deepspeed."""
    code = ("import sys, io, contextlib; from hpcmem.cli import run\n"
            "with contextlib.redirect_stdout(io.StringIO()): assert run(['calibrate', '--preset', 'example-h100', "
            "'--dry-run', '--json']) == 0\n"
            "assert not {'torch', 'transformers', 'trl', 'deepspeed'} & set(sys.modules), sorted(sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]


def test_a_cpu_rehearsal_must_be_shrunken(capsys):
    from hpcmem.cli import run

    assert run(["calibrate", "--preset", "example-h100", "--device", "cpu", "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert "--tiny" in err and err.count("\n") == 1, err
