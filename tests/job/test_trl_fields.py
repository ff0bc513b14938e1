"""Every field of TRL's ModelConfig, its seven trainer configs and transformers' TrainingArguments is classified —
modelled, no memory effect (with why), or refused (with why) — read from TRL's own dataclasses, so a TRL upgrade
that adds or moves a field fails here until it is classified. Refused values are refused by `build_job`, before
anything is estimated or submitted."""

from __future__ import annotations

import dataclasses
import importlib
from collections import Counter

import pytest

from hpcmem.errors import SpecError
from hpcmem.job.trainers import REGISTRY
from hpcmem.job.trainers.fields import MODELLED, NO_EFFECT, REFUSED, classify, declared
from hpcmem.job.trl_config import build_job

trl = pytest.importorskip("trl")
transformers = pytest.importorskip("transformers")

pytestmark = pytest.mark.torch


def trl_classes() -> dict[str, type]:
    return {"TrainingArguments": transformers.TrainingArguments, "ModelConfig": trl.ModelConfig,
            **{e.config_class: getattr(trl, e.config_class) for e in REGISTRY.values()}}


def script_classes() -> dict[str, type]:
    """The script's own dataclasses `trl <trainer>` parses beside the config (trl/scripts/<name>.py make_parser)."""
    from trl.scripts.grpo import GRPOScriptArguments
    from trl.scripts.rloo import RLOOScriptArguments

    return {"ScriptArguments": trl.ScriptArguments, "DatasetMixtureConfig": trl.DatasetMixtureConfig,
            "GRPOScriptArguments": GRPOScriptArguments, "RLOOScriptArguments": RLOOScriptArguments}


def test_declared_fields_are_trls():
    classes = trl_classes()
    base = {f.name for f in dataclasses.fields(transformers.TrainingArguments)}
    for name, cls in classes.items():
        own = [f.name for f in dataclasses.fields(cls)
               if name in ("TrainingArguments", "ModelConfig") or f.name not in base]
        assert list(declared()[name]) == own, name
    script_base = {f.name for f in dataclasses.fields(trl.ScriptArguments)}
    for name, cls in script_classes().items():
        own = [f.name for f in dataclasses.fields(cls) if name == "ScriptArguments" or f.name not in script_base]
        assert list(declared()[name]) == own, name
    assert set(declared()) == set(classes) | set(script_classes())
    for e in REGISTRY.values():        # each entry names the script class its script parses
        parser_classes = importlib.import_module(e.script).make_parser().dataclass_types
        assert e.script_class in [c.__name__ for c in parser_classes], e.name


def test_every_field_is_classified_with_a_reason():
    table: dict[str, Counter] = {}
    missing = []
    for cls_name, cls in {**trl_classes(), **script_classes()}.items():
        for f in dataclasses.fields(cls):
            if cls_name not in ("TrainingArguments", "ModelConfig") and f.name in declared()["TrainingArguments"]:
                continue                     # a TrainingArguments field a TRL config re-declares with its default
            field = classify(cls_name, f.name)
            if field is None:
                missing.append(f"{cls_name}.{f.name}")
                continue
            assert field.kind in (MODELLED, NO_EFFECT, REFUSED) and len(field.why) > 10, (cls_name, f.name)
            table.setdefault(cls_name, Counter())[field.kind] += 1
    assert not missing, "unclassified TRL fields: " + ", ".join(missing)
    for cls_name, counts in sorted(table.items()):
        print(f"{cls_name:20} " + ", ".join(f"{k} {counts[k]}" for k in (MODELLED, NO_EFFECT, REFUSED)))


# A non-default value for every refused field (the one TRL would act on)
REFUSED_VALUES = {
    "use_liger_kernel": True, "liger_kernel_config": {"rms_norm": True}, "use_cache": True,
    "parallelism_config": {"cp_size": 2}, "fsdp": "full_shard", "fsdp_config": {"version": 2},
    "deepspeed": "ds_config.json", "eval_packing": True, "generation_kwargs": {"num_beams": 4},
    "use_transformers_continuous_batching": True, "transformers_continuous_batching_config": {"block_size": 32},
    "use_transformers_paged": True,
}


@pytest.mark.parametrize("trainer", list(REGISTRY))
def test_refused_fields_are_refused_before_anything_runs(trainer):
    e = REGISTRY[trainer]
    shared = declared()["TrainingArguments"] + declared()["ModelConfig"]
    base = {"model_name_or_path": "Qwen/Qwen2.5-0.5B", "per_device_train_batch_size": 8,
            "teacher_model_name_or_path": "Qwen/Qwen2.5-1.5B" if trainer == "distillation" else None}
    tried = 0
    for name in list(shared) + list(declared()[e.config_class]):
        field = classify(e.config_class, name)
        if field.kind != REFUSED:
            continue
        value = REFUSED_VALUES.get(name, 0.1 if isinstance(field.default, float) else True)
        with pytest.raises(SpecError, match=name):
            build_job(trainer, {**base, name: value})
        build_job(trainer, {**base, name: field.default})          # TRL's default is accepted
        tried += 1
    assert tried >= 6


