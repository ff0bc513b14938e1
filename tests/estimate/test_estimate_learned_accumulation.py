"""Full fine-tuning of learned types under gradient accumulation (hpcmem.estimate.learned `accumulated_peaks`,
hpcmem.estimate.allocator `stacks_mapped_again`). The cells were traced without accumulation, where a layer's new
gradients stay as `.grad`; under accumulation they are added into `.grad` and freed, so the end of a fused-expert
layer's backward holds one stack's new gradient, not all of them. Before, these MoE jobs read 3.1–5.1 % over their
trace; an LFM2-MoE job at long rows, whose layer peaks before its stacks' gradients exist, must not fall under.

Known answers: traces of random jobs (estimator/random/trace.jsonl: the real TRL trainers on fake tensors at full
width, types and settings drawn at random), none of which the cells were learned on, and a fresh trace of one of them
without accumulation."""

from __future__ import annotations

import copy

import pytest

pytest.importorskip("trl")

from tests.helpers.random_records import stored_trace_record  # noqa: E402
from tests.helpers.trace_helpers import assert_within, traced_and_estimated  # noqa: E402

pytestmark = pytest.mark.torch
# (id, share): MiMo-V2-Flash SFT 1 × 577 packed, accumulation 2 (+3.43 % before); AXK1 SFT 4 × 3,697, accumulation 4
# (+3.15 %); dots3 Note SFT without checkpointing, accumulation 2 (+3.44 %); HY-V4 GRPO, accumulation 3 (+5.09 %;
# +2.4 % now, the rest not looked into); LFM2-MoE SFT 4 × 2,725, accumulation 3 (+0.01 %: a rule that took every
# stack's gradient off the layer's peak put it at −3.31 %)
ACCUMULATING = [("s2-50", 0.01), ("s2-149", 0.01), ("s3-37", 0.01), ("s7-29", 0.03), ("s1-236", 0.01)]


@pytest.mark.parametrize(("job_id", "share"), ACCUMULATING)
def test_allocated_within_the_stored_trace(job_id: str, share: float) -> None:
    from hpcmem.validate.random_trace import score

    got = score(stored_trace_record(job_id))
    assert abs(got["err_pct"]) <= 100 * share, got["why"]


@pytest.mark.parametrize("job_id", ["s2-50", "s7-29"])
def test_reserved_holds_the_stacks_the_second_step_maps_again(job_id: str) -> None:
    """Without the stacks' blocks in the slack MiMo-V2-Flash's reserved reads 3.3 % under its trace's allocator model
    once its allocated peak is right (the old allocated excess had stood in for them)."""
    from hpcmem.validate.random_trace import score

    got = score(stored_trace_record(job_id))
    assert abs(got["reserved_err_pct"]) <= 3.0, got["why"]


@pytest.mark.slow
def test_accumulation_keeps_one_stack_gradient_not_the_layer() -> None:
    """The mechanism, traced afresh on MiMo-V2-Flash (3 layers, 1 × 577 tokens): with accumulation the trace peaks
    higher than without by less than one MoE layer's gradients (12.5 GB), and both estimates are within 1 %."""
    from hpcmem.estimate.states import param_parts
    from hpcmem.validate.random_jobs import RandomJob
    from hpcmem.validate.random_model import job_spec

    peaks = {}
    for steps in (1, 2):
        job = copy.deepcopy(stored_trace_record("s2-50")["job"])
        job["settings"]["gradient_accumulation_steps"] = steps
        spec = job_spec(RandomJob.from_dict(job))
        traced, _, peak = traced_and_estimated(spec)
        assert_within(peak, traced.peak_allocated_bytes, 0.01)
        peaks[steps] = traced.peak_allocated_bytes
    parts = param_parts(spec.model)
    stacks = (parts.moe_stack_rest + parts.largest_moe_tensor) * 2       # bf16 gradients of one layer's stacks
    assert 0 < peaks[2] - peaks[1] < stacks, (peaks, stacks)
