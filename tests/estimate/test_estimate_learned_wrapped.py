"""LoRA on wrapped parameters (lora.ParamWrapper: fused expert stacks, a router's weight — what peft 0.21 makes of
all-linear on transformers-5 MoE types) on a learned type under checkpointing (hpcmem.estimate.learned
`wrapped_stacks`): the learned LoRA cell without dropout (`lora-nodrop`, as peft requires for wrapped parameters)
adapts the nn.Linear reference targets; the recompute's W + ΔW copies, and the larger of the trained experts' routed
input and gated product and the stacks' weight gradients, are added to each MoE layer's backward by the derived
step's terms.

Known answers: stored traces of random jobs on three types (estimator/random/trace.jsonl: the real TRL/peft/
transformers step on fake tensors, lora_dropout 0 as peft requires), declined by hpcmem before: s1-282 GLM-4-MoE-Lite
SFT, s3-180 Sarvam-MLA SFT, s4-119 Qwen3-Next SFT."""

from __future__ import annotations

import pytest

from hpcmem.errors import SpecError
from tests.helpers.random_records import stored_trace_record


def _estimated(rec: dict, **settings) -> dict:
    from hpcmem.validate.random_jobs import RandomJob
    from hpcmem.validate.random_model import job_spec
    from hpcmem.validate.random_trace import as_traced
    from hpcmem.estimate.workspaces import tensor_bytes

    job = dict(rec["job"], settings={**rec["job"]["settings"], **settings})
    est = as_traced(job_spec(RandomJob.from_dict(job)))[0]
    return {"allocated": max(tensor_bytes(p) for p in est.phases), "table": est}


@pytest.mark.torch
@pytest.mark.parametrize("job_id", ["s1-282", "s3-180", "s4-119"])
def test_wrapped_stacks_within_one_percent_of_the_trace(job_id: str) -> None:
    rec = stored_trace_record(job_id)
    assert rec["job"]["settings"]["lora_target_modules"] == ["all-linear"]
    got = _estimated(rec)
    traced = rec["trace"]["peak_allocated_bytes"]
    assert abs(got["allocated"] - traced) / traced < 0.01
    assert "parameters" in next(c.note for c in got["table"].peak_phase.components if c.name == "lora adapters")


@pytest.mark.torch
def test_wrapped_stacks_without_checkpointing_are_still_declined() -> None:
    with pytest.raises(SpecError, match="is not learned without checkpointing"):
        _estimated(stored_trace_record("s1-282"), gradient_checkpointing=False)
