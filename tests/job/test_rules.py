"""Each TRL 1.16 verdict hpcmem reproduces — an error where TRL raises, a warning where it only warns."""

import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hpcmem.cli import cli
from hpcmem.errors import HpcmemError, SpecError
from hpcmem.estimate import estimate
from hpcmem.job.jobspec import JobSpec
from hpcmem.job.rules import job_warnings
from hpcmem.job.spec import ParallelSpec, TrainSpec
from hpcmem.models import resolve_model

QWEN = resolve_model("Qwen/Qwen2.5-0.5B")


def job(par=None, **train):
    return JobSpec(model=QWEN, train=TrainSpec(trainer=train.pop("trainer", "sft"), **train),
                   parallel=par or ParallelSpec())


def problems(**kw):
    with pytest.raises(SpecError) as info:
        job(**kw)
    return " ".join(info.value.problems)


def test_packing_is_sft_only():
    assert "DPOConfig has no packing field" in problems(trainer="dpo", packing=True)


def test_a_single_lora_target_is_refused_as_peft_refuses_it():
    # TRL's ModelConfig turns ["q_proj"] into "q_proj", a regex peft fullmatches against whole module paths: no match,
    # get_peft_model raises (tests/job/test_trl_rejections.py runs the real trainer on both sides of this rule)
    assert "lora_target_modules 'q_proj'" in problems(use_peft=True, lora_target_modules=("q_proj",))
    job(use_peft=True, lora_target_modules=("all-linear",))       # peft's keyword, kept as a string
    job(use_peft=True, lora_target_modules=("q_proj", "v_proj"))


def test_padding_free_without_packing_needs_max_length_none():
    assert "padding_free=True without packing" in problems(padding_free=True)
    job(padding_free=True, max_length=None)          # what TRL accepts


def test_selective_requires_gradient_checkpointing():
    assert "requires gradient_checkpointing=True" in problems(
        gradient_checkpointing=False, gradient_checkpointing_kwargs={"selective": True})


def test_selective_refused_with_peft_and_zero3():
    z3 = ParallelSpec(num_processes=2, distributed_type="DEEPSPEED", zero_stage=3)
    assert "PEFT + DeepSpeed ZeRO-3" in problems(par=z3, use_peft=True,
                                                 gradient_checkpointing_kwargs={"selective": True})
    # SFTConfig only refuses ZeRO-3; under ZeRO-2 TRL's trainer dies at the first step instead (any layout:
    # tests/job/test_trl_rejections.py runs it), which hpcmem refuses too.
    assert "dies at the first step" in problems(
        par=ParallelSpec(num_processes=2, distributed_type="DEEPSPEED", zero_stage=2), use_peft=True,
        gradient_checkpointing_kwargs={"selective": True})
    job(par=ParallelSpec(num_processes=2, distributed_type="DEEPSPEED", zero_stage=2),
        gradient_checkpointing_kwargs={"selective": True})


def test_selective_is_sft_only():
    assert "SFT-only" in problems(trainer="dpo", gradient_checkpointing_kwargs={"selective": True})


def test_quantized_base_needs_peft():
    assert "use_peft" in problems(load_in_4bit=True)


def test_activation_offloading_not_in_grpo():
    assert "GRPOConfig has no activation_offloading field" in problems(trainer="grpo", activation_offloading=True)


def test_generation_batch_arithmetic():
    assert "both be set" in problems(trainer="grpo", generation_batch_size=16, steps_per_generation=2)
    assert "divisible by num_generations" in problems(trainer="grpo", per_device_train_batch_size=3,
                                                      num_generations=8)


def test_all_problems_reported_together():
    text = problems(trainer="dpo", packing=True, load_in_8bit=True, gradient_checkpointing_kwargs={"selective": True})
    assert "packing" in text and "use_peft" in text and "SFT-only" in text


def test_dpo_padding_free_warns_and_falls_back():
    j = job(trainer="dpo", padding_free=True)
    assert any("falls back to padding" in w for w in job_warnings(j))
    assert estimate(j).peak_allocated_bytes == estimate(job(trainer="dpo")).peak_allocated_bytes


def test_peft_zero3_forces_reentrant_warning():
    j = job(par=ParallelSpec(num_processes=2, distributed_type="DEEPSPEED", zero_stage=3), use_peft=True)
    assert any("reentrant" in w for w in job_warnings(j))


def test_cli_error_is_a_message_not_a_traceback():
    import subprocess
    import sys

    run = subprocess.run([sys.executable, "-m", "hpcmem", "estimate", "dpo", "--model_name_or_path",
                          "Qwen/Qwen2.5-0.5B", "--packing"], capture_output=True, text=True)
    assert run.returncode == 2
    assert "DPOConfig has no packing field" in run.stderr and "Traceback" not in run.stderr


