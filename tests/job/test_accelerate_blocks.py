"""The deepspeed_config / fsdp_config blocks of an accelerate config, read as `accelerate launch` reads them: the
installed accelerate's launcher (its argument groups, `_validate_launch_command`, `prepare_deepspeed_cmd_env`) and
DeepSpeedPlugin are the reference. Torch tier (imports accelerate and deepspeed: ~10 s on two shared cores)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from hpcmem.errors import HpcmemError, SpecError
from hpcmem.job.accelerate_keys import block_keys
from hpcmem.job.trl_config import accelerate_settings

pytestmark = pytest.mark.torch
accelerate_launch = pytest.importorskip("accelerate.commands.launch")


def write(tmp_path: Path, config: dict) -> str:
    path = tmp_path / "accelerate.yaml"
    path.write_text(yaml.safe_dump({"compute_environment": "LOCAL_MACHINE", "num_machines": 1, **config}))
    return str(path)


def test_the_block_keys_hpcmem_knows_are_the_launchers_arguments():
    parser = accelerate_launch.launch_command_parser()
    for group in ("DeepSpeed Arguments", "FSDP Arguments"):
        actions = next(g for g in parser._action_groups if g.title == group)._group_actions
        assert list(block_keys(group)) == [a.dest for a in actions]


def test_a_deepspeed_file_without_zero_stage_is_the_stage_accelerate_runs(tmp_path, monkeypatch):
    from accelerate.utils import DeepSpeedPlugin
    from accelerate.utils.launch import prepare_deepspeed_cmd_env

    path = write(tmp_path, {"distributed_type": "DEEPSPEED", "num_processes": 2,
                            "deepspeed_config": {"offload_optimizer_device": "none"}})
    monkeypatch.chdir(tmp_path)
    args = accelerate_launch.launch_command_parser().parse_args(["--config_file", path, "train.py"])
    args, defaults, _ = accelerate_launch._validate_launch_command(args)
    args.deepspeed_fields_from_accelerate_config = ",".join(defaults.deepspeed_config)   # as launch_command sets it
    _, env = prepare_deepspeed_cmd_env(args)
    for name, value in env.items():
        if name.startswith("ACCELERATE_"):
            monkeypatch.setenv(name, value)
    assert accelerate_settings(path)["zero_stage"] == DeepSpeedPlugin().zero_stage == 2


def test_a_deepspeed_json_named_in_the_block_is_refused_in_one_line(tmp_path):
    (tmp_path / "ds.json").write_text(json.dumps({"zero_optimization": {"stage": 3,
                                                                          "offload_optimizer": {"device": "cpu"}}}))
    path = write(tmp_path, {"distributed_type": "DEEPSPEED", "num_processes": 8,
                            "deepspeed_config": {"deepspeed_config_file": str(tmp_path / "ds.json")}})
    with pytest.raises(SpecError) as err:
        accelerate_settings(path)
    (message,) = err.value.problems
    assert "deepspeed_config.deepspeed_config_file=" in message and "ds.json" in message and "zero_stage" in message


def test_a_misspelt_block_key_is_asked_about_not_dropped(tmp_path):
    path = write(tmp_path, {"distributed_type": "DEEPSPEED", "num_processes": 8, "deepspeed_config": {"zero_stag": 3}})
    with pytest.raises(SpecError, match=r"deepspeed_config\.zero_stag is not an accelerate launch argument.*did you "
                                        r"mean zero_stage\?"):
        accelerate_settings(path)


@pytest.mark.parametrize("block", [{"fsdp_activation_checkpointing": True}, {"activation_checkpointing": True},
                                   {"fsdp_auto_wrap_policy": "SIZE_BASED_WRAP"},
                                   {"fsdp_sharding_strategy": "NO_SHARD"}])
def test_fsdp_keys_with_a_memory_effect_hpcmem_does_not_model_are_refused(block, tmp_path):
    path = write(tmp_path, {"distributed_type": "FSDP", "num_processes": 4,
                            "fsdp_config": {"fsdp_version": 2, **block}})
    with pytest.raises(SpecError, match=r"fsdp_config\.\w+="):
        accelerate_settings(path)


def test_an_unprefixed_fsdp_key_is_read_as_accelerate_prefixes_it(tmp_path):
    path = write(tmp_path, {"distributed_type": "FSDP", "num_processes": 4,
                            "fsdp_config": {"version": 2, "offload_params": True}})
    monkeypatch_free = accelerate_launch.launch_command_parser().parse_args(["--config_file", path, "train.py"])
    args, _, _ = accelerate_launch._validate_launch_command(monkeypatch_free)
    out = accelerate_settings(path)
    assert (out["fsdp_version"], out["fsdp_offload_params"]) == (int(args.fsdp_version), args.fsdp_offload_params)


def test_a_bare_no_distributed_type_says_how_to_write_it(tmp_path):
    path = tmp_path / "single.yaml"
    path.write_text("distributed_type: NO\nnum_processes: 1\n")
    with pytest.raises(HpcmemError, match="write distributed_type: 'NO'"):
        accelerate_settings(str(path))


def test_fsdp_keys_read_by_accelerate_but_not_modelled_are_listed_back():
    """TRL's fsdp1.yaml turns forward prefetch on; hpcmem.estimate.fsdp_units models none, so the estimate names the
    key among the settings it ignored instead of passing over it."""
    import importlib.resources

    from hpcmem.job.trl_config import build_job

    path = str(importlib.resources.files("trl.accelerate_configs").joinpath("fsdp1.yaml"))
    assert yaml.safe_load(Path(path).read_text())["fsdp_config"]["fsdp_forward_prefetch"] is True
    _, ignored = build_job("sft", {"model_name_or_path": "Qwen/Qwen2.5-0.5B", **accelerate_settings(path)})
    assert "fsdp_config.fsdp_forward_prefetch" in ignored and "fsdp_config.fsdp_backward_prefetch" in ignored
