"""The routed experts' first backward instant (transformers/integrations/moe.py `grouped_mm_experts_forward`):
IndexBackward0 of `weighted_out[inv_perm]` scatters the gradient into a zeros [tokens·k, H], then MulBackward0 of
`proj_out * sample_weights_g` writes proj_out's gradient and grad · proj_out (the routing weights' gradient before
its sum over H): three [tokens·k, H] tensors on top of the layer's saved ones, before any expert weight gradient.

Against stored traces of the real TRL code (estimator/random/trace.jsonl, traced with the tracker's in-place
scatter: hpcmem.trace.tracker `_index_put_in_place`): s1-145 and s1-614 (distillation on Qwen3-MoE at ~30k and ~90k
tokens per micro-batch) stood −11.2 % and −8.6 % under them with two [tokens·k, I] gradients as the MLP's backward.
"""

from __future__ import annotations

import pytest

from tests.helpers.random_records import stored_trace_record


@pytest.mark.torch
def test_three_routed_hidden_tensors_by_hand() -> None:
    from hpcmem.estimate.activations import routing_weight_backward
    from hpcmem.job.shape import micro_batch, precision
    from hpcmem.validate.random_jobs import RandomJob
    from hpcmem.validate.random_model import job_spec

    rec = stored_trace_record("s1-614")
    spec = job_spec(RandomJob.from_dict(rec["job"]))
    mb = micro_batch(spec)
    s = rec["job"]["settings"]
    tokens = s["per_device_train_batch_size"] * (s["max_prompt_length"] + s["max_completion_length"])
    assert mb.tokens == tokens == 6 * 15015
    # Qwen3-30B-A3B's widths: 8 experts per token, hidden 2,048, bf16
    assert routing_weight_backward(spec.model, mb, precision(spec)) == 3 * tokens * 8 * 2048 * 2


@pytest.mark.torch
@pytest.mark.parametrize("job_id", ["s1-145", "s1-614"])
def test_long_moe_distillation_within_3_percent_of_its_trace(job_id: str) -> None:
    from hpcmem.validate.random_trace import score

    scored = score(stored_trace_record(job_id))
    assert abs(scored["err_pct"]) < 3.0, scored
