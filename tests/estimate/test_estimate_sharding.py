"""The estimator's sharded terms held to per-rank measurements of the real engines.

The numbers below were MEASURED (not computed by hpcmem): 2 CPU processes over gloo running DeepSpeed 0.19.8
ZeRO-1/2/3 and accelerate 1.15 FSDP2 on the 2-layer tiny Llama of estimator/probes/models/ (Ψ = 1,705,216, bf16
load), bytes per rank just before the optimizer step — see estimator/LOG.md (2026-11-29, CPU probes) and
tests/probe/test_probe_sharding.py, which re-measures them. Tolerance 3 %."""

from pathlib import Path

import pytest

from hpcmem.estimate.lora import lora_layout
from hpcmem.estimate.states import model_states
from hpcmem.job.jobspec import JobSpec
from hpcmem.job.shape import precision
from hpcmem.job.spec import ParallelSpec, TrainSpec
from hpcmem.models import resolve_model

TINY = resolve_model(str(Path(__file__).resolve().parents[2] / "estimator/probes/models/tiny-llama-2l-256h.json"))
MEASURED = {  # layout → (weights, fp32 master, optimizer states, gradients)
    ("DEEPSPEED", 1): (3_410_432, 3_410_432, 6_820_872, 1_705_476),
    ("DEEPSPEED", 2): (3_410_432, 3_410_432, 6_820_872, 1_705_476),
    ("DEEPSPEED", 3): (1_707_776, 3_410_432, 6_820_872, 1_705_224),
    ("FSDP", 0): (3_410_432, 0, 6_820_948, 3_410_432),
}


# LoRA r=8 on all linears of the same tiny model (65,536 adapter params), bytes per rank before the optimizer step,
# MEASURED the same way (2 CPU processes, gloo; estimator/LOG.md, sharded LoRA). Base weights and adapters together
# as the engines hold them: ZeRO-2 keeps both whole (adapters cast to bf16); ZeRO-3 partitions the adapters but keeps
# the small ones whole too (persistence threshold 10·hidden); FSDP2 shards each adapter on dim 0 in fp32.
MEASURED_LORA = {  # layout → (weights incl. adapters, fp32 master, optimizer states, gradients)
    ("DEEPSPEED", 2): (3_541_504, 131_072, 262_148, 65_540),
    ("DEEPSPEED", 3): (1_855_232, 131_072, 262_148, 65_544),
    ("FSDP", 0): (1_836_288, 0, 262_256, 131_072),
}
LORA = {"max_length": 32, "use_peft": True, "lora_r": 8, "lora_target_modules": ("all-linear",)}
CASES = [(layout, {"max_length": 64}, MEASURED[layout]) for layout in sorted(MEASURED)] + \
        [(layout, LORA, MEASURED_LORA[layout]) for layout in sorted(MEASURED_LORA)]


@pytest.mark.parametrize("layout,train,measured", CASES, ids=lambda v: str(v.get("use_peft", "")) if
                         isinstance(v, dict) else None)
def test_sharded_states_match_the_engines(layout, train, measured):
    kind, stage = layout
    par = ParallelSpec(num_processes=2, distributed_type=kind, zero_stage=stage)
    job = JobSpec(model=TINY, train=TrainSpec(trainer="sft", dtype="bfloat16", **train), parallel=par)
    lora = lora_layout(job)
    s = model_states(job, precision(job), lora)
    assert TINY.num_params == 1_705_216 and lora.num_params == (65_536 if lora.enabled else 0)
    for name, got, want in zip(("weights", "master", "optimizer", "gradients"),
                               (s.weights + s.adapters, s.master, s.optimizer, s.gradients), measured):
        assert got == pytest.approx(want, rel=0.03, abs=64), f"{kind} {stage} {name}: {got} vs measured {want}"


