"""Properties of the estimate over its whole input space (models × trainers × layouts × techniques), fuzzed.

Every component of every phase — GPU and host — is a count of bytes, never a difference that could go negative
(`Component` refuses a negative value, so a formula that subtracts too much fails here with its inputs); totals are
the sums of their parts; a node holds at least its largest process. Combinations TRL refuses are skipped (SpecError).
"""

from __future__ import annotations

from pathlib import Path

from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from hpcmem.errors import SpecError
from hpcmem.estimate import estimate
from hpcmem.job.trl_config import SHIPPED_ACCELERATE, build_job

MODELS = ("Qwen/Qwen2.5-0.5B", "meta-llama/Llama-3.1-8B", "google--gemma-2-9b", "Qwen/Qwen3-30B-A3B",
          "microsoft/Phi-3-mini-4k-instruct", "mistralai/Mixtral-8x7B-v0.1", "meta-llama/Llama-3.2-1B",
          str(Path(__file__).resolve().parents[2] / "estimator/probes/models/tiny-llama-2l-256h.json"))
LAYOUTS = {
    "single": {},
    "ddp": {"distributed_type": "MULTI_GPU"},
    **{name: dict(cfg) for name, cfg in SHIPPED_ACCELERATE.items() if name != "single_gpu"},
    "zero2+offload": {"distributed_type": "DEEPSPEED", "zero_stage": 2, "offload_optimizer_device": "cpu"},
    "zero3+offload": {"distributed_type": "DEEPSPEED", "zero_stage": 3, "offload_optimizer_device": "cpu",
                      "offload_param_device": "cpu"},
    "fsdp2+offload": {"distributed_type": "FSDP", "fsdp_version": 2, "fsdp_offload_params": True},
}
TECHNIQUES = {
    "use_peft": st.booleans(), "lora_r": st.sampled_from([1, 4, 8, 16, 64, 256]),
    "lora_target_modules": st.sampled_from([(), ("all-linear",), ("q_proj", "v_proj"), ("down_proj",)]),
    "load_in_4bit": st.booleans(), "dtype": st.sampled_from(["float32", "bfloat16"]),
    "gradient_checkpointing": st.booleans(),
    "gradient_checkpointing_kwargs": st.sampled_from([{}, {"selective": True}]),
    "packing": st.booleans(), "activation_offloading": st.booleans(),
    "per_device_train_batch_size": st.sampled_from([1, 2, 8]), "gradient_accumulation_steps": st.sampled_from([1, 4]),
    "max_length": st.sampled_from([128, 1024, 4096]), "optim": st.sampled_from(["adamw_torch_fused", "adamw_torch",
                                                                                "adamw_8bit", "adafactor", "sgd"]),
    "eval_strategy": st.sampled_from(["no", "steps"]), "per_device_eval_batch_size": st.sampled_from([1, 8, 32]),
    "save_strategy": st.sampled_from(["no", "steps"]), "save_only_model": st.booleans(),
    "dataloader_num_workers": st.sampled_from([0, 4]), "fsdp_state_dict_type": st.sampled_from(
        ["FULL_STATE_DICT", "SHARDED_STATE_DICT"]), "zero3_save_16bit_model": st.booleans(),
    "zero3_init_flag": st.booleans(), "fsdp_cpu_ram_efficient_loading": st.booleans(),
    "expandable_segments": st.booleans(), "gpu": st.sampled_from(["H100-80GB", "L4", "A100-40GB"]),
    "beta": st.sampled_from([0.0, 0.1]), "precompute_ref_log_probs": st.booleans(),
}


def _model(name: str) -> str:
    return name.replace("google--", "google/")


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(model=st.sampled_from(MODELS), trainer=st.sampled_from(["sft", "dpo", "reward", "grpo", "rloo"]),
       layout=st.sampled_from(sorted(LAYOUTS)), world=st.sampled_from([1, 2, 8, 16, 64]),
       nodes=st.sampled_from([1, 2]), picks=st.fixed_dictionaries({}, optional=TECHNIQUES))
def test_no_component_is_negative_and_parts_add_up(model, trainer, layout, world, nodes, picks):
    settings_ = {"model_name_or_path": _model(model), "num_processes": world, "num_machines": nodes,
                 **LAYOUTS[layout], **picks}
    try:
        job, _ = build_job(trainer, settings_)
        est = estimate(job)          # a few refusals surface only here (no peft default targets for a model type)
    except SpecError:
        assume(False)
    for phase in est.phases:
        assert all(c.bytes >= 0 for c in phase.components), phase
        assert phase.bytes == sum(c.bytes for c in phase.components)
    assert est.peak_allocated_bytes == max(p.bytes for p in est.phases) > 0
    assert est.device_peak_bytes >= est.peak_reserved_bytes >= est.peak_allocated_bytes
    host = est.host
    for phase in host.phases:
        assert all(c.bytes >= 0 for c in (*phase.rank0, *phase.other)), phase
    assert host.per_node_bytes >= host.per_rank_bytes > 0
    assert host.ranks_per_node == job.parallel.gpus_per_machine
    out = est.to_json()
    assert out["host"]["per_node_bytes"] == host.per_node_bytes
    assert set(out["phases"]) >= {"checkpoint save"} | ({"evaluation"} if job.train.eval_strategy != "no" else set())
