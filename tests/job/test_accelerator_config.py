"""TrainingArguments.accelerator_config read as transformers reads it (a mapping, JSON text, or a JSON file; its keys
checked against transformers' own AcceleratorConfig), and the two keys that change memory: gradient_accumulation_kwargs
num_steps (the accumulation when gradient_accumulation_steps is 1) and sync_each_batch (FSDP's gradients sharded
between micro-batches). Hand counts: Qwen2.5-0.5B's 494,032,768 parameters (its config.json: embedding 151,936 × 896
tied, 24 layers)."""

from __future__ import annotations

import json

import pytest

from hpcmem.errors import SpecError
from hpcmem.estimate.lora import lora_layout
from hpcmem.estimate.states import model_states
from hpcmem.job.accelerator_config import ACCUMULATION_KEYS, KEYS
from hpcmem.job.shape import precision
from hpcmem.job.trl_config import build_job

PSI = 494_032_768
BASE = {"model_name_or_path": "Qwen/Qwen2.5-0.5B", "dtype": "bfloat16", "distributed_type": "FSDP", "fsdp_version": 2,
        "num_processes": 4}


def _states(**settings):
    job, _ = build_job("sft", {**BASE, **settings})
    return job, model_states(job, precision(job), lora_layout(job))


def test_fsdp_keeps_every_gradient_unsharded_across_accumulation() -> None:
    job, s = _states(gradient_accumulation_steps=4)
    assert s.accumulated == 2 * PSI             # bf16 policy, unsharded
    assert s.gradients == 4 * PSI // 4          # the reduce-scattered fp32 shard of the window's last micro-batch
    _, synced = _states(gradient_accumulation_steps=4,
                        accelerator_config={"gradient_accumulation_kwargs": {"sync_each_batch": True}})
    assert synced.accumulated == synced.gradients == 4 * PSI // 4
    _, fp32 = _states(gradient_accumulation_steps=4, dtype="float32", bf16=False)
    assert fp32.accumulated == 4 * PSI
    _, zero = _states(gradient_accumulation_steps=4, distributed_type="DEEPSPEED", zero_stage=2)
    assert zero.accumulated == zero.gradients   # DeepSpeed: the Trainer syncs every micro-batch


def test_num_steps_is_the_accumulation_when_the_steps_are_one() -> None:
    job, _ = build_job("sft", {**BASE, "accelerator_config": {"gradient_accumulation_kwargs": {"num_steps": 4}}})
    assert job.train.gradient_accumulation_steps == 4
    with pytest.raises(SpecError, match="num_steps=4 with gradient_accumulation_steps=2"):
        build_job("sft", {**BASE, "gradient_accumulation_steps": 2,
                          "accelerator_config": {"gradient_accumulation_kwargs": {"num_steps": 4}}})


def test_json_text_and_file_read_alike(tmp_path) -> None:
    config = {"split_batches": True, "gradient_accumulation_kwargs": {"sync_each_batch": True}}
    path = tmp_path / "accelerator.json"
    path.write_text(json.dumps(config))
    for value in (config, json.dumps(config), str(path)):
        job, _ = build_job("sft", {**BASE, "accelerator_config": value})
        assert job.train.accelerator_config == config and job.train.sync_each_batch


@pytest.mark.parametrize("value, rule", [
    ({"bogus": 1}, "unknown key"),
    ({"gradient_accumulation_kwargs": {"sync_each_batch": "yes"}}, "true or false"),
    ({"gradient_accumulation_kwargs": {"num_step": 2}}, "unknown key"),
    ({"gradient_accumulation_kwargs": [1]}, "a mapping"),
    ({"gradient_accumulation_kwargs": {"num_steps": 0}}, "a positive integer"),
    ({"gradient_accumulation_kwargs": {"num_steps": 10**23}}, "a positive integer ≤ 2147483647"),
    ("/nonexistent/accelerator.json", "nor a JSON file"),
])
def test_bad_values_are_one_line_errors(value, rule) -> None:
    with pytest.raises(SpecError, match=rule) as info:
        build_job("sft", {**BASE, "accelerator_config": value})
    assert "\n" not in str(info.value).strip()


def test_the_keys_are_transformers_and_accelerates_own() -> None:
    import dataclasses

    pytest.importorskip("transformers")
    from accelerate.utils import GradientAccumulationPlugin
    from transformers.trainer_pt_utils import AcceleratorConfig

    assert set(KEYS) == {f.name for f in dataclasses.fields(AcceleratorConfig)}
    assert set(ACCUMULATION_KEYS) == {f.name for f in dataclasses.fields(GradientAccumulationPlugin)}
    with pytest.raises(TypeError):          # what transformers does with a key it does not know
        AcceleratorConfig(bogus=1)
