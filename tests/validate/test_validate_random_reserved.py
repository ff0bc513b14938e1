"""Reserved of learned-profile jobs against the stored traces of random jobs (estimator/random/trace.jsonl): the
second step's [V, H] blocks are counted whatever the forward phase is called.

A learned profile names its forward phase "forward (layer k)" when the forward's highest instant is inside a layer
(hpcmem.estimate.learned `_forward_phase`); the reserved terms that need the first step (`second_step`, `beside`,
`embedding_grad`) must find it there too. s1-584 (glm4 SFT, full fine-tuning, 3 × 262 tokens, bf16): in the trace's
allocator-model replay step 1's AdamW states take the fused head's freed fp32 [V, H] accumulator block and step 2's
head backward maps a new 2,368 MiB segment for it (V·H·4); the stored reserved peak is 16,762 MiB.
"""

from __future__ import annotations

import dataclasses
import json

import pytest

from hpcmem.datapath import estimator_dir

MIB = 1024**2


def _record(job_id: str) -> dict:
    for line in (estimator_dir() / "random" / "trace.jsonl").read_text().splitlines():
        rec = json.loads(line)
        if rec["id"] == job_id:
            return rec
    raise AssertionError(f"{job_id}: no stored record")


@pytest.mark.torch
@pytest.mark.slow
def test_learned_forward_phase_inside_a_layer_keeps_the_second_steps_blocks(monkeypatch: pytest.MonkeyPatch) -> None:
    import hpcmem.estimate as est_module
    from hpcmem.estimate import estimate
    from hpcmem.estimate.allocator import allocator_slack
    from hpcmem.validate.random_jobs import RandomJob
    from hpcmem.validate.random_model import job_spec

    rec = _record("s1-584")
    spec = job_spec(RandomJob.from_dict(rec["job"]))
    seen: dict = {}

    def keep(job, mb, prec, lora, phases):                  # the estimate's own arguments, to call it again
        seen.update(args=(job, mb, prec, lora, phases))
        return allocator_slack(job, mb, prec, lora, phases)

    monkeypatch.setattr(est_module, "allocator_slack", keep)
    est = estimate(spec)
    job, mb, prec, lora, phases = seen["args"]
    names = [p.name for p in phases]
    assert any(n.startswith("forward (layer ") for n in names), names      # the case this test is about
    renamed = [dataclasses.replace(p, name="forward") if p.name.startswith("forward (") else p for p in phases]
    assert allocator_slack(job, mb, prec, lora, phases) == allocator_slack(job, mb, prec, lora, renamed)

    traced = rec["trace"]["reserved"]["default"]
    assert traced == 16762 * MIB
    vh4 = spec.model.vocab_size * spec.model.hidden_size * 4
    assert vh4 == 2368 * MIB                                    # the block step 2 maps again in the replay
    # without the step-two term the estimate stood 13.6 % under the trace; with it, within 5 %
    assert abs(est.peak_reserved_bytes - traced) / traced < 0.05, est.peak_reserved_bytes / MIB