def test_fsdp_pads_adapter_rows_when_r_is_below_the_world_size():
    """FSDP2 splits lora_A ([r, in]) on dim 0: with r = 8 on 16 ranks every rank holds one padded row, so a rank's
    adapter bytes are 1/8 of lora_A, not 1/16 (hand count for one q_proj adapter of the tiny model)."""
    from hpcmem.estimate.states import fsdp_shard_numel

    assert fsdp_shard_numel(((8, 256, 1), (256, 8, 1)), 16) == 1 * 256 + 16 * 8
    assert fsdp_shard_numel(((8, 256, 1), (256, 8, 1)), 2) == (8 * 256 + 256 * 8) // 2


def _qwen_fsdp_lora(r: int, offload: bool):
    from hpcmem.estimate import estimate

    train = TrainSpec(trainer="sft", use_peft=True, lora_r=r, lora_target_modules=("all-linear",))
    par = ParallelSpec(num_processes=8, distributed_type="FSDP", fsdp_offload_params=offload)
    return estimate(JobSpec(model=resolve_model("Qwen/Qwen2.5-0.5B"), train=train, parallel=par))


def test_fsdp2_lora_weights_are_the_base_shard_and_adapters_their_own():
    """The command that printed `weights -0.23 GiB`: the fp32 base is 1/8 per rank and the adapters are 1/8 of
    r·(in + out) per linear (every dim 0 here divides by 8): hand counts, not the estimator's."""
    est = _qwen_fsdp_lora(256, offload=False)
    parts = {c.name: c.bytes for p in est.phases for c in p.components}
    adapters = 24 * 256 * (2 * (896 + 896) + 2 * (896 + 128) + 2 * (896 + 4864) + (4864 + 896))
    assert adapters == 140_771_328
    assert parts["weights"] == est.num_params * 4 // 8
    assert parts["lora adapters"] == adapters * 4 // 8


def test_fsdp_offload_lora_peak_grows_with_r_and_its_states_go_to_the_host():
    """With parameter offload the GPU holds the gathered unit (base + adapters, 16-bit) and the activations; the
    sharded adapters, their gradients and Adam states live in host RAM. A larger r must add to both, never subtract
    (the estimate once subtracted the full adapters from offloaded weights: the peak fell as r grew)."""
    small, large = _qwen_fsdp_lora(8, offload=True), _qwen_fsdp_lora(256, offload=True)
    assert large.peak_allocated_bytes > small.peak_allocated_bytes
    assert large.host_bytes - small.host_bytes == (140_771_328 - 4_399_104) * (4 + 4 + 8) // 8


# Adafactor (TrainingArguments.optim "adafactor") under ZeRO-2 on the same tiny model, MEASURED the same way: the
# optimizer's states per rank before the step (3,410,440 B on both ranks; estimator/LOG.md, ZeRO with other
# optimizers; tests/probe/test_probe_sharding.py re-measures them)
MEASURED_ADAFACTOR_ZERO2 = 3_410_440


def _states(optim: str, **par):
    job = JobSpec(model=TINY, train=TrainSpec(trainer="sft", max_length=64, dtype="bfloat16", optim=optim),
                  parallel=ParallelSpec(num_processes=2, distributed_type="DEEPSPEED", **par))
    return model_states(job, precision(job), lora_layout(job))


def test_adafactor_on_zero_flat_partitions_keeps_a_whole_second_moment():
    got = _states("adafactor", zero_stage=2).optimizer
    assert abs(got - MEASURED_ADAFACTOR_ZERO2) <= 0.03 * MEASURED_ADAFACTOR_ZERO2, got


def test_offloaded_zero_optimizer_is_deepspeeds_cpu_adam_whatever_optim_says():
    """accelerate maps the Trainer's optimizer to DeepSpeedCPUAdam when offloading (accelerator.py
    prepare_deepspeed): fp32 master 4 + Adam 8 bytes per element of the rank's partition, all on the host; by hand."""
    psi = TINY.num_params
    for optim in ("adafactor", "adamw_8bit", "adamw_torch_fused"):
        s = _states(optim, zero_stage=2, offload_optimizer_device="cpu")
        assert s.optimizer == 0 and s.master == 0
        assert s.host >= (4 + 8) * psi // 2, (optim, s.host)
    assert _states("adamw_8bit", zero_stage=2).optimizer < _states("adamw_torch_fused", zero_stage=2).optimizer // 3
