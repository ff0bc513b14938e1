"""The trace's self-check: a REAL two-step SFTTrainer run on the CPU (tiny model, real tensors, plain TRL) and
`run_trace(..., kernels="cpu")` on fake tensors must count the same peak, for each technique the trace covers.

Both sides count storages with the same StorageTracker, so the check proves that the fake world (FakeTensorMode,
the value oracle, the fake-model adjustments) runs the code path a real run takes and allocates what it allocates.
"""

from __future__ import annotations

import pytest

pytest.importorskip("trl")

from hpcmem.job.jobspec import JobSpec
from hpcmem.job.spec import TrainSpec
from tests.helpers.trace_helpers import TINY_LLAMA, trace_matches_cpu  # noqa: E402

pytestmark = pytest.mark.torch



def tiny_job(**train) -> JobSpec:
    model = TINY_LLAMA
    tokens = train.pop("tokens_per_micro_batch", None)
    settings = {"max_length": 192, "per_device_train_batch_size": 2, **train}
    return JobSpec(model=model, train=TrainSpec(trainer="sft", **settings), tokens_per_micro_batch=tokens)


CASES = {
    "gc-full": {},
    "gc-off": {"gradient_checkpointing": False},
    "gc-selective": {"gradient_checkpointing_kwargs": {"selective": True}},
    "lora": {"use_peft": True, "lora_r": 8, "gradient_checkpointing": False},
    "lora-no-dropout": {"use_peft": True, "lora_r": 8, "gradient_checkpointing": False, "lora_dropout": 0.0},
    "dora-save-head": {"use_peft": True, "lora_r": 8, "use_dora": True, "lora_modules_to_save": ("lm_head",)},
    "packing-bfd": {"packing": True},
    "padding-free": {"padding_free": True, "max_length": None, "tokens_per_micro_batch": 384},
    "optimizer-peak": {"optim": "adamw_torch", "max_length": 8, "per_device_train_batch_size": 1},
}


@pytest.mark.parametrize("case", list(CASES))
def test_trace_matches_a_real_cpu_run(case):
    job = tiny_job(**dict(CASES[case]))
    real, traced = trace_matches_cpu(job, case)
    if case == "optimizer-peak":
        assert "optimizer" in real.phase


def test_lora_dropout_zero_lowers_the_estimate_and_the_trace_alike():
    """lora_dropout 0: peft puts nn.Identity where the dropout was — no mask and no dropped copy per adapted linear
    (peft/tuners/lora/layer.py update_layer). Both the estimate and the CUDA-mapped trace drop (how close they stay at
    full size: the *-nodropout-* cases of estimator/cases/lora-variants.yaml)."""
    from hpcmem.estimate import estimate
    from hpcmem.estimate.workspaces import tensor_bytes
    from hpcmem.trace import run_trace

    def both(**lora):
        job = tiny_job(use_peft=True, lora_r=8, gradient_checkpointing=False, **lora)
        return max(tensor_bytes(p) for p in estimate(job).phases), run_trace(job).peak_allocated_bytes

    est_on, trace_on = both()
    est_off, trace_off = both(lora_dropout=0.0)
    assert est_off < est_on and trace_off < trace_on
