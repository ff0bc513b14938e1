"""An accelerate config with a key accelerate does not know is refused, as `accelerate launch` refuses it
(commands/config/config_args.py BaseConfig.from_yaml_file) — accelerate's own loader is the oracle here."""

from __future__ import annotations

import dataclasses

import pytest
import yaml

from hpcmem.errors import SpecError
from hpcmem.job.accelerate_keys import accelerate_keys
from hpcmem.job.trl_config import accelerate_settings

config_args = pytest.importorskip("accelerate.commands.config.config_args")
pytestmark = pytest.mark.torch


def test_shipped_keys_are_accelerates():
    assert list(accelerate_keys()) == [f.name for f in dataclasses.fields(config_args.ClusterConfig)]


CONFIGS = {
    "typo": {"compute_environment": "LOCAL_MACHINE", "distributed_type": "DEEPSPEED", "num_proceses": 8,
             "deepspeed_config": {"zero_stage": 3}},
    "valid": {"compute_environment": "LOCAL_MACHINE", "distributed_type": "DEEPSPEED", "num_processes": 8,
              "deepspeed_config": {"zero_stage": 3}},
    "foreign": {"compute_environment": "LOCAL_MACHINE", "distributed_type": "MULTI_GPU", "num_processes": 2,
                "zero_stage": 3},
}


@pytest.mark.parametrize("name", list(CONFIGS))
def test_refused_exactly_when_accelerate_refuses(name, tmp_path):
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(CONFIGS[name]))
    try:
        config_args.ClusterConfig.from_yaml_file(yaml_file=str(path))
        accelerate_refuses = False
    except ValueError as exc:
        accelerate_refuses = "unknown keys" in str(exc)
    if accelerate_refuses:
        with pytest.raises(SpecError, match="is not an accelerate config key"):
            accelerate_settings(str(path))
    else:
        accelerate_settings(str(path))
    assert accelerate_refuses == (name != "valid")


def test_the_nearest_key_is_named(tmp_path):
    path = tmp_path / "a.yaml"
    path.write_text(yaml.safe_dump(CONFIGS["typo"]))
    with pytest.raises(SpecError, match="did you mean num_processes"):
        accelerate_settings(str(path))
