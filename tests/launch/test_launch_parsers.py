"""What hpcmem writes, read by the real parsers unchanged: accelerate's config loader and launcher validation,
TRL's TrlParser (no leftover keys), DeepSpeed's config validation after transformers fills the "auto" values.
Torch tier (CPU): needs the [train] extra."""

from __future__ import annotations

import dataclasses
import importlib
import types
from pathlib import Path

import pytest
import yaml

from hpcmem.job.trainers import MODEL_CONFIG_FIELDS, REGISTRY
from hpcmem.launch.configs import accelerate_config, deepspeed_config
from hpcmem.launch.trl_yaml import trl_config
from tests.helpers.launch_helpers import job

pytestmark = pytest.mark.torch

trl = pytest.importorskip("trl")
accelerate_launch = pytest.importorskip("accelerate.commands.launch")

LAYOUTS = {
    "single-gpu": {},
    "ddp-one-node": {"num_processes": 8},
    "ddp-two-nodes": {"num_machines": 2, "num_processes": 16},
    "zero2-two-nodes": {"num_machines": 2, "num_processes": 16, "distributed_type": "DEEPSPEED", "zero_stage": 2,
                        "offload_optimizer_device": "cpu"},
    "zero3-offload": {"num_processes": 8, "distributed_type": "DEEPSPEED", "zero_stage": 3,
                      "offload_optimizer_device": "cpu", "offload_param_device": "cpu"},
    "fsdp2-two-nodes": {"num_machines": 2, "num_processes": 16, "distributed_type": "FSDP"},
    "fsdp1": {"num_processes": 8, "distributed_type": "FSDP", "fsdp_version": 1, "fsdp_offload_params": True},
    # parallelism_config layouts: accelerate's launcher must hand them to the processes unchanged
    "fsdp2-cp4-hsdp": {"num_processes": 16, "num_machines": 2, "distributed_type": "FSDP", "dp_replicate_size": 2,
                       "dp_shard_size": 2, "cp_size": 4, "pad_to_multiple_of": 8, "max_length": 4096},
    "zero3-sp2": {"num_processes": 8, "distributed_type": "DEEPSPEED", "zero_stage": 3, "sp_size": 2,
                  "pad_to_multiple_of": 2, "max_length": 4096},      # Qwen2.5-0.5B: 14 heads, 2 kv heads
}


def _launch_args(j, config_path: Path) -> list[str]:
    """The launcher's own arguments as the sbatch script passes them (machine 1 skips accelerate's port probe)."""
    par = j.parallel
    args = ["--config_file", str(config_path), "--num_machines", str(par.num_machines),
            "--num_processes", str(par.num_processes), "--main_process_port", "29555"]
    if par.num_machines > 1:
        args += ["--machine_rank", "1", "--main_process_ip", "10.0.0.1", "--rdzv_backend", "c10d",
                 "--rdzv_conf", "is_host=0"]
    return args + ["--module", "trl.scripts.sft", "--config", "trl.yaml"]


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_accelerate_reads_the_config_and_validates_the_launch(layout, tmp_path, monkeypatch):
    from accelerate.commands.config.config_args import load_config_from_file
    from accelerate.utils import patch_environment
    from accelerate.utils.launch import prepare_deepspeed_cmd_env, prepare_multi_gpu_env

    j = job(**LAYOUTS[layout])
    ds_path = tmp_path / "deepspeed.json" if j.parallel.deepspeed else None
    if ds_path:
        import json

        ds_path.write_text(json.dumps(deepspeed_config(j)))
    path = tmp_path / "accelerate.yaml"
    path.write_text(yaml.safe_dump(accelerate_config(j, deepspeed_config_file=str(ds_path) if ds_path else None)))
    loaded = load_config_from_file(str(path))            # raises on any unknown key
    assert loaded.num_processes == j.parallel.num_processes and loaded.num_machines == j.parallel.num_machines

    monkeypatch.chdir(tmp_path)
    args = accelerate_launch.launch_command_parser().parse_args(_launch_args(j, path))
    args, defaults, mp_from_config = accelerate_launch._validate_launch_command(args)
    if j.parallel.deepspeed:
        assert args.use_deepspeed
        args.deepspeed_fields_from_accelerate_config = ",".join(
            list(defaults.deepspeed_config) + (["mixed_precision"] if mp_from_config else []))
        _, env = prepare_deepspeed_cmd_env(args)
        from accelerate.utils import DeepSpeedPlugin

        with patch_environment(**env):
            plugin = DeepSpeedPlugin()                    # runs accelerate's deepspeed_config_file checks
        assert plugin.hf_ds_config.config["zero_optimization"]["stage"] == j.parallel.zero_stage
    elif j.parallel.num_processes > 1:
        assert args.multi_gpu or args.use_fsdp
        env = prepare_multi_gpu_env(args)
        if j.parallel.fsdp:
            import accelerate.utils.dataclasses as acc_dc
            import torch
            from accelerate.utils import FullyShardedDataParallelPlugin

            # sync_module_states asks for the current GPU; this machine has none, so pretend device 0
            monkeypatch.setattr(acc_dc, "is_cuda_available", lambda: True)
            monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
            with patch_environment(**env):
                FullyShardedDataParallelPlugin()
    if j.parallel.layout.active:
        _assert_parallelism_reaches_accelerate(j, env)
    if j.parallel.num_machines > 1:                       # c10d gets a real endpoint, not localhost:29400
        assert args.rdzv_endpoint == "10.0.0.1:29555" and args.nnodes == str(j.parallel.num_machines)


