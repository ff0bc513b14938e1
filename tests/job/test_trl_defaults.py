"""`hpcmem estimate <trainer> --help` shows TRL's defaults for that trainer: the TRL fields' table
(hpcmem/job/trainers/trl_defaults.json) is what the installed TRL and transformers declare, and every modelled
flag's default is what the trainer's config holds once TRL has built it."""

from __future__ import annotations

import ast
import dataclasses
import enum
import json
import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from hpcmem.cli import cli
from hpcmem.cli.options import SpecOption, spec_options
from hpcmem.job.trainers import REGISTRY

trl = pytest.importorskip("trl")
transformers = pytest.importorskip("transformers")

pytestmark = pytest.mark.torch
# attn_implementation: None in the config, sdpa chosen when transformers loads the model; dataloader_pin_memory: True
# in the dataclass, turned off by TrainingArguments.__post_init__ only because this test builds with use_cpu;
# steps_per_generation / generation_batch_size: None, which GRPOConfig/RLOOConfig.__post_init__ derive from
# gradient_accumulation_steps and the batch size
RESOLVED_ELSEWHERE = {"attn_implementation", "dataloader_pin_memory", "steps_per_generation", "generation_batch_size"}
TABLE = Path(__file__).parents[2] / "hpcmem" / "job" / "trainers" / "trl_defaults.json"


def _plain(value):
    """A dataclass default as JSON holds it: enums by value, containers element-wise, other objects as text."""
    if isinstance(value, enum.Enum):
        return _plain(value.value)
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    return str(value)


def _declared_defaults(cls) -> dict:
    out = {}
    for f in dataclasses.fields(cls):
        value = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
        out[f.name] = None if value is dataclasses.MISSING else _plain(value)
    return out


def test_the_table_is_what_trl_declares():
    from trl.scripts.grpo import GRPOScriptArguments
    from trl.scripts.rloo import RLOOScriptArguments

    base = _declared_defaults(transformers.TrainingArguments)
    classes = {"ModelConfig": trl.ModelConfig, **{e.config_class: getattr(trl, e.config_class)
                                                   for e in REGISTRY.values()},
               "ScriptArguments": trl.ScriptArguments, "DatasetMixtureConfig": trl.DatasetMixtureConfig,
               "GRPOScriptArguments": GRPOScriptArguments, "RLOOScriptArguments": RLOOScriptArguments}
    expected = {"TrainingArguments": base}
    for name, cls in classes.items():       # each class: what it adds or re-declares with another default
        expected[name] = {k: v for k, v in _declared_defaults(cls).items() if k not in base or base[k] != v}
    assert json.loads(TABLE.read_text(encoding="utf-8")) == expected, \
        f"TRL's defaults moved: regenerate {TABLE} as this test computes it"


def _help_defaults(trainer: str) -> dict[str, str]:
    """flag → the default its help line shows, read off the printed help (records wrap onto indented lines)."""
    text = CliRunner().invoke(cli, ["estimate", trainer, "--help"]).output
    records = re.split(r"\n(?=  -)", text)
    out = {}
    for record in records:
        flat = " ".join(record.split())
        m = re.match(r"--([a-z0-9_]+)\b.*?\(default (.*?)(?::|\)$)", flat)
        if m:
            out[m.group(1)] = m.group(2)
    return out


@pytest.mark.parametrize("trainer", list(REGISTRY))
def test_help_defaults_are_the_built_configs(trainer, tmp_path):
    """The config TRL builds (after __post_init__) holds the default each flag's help shows."""
    e = REGISTRY[trainer]
    config = getattr(trl, e.config_class)(output_dir=str(tmp_path), use_cpu=True)  # bf16 on a CPU needs it
    model_config = trl.ModelConfig()
    shown = _help_defaults(trainer)
    checked = []
    for option in spec_options():
        name = option.name
        if not isinstance(option, SpecOption) or name in RESOLVED_ELSEWHERE or name not in shown:
            continue
        holder = config if hasattr(config, name) else model_config if hasattr(model_config, name) else None
        if holder is None:
            continue
        built = getattr(holder, name)
        if built is None and name.startswith("lora_") or name == "gradient_checkpointing_kwargs" and built is None:
            built = {} if name.endswith("kwargs") else ()      # peft / transformers read None as empty
        if name == "accelerator_config" and built == type(built)():
            built = {}                  # transformers builds AcceleratorConfig() from None: an empty mapping's defaults
        value = ast.literal_eval(shown[name])
        assert value == (tuple(built) if isinstance(built, list) else built), (trainer, name, shown[name], built)
        checked.append(name)
    assert {"per_device_train_batch_size", "gradient_checkpointing", "bf16"} <= set(checked), checked
    if "beta" in e.fields:
        assert "beta" in checked


def test_distillation_help_says_trls_beta():
    assert _help_defaults("distillation")["beta"] == repr(trl.DistillationConfig(output_dir="x", use_cpu=True).beta) == "1.0"


def test_other_trl_fields_listed_with_their_defaults():
    shown = _help_defaults("sft")
    assert shown["learning_rate"] == json.dumps(trl.SFTConfig(output_dir="x", use_cpu=True).learning_rate)
    assert shown["dataset_name"] == "null" and shown["adam_beta2"] == "0.999"
