"""FSDP's gathered units in the estimate, held to hand counts of the tiny Llama's parameters and to the units measured
in flight on 2 CPU ranks (tests/probe/test_probe_fsdp_units.py; estimator/LOG.md 2026-12-02 "FSDP units in flight"):
the root and one decoder unit in every phase; the previous layer beside them through a layer's backward, or — with
LoRA leaves as their own units (FSDP1 + PEFT) — only at the attention projections."""

from pathlib import Path

import pytest

from hpcmem.estimate import estimate
from hpcmem.estimate.breakdown import Component, Phase
from hpcmem.estimate.fsdp_units import stream_pool_extra
from hpcmem.estimate.names import GATHERED, PREFETCHED_UNIT
from hpcmem.job.jobspec import JobSpec
from hpcmem.job.spec import ParallelSpec, TrainSpec
from hpcmem.models import resolve_model

TINY = resolve_model(str(Path(__file__).resolve().parents[2] / "estimator/probes/models/tiny-llama-2l-256h.json"))
H, V, FF, KV, HD = 256, 1024, 512, 2, 64
LAYER = H * 4 * HD + 2 * H * KV * HD + 4 * HD * H + 3 * H * FF + 2 * H      # q, k+v, o, gate/up/down, 2 norms
ROOT = 2 * V * H                                                           # embed_tokens + lm_head (untied)
# LoRA r=8 on every linear of a layer: r·(in + out) each
R = 8
LORA_LAYER = R * ((H + 4 * HD) + 2 * (H + KV * HD) + (4 * HD + H) + 2 * (H + FF) + (FF + H))
LORA = {"use_peft": True, "lora_r": R, "lora_target_modules": ("all-linear",)}


def _job(version: int, train: dict) -> JobSpec:
    par = ParallelSpec(num_processes=2, distributed_type="FSDP", fsdp_version=version)
    return JobSpec(model=TINY, train=TrainSpec(trainer="sft", dtype="bfloat16", max_length=64, **train), parallel=par)


def _bytes(phase: Phase, name: str) -> int:
    return sum(c.bytes for c in phase.components if c.name == name)


def test_hand_counts():
    assert LAYER == 590_336 and LORA_LAYER == 32_768


@pytest.mark.parametrize("version,train,unit,late", [
    (1, LORA, LAYER + LORA_LAYER, True),        # Trainer gives FSDP1 PEFT's policy: LoRA leaves their own units
    (2, LORA, LAYER + LORA_LAYER, False),       # FSDP2 keeps each layer's adapters in its unit
    (1, {}, LAYER, False),
    (2, {}, LAYER, False)])
def test_units_by_phase(version, train, unit, late):
    est = estimate(_job(version, train))
    held = (ROOT + unit) * 2                   # bf16
    for phase in est.phases:
        if phase.name.startswith(("forward", "backward")):
            assert _bytes(phase, GATHERED) == held, phase.name
    layers = [p for p in est.phases if p.name.startswith("backward (layer")]
    with_next = [p.name for p in layers if _bytes(p, PREFETCHED_UNIT) == unit * 2]
    if late:
        assert len(layers) == 2 and with_next == [n for n in with_next if n.endswith("attention projections)")] \
            and len(with_next) == 1
    else:
        assert len(layers) == 1 and with_next == [layers[0].name]
    for phase in est.phases:
        if phase.name.startswith(("forward", "backward (LM head)", "optimizer")):
            assert _bytes(phase, PREFETCHED_UNIT) == 0, phase.name


def _phase(name: str, gathered: int, prefetched: int, rest: int) -> Phase:
    return Phase(name=name, components=(Component(name=GATHERED, bytes=gathered),
                                        Component(name=PREFETCHED_UNIT, bytes=prefetched),
                                        Component(name="other", bytes=rest)))


def test_stream_pool_sits_beside_the_largest_rest():
    """By hand: root 3 + two units of 2 = a pool of 7 cached on the all-gather stream. The MLP instant allocates
    3 + 2 + 10 = 15, the attention instant 3 + 2 + 2 + 6 = 13, the optimizer step 12 with nothing gathered. The
    default stream needs 12 beside the pool's 7: reserved 19, 4 above the allocated peak of 15."""
    phases = [_phase("backward (mlp)", 5, 0, 10), _phase("backward (attention)", 5, 2, 6),
              _phase("optimizer step", 0, 0, 12)]
    job = _job(1, LORA)
    assert stream_pool_extra(job, phases) == 4
    no_fsdp = JobSpec(model=TINY, train=job.train, parallel=ParallelSpec(num_processes=2, distributed_type="MULTI_GPU"))
    assert stream_pool_extra(no_fsdp, phases) == 0


def test_estimate_reserves_the_pool_and_says_so_for_quantized_bases():
    est = estimate(_job(1, LORA))
    assert est.reserved_pool_bytes > 0 and est.reserved_extra_bytes >= est.reserved_pool_bytes
    q = estimate(_job(1, {**LORA, "load_in_4bit": True}))
    assert any("16-bit bytes" in w for w in q.warnings)
    assert not any("16-bit bytes" in w for w in est.warnings)