def _assert_parallelism_reaches_accelerate(j, env) -> None:
    """The environment accelerate's launcher built from the YAML becomes the ParallelismConfig every rank's
    Accelerator constructs (accelerator.py: `ParallelismConfig()` reads PARALLELISM_CONFIG_*)."""
    from accelerate import ParallelismConfig
    from accelerate.utils import patch_environment

    assert env["ACCELERATE_USE_PARALLELISM_CONFIG"] == "true"
    with patch_environment(**env):
        pc = ParallelismConfig()
    par = j.parallel
    got = (pc.dp_replicate_size, pc.dp_shard_size, pc.tp_size, pc.cp_size, pc.sp_size)
    assert got == (par.dp_replicate_size, par.dp_shard_size, par.tp_size, par.cp_size, par.sp_size)
    assert pc.sp_backend == "deepspeed" and pc.cp_backend == "torch"
    if par.cp_size > 1:
        assert pc.cp_handler.cp_comm_strategy == par.cp_comm_strategy
    if par.sp_size > 1:
        assert pc.sp_handler.sp_attn_implementation == par.sp_attn_implementation


TRAINER_CASES = {
    "sft": {"packing": True, "padding_free": True, "per_device_train_batch_size": 4, "use_peft": True,
            "lora_target_modules": ("all-linear",)},
    "dpo": {"beta": 0.2, "max_length": 2048, "precompute_ref_log_probs": True},
    "reward": {"max_length": 512, "activation_offloading": True},
    "grpo": {"num_generations": 4, "per_device_train_batch_size": 4, "max_completion_length": 256,
             "use_vllm": True, "vllm_mode": "server"},
    "rloo": {"num_generations": 4, "per_device_train_batch_size": 4, "beta": 0.1},
    "kto": {"beta": 0.2, "max_length": 512, "precompute_ref_log_probs": True, "per_device_train_batch_size": 4},
    "distillation": {"teacher_model_name_or_path": "Qwen/Qwen2.5-1.5B", "max_completion_length": 256, "beta": 0.5,
                     "teacher_model_init_kwargs": {"dtype": "bfloat16"}},
}


