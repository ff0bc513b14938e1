"""Context parallelism (torch, FSDP2), sequence parallelism (DeepSpeed ALST/Ulysses) and HSDP: read from accelerate's
`parallelism_config` block, checked by accelerate's, TRL's and DeepSpeed's rules, and estimated per rank.

Known answers are hand counts from the models' published config.json (Qwen3-8B: hidden 4096, 36 layers, 32 heads,
8 kv heads, 8,190,735,360 parameters) and the libraries' source, cited per test. Fast tier: no torch."""

from __future__ import annotations

from dataclasses import replace

import pytest
import yaml

from hpcmem.errors import HpcmemError, SpecError
from hpcmem.estimate import estimate
from hpcmem.job.jobspec import JobSpec
from hpcmem.job.spec import ParallelSpec, TrainSpec
from hpcmem.job.trl_config import accelerate_settings, build_job
from hpcmem.models import resolve_model

QWEN3_8B = resolve_model("Qwen/Qwen3-8B")
PSI = 8_190_735_360
H, LAYERS = 4096, 36
LONG = {"model_name_or_path": "Qwen/Qwen3-8B", "dtype": "bfloat16", "max_length": 65536,
        "per_device_train_batch_size": 1, "pad_to_multiple_of": 8, "gpu": "H100-80GB"}
FSDP2 = {"compute_environment": "LOCAL_MACHINE", "distributed_type": "FSDP", "mixed_precision": "bf16",
         "num_machines": 1, "num_processes": 8, "fsdp_config": {"fsdp_version": 2}}
ZERO3 = {"compute_environment": "LOCAL_MACHINE", "distributed_type": "DEEPSPEED", "mixed_precision": "bf16",
         "num_machines": 1, "num_processes": 8, "deepspeed_config": {"zero_stage": 3}}


def yaml_file(tmp_path, base: dict, **block) -> str:
    data = dict(base)
    if block:
        data["parallelism_config"] = {f"parallelism_config_{k}": v for k, v in block.items()}
    path = tmp_path / "accelerate.yaml"
    path.write_text(yaml.safe_dump(data))
    return str(path)


def from_yaml(path: str, **settings):
    job, ignored = build_job("sft", {**LONG, **settings, **accelerate_settings(path)})
    return job, ignored


def component(est, name: str) -> int:
    return next(c.bytes for c in est.peak_phase.components if c.name == name)