FLAG_VALUES = {
    "--max_length": st.one_of(st.integers(-5, 70000).map(str), st.sampled_from(["none", "abc", "1e3"])),
    "--per_device_train_batch_size": st.integers(-2, 64).map(str),
    "--packing": st.sampled_from(["true", "false", "maybe"]),
    "--packing_strategy": st.sampled_from(["bfd", "bfd_split", "wrapped", "zzz"]),
    "--padding_free": st.sampled_from(["true", "false"]),
    "--pad_to_multiple_of": st.sampled_from(["8", "64", "0", "none"]),
    "--gradient_checkpointing": st.sampled_from(["true", "false"]),
    "--gradient_checkpointing_kwargs": st.sampled_from(['{"selective": true}', "{}", "[1]", "nope"]),
    "--use_peft": st.sampled_from(["true", "false"]),
    "--load_in_4bit": st.sampled_from(["true", "false"]),
    "--lora_r": st.integers(-1, 512).map(str),
    "--dtype": st.sampled_from(["float32", "bfloat16", "auto", "int3"]),
    "--optim": st.sampled_from(["adamw_torch_fused", "adamw_8bit", "sgd", "lion"]),
    "--accelerate_config": st.sampled_from(["zero1", "zero2", "zero3", "fsdp2", "multi_gpu", "nope"]),
    "--num_processes": st.integers(0, 16).map(str),
    "--num_machines": st.integers(0, 4).map(str),
    "--gpu": st.sampled_from(["H100-80GB", "A100-40GB", "TPU"]),
    "--activation_offloading": st.sampled_from(["true", "false"]),
}


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(trainer=st.sampled_from(["sft", "dpo", "reward", "grpo", "rloo"]),
       picks=st.dictionaries(st.sampled_from(sorted(FLAG_VALUES)), st.none(), max_size=8), data=st.data())
def test_fuzzed_flags_never_raise_a_traceback(trainer, picks, data):
    args = ["estimate", trainer, "--model_name_or_path", "Qwen/Qwen2.5-0.5B", "--json"]
    for flag in picks:
        args += [flag, data.draw(FLAG_VALUES[flag])]
    result = CliRunner().invoke(cli, args)
    # click usage errors exit 2 via SystemExit; hpcmem's own errors are HpcmemError (main() prints them).
    assert result.exception is None or isinstance(result.exception, (SystemExit, HpcmemError)), \
        f"{args} raised {result.exception!r}"


def test_literal_none_string_stays_a_string_for_choice_fields():
    # --offload_optimizer_device none is the accelerate value "none"; only INT|none flags turn "none" into None.
    result = CliRunner().invoke(cli, ["estimate", "sft", "--model_name_or_path", "Qwen/Qwen2.5-0.5B",
                                      "--offload_optimizer_device", "none", "--max_length", "none",
                                      "--padding_free", "--json"])
    assert result.exception is None, result.output


def test_rwkv_jobs_the_wkv_kernel_cannot_run_are_refused():
    # kernels-community rwkv (the kernel transformers loads on a GPU): built with -DTmax=1024, its backward keeps
    # float[1024] per-token arrays; forward_bf16 reads time_first as bf16 (torch_binding.cpp data_ptr<bf16>), so bf16
    # autocast over fp32 weights stops there. The RWKV model is Qwen's sizes under the rwkv type: the rule reads only
    # the type, the micro-batch and the precision.
    from dataclasses import replace

    rwkv = replace(QWEN, model_type="rwkv")

    def rwkv_problems(**train):
        try:
            JobSpec(model=rwkv, train=TrainSpec(trainer="sft", **train), parallel=ParallelSpec())
        except SpecError as exc:
            return " ".join(exc.problems)
        return ""

    assert rwkv_problems(dtype="bfloat16", max_length=1024) == ""
    assert "at most 1024" in rwkv_problems(dtype="bfloat16", max_length=1025)
    # packing bfd is padding-free: one row of batch × max_length = 2 × 1024 tokens
    assert "2048 tokens per row" in rwkv_problems(dtype="bfloat16", max_length=1024, packing=True,
                                                  per_device_train_batch_size=2)
    assert "fp32 weights under bf16 autocast" in rwkv_problems()           # TRL's defaults: fp32 load, bf16 on
    assert rwkv_problems(bf16=False) == ""                                  # the fp32 kernel
    assert rwkv_problems(bf16=False, fp16=True) == ""                      # fp16 keys are cast to fp32 for the kernel
    assert job(max_length=4096)                                             # the rule is RWKV's alone


def test_rwkv_rows_past_context_length_are_refused():
    # RwkvLinearAttention.forward raises for more tokens than config.context_length (max_position_embeddings here)
    from dataclasses import replace

    rwkv = replace(QWEN, model_type="rwkv", max_position_embeddings=512)
    with pytest.raises(SpecError, match="at most 512"):
        JobSpec(model=rwkv, train=TrainSpec(trainer="sft", dtype="bfloat16", max_length=513), parallel=ParallelSpec())
