"""Reference model placement, generation KV cache, vLLM pool and weight sync, against hand calculations."""

import pytest

from hpcmem.estimate import estimate
from hpcmem.gpus.lookup import gpu_spec
from hpcmem.job.jobspec import JobSpec
from hpcmem.job.spec import ParallelSpec, TrainSpec
from hpcmem.models import resolve_model

QWEN7 = resolve_model("Qwen/Qwen2.5-7B")        # 28 layers, 4 KV heads, head_dim 128, 7,615,616,512 params
PSI = 7_615_616_512
H100 = gpu_spec("H100-80GB")


def run(trainer, par=None, gpu=None, **train):
    return estimate(JobSpec(model=QWEN7, train=TrainSpec(trainer=trainer, **train), parallel=par or ParallelSpec(),
                            gpu=gpu))


def phase(est, name):
    return {p.name: p for p in est.phases}[name]


def component(phase_, name):
    return {c.name: c.bytes for c in phase_.components}.get(name, 0)


def ref_bytes(est):
    return component(est.peak_phase, "reference model")


def z(stage, n=8):
    return ParallelSpec(num_processes=n, distributed_type="DEEPSPEED", zero_stage=stage)


def test_dpo_reference_placement():
    assert ref_bytes(run("dpo")) == PSI * 4                                  # fp32 load, DDP/single: full replica
    assert ref_bytes(run("dpo", dtype="bfloat16")) == PSI * 2
    assert ref_bytes(run("dpo", par=z(2))) == PSI * 2                        # ZeRO-2 → stage 0, 16-bit, FULL
    assert ref_bytes(run("dpo", par=z(3))) == PSI * 2 // 8                   # ZeRO-3 → partition
    assert ref_bytes(run("dpo", use_peft=True)) == 0                         # adapters disabled act as reference
    assert ref_bytes(run("dpo", precompute_ref_log_probs=True)) == 0


def test_grpo_beta_zero_has_no_reference_and_rloo_has_one():
    assert ref_bytes(run("grpo")) == 0
    # RLOO's defaults (beta 0.05, num_generations 2) come from trl_config; TrainSpec alone needs them spelled out
    assert ref_bytes(run("rloo", dtype="bfloat16", per_device_train_batch_size=2, num_generations=2, beta=0.05)) \
        == PSI * 2


def test_generation_kv_cache_by_hand():
    est = run("grpo", dtype="bfloat16")                   # 8 completions × (512 prompt + 512 completion)
    kv = 2 * 28 * 4 * 128 * 1024 * 8 * 2
    assert component(phase(est, "generation (last token)"), "KV cache") == kv
    est4 = run("grpo", dtype="bfloat16", steps_per_generation=4)   # rows per rank = 8 × 4
    assert component(phase(est4, "generation (last token)"), "KV cache") == 4 * kv


def test_ds3_gather_for_generation_materialises_the_full_model():
    on = phase(run("grpo", par=z(3), dtype="bfloat16"), "generation (prefill)")
    off = phase(run("grpo", par=z(3), dtype="bfloat16", ds3_gather_for_generation=False), "generation (prefill)")
    assert component(on, "gathered model (ds3_gather_for_generation)") == PSI * 2
    assert component(off, "gathered model (ds3_gather_for_generation)") == 0


def test_vllm_colocate_pool_and_sleep_mode():
    awake = run("grpo", gpu=H100, use_vllm=True, dtype="bfloat16", use_peft=True)
    pool = int(0.3 * H100.capacity_bytes)     # vLLM takes its share of torch.cuda.mem_get_info()'s total
    assert awake.device_extra_bytes - run("grpo", gpu=H100, dtype="bfloat16", use_peft=True).device_extra_bytes \
        == pool
    asleep = run("grpo", gpu=H100, use_vllm=True, vllm_enable_sleep_mode=True, dtype="bfloat16", use_peft=True)
    assert component(phase(asleep, "generation (vLLM awake)"), "vLLM pool") == pool
    # peak = max(train, resident + pool), never the sum
    assert asleep.device_peak_bytes < awake.device_peak_bytes
    server = run("grpo", gpu=H100, use_vllm=True, vllm_mode="server", dtype="bfloat16", use_peft=True)
    assert server.device_extra_bytes == run("grpo", gpu=H100, dtype="bfloat16", use_peft=True).device_extra_bytes


def test_peft_zero3_weight_sync_gathers_whole_model():
    est = run("grpo", par=z(3), gpu=H100, use_vllm=True, use_peft=True, dtype="bfloat16")
    assert component(phase(est, "weight sync"), "gathered for vLLM sync") == PSI * 2


def test_grpo_phases_are_named_and_the_peak_is_one_of_them():
    est = run("grpo", gpu=H100, use_vllm=True)
    names = [p.name for p in est.phases]
    assert {"forward", "optimizer step", "old log-prob pass"} <= set(names)
    assert est.to_json()["per_gpu"]["phase"] in names


@pytest.mark.parametrize("trainer", ["dpo", "reward", "grpo", "rloo"])
def test_phase_totals_are_sums(trainer):
    est = run(trainer, dtype="bfloat16", per_device_train_batch_size=2, gpu=H100,
              **({"num_generations": 2} if trainer in ("grpo", "rloo") else {}))
    for p in est.phases:
        assert p.bytes == sum(c.bytes for c in p.components)


@pytest.mark.parametrize("trainer", ["dpo", "kto"])
def test_reference_forward_holds_the_accumulated_gradients(trainer):
    # the reference forward runs inside the policy's micro-batch; from the second micro-batch on every trained
    # parameter's fp32 .grad is there (Trainer zeroes them only after the optimizer step): Ψ · 4 bytes
    ga2 = phase(run(trainer, gradient_accumulation_steps=2), "reference forward")
    assert component(ga2, "gradients") == PSI * 4
    assert component(phase(run(trainer), "reference forward"), "gradients") == 0


def test_moe_reference_forward_holds_four_routed_hidden_tensors():
    # Qwen3-30B-A3B: H 2048, I 768, top-8 routing; without autograd the experts' call peaks at
    # weighted_out[inv_perm] with four [T·8, H] tensors (4·2048 > 2048 + 4·768); bf16, 8 rows × 1024 tokens
    moe = resolve_model("Qwen/Qwen3-30B-A3B")
    job = JobSpec(model=moe, train=TrainSpec(trainer="kto", dtype="bfloat16", max_length=1024))
    tokens, act = 8 * 1024, 2
    routed = 4 * tokens * 8 * 2048 * act
    hidden = 2 * tokens * 2048 * act
    stats = tokens * 3 * 4
    tile = min(tokens, 4096) * 32768 * act
    assert component(phase(estimate(job), "reference forward"), "no-grad pass") == hidden + max(routed, tile) + stats
