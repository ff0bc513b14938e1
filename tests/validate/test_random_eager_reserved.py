"""Learned-profile random jobs with eager attention against their stored traces (estimator/random/trace.jsonl): under
gradient checkpointing the reserved estimate counts the fp32 [rows, heads, S, S] attention scores as the layer's
largest block; without checkpointing it does not.

The expected numbers are the trace's: each record's reserved peak is the caching-allocator model replaying the real
HF code's allocations on fake tensors. Replaying s1-135's stream (hy_v4 SFT, LoRA, checkpointing, 1 × 9,760 tokens,
32 heads) maps segments of 5,816 and 11,630 MiB in step one's forward of layer 0 and one more of 11,630 MiB in the
backward of layer 2: 11,630 MiB is 4 B × 32 × 9,760² rounded up to 2 MiB (the score tensor, by hand below). Before
the rule the estimate stood 25.3 % under the trace there, and s1-675 (flint SFT, full, 3 × 7,165 tokens) 26.0 % under.
"""

from __future__ import annotations

import pytest

from hpcmem.datapath import estimator_dir
from tests.helpers.random_records import stored_trace_record

MIB = 1024**2


def _reserved_err(job_id: str) -> tuple[float, object]:
    from hpcmem.validate.random_jobs import RandomJob
    from hpcmem.validate.random_model import job_spec
    from hpcmem.validate.random_trace import as_traced

    rec = stored_trace_record(job_id)
    spec = job_spec(RandomJob.from_dict(rec["job"]))
    est, _ = as_traced(spec)
    traced = rec["trace"]["reserved"]["default"]
    return (est.peak_reserved_bytes - traced) / traced, spec


@pytest.mark.torch
@pytest.mark.slow
def test_checkpointed_eager_scores_are_the_largest_block_s1_135() -> None:
    from hpcmem.estimate.allocator import largest_layer_block
    from hpcmem.estimate.parallel import local_micro_batch
    from hpcmem.job.shape import micro_batch, precision

    err, spec = _reserved_err("s1-135")
    assert stored_trace_record("s1-135")["trace"]["reserved"]["default"] == 63144 * MIB
    scores = 4 * 32 * 9760 * 9760                       # fp32 [1, 32, 9,760, 9,760], by hand
    assert -(-scores // (2 * MIB)) * 2 == 11630         # the segment size the trace's replay maps for it
    mb, prec = local_micro_batch(spec, micro_batch(spec)), precision(spec)
    assert largest_layer_block(spec, mb, prec) == scores
    assert abs(err) < 0.04, err                         # was −25.3 %


@pytest.mark.torch
@pytest.mark.slow
def test_checkpointed_eager_scores_with_sinks_s1_675() -> None:
    err, _ = _reserved_err("s1-675")
    assert stored_trace_record("s1-675")["trace"]["reserved"]["default"] == 99612 * MIB
    assert abs(err) < 0.04, err                         # was −26.0 %


@pytest.mark.torch
@pytest.mark.slow
def test_without_checkpointing_the_scores_are_held_at_the_peak_s1_208() -> None:
    """gpt_oss RLOO, full fine-tuning without checkpointing: the trace's reserve is 0.6 % above the estimate's;
    counting the score tensor as a free block would put the estimate 19 % over."""
    err, _ = _reserved_err("s1-208")
    assert abs(err) < 0.03, err


@pytest.mark.torch
def test_a_state_space_profile_that_says_eager_builds_no_scores() -> None:
    """transformers records `_attn_implementation` "eager" for Mamba, which has no attention: no score block."""
    from hpcmem.estimate.allocator import learned_eager
    from hpcmem.models.profile import load_profile

    mamba = load_profile(estimator_dir() / "coverage-profiles" / "mamba.json")
    flint = load_profile(estimator_dir() / "coverage-profiles" / "flint.json")
    assert mamba.provenance["attention"] == "eager" and not learned_eager(mamba)
    assert flint.provenance["attention"] == "eager" and learned_eager(flint)