@pytest.mark.parametrize("trainer", list(TRAINER_CASES))
def test_trl_parser_takes_the_yaml_with_nothing_left_over(trainer, tmp_path):
    j = job(trainer, **TRAINER_CASES[trainer])
    user = {"model_name_or_path": "Qwen/Qwen2.5-0.5B", "dataset_name": "trl-lib/Capybara", "learning_rate": 1e-5,
            "use_cpu": True, "bf16": False, "report_to": "none"}
    script = importlib.import_module(f"trl.scripts.{trainer}")
    if any(f.name == "reward_model_name_or_path" for cls in script.make_parser().dataclass_types
           for f in dataclasses.fields(cls)):
        user["reward_model_name_or_path"] = "Qwen/Qwen2.5-0.5B"      # GRPO/RLOO's scripts need a reward
    data = trl_config(dataclasses.replace(j, train=dataclasses.replace(j.train, bf16=False)), user,
                      output_dir=str(tmp_path / "out"))
    path = tmp_path / "trl.yaml"
    path.write_text(yaml.safe_dump(data))
    *parsed, config_left, cli_left = script.make_parser().parse_args_and_config(
        ["--config", str(path)], return_remaining_strings=True, separate_remaining_strings=True)
    assert config_left == [] and cli_left == []
    by_name = {f.name: getattr(obj, f.name) for obj in parsed for f in dataclasses.fields(obj)}
    for key, value in data.items():
        if key not in REGISTRY[trainer].fields + MODEL_CONFIG_FIELDS:
            continue                              # the user's own fields: TrainingArguments may normalise them
        expected = list(value) if isinstance(value, tuple) else value
        assert by_name[key] == expected or str(by_name[key]) == str(expected), key


def test_trainer_field_tables_match_trl_dataclasses():
    from hpcmem.job.spec import TrainSpec, field_names

    model = {f.name for f in dataclasses.fields(trl.ModelConfig)}
    spec = set(field_names(TrainSpec)) - {"trainer"}
    assert set(MODEL_CONFIG_FIELDS) == spec & model
    for name, e in REGISTRY.items():
        cls = getattr(trl, e.config_class)
        assert getattr(trl, e.trainer_class).__module__ == f"trl.trainer.{name}_trainer"
        assert importlib.import_module(e.script).make_parser    # `trl <name>` runs this script
        declared = {f.name: f.default for f in dataclasses.fields(cls)}
        assert set(e.fields) == (spec - model) & set(declared), name
        for key, value in e.defaults.items():                 # the entry's defaults are the config class's
            assert declared[key] == value, (name, key)


@pytest.mark.parametrize("stage,offload", [(2, "none"), (2, "cpu"), (3, "none"), (3, "cpu")])
def test_deepspeed_validates_the_config_once_auto_is_filled(stage, offload):
    from deepspeed.runtime.config import DeepSpeedConfig
    from transformers.integrations.deepspeed import HfTrainerDeepSpeedConfig, unset_hf_deepspeed_config

    offloads = {} if offload == "none" else {"offload_optimizer_device": offload}
    if stage == 3 and offload != "none":
        offloads["offload_param_device"] = offload
    j = job(num_processes=1, distributed_type="DEEPSPEED", zero_stage=stage, bf16=True, **offloads)
    args = trl.SFTConfig(output_dir="/tmp/hpcmem-ds-check", use_cpu=True, bf16=True, report_to="none",
                         per_device_train_batch_size=2, gradient_accumulation_steps=4)
    hf = HfTrainerDeepSpeedConfig(deepspeed_config(j))
    try:
        hf.trainer_config_process(args)      # batch sizes, accumulation, clipping, precision from TrainingArguments
        hf.trainer_config_finalize(args, types.SimpleNamespace(config=types.SimpleNamespace(hidden_size=896)), 100)
    finally:
        unset_hf_deepspeed_config()
    checked = DeepSpeedConfig(hf.config)
    assert checked.zero_optimization_stage == stage and checked.train_micro_batch_size_per_gpu == 2
    assert checked.gradient_accumulation_steps == 4 and checked.zero_config.reduce_bucket_size == 896 * 896
    assert (checked.zero_config.offload_optimizer is not None) == (offload != "none")
