"""LoRA / DoRA over 16-bit weights with bf16 off: no autocast, so peft's fp32 adapters compute in fp32 and keep fp32
inputs (and DoRA fp32 outputs and an fp32 copy of the base weight) for backward. A REAL two-step SFTTrainer on the
CPU with bf16 on (accelerate's CPU autocast, as every other self-check runs) and off: its peak moves by what the
`--kernels cpu` trace and the CUDA-mapped trace measure, and the estimate moves with it. (How close the estimate stays
at full size: estimator/cases/lora-no-autocast.yaml, tests/estimate/test_estimate_lora_no_autocast.py.)"""

from __future__ import annotations

import pytest

pytest.importorskip("trl")

from hpcmem.job.jobspec import JobSpec  # noqa: E402
from hpcmem.job.spec import TrainSpec  # noqa: E402
from tests.helpers.trace_helpers import TINY_LLAMA, trace_matches_cpu  # noqa: E402

pytestmark = pytest.mark.torch

# no checkpointing: every layer's saved tensors are alive at the LM head's backward, where the tiny model peaks
CASES = {"lora-qv": {}, "dora-qv": {"use_dora": True}}
# the estimate's move against the real one on the tiny model (measured: +2.5 % LoRA, +5.7 % DoRA)
MOVE_TOLERANCE = 0.08


def tiny_job(bf16: bool, **lora) -> JobSpec:
    return JobSpec(model=TINY_LLAMA, train=TrainSpec(
        trainer="sft", dtype="bfloat16", use_peft=True, lora_r=8, gradient_checkpointing=False, bf16=bf16,
        max_length=192, per_device_train_batch_size=2, **lora))


@pytest.mark.parametrize("case", list(CASES))
def test_bf16_off_moves_the_real_trainer_as_the_trace_says(case):
    from hpcmem.estimate import estimate
    from hpcmem.estimate.workspaces import tensor_bytes
    from hpcmem.trace import run_trace

    real, traced, cuda, est = {}, {}, {}, {}
    for bf16 in (True, False):
        job = tiny_job(bf16, **CASES[case])
        r, t = trace_matches_cpu(job, f"{case} bf16={bf16}")
        real[bf16], traced[bf16] = r.peak_allocated_bytes, t.peak_allocated_bytes
        cuda[bf16] = run_trace(job).peak_allocated_bytes
        est[bf16] = max(tensor_bytes(p) for p in estimate(job).phases)
    real_move = real[False] - real[True]
    assert real_move > 0
    assert traced[False] - traced[True] == real_move           # measured: equal to the byte
    assert cuda[False] - cuda[True] == real_move
    assert abs((est[False] - est[True]) - real_move) <= MOVE_TOLERANCE * real_move, (est, real)


def test_fp32_adapters_on_the_mlp_peak_in_the_recompute_as_the_trace_says():
    """bf16 off, LoRA on gate_proj, up_proj and down_proj, checkpointing on: the fp32 adapters compute in fp32, so
    down_proj's recompute holds its fp32 input copy and its 16-bit input (the product) beside every saved tensor,
    while its backward frees its saved fp32 input before the product's gradients exist (hpcmem.estimate
    .lora_fp32_compute). The CUDA-mapped trace of TRL's SFTTrainer peaks there; the estimate follows it (counting
    autocast's 7 B per input element and the product's gradients beside it, it was 16 % over)."""
    from dataclasses import replace

    from hpcmem.estimate import estimate
    from hpcmem.estimate.workspaces import tensor_bytes
    from hpcmem.trace import run_trace

    model = replace(TINY_LLAMA, name="llama-wide-mlp", hidden_size=1024, intermediate_size=8192, num_hidden_layers=3,
                    num_attention_heads=8, num_key_value_heads=8, head_dim=128)
    job = JobSpec(model=model, train=TrainSpec(
        trainer="sft", dtype="bfloat16", bf16=False, use_peft=True, lora_r=16,
        lora_target_modules=("gate_proj", "up_proj", "down_proj"), gradient_checkpointing=True, max_length=2048,
        per_device_train_batch_size=2))
    traced = run_trace(job).peak_allocated_bytes
    est = max(tensor_bytes(p) for p in estimate(job).phases)
    assert abs(est - traced) <= 0.03 * traced, (est, traced)


def test_adapters_without_dropout_or_cast_save_the_shared_input_once():
    """fp32 weights, bf16 off, LoRA on every linear with lora_dropout 0: lora_A gets each linear's input tensor itself
    (nn.Identity, no cast), so q/k/v_proj save the one normed hidden state they all read, gate/up_proj the MLP's, and
    o_proj the attention output SDPA keeps anyway (hpcmem.estimate.lora SHARED_INPUT, `saved_attention_output`). The
    CUDA-mapped trace of TRL's SFTTrainer counts each once; the estimate follows (counting a copy per linear, it was
    14 % over)."""
    from dataclasses import replace

    from hpcmem.estimate import estimate
    from hpcmem.estimate.workspaces import tensor_bytes
    from hpcmem.trace import run_trace

    model = replace(TINY_LLAMA, name="llama-wide", hidden_size=2048, intermediate_size=4096, num_hidden_layers=3,
                    num_attention_heads=16, num_key_value_heads=16, head_dim=128, vocab_size=32768)
    job = JobSpec(model=model, train=TrainSpec(
        trainer="sft", dtype="float32", bf16=False, use_peft=True, lora_r=16, lora_dropout=0.0,
        lora_target_modules=("all-linear",), gradient_checkpointing=False, max_length=2048,
        per_device_train_batch_size=2))
    traced = run_trace(job).peak_allocated_bytes
    est = max(tensor_bytes(p) for p in estimate(job).phases)
    assert abs(est - traced) <= 0.03 * traced, (est, traced)
