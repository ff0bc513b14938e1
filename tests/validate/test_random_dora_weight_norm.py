"""DoRA's weight norm as its trace runs it (peft/tuners/lora/dora.py): the derived-layer DoRA jobs of the random set
that the estimate over-counted (it summed the eye [in, in] and four [in, out] copies as one instant) are within 3 % of
their stored traces once the two instants are apart — the eye's (the eye, autocast's 16-bit copy of it, lora_B's
[in, out] output) and the norm's (the saved eye copy, the adapter weight in the input's dtype, the base weight in that
dtype, their scaled sum).

Expected values: the stored traces of the real TRL/peft code (estimator/random/trace.jsonl). In s1-103's trace
(OLMo-2 widths, fp32 weights, bf16 autocast, 5 × 195 tokens) down_proj's recompute allocates, in order, the eye
11,008² × 4 B = 462.2 MiB, its bf16 copy 231.1 MiB and lora_B's bf16 output 11,008 × 4,096 × 2 B = 86.0 MiB — the
peak — then frees the eye before the norm's three fp32 [in, out] tensors (3 × 172.0 MiB)."""

from __future__ import annotations

import pytest

from hpcmem.validate.random_trace import score
from tests.helpers.random_records import stored_trace_record

# SFT OLMo-2 DoRA GC (fp32 weights, two jobs): over +5.0 … +5.4 % with the summed instant. The third job of that
# finding (a distillation Phi-3 DoRA job) was re-drawn when GLM-4 turned derived; its id is now an fp16 job the trace
# cannot run, and the derived DoRA jobs of today's draw with a trace stand beside the two: s1-533 (RLOO Qwen2, fp32
# weights), s1-626 (distillation Llama, bf16 weights)
JOBS = ("s1-103", "s1-402", "s1-533", "s1-626")


@pytest.mark.parametrize("job_id", JOBS)
def test_derived_dora_jobs_are_within_3_percent_of_their_traces(job_id: str) -> None:
    s = score(stored_trace_record(job_id))
    assert abs(s["err_pct"]) <= 3.0 and abs(s["reserved_err_pct"]) <= 3.0, s
