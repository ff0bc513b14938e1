"""The trace's self-check: a REAL two-step SFTTrainer run on the CPU (tiny model, real tensors, plain TRL) and
`run_trace(..., kernels="cpu")` on fake tensors must count the same peak, for each technique the trace covers.

Both sides count storages with the same StorageTracker, so the check proves that the fake world (FakeTensorMode,
the value oracle, the fake-model adjustments) runs the code path a real run takes and allocates what it allocates.
"""

from __future__ import annotations

import pytest

pytest.importorskip("trl")

from hpcmem.spec import JobSpec, ModelSpec, TrainSpec  # noqa: E402

pytestmark = pytest.mark.torch

TOLERANCE = 0.01        # the brief's bar; measured: identical to the byte


def tiny_job(**train) -> JobSpec:
    model = ModelSpec(name="tiny-llama", model_type="llama", vocab_size=1000, hidden_size=128, intermediate_size=256,
                      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                      tie_word_embeddings=False)
    tokens = train.pop("tokens_per_micro_batch", None)
    settings = {"max_length": 192, "per_device_train_batch_size": 2, **train}
    return JobSpec(model=model, train=TrainSpec(trainer="sft", **settings), tokens_per_micro_batch=tokens)


CASES = {
    "gc-full": {},
    "gc-off": {"gradient_checkpointing": False},
    "gc-selective": {"gradient_checkpointing_kwargs": {"selective": True}},
    "lora": {"use_peft": True, "lora_r": 8, "gradient_checkpointing": False},
    "packing-bfd": {"packing": True},
    "padding-free": {"padding_free": True, "max_length": None, "tokens_per_micro_batch": 384},
    "optimizer-peak": {"optim": "adamw_torch", "max_length": 8, "per_device_train_batch_size": 1},
}


@pytest.mark.parametrize("case", list(CASES))
def test_trace_matches_a_real_cpu_run(case):
    from hpcmem.trace import measure_cpu, run_trace

    job = tiny_job(**dict(CASES[case]))
    real = measure_cpu(job)
    traced = run_trace(job, kernels="cpu")
    delta = (traced.peak_allocated_bytes - real.peak_allocated_bytes) / real.peak_allocated_bytes
    assert abs(delta) <= TOLERANCE, (case, real.peak_allocated_bytes, traced.peak_allocated_bytes, real.phase,
                                     traced.phase)
    assert traced.phase == real.phase
    assert [s["step"] for s in traced.step_peaks] == [1, 2]
    if case == "optimizer-peak":
        assert "optimizer" in real.phase