def test_a_field_of_another_trainers_config_is_refused():
    with pytest.raises(SpecError, match="desirable_weight is a KTOConfig field; SFTConfig has no desirable_weight"):
        build_job("sft", {"model_name_or_path": "Qwen/Qwen2.5-0.5B", "desirable_weight": 2.0})
    job, passed = build_job("kto", {"model_name_or_path": "Qwen/Qwen2.5-0.5B", "per_device_train_batch_size": 2,
                                    "desirable_weight": 2.0, "dataset_name": "trl-lib/kto-mix-14k"})
    assert passed == ["dataset_name", "desirable_weight"]      # no memory effect; not a TRL config field


def test_transformers_new_checkpointing_names_win_as_in_training_arguments():
    """activation_checkpointing is TrainingArguments' name since transformers 5; when set it decides, whatever the
    deprecated gradient_checkpointing says (training_args.py __post_init__) — a real memory difference."""
    on, _ = build_job("sft", {"model_name_or_path": "Qwen/Qwen2.5-0.5B"})
    off, _ = build_job("sft", {"model_name_or_path": "Qwen/Qwen2.5-0.5B", "activation_checkpointing": False,
                               "gradient_checkpointing": True})
    args = transformers.TrainingArguments(output_dir="/tmp/x", activation_checkpointing=False,
                                          gradient_checkpointing=True, use_cpu=True)
    assert on.train.gradient_checkpointing and off.train.gradient_checkpointing is args.gradient_checkpointing is False


def test_fp16_alone_turns_bf16_off_as_trl_does():
    """TRL's bf16 defaults to None and becomes `not fp16` (trl/trainer/base_config.py __post_init__): `--fp16 true`
    alone is an fp16 job, not a clash with a bf16 TRL never set."""
    job, _ = build_job("sft", {"model_name_or_path": "Qwen/Qwen2.5-0.5B", "fp16": True})
    import trl

    real = trl.SFTConfig(output_dir="/tmp/hpcmem-fp16-alone", fp16=True, use_cpu=True)
    assert (job.train.bf16, job.train.fp16) == (real.bf16, real.fp16) == (False, True)


@pytest.mark.parametrize("name", ["beta", "num_generations", "disable_dropout"])
def test_flag_help_gives_each_trainers_default_as_trls_config_has_it(name):
    """`--beta` and the like differ by trainer (DistillationConfig's beta is 1.0, GRPOConfig's 0.0): the help names
    each trainer's default, read here from TRL's own config classes (a field TRL types as None-able is given as TRL
    resolves it only where hpcmem does too, so only plain values are compared)."""
    from hpcmem.cli.options import spec_options

    option = next(o for o in spec_options() if f"--{name}" in o.opts)
    for e in REGISTRY.values():
        if not e.declares(name):
            continue
        trl_default = next(f.default for f in dataclasses.fields(getattr(trl, e.config_class)) if f.name == name)
        if trl_default is not None:
            assert f"{e.name} {trl_default!r}" in option.help, (e.name, trl_default, option.help)


KEYS = ["max_seq_length", "per_device_train_batchsize", "max_length", "dataset_name", "dataset_text_field",
        "lora_r", "reward_funcs", "learning_rate", "gpu", "num_proceses", "streaming", "evaluation_strategy"]


@pytest.mark.parametrize("trainer", ["sft", "grpo", "kto"])
def test_a_yaml_key_is_refused_exactly_when_trls_parser_leaves_it_unread(trainer, tmp_path):
    """`trl <trainer> --config x.yaml` parses the YAML with the script's TrlParser and hands every key no dataclass
    consumed to `accelerate launch`, which stops on it (trl/cli/commands/training.py). hpcmem refuses a key as
    unknown exactly when TRL's own parser leaves it unconsumed — hpcmem's own keys (gpu) aside."""
    import yaml

    e = REGISTRY[trainer]
    for key in KEYS:
        value = ["accuracy_reward"] if key == "reward_funcs" else "H100-80GB" if key == "gpu" else 8
        cfg = tmp_path / f"{key}.yaml"
        cfg.write_text(yaml.safe_dump({"model_name_or_path": "Qwen/Qwen2.5-0.5B", "output_dir": str(tmp_path),
                                       "use_cpu": True,
                                       key: value}))
        parser = importlib.import_module(e.script).make_parser()
        *_, config_left, _ = parser.parse_args_and_config(["--config", str(cfg)], return_remaining_strings=True,
                                                          separate_remaining_strings=True)
        trl_unread = f"--{key}" in config_left
        try:
            build_job(trainer, {"model_name_or_path": "Qwen/Qwen2.5-0.5B", key: value})
            refused = ""
        except SpecError as exc:
            refused = " ".join(exc.problems)
        unknown = "is not a field of" in refused or f"has no {key} field" in refused
        if key == "gpu":
            assert trl_unread and not refused          # hpcmem's own key, which hpcmem reads and strips
        else:
            assert unknown == trl_unread, (trainer, key, refused, config_left)


def test_an_older_trl_name_is_refused_with_the_new_one():
    with pytest.raises(SpecError, match="max_seq_length is not a field of TRL 1.16.*write max_length"):
        build_job("sft", {"model_name_or_path": "Qwen/Qwen2.5-0.5B", "max_seq_length": 2048})
    with pytest.raises(SpecError, match="did you mean per_device_train_batch_size"):
        build_job("sft", {"model_name_or_path": "Qwen/Qwen2.5-0.5B", "per_device_train_batchsize": 1})