# (base config, split, name in the summary, weight bytes per rank): FSDP2 shards over the flattened dp_shard × cp
# mesh, all 8 ranks, in fp32 (accelerate upcasts under bf16); ZeRO-3 over DeepSpeed's sequence-data-parallel group,
# all 8 ranks, 16-bit (engine.py seq_data_parallel_group)
SPLITS = [(FSDP2, {"cp_size": 4}, "dp_shard 2 × cp 4", PSI * 4 // 8),
          (ZERO3, {"sp_size": 4}, "sp 4 × dp 2", PSI * 2 // 8)]


@pytest.mark.parametrize("base,split,name,weights", SPLITS, ids=["cp4", "sp4"])
def test_a_split_row_names_the_layout_and_keeps_a_quarter_of_the_sequence(tmp_path, base, split, name, weights):
    job, _ = from_yaml(yaml_file(tmp_path, base, dp_shard_size=2, **split))
    plain, _ = from_yaml(yaml_file(tmp_path, base))
    est, ref = estimate(job), estimate(plain)
    assert name in est.summary and "16384 tokens per rank" in est.summary
    # full checkpointing keeps each layer's bf16 input: 36 layers × 2 B × 4096 × (65536 / 4) tokens (+ RoPE cos/sin)
    assert component(est, "activations") == pytest.approx(LAYERS * 2 * H * 65536 // 4, rel=0.005)
    assert component(est, "activations") == pytest.approx(component(ref, "activations") / 4, rel=0.001)
    assert est.peak_phase.components[0].bytes == weights
    assert est.fits and est.device_peak_bytes < ref.device_peak_bytes
    assert any("do not act under DeepSpeed" in w for w in est.warnings) == ("sp_size" in split)


def test_hsdp_shards_within_the_group_and_replicates_across(tmp_path):
    hsdp, _ = from_yaml(yaml_file(tmp_path, FSDP2, dp_replicate_size=2, dp_shard_size=4))
    assert hsdp.parallel.layout.state_shards == 4 and "dp_replicate 2 × dp_shard 4" in estimate(hsdp).summary
    assert estimate(hsdp).peak_phase.components[0].bytes == PSI * 4 // 4       # fp32 shards over 4, not 8


def test_evaluation_is_split_under_cp_but_whole_under_sp(tmp_path):
    """CP shards eval batches too (transformers trainer.py prediction_step enters the same context); accelerate
    registers Ulysses with disable_in_eval=True, so SP evaluates whole rows on every rank."""
    ev = {"eval_strategy": "steps", "per_device_eval_batch_size": 1}

    def eval_bytes(path: str) -> int:
        est = estimate(from_yaml(path, **ev)[0])
        phase = next(p for p in est.phases if p.name == "evaluation")
        return next(c.bytes for c in phase.components if c.name == "eval forward (no grad)")

    whole_zero3 = eval_bytes(yaml_file(tmp_path, ZERO3))
    assert eval_bytes(yaml_file(tmp_path, ZERO3, sp_size=4)) == whole_zero3
    whole_fsdp = eval_bytes(yaml_file(tmp_path, FSDP2))
    assert eval_bytes(yaml_file(tmp_path, FSDP2, dp_shard_size=2, cp_size=4)) < whole_fsdp / 3


def test_ring_attention_holds_the_whole_sequences_kv_with_allgather(tmp_path):
    """torch's all-gather rotater gathers every rank's k and v (the full sequence's); all-to-all holds one chunk."""
    from hpcmem.estimate.parallel import local_micro_batch, sequence_buffers
    from hpcmem.job.shape import micro_batch, precision

    forward = {}
    for strategy in ("allgather", "alltoall"):
        job, _ = from_yaml(yaml_file(tmp_path, FSDP2, cp_size=8, cp_comm_strategy=strategy), pad_to_multiple_of=16)
        forward[strategy] = sequence_buffers(job, local_micro_batch(job, micro_batch(job)), precision(job)).forward
    full_kv = 2 * 65536 * 8 * 128 * 2                # k and v, 8 kv heads × 128, bf16, all 65536 tokens
    # all-gather holds all 8 ranks' k/v; all-to-all the one being sent and the one received (2 of 8 chunks)
    assert forward["allgather"] - forward["alltoall"] == full_kv - 2 * full_kv // 8


def test_bare_parallelism_keys_are_refused_because_accelerate_drops_them(tmp_path):
    path = tmp_path / "bare.yaml"
    path.write_text(yaml.safe_dump({**FSDP2, "parallelism_config": {"dp_shard_size": 2, "cp_size": 4}},
                                   sort_keys=False))
    with pytest.raises(HpcmemError, match="write parallelism_config_dp_shard_size: 2, parallelism_config_cp_size: 4"):
        accelerate_settings(str(path))


def test_backends_accelerate_refuses_are_refused(tmp_path):
    # TRL's examples/accelerate_configs/alst_ulysses_4gpu.yaml still says cp_backend deepspeed
    with pytest.raises(HpcmemError, match="cp_backend must be 'torch'"):
        accelerate_settings(yaml_file(tmp_path, ZERO3, cp_size=2, cp_backend="deepspeed"))
    with pytest.raises(HpcmemError, match="nothing to shard over"):
        accelerate_settings(yaml_file(tmp_path, FSDP2, dp_shard_size=1))


def test_keys_accelerate_reads_without_memory_effect_are_listed_as_ignored(tmp_path):
    _, ignored = from_yaml(yaml_file(tmp_path, ZERO3, sp_size=4, sp_seq_length_is_variable=True))
    assert "parallelism_config_sp_seq_length_is_variable" in ignored


@pytest.mark.parametrize("kw,rule", [
    ({"distributed_type": "FSDP", "num_processes": 8, "cp_size": 4}, "covers"),
    ({"distributed_type": "FSDP", "num_processes": 8, "cp_size": 2, "sp_size": 4}, "exclude each other"),
    ({"distributed_type": "DEEPSPEED", "zero_stage": 3, "num_processes": 8, "cp_size": 8},
     "needs distributed_type FSDP"),
    ({"distributed_type": "FSDP", "num_processes": 8, "sp_size": 8}, "needs distributed_type DEEPSPEED"),
    ({"distributed_type": "DEEPSPEED", "zero_stage": 3, "num_processes": 6, "sp_size": 4}, "multiple of sp_size"),
    ({"distributed_type": "FSDP", "fsdp_version": 1, "num_processes": 8, "dp_shard_size": 8}, "FSDP version 2"),
    ({"distributed_type": "MULTI_GPU", "num_processes": 8, "dp_shard_size": 8}, "shards only under FSDP2"),
    ({"distributed_type": "FSDP", "num_processes": 8, "dp_replicate_size": 2, "cp_size": 4}, "pure data parallel"),
    ({"distributed_type": "FSDP", "num_processes": 8, "dp_shard_size": 4, "tp_size": 2}, "not modelled"),
])
def test_accelerates_layout_rules(kw, rule):
    with pytest.raises(SpecError, match=rule):
        ParallelSpec(**kw)


def job_with(par: dict, model=QWEN3_8B, **train) -> JobSpec:
    train = {"dtype": "bfloat16", "max_length": 8192, "per_device_train_batch_size": 1, "pad_to_multiple_of": 16,
             **train}
    return JobSpec(model=model, train=TrainSpec(trainer=train.pop("trainer", "sft"), **train),
                   parallel=ParallelSpec(**par))


CP8 = {"distributed_type": "FSDP", "num_processes": 8, "cp_size": 8}
SP8 = {"distributed_type": "DEEPSPEED", "zero_stage": 3, "num_processes": 8, "sp_size": 8}


@pytest.mark.parametrize("par,kw,rule", [
    (CP8, {"packing": True}, "SFTTrainer refuses it"),                       # sft_trainer.py
    (SP8, {"trainer": "grpo", "max_length": 1024}, "GRPOConfig refuses"),  # grpo_config.py __post_init__
    (CP8, {"trainer": "rloo", "max_length": 1024}, "RLOOConfig refuses"),
    (CP8, {"trainer": "dpo"}, "not modelled"),
    (CP8, {"attn_implementation": "flash_attention_2"}, "needs attn_implementation sdpa"),
    (CP8, {"pad_to_multiple_of": 8}, "multiple of 16"),
    (SP8, {"pad_to_multiple_of": None}, "multiple of 8"),
    (SP8, {"attn_implementation": "eager"}, "does not run eager"),
    (SP8, {"attn_implementation": "flash_attention_2"}, "must be the model's attn_implementation"),
])
def test_trl_and_library_rules_refuse_before_the_queue(par, kw, rule):
    with pytest.raises(SpecError, match=rule):
        job_with(par, **kw)


def test_heads_must_divide_over_sp_ranks():
    qwen05 = resolve_model("Qwen/Qwen2.5-0.5B")              # 14 heads, 2 kv heads
    with pytest.raises(SpecError, match="must divide num_attention_heads 14"):
        job_with({**SP8, "sp_size": 4, "num_processes": 4}, model=qwen05)
    job_with({**SP8, "sp_size": 2, "num_processes": 4}, model=qwen05)


def test_sliding_window_models_are_refused_under_cp():
    with pytest.raises(SpecError, match="sliding-window attention"):
        job_with(CP8, model=resolve_model("google/gemma-2-9b"))


def test_losses_sequence_parallelism_cannot_reduce_are_refused():
    base = {**LONG, "distributed_type": "DEEPSPEED", "zero_stage": 3, "num_processes": 8, "sp_size": 4}
    with pytest.raises(SpecError, match="loss_type dft"):
        build_job("sft", {**base, "loss_type": "dft"})
    with pytest.raises(SpecError, match="label_smoothing_factor"):
        build_job("sft", {**base, "label_smoothing_factor": 0.1})
    build_job("sft", {**base, "loss_type": "nll"})


def test_kv_heads_replicated_when_sp_exceeds_them():
    """sp 4 over 2 kv heads: DeepSpeed repeats each kv head twice, and k, v keep S × head_dim per rank."""
    from hpcmem.estimate.parallel import local_micro_batch, sequence_buffers
    from hpcmem.job.shape import micro_batch, precision

    # every layer keeps the output re-laid to its 2048 local tokens beside the attention's own: 2048 × q width × bf16
    job = job_with({**SP8, "sp_size": 4, "num_processes": 4}, model=resolve_model("meta-llama/Llama-3.2-1B"),
                   gradient_checkpointing=False)                     # 32 heads × 64, 8 kv heads: no replication
    mb = local_micro_batch(job, micro_batch(job))
    assert sequence_buffers(job, mb, precision(job)).kept_per_layer == 2048 * 32 * 64 * 2
    small = resolve_model("Qwen/Qwen2.5-1.5B")                       # 12 heads, 2 kv heads, head_dim 128
    job = job_with({**SP8, "sp_size": 4, "num_processes": 4}, model=small)
    mb = local_micro_batch(job, micro_batch(job))
    # + per tensor: the whole 8192-token sequence × one replicated head × 128 × bf16, minus the local formula's
    # 2048 tokens × 2 kv heads × 128 × bf16; for k and v
    replicated = 2 * (8192 * 128 * 2 - 2048 * 2 * 128 * 2)
    assert sequence_buffers(job, mb, precision(job)).kept_per_layer == 2048 * 12 * 128 * 2 + replicated


def test_single_gpu_is_one_process_from_the_file_and_by_name(tmp_path):
    """TRL's single_gpu.yaml says distributed_type NO with num_processes 8; accelerate launches it as one process
    (commands/launch.py launch_command → simple_launcher), whether the file is named or passed."""
    path = tmp_path / "single_gpu.yaml"
    path.write_text(yaml.safe_dump({"distributed_type": "NO", "num_processes": 8, "num_machines": 1,
                                    "mixed_precision": "bf16"}))
    settings = {**LONG, "max_length": 2048}
    by_file, _ = build_job("sft", {**settings, **accelerate_settings(str(path))})
    by_name, _ = build_job("sft", {**settings, **accelerate_settings("single_gpu"), "num_processes": 8})
    for job in (by_file, by_name):
        assert job.parallel.world_size == 1
        assert any("one process" in w for w in estimate(job).warnings)
    assert estimate(by_file).device_peak_bytes == estimate(by_name).device_peak_bytes


def test_the_generated_accelerate_yaml_carries_the_layout_in_accelerates_keys(tmp_path):
    from hpcmem.launch.configs import accelerate_config

    job, _ = from_yaml(yaml_file(tmp_path, FSDP2, dp_shard_size=2, cp_size=4))
    block = accelerate_config(job)["parallelism_config"]
    assert block["parallelism_config_cp_size"] == 4 and block["parallelism_config_dp_shard_size"] == 2
    again, _ = build_job("sft", {**LONG, **accelerate_settings(_write(tmp_path, accelerate_config(job)))})
    assert again.parallel == job.parallel
    plain, _ = from_yaml(yaml_file(tmp_path, FSDP2))
    assert "parallelism_config" not in accelerate_config(plain)


def _write(tmp_path, data: dict) -> str:
    path = tmp_path / "rendered.yaml"
    path.write_text(yaml.safe_dump(data))
    return str(path)


@pytest.mark.parametrize("value,want", [("FULL_SHARD", True), ("SHARD_GRAD_OP", False), ("2", False), (1, True),
                                        ("NO_SHARD", "not modelled"), ("HALF", "must be one of")])
def test_fsdp1_sharding_strategies_read_as_accelerate_reads_them(tmp_path, value, want):
    """TRL's fsdp1.yaml says fsdp_reshard_after_forward: FULL_SHARD — a sharding strategy name or its number for
    FSDP1 (accelerate utils/dataclasses.py FullyShardedDataParallelPlugin); FULL_SHARD reshards after forward."""
    path = yaml_file(tmp_path, {**FSDP2, "fsdp_config": {"fsdp_version": 1, "fsdp_reshard_after_forward": value}})
    if isinstance(want, bool):
        assert accelerate_settings(path)["fsdp_reshard_after_forward"] is want
    else:
        with pytest.raises(HpcmemError, match=want):
            accelerate_settings(path)


def test_fsdp_without_a_version_is_fsdp1_as_accelerate_launch_defaults(tmp_path):
    path = yaml_file(tmp_path, {**FSDP2, "fsdp_config": {"fsdp_offload_params": False}})
    assert accelerate_settings(path)["fsdp_version"] == 1          # commands/launch.py --fsdp_version default "1"


def test_the_gpu_campaign_cases_are_jobs_hpcmem_estimates():
    """hpcmem calibrate's long-context family: the layouts only a GPU can measure, each a job hpcmem estimates as
    written, one node of 8 GPUs."""
    from hpcmem.calibrate.long_context import CASES, GPUS

    for name, (model, flags, _) in CASES.items():
        job, ignored = build_job("sft", {"model_name_or_path": model, **flags, "gpu": "H100-80GB"})
        assert ignored == [] and job.parallel.layout.active and job.parallel.world_size == GPUS, name
        assert estimate(job).device_peak_bytes > 0


def test_json_names_the_layout(tmp_path):
    job, _ = from_yaml(yaml_file(tmp_path, FSDP2, dp_shard_size=2, cp_size=4))
    lay = estimate(job).to_json()["layout"]
    assert (lay["cp_size"], lay["dp_shard_size"], lay["state_shards"], lay["data_parallel_size"]) == (4, 2, 8, 2)
    assert lay["tokens_per_rank"] == 65536 // 4
    plain, _ = from_yaml(yaml_file(tmp_path, FSDP2))
    assert estimate(plain).to_json()["layout"] is None


def test_the_planner_proposes_a_split_row_when_data_parallel_plans_must_offload_activations():
    """Qwen3-8B at 131,072 tokens on 8 × H100: every data-parallel plan that fits offloads activations, so context
    and sequence parallelism are searched; the first plan splits the row, its safe bound fits, and its flags rebuild
    the same job."""
    import shlex

    from hpcmem.cli.options import job_from_cli
    from hpcmem.gpus.lookup import gpu_spec
    from hpcmem.plan import search
    from hpcmem.plan.flags import flags_line

    base = {"model_name_or_path": "Qwen/Qwen3-8B", "max_length": 131072, "num_processes": 8}
    job, _ = build_job("sft", base)
    gpu = gpu_spec("H100-80GB")
    report = search(job, gpu, fixed=set(base), top=5)
    best = report.plans[0]
    assert best.job.parallel.layout.seq_shards > 1, best.knobs.label()
    assert best.safe_device_peak_bytes <= gpu.usable_bytes
    from hpcmem.plan.sequence_split import split

    assert any(v.fits and v.knobs.activation_offloading and not split(v.knobs.sharding)[1]
               for v in report.walked)                      # a data-parallel plan fitted, by offloading activations
    flags = shlex.split(flags_line(job, best.job))
    given = dict(zip(flags[::2], flags[1::2]))
    rebuilt, _ = job_from_cli("sft", {**base, **{k.lstrip("-"): v for k, v in given.items()}})
    # the flags line leaves the GPU to the user's --gpu, whose board sets device terms (NCCL's NVLS buffers on H100)
    assert rebuilt.parallel == best.job.parallel
    assert estimate(replace(rebuilt, gpu=best.job.gpu)).device_peak_bytes == best.device_peak_bytes
    short, _ = build_job("sft", {**base, "max_length": 2048})
    assert all(p.job.parallel.layout.seq_shards == 1 for p in search(short, gpu, fixed=set(base), top=5).plans)


def test_submit_dry_run_writes_the_layout_into_the_accelerate_yaml(tmp_path):
    import subprocess
    import sys

    cmd = [sys.executable, "-m", "hpcmem", "submit", "sft", "--model_name_or_path", "Qwen/Qwen3-8B", "--max_length",
           "131072", "--num_processes", "8", "--preset", "example-h100", "--plan", "--dry-run", "--runs-dir",
           str(tmp_path)]
    done = subprocess.run(cmd, capture_output=True, text=True, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    (folder,) = [p for p in tmp_path.iterdir() if p.is_dir()]
    config = yaml.safe_load((folder / "accelerate.yaml").read_text())
    block = config["parallelism_config"]
    assert max(block["parallelism_config_cp_size"], block["parallelism_config_sp_size"]) > 1
    trl = yaml.safe_load((folder / "trl.yaml").read_text())
    split = max(block["parallelism_config_cp_size"] * 2, block["parallelism_config_sp_size"])
    assert trl["pad_to_multiple_of"] % split == 0
