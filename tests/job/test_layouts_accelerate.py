"""hpcmem reads accelerate configs as the installed accelerate does: every file the installed TRL ships, the
`parallelism_config` block (only its prefixed keys reach the processes), and the models accelerate refuses for
context parallelism. Torch tier (CPU, seconds): accelerate's own launcher code is the reference."""

from __future__ import annotations

import copy
import importlib.resources
from pathlib import Path

import pytest
import yaml

pytestmark = pytest.mark.torch
accelerate_launch = pytest.importorskip("accelerate.commands.launch")
pytest.importorskip("trl")

TRL_CONFIGS = sorted(p.name for p in importlib.resources.files("trl.accelerate_configs").iterdir()
                     if p.name.endswith(".yaml"))


def accelerate_args(path: str, tmp_path, monkeypatch):
    """What `trl sft --accelerate_config FILE` hands accelerate (trl/cli/accelerate_config.py: --config_file)."""
    monkeypatch.chdir(tmp_path)
    args = accelerate_launch.launch_command_parser().parse_args(["--config_file", path, "train.py"])
    return accelerate_launch._validate_launch_command(args)


def launched_processes(args) -> int:
    """accelerate's `launch_command`: DeepSpeed, FSDP and multi-GPU go through torchrun with num_processes ranks;
    anything else is `simple_launcher`, one process."""
    if args.use_deepspeed or args.use_fsdp or args.multi_gpu:
        return int(args.num_processes)
    return 1


def test_trl_ships_the_configs_this_test_expects():
    assert {"single_gpu.yaml", "multi_gpu.yaml", "zero3.yaml", "fsdp2.yaml"} <= set(TRL_CONFIGS)


@pytest.mark.parametrize("name", TRL_CONFIGS)
def test_every_shipped_trl_config_estimates_as_accelerate_launches_it(name, tmp_path, monkeypatch):
    from hpcmem.estimate import estimate
    from hpcmem.job.trl_config import SHIPPED_ACCELERATE, accelerate_settings, build_job

    path = str(importlib.resources.files("trl.accelerate_configs").joinpath(name))
    job, _ = build_job("sft", {"model_name_or_path": "Qwen/Qwen2.5-0.5B", "max_length": 512, "gpu": "H100-80GB",
                               **accelerate_settings(path)})
    est = estimate(job)
    assert est.device_peak_bytes > 0
    args, defaults, _ = accelerate_args(path, tmp_path, monkeypatch)
    assert job.parallel.world_size == launched_processes(args)
    assert job.parallel.distributed_type == defaults.distributed_type.value
    # the same config by name: the same layout (by name hpcmem does not know TRL's num_processes, so compare kind)
    by_name, _ = build_job("sft", {"model_name_or_path": "Qwen/Qwen2.5-0.5B", "max_length": 512,
                                   **accelerate_settings(Path(name).stem)})
    assert by_name.parallel.distributed_type == job.parallel.distributed_type
    shipped = SHIPPED_ACCELERATE[Path(name).stem]
    assert shipped == {k: getattr(job.parallel, k) for k in shipped}


def test_bare_parallelism_keys_never_reach_the_processes(tmp_path, monkeypatch):
    """Why hpcmem refuses `cp_size: 4` in the block: accelerate's launcher drops it (the processes get size 1)."""
    from accelerate.utils.launch import prepare_multi_gpu_env

    path = tmp_path / "bare.yaml"
    path.write_text(yaml.safe_dump({"distributed_type": "FSDP", "num_processes": 8, "num_machines": 1,
                                    "fsdp_config": {"fsdp_version": 2},
                                    "parallelism_config": {"dp_shard_size": 2, "cp_size": 4}}))
    args, _, _ = accelerate_args(str(path), tmp_path, monkeypatch)
    env = prepare_multi_gpu_env(args)
    assert env["PARALLELISM_CONFIG_CP_SIZE"] == "1" and env["PARALLELISM_CONFIG_DP_SHARD_SIZE"] == "1"


def test_the_block_keys_hpcmem_knows_are_accelerates_arguments():
    from hpcmem.job.parallelism import ARGUMENTS, PREFIX

    parser = accelerate_launch.launch_command_parser()
    group = next(g for g in parser._action_groups if g.title == "ParallelismConfig Arguments")
    assert {a.dest for a in group._group_actions} == {PREFIX + name for name in ARGUMENTS}


def test_sliding_window_models_match_accelerates_refusal():
    """hpcmem's ModelSpec.sliding_window against accelerate's own check (big_modeling.py
    `_attach_context_parallel_hooks`) on transformers' config class for every catalog model."""
    import torch
    from accelerate.big_modeling import _attach_context_parallel_hooks
    from transformers import AutoConfig

    from hpcmem.models import resolve_model
    from hpcmem.models.resolve import catalog_entry, catalog_ids

    for hub_id in catalog_ids():
        # a deep copy: transformers standardises nested dicts (rope_scaling) in place, which would change the
        # catalog's config and so the hash its shipped learned profile is found by
        cfg = copy.deepcopy(catalog_entry(hub_id)["config"])
        config = AutoConfig.for_model(**cfg)
        module = torch.nn.Module()
        module.config = config
        try:
            _attach_context_parallel_hooks(module)
            refused = False
        except ValueError:
            refused = True
        assert refused == bool(resolve_model(hub_id).sliding_window), hub_id


@pytest.mark.parametrize("value", ["sdpa", "flash_attention_2", "flash_attention_3", "eager", "flex_attention",
                                   "kernels-community/flash-attn2", "org/other-kernel", "$(id)", ""])
def test_sp_attn_implementation_is_refused_exactly_where_accelerate_refuses_it(value):
    """hpcmem's check against accelerate's own DeepSpeedSequenceParallelConfig on the same value."""
    from accelerate.utils.dataclasses import DeepSpeedSequenceParallelConfig

    from hpcmem.errors import SpecError
    from hpcmem.job.jobspec import JobSpec
    from hpcmem.job.spec import ParallelSpec, TrainSpec
    from hpcmem.models import resolve_model

    try:
        DeepSpeedSequenceParallelConfig(sp_attn_implementation=value)
        accelerate_refuses = False
    except ValueError:
        accelerate_refuses = True
    try:
        JobSpec(model=resolve_model("Qwen/Qwen2.5-0.5B"), train=TrainSpec(trainer="sft"),
                parallel=ParallelSpec(distributed_type="FSDP", num_processes=2, sp_attn_implementation=value))
        hpcmem_refuses = False
    except SpecError as exc:
        assert "sp_attn_implementation" in str(exc)
        hpcmem_refuses = True
    assert hpcmem_refuses == accelerate_refuses, value
