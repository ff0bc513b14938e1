"""Host RAM of the whole job, and the job phases beside the step (evaluation, checkpoint save), against hand counts
of what TRL 1.16 / transformers 5.24 / accelerate 1.15 / DeepSpeed 0.19 do (the rules are cited in
hpcmem/estimate/host.py and checkpoint.py); the plan and submit gates that read it (a preset's memory_per_node_gb)."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from hpcmem.estimate import estimate
from hpcmem.estimate.host import PROCESS_BASELINE_BYTES, check_host
from hpcmem.job.jobspec import JobSpec
from hpcmem.job.spec import ParallelSpec, TrainSpec
from hpcmem.models import resolve_model

LLAMA8 = resolve_model("meta-llama/Llama-3.1-8B")
PSI = LLAMA8.num_params
GIB = 1024**3


def _job(par: ParallelSpec, **train) -> JobSpec:
    return JobSpec(model=LLAMA8, train=TrainSpec(trainer="sft", **train), parallel=par)


def _phase(est, name: str):
    return next(p for p in est.host.phases if p.name == name)


def test_every_ddp_rank_loads_a_full_fp32_copy():
    """TRL passes device_map=None under MULTI_GPU: 8 ranks × Ψ × 4 B (fp32 default) + 8 process baselines."""
    est = estimate(_job(ParallelSpec(num_processes=8, distributed_type="MULTI_GPU")))
    load = _phase(est, "model loading")
    assert load.rank0_bytes == load.other_bytes == PROCESS_BASELINE_BYTES + 4 * PSI
    assert est.host.node_bytes(load) == 8 * (PROCESS_BASELINE_BYTES + 4 * PSI)
    assert est.host.peak_phase.name == "model loading"


def test_one_gpu_loads_onto_the_gpu_and_zero3_init_partitions_while_loading():
    single = estimate(_job(ParallelSpec()))
    assert _phase(single, "model loading").rank0_bytes == PROCESS_BASELINE_BYTES
    z3 = estimate(_job(ParallelSpec(num_processes=8, distributed_type="DEEPSPEED", zero_stage=3)))
    assert _phase(z3, "model loading").other_bytes == PROCESS_BASELINE_BYTES
    no_init = estimate(_job(ParallelSpec(num_processes=8, distributed_type="DEEPSPEED", zero_stage=3,
                                         zero3_init_flag=False)))
    assert _phase(no_init, "model loading").other_bytes == PROCESS_BASELINE_BYTES + 4 * PSI


def test_fsdp_efficient_loading_is_one_copy_per_node():
    eff = estimate(_job(ParallelSpec(num_processes=8, distributed_type="FSDP"), dtype="bfloat16"))
    load = _phase(eff, "model loading")
    assert (load.rank0_bytes, load.other_bytes) == (PROCESS_BASELINE_BYTES + 2 * PSI, PROCESS_BASELINE_BYTES)
    every = estimate(_job(ParallelSpec(num_processes=8, distributed_type="FSDP",
                                       fsdp_cpu_ram_efficient_loading=False), dtype="bfloat16"))
    assert _phase(every, "model loading").other_bytes == PROCESS_BASELINE_BYTES + 2 * PSI


def test_zero2_save_clones_the_16bit_model_on_every_rank():
    """accelerate get_state_dict → clone_tensors_for_torch_save on every rank: 2Ψ each, all 8 at once."""
    est = estimate(_job(ParallelSpec(num_processes=8, distributed_type="DEEPSPEED", zero_stage=2)))
    save = _phase(est, "checkpoint save")
    assert save.other_bytes == PROCESS_BASELINE_BYTES + 2 * PSI
    assert est.host.node_bytes(save) == 8 * (PROCESS_BASELINE_BYTES + 2 * PSI)


def test_fsdp_full_state_dict_lands_on_rank0_and_gathers_one_parameter_on_each_gpu():
    """Full fine-tuning under FSDP2 keeps fp32 shards (accelerate's upcast): the full model is 4Ψ on rank 0's host,
    then the full Adam state dict 8Ψ; each GPU holds one whole parameter at a time (the [V, H] embedding, fp32)."""
    par = ParallelSpec(num_processes=8, distributed_type="FSDP", fsdp_state_dict_type="FULL_STATE_DICT")
    est = estimate(_job(par, dtype="bfloat16"))
    save = _phase(est, "checkpoint save")
    assert save.rank0_bytes == PROCESS_BASELINE_BYTES + 8 * PSI
    gpu = next(p for p in est.phases if p.name == "checkpoint save")
    assert [c.bytes for c in gpu.components if c.name.startswith("gathered")] == [128_256 * 4096 * 4]
    sharded = estimate(_job(ParallelSpec(num_processes=8, distributed_type="FSDP"), dtype="bfloat16"))
    assert _phase(sharded, "checkpoint save").rank0_bytes < PROCESS_BASELINE_BYTES + PSI // 8


def test_offloaded_states_and_workers_count_per_node():
    par = ParallelSpec(num_processes=8, distributed_type="DEEPSPEED", zero_stage=3, offload_optimizer_device="cpu",
                       offload_param_device="cpu")
    est = estimate(_job(par, dtype="bfloat16", dataloader_num_workers=2))
    train = _phase(est, "training")
    # fp32 master + Adam m, v + fp32 gradient partition (16 B) and the 16-bit parameter partition (2 B), per rank
    assert train.other_bytes == PROCESS_BASELINE_BYTES + 18 * PSI // 8 == PROCESS_BASELINE_BYTES + est.host_bytes
    assert est.host.workers.bytes == 8 * 2 * 512 * 1024**2


def test_eval_phase_holds_states_not_gradients():
    base = _job(ParallelSpec(), dtype="bfloat16", use_peft=True)
    est = estimate(JobSpec(model=LLAMA8, train=TrainSpec(trainer="sft", dtype="bfloat16", use_peft=True,
                                                         eval_strategy="steps", per_device_eval_batch_size=4)))
    assert "evaluation" not in {p.name for p in estimate(base).phases}
    ev = next(p for p in est.phases if p.name == "evaluation")
    names = {c.name for c in ev.components}
    assert {"weights", "lora adapters", "optimizer states", "eval forward (no grad)"} <= names
    assert "gradients" not in names and "activations" not in names


def test_host_check_against_a_node():
    est = estimate(_job(ParallelSpec(num_processes=8, distributed_type="MULTI_GPU")))
    need = est.host.per_node_bytes
    assert check_host(est.host, need).fits and not check_host(est.host, need - 1).fits
    assert "per node at model loading" in check_host(est.host, 256 * GIB).message()


def _cli(args: list[str]):
    from hpcmem.cli import cli

    return CliRunner().invoke(cli, args)


def test_submit_refuses_a_70b_plan_whose_host_ram_exceeds_the_node(tmp_path):
    """The 70B full fine-tune on the L40S preset (256 GB nodes): every plan that fits the GPU offloads ≈ 1 TB of
    states to one node's host RAM, so --plan refuses (exit 2) with the numbers, and nothing is written."""
    import os
    import subprocess
    import sys

    res = subprocess.run([sys.executable, "-m", "hpcmem", "submit", "sft", "--model_name_or_path",
                          "meta-llama/Llama-3.1-70B", "--preset", "example-l40s", "--use_peft", "false",
                          "--max_length", "2048", "--plan", "--dry-run", "--runs-dir", str(tmp_path)],
                         capture_output=True, text=True, env={**os.environ, "HF_HUB_OFFLINE": "1"}, timeout=120)
    assert res.returncode == 2, res.stderr
    assert "host RAM" in res.stderr and "256.0 GiB" in res.stderr and "per node" in res.stderr
    assert "\\n" not in res.stderr and all(ln.startswith("- ") for ln in res.stderr.splitlines()[1:])  # a line each
    assert not any(tmp_path.iterdir())


def test_plan_with_a_preset_offers_only_plans_whose_host_ram_fits():
    res = _cli(["plan", "sft", "--model_name_or_path", "Qwen/Qwen2.5-7B", "--preset", "example-l40s",
                "--max_length", "2048", "--num_processes", "4", "--top", "5", "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.output)
    assert out["host_capacity_bytes"] == 256 * GIB and out["plans"]
    assert all(p["host_per_node_bytes"] <= out["host_capacity_bytes"] for p in out["plans"])


@pytest.mark.parametrize("field,value", [("eval_strategy", "sometimes"), ("save_strategy", "always"),
                                         ("fsdp_state_dict_type", "LOCAL_STATE_DICT")])
def test_new_fields_refuse_values_trl_and_accelerate_do_not_take(field, value):
    res = _cli(["estimate", "sft", "--model_name_or_path", "Qwen/Qwen2.5-0.5B", f"--{field}", value])
    assert res.exit_code != 0 and field in str(res.exception or res.output)


def test_plan_stops_at_a_host_floor_no_knob_lowers():
    """Per-rank baselines and dataloader workers are the same for every combination: when they alone exceed the
    node, the search says so and estimates nothing (it used to estimate every combination, seconds per refusal)."""
    from hpcmem.cli.options import job_from_cli
    from hpcmem.plan import search

    job, _ = job_from_cli("sft", {"model_name_or_path": "Qwen/Qwen2.5-0.5B", "gpu": "H100-80GB",
                                  "dataloader_num_workers": 4000})
    node = 1000 * 1024**3
    report = search(job, job.gpu, host_memory_per_node_bytes=node)
    # 1 rank: the 1,797 MiB baseline + 4,000 workers × 512 MiB = 2,049,797 MiB = 2001.8 GiB > 1000 GiB
    assert report.plans == () and report.stats.full_estimates == 0
    assert "at least 2001.8 GiB" in report.note
    fine = search(job, job.gpu, host_memory_per_node_bytes=2100 * 1024**3, top=1)
    assert fine.note == "" and fine.plans
