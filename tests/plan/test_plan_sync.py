"""accelerator_config's sync_each_batch as a planner choice for FSDP under gradient accumulation: offered where the
unsharded gradients the Trainer's no_sync keeps do not fit, written as the flag `hpcmem estimate` reads back, never
against an accelerator_config the user gave, and not on one GPU."""

from __future__ import annotations

import json

from click.testing import CliRunner

from hpcmem.cli import cli
from hpcmem.cli.options import job_from_cli
from hpcmem.plan import search
from hpcmem.plan.flags import changed_flags
from hpcmem.plan.knobs import apply, axes, job_knobs

BIG = {"model_name_or_path": "meta-llama/Llama-3.1-70B", "gpu": "H100-80GB", "num_processes": 32, "num_machines": 4,
       "accelerate_config": "fsdp2", "per_device_train_batch_size": 1, "gradient_accumulation_steps": 8,
       "max_length": 4096}
FIXED = set(BIG) - {"gpu"}


def test_70b_fsdp_accumulation_fits_only_by_syncing_each_micro_batch():
    """Llama-3.1-70B's bf16 gradients are 2 B × 70.55e9 = 131 GiB a rank when kept whole: no GPU holds them."""
    job, _ = job_from_cli("sft", BIG, settle_required=True)
    report = search(job, job.gpu, fixed=FIXED, top=3)
    assert report.plans and all(p.knobs.sharding == "fsdp2+sync" and p.job.train.sync_each_batch
                                for p in report.plans)
    best = report.plans[0]
    flags = changed_flags(job, best.job)
    i = flags.index("--accelerator_config")
    assert json.loads(flags[i + 1]) == {"gradient_accumulation_kwargs": {"sync_each_batch": True}}
    argv = ["estimate", "sft", *[x for k, v in BIG.items() for x in (f"--{k}", str(v))], *flags, "--json"]
    out = CliRunner().invoke(cli, argv, catch_exceptions=False)
    assert out.exit_code == 0, out.output
    assert json.loads(out.output)["per_gpu"]["device_peak_bytes"] == best.device_peak_bytes


def test_an_accelerator_config_the_user_gave_is_kept():
    given = {**BIG, "accelerator_config": {"gradient_accumulation_kwargs": {"sync_each_batch": False}}}
    job, _ = job_from_cli("sft", given, settle_required=True)
    report = search(job, job.gpu, fixed=FIXED | {"accelerator_config"}, top=3)
    assert not report.plans          # it does not fit without syncing, and the user said not to


def test_other_accelerator_config_keys_travel_with_the_choice():
    job, _ = job_from_cli("sft", {**BIG, "accelerator_config": {"even_batches": False}})
    k = job_knobs(job)
    planned = apply(job, k._replace(sharding="fsdp2+sync"))
    assert planned.train.accelerator_config == {"even_batches": False,
                                                "gradient_accumulation_kwargs": {"sync_each_batch": True}}
    assert job_knobs(planned).sharding == "fsdp2+sync"
    assert apply(planned, k._replace(sharding="fsdp2")).train.accelerator_config == {"even_batches": False}


def test_one_gpu_has_nothing_to_reduce_scatter():
    job, _ = job_from_cli("sft", {"model_name_or_path": "Qwen/Qwen2.5-0.5B", "gpu": "H100-80GB",
                                  "accelerate_config": "fsdp2", "gradient_accumulation_steps": 4})
    assert not any(s.endswith("+sync") for s in axes(job, (), 32, False)["sharding"])
