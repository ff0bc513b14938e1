"""The no-grad passes of GRPO and RLOO (old log-probs, reference): TRL's `_get_per_token_logps_and_entropies` runs the
model over chunks of per_device_train_batch_size rows with the prompt's labels set to -100, so its fused head
projects the completion positions only, after the last layer (hpcmem.estimate.trainers `reference_pass`). Counting a
head tile over every prompt and completion token on top of the widest layer's intermediates put three RLOO jobs on
GPT-2-sized models 13–25 % over their trace: the pass was their estimate's peak, and a 50k-token vocabulary's tile the
largest part of it.

Known answers: traces of RLOO jobs drawn from seed 21 (estimator/random/touched/dora-default.jsonl: the real TRL
trainer on fake tensors at full width). In-sample: the change was made after their errors."""

from __future__ import annotations

import pytest

from tests.helpers.random_records import stored_trace_record

pytestmark = pytest.mark.torch

RLOO_SMALL = ["s21-2452", "s21-30071", "s21-33412"]      # GPT-BigCode ×2, GPT-2; DoRA on c_attn, 3 layers


@pytest.mark.parametrize("job_id", RLOO_SMALL)
def test_old_log_prob_pass_is_not_the_peak_of_a_small_rloo_job(job_id: str) -> None:
    from hpcmem.estimate.workspaces import tensor_bytes
    from hpcmem.validate.random_jobs import RandomJob
    from hpcmem.validate.random_model import job_spec
    from hpcmem.validate.random_trace import as_traced, scored_as_traced

    rec = stored_trace_record(job_id, "touched/dora-default.jsonl")
    est = as_traced(scored_as_traced(job_spec(RandomJob.from_dict(rec["job"]))))[0]
    peak = max(est.phases, key=tensor_bytes)
    traced = rec["trace"]["peak_allocated_bytes"]
    assert abs(100.0 * (tensor_bytes(peak) - traced) / traced) < 1.0
    # the trace's peak is the layers' backward; the no-grad pass sits below it
    assert rec["trace"]["phase"].startswith("step 2 / backward")
    old = next(p for p in est.phases if p.name == "old log-prob pass")
    assert tensor_bytes(old) < traced
