"""Keys of a TRL YAML that `trl <trainer>` does not read as a field of its own classes are a question, never taken as
"no memory effect": TRL's own parser (trl/scripts/<trainer>.py `make_parser`, TrlParser) is the oracle for which keys
it leaves unread, and hpcmem's answer is checked through its command line."""

from __future__ import annotations

import pytest
import yaml

from hpcmem.cli import run

pytest.importorskip("trl")
pytestmark = pytest.mark.torch


def trl_leaves_unread(script: str, config: dict, tmp_path) -> list[str]:
    """The config keys TRL's parser hands on (to `accelerate launch`, trl/cli/commands/training.py) instead of
    reading them; `env` it pops first (TrlParser.parse_args_and_config)."""
    import importlib

    path = tmp_path / "trl.yaml"
    path.write_text(yaml.safe_dump({"output_dir": str(tmp_path / "out"), **config}))
    parser = importlib.import_module(f"trl.scripts.{script}").make_parser()
    *_, config_remaining, _ = parser.parse_args_and_config(
        ["--config", str(path), "--dataset_name", "x", "--use_cpu", "true", "--bf16", "false"],
        return_remaining_strings=True, separate_remaining_strings=True)
    return config_remaining[::2]


@pytest.mark.parametrize("trainer, key, value", [("sft", "num_generations", 8), ("dpo", "packing", False),
                                                 ("grpo", "max_length", 1024)])
def test_another_trainers_field_at_its_default_value_is_refused(trainer, key, value, tmp_path, capsys):
    assert trl_leaves_unread(trainer, {key: value}, tmp_path) == [f"--{key}"]
    path = tmp_path / "hpcmem.yaml"
    path.write_text(yaml.safe_dump({"model_name_or_path": "Qwen/Qwen2.5-0.5B", key: value}))
    assert run(["estimate", trainer, "--config", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{key} is a " in err and "has no " in err
    assert run(["estimate", trainer, "--model_name_or_path", "Qwen/Qwen2.5-0.5B", f"--{key}", str(value)]) == 2
    assert f"{key} is a " in capsys.readouterr().err


def test_an_env_block_is_trls_but_not_read_and_says_where_it_goes(tmp_path, capsys):
    env = {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}
    assert trl_leaves_unread("sft", {"env": env}, tmp_path) == []          # TrlParser takes it (and exports it)
    path = tmp_path / "hpcmem.yaml"
    path.write_text(yaml.safe_dump({"model_name_or_path": "Qwen/Qwen2.5-0.5B", "env": env}))
    assert run(["estimate", "sft", "--config", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "env (variables TrlParser exports" in err and "--expandable_segments" in err


def trl_refuses(script: str, config: dict, tmp_path) -> bool:
    try:
        trl_leaves_unread(script, config, tmp_path)
    except SystemExit:                   # argparse: "argument --seed: invalid int value: 'abc'"
        return True
    return False


@pytest.mark.parametrize("key, value", [("seed", "abc"), ("seed", "7"), ("learning_rate", "fast"),
                                        ("learning_rate", "2e-5"), ("do_eval", "maybe"), ("do_eval", "Yes"),
                                        ("num_train_epochs", "three"), ("num_train_epochs", 3)])
def test_a_field_hpcmem_does_not_model_is_refused_exactly_when_trls_parser_refuses_its_value(key, value, tmp_path,
                                                                                           capsys):
    refused = trl_refuses("sft", {key: value}, tmp_path)
    capsys.readouterr()                  # argparse's own usage message
    path = tmp_path / "hpcmem.yaml"
    path.write_text(yaml.safe_dump({"model_name_or_path": "Qwen/Qwen2.5-0.5B", key: value}))
    assert run(["estimate", "sft", "--config", str(path)]) == (2 if refused else 0)
    err = capsys.readouterr().err
    assert (f"{key} must be" in err and err.count("\n") == 1) if refused else "error" not in err


def test_a_number_given_for_a_boolean_is_told_apart_from_the_word(tmp_path, capsys):
    """YAML's `gradient_checkpointing: 1` is the number 1; the refusal listed the word "1" as accepted and then
    showed `got 1`, which read as a contradiction."""
    path = tmp_path / "hpcmem.yaml"
    path.write_text("model_name_or_path: Qwen/Qwen2.5-0.5B\ngradient_checkpointing: 1\n")
    assert run(["estimate", "sft", "--config", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "a number is not a boolean; got 1" in err
    path.write_text("model_name_or_path: Qwen/Qwen2.5-0.5B\ngradient_checkpointing: '1'\n")
    assert run(["estimate", "sft", "--config", str(path)]) == 0
