"""ZeRO's reduce buckets held to independent numbers: the bytes DeepSpeed 0.19.8 allocated on 2 CPU ranks (measured,
estimator/LOG.md 2026-11-29 table, re-measured by tests/probe/test_probe_sharding.py), the bucket sizes DeepSpeed's
own config class and transformers' "auto" fill resolve to (run here on CPU), and the published ZeRO-3 row that had the
bucket missing."""

from pathlib import Path
from types import SimpleNamespace

import pytest

from hpcmem.estimate import estimate
from hpcmem.estimate.lora import lora_layout
from hpcmem.estimate.states import model_states
from hpcmem.estimate.zero_buckets import backward_bucket_bytes, resident_bucket_bytes, zero_buckets
from hpcmem.errors import HpcmemError
from hpcmem.job.jobspec import JobSpec
from hpcmem.job.shape import precision
from hpcmem.job.spec import ParallelSpec, TrainSpec
from hpcmem.launch.configs import deepspeed_config
from hpcmem.models import resolve_model

TINY = resolve_model(str(Path(__file__).resolve().parents[2] / "estimator/probes/models/tiny-llama-2l-256h.json"))
# ipg_buckets[bf16].buffer bytes per rank, MEASURED on 2 CPU ranks (gloo) under hpcmem's JSON (estimator/LOG.md)
MEASURED_BUCKETS = {1: 262_144, 2: 262_144, 3: 131_072}


def _job(stage: int, sizes: str = "auto", model=TINY) -> JobSpec:
    par = ParallelSpec(num_processes=2, distributed_type="DEEPSPEED", zero_stage=stage, zero_bucket_sizes=sizes)
    return JobSpec(model=model, train=TrainSpec(trainer="sft", dtype="bfloat16", max_length=64), parallel=par)


@pytest.mark.parametrize("stage", [1, 2, 3])
def test_bucket_bytes_match_what_deepspeed_allocated(stage):
    job = _job(stage)
    got = resident_bucket_bytes(job) if stage == 3 else backward_bucket_bytes(job)
    assert got == MEASURED_BUCKETS[stage]
    # a stage holds one kind only: ZeRO-3's for the run, ZeRO-1/2's through the backward
    assert (backward_bucket_bytes(job) if stage == 3 else resident_bucket_bytes(job)) == 0


def test_zero3_bucket_is_a_resident_component_and_zero2_buckets_only_in_the_backward():
    z3 = estimate(_job(3))
    for phase in z3.phases:
        assert any(c.name == "reduce bucket" and c.bytes == 131_072 for c in phase.components), phase.name
    z2 = estimate(_job(2))
    with_buckets = {p.name for p in z2.phases if any(c.name == "reduce buckets" for c in p.components)}
    assert with_buckets and all(name.startswith("backward") for name in with_buckets)
    assert model_states(_job(3), precision(_job(3)), lora_layout(_job(3))).reduce_bucket == 131_072


def test_deepspeed_defaults_are_deepspeeds_own():
    """zero_bucket_sizes "deepspeed" resolves to what DeepSpeed's config class fills for a config that names only the
    stage (as accelerate's DeepSpeedPlugin writes it without a JSON)."""
    zc = pytest.importorskip("deepspeed.runtime.zero.config")
    for stage in (1, 2, 3):
        ds = zc.DeepSpeedZeroConfig(stage=stage)
        b = zero_buckets(_job(stage, "deepspeed"))
        assert (b.reduce_bucket, b.prefetch_bucket, b.persistence_threshold, b.max_live, b.overlap_comm) == (
            ds.reduce_bucket_size, ds.prefetch_bucket_size, ds.param_persistence_threshold, ds.max_live_parameters,
            ds.overlap_comm)
        assert ds.contiguous_gradients
    # by hand: 5e8 16-bit elements = 0.93 GiB under ZeRO-3; one buffer under ZeRO-1/2 (overlap_comm off)
    assert resident_bucket_bytes(_job(3, "deepspeed")) == 1_000_000_000
    assert backward_bucket_bytes(_job(2, "deepspeed")) == 1_000_000_000


def test_auto_sizes_are_what_transformers_fills_into_hpcmems_json():
    """hpcmem's JSON run through transformers' HfTrainerDeepSpeedConfig.trainer_config_finalize with the model's
    hidden size gives the sizes the estimate uses."""
    ds_mod = pytest.importorskip("transformers.integrations.deepspeed")
    job = _job(3)
    hf = ds_mod.HfTrainerDeepSpeedConfig(deepspeed_config(job))
    hf.trainer_config_finalize(SimpleNamespace(get_warmup_steps=lambda n: 0),
                               SimpleNamespace(config=SimpleNamespace(hidden_size=TINY.hidden_size)), 10)
    zero = hf.config["zero_optimization"]
    b = zero_buckets(job)
    assert (zero["reduce_bucket_size"], zero["stage3_prefetch_bucket_size"],
            zero["stage3_param_persistence_threshold"], zero["overlap_comm"]) == (
        b.reduce_bucket, b.prefetch_bucket, b.persistence_threshold, b.overlap_comm)


def test_launch_json_without_bucket_keys_under_deepspeed_defaults():
    zero = deepspeed_config(_job(3, "deepspeed"))["zero_optimization"]
    assert not {"reduce_bucket_size", "stage3_prefetch_bucket_size", "stage3_param_persistence_threshold",
                "overlap_comm"} & set(zero)


def test_bucket_sizes_outside_deepspeed_are_refused():
    with pytest.raises(HpcmemError, match="zero_bucket_sizes"):
        ParallelSpec(num_processes=2, distributed_type="FSDP", zero_bucket_sizes="deepspeed")
    with pytest.raises(HpcmemError, match="zero_bucket_sizes must be one of"):
        ParallelSpec(num_processes=2, distributed_type="DEEPSPEED", zero_stage=3, zero_bucket_sizes="5e8")
