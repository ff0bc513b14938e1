"""LoRA all-linear on MoE types whose experts are fused parameters, as peft 0.21.2 makes it (its transformers-5
conversion adapts the experts and the router as lora.ParamWrapper): refused at TRL's default dropout with peft's own
words, by `hpcmem estimate` and `hpcmem trace` alike, and at dropout 0 estimated within 3 % of the trace (the trace
computed here, on depth-cut catalog models)."""

from __future__ import annotations

import os
import warnings
from dataclasses import replace

import pytest

pytestmark = [pytest.mark.torch, pytest.mark.slow]
os.environ.setdefault("HF_HUB_OFFLINE", "1")
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")

from hpcmem.cli import run  # noqa: E402
from hpcmem.errors import SpecError  # noqa: E402
from hpcmem.estimate import estimate  # noqa: E402
from hpcmem.job.jobspec import JobSpec  # noqa: E402
from hpcmem.job.spec import TrainSpec  # noqa: E402
from hpcmem.models import resolve_model  # noqa: E402
from hpcmem.trace import run_trace  # noqa: E402

QWEN3_MOE = ["sft", "--model_name_or_path", "Qwen/Qwen3-30B-A3B", "--use_peft", "true", "--lora_target_modules",
             "all-linear", "--dtype", "bfloat16"]


def peft_refusal(**lora) -> str:
    """What get_peft_model itself raises on a tiny Qwen3-MoE with all-linear."""
    config = transformers.AutoConfig.for_model("qwen3_moe", hidden_size=64, intermediate_size=96,
                                               moe_intermediate_size=32, num_hidden_layers=1, num_attention_heads=4,
                                               num_key_value_heads=2, head_dim=16, num_experts=4,
                                               num_experts_per_tok=2, vocab_size=128)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(ValueError) as raised:
            peft.get_peft_model(transformers.AutoModelForCausalLM.from_config(config),
                                peft.LoraConfig(r=8, target_modules="all-linear", **lora))
    return str(raised.value)


@pytest.mark.parametrize("command", ["estimate", "trace"])
def test_default_dropout_is_refused_with_peft_s_reason(capsys, command):
    reason = peft_refusal(lora_dropout=0.05)
    capsys.readouterr()
    status = run([command, *QWEN3_MOE])
    err = capsys.readouterr().err.strip()
    assert status == 2, err
    assert err.startswith("hpcmem: error: ") and "\n" not in err, err
    assert reason in err and "lora_dropout 0.05" in err


def test_dora_is_refused_with_peft_s_reason():
    reason = peft_refusal(lora_dropout=0.0, use_dora=True)
    with pytest.raises(SpecError) as refused:
        JobSpec(model=resolve_model("Qwen/Qwen3-30B-A3B"), train=TrainSpec(
            trainer="sft", dtype="bfloat16", use_peft=True, lora_target_modules=("all-linear",), lora_dropout=0.0,
            use_dora=True))
    assert reason in str(refused.value)


# depth cuts that keep each trace near a minute on one CPU core (estimator/LOG.md has the full-depth numbers); TRL's
# default batch, where the MoE backward's token gradients make the peak, and one short row, where the wrapped experts'
# weight gradients do
@pytest.mark.parametrize("model,layers,rows,length", [
    ("Qwen/Qwen3-30B-A3B", 8, 8, 1024), ("Qwen/Qwen3-30B-A3B", 2, 1, 128),
    ("mistralai/Mixtral-8x7B-v0.1", 2, 8, 1024), ("mistralai/Mixtral-8x7B-v0.1", 2, 1, 128)])
def test_dropout_zero_within_3_percent_of_the_trace(model, layers, rows, length):
    spec = replace(resolve_model(model), num_hidden_layers=layers)
    job = JobSpec(model=spec, train=TrainSpec(trainer="sft", dtype="bfloat16", use_peft=True,
                                              lora_target_modules=("all-linear",), lora_dropout=0.0,
                                              per_device_train_batch_size=rows, max_length=length))
    est = estimate(job).peak_allocated_bytes
    traced = run_trace(job, kernels="cuda").peak_allocated_bytes
    assert abs(est - traced) / traced <= 0.03, (model, layers, rows, length, est, traced)
