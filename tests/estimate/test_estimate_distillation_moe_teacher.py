"""An MoE teacher's no-grad pass in TRL's DistillationTrainer: after the student's backbone, with all its saved
activations alive, the teacher's routed experts run transformers' grouped-mm path (transformers/integrations/moe.py
`grouped_mm_experts_forward`), whose locals are [tokens·k, H] wide — the routed copy of the hidden states, the
experts' output, its product with the routing weights and that product in token order — not the three [tokens, k·I]
intermediates of a gated MLP the estimate took (hpcmem.estimate.distillation `teacher_pass`).

Known answer: the trace of random job s2-236 (Qwen3-MoE student and teacher, 4 × 18,876 tokens, no checkpointing;
its job stored as tests/fixtures/random/), whose peak is the teacher's layer 1 over the student's activations; the
estimate read it 5.2 % under.
"""

from __future__ import annotations

import pytest

pytest.importorskip("trl")

from tests.helpers.trace_helpers import assert_within, stored_random_job, traced_and_estimated  # noqa: E402

pytestmark = pytest.mark.torch


@pytest.mark.slow
def test_the_moe_teachers_pass_holds_its_routed_experts_locals():
    spec = stored_random_job("s2-236-qwen3-moe-distillation.json")
    assert spec.train.trainer == "distillation" and spec.teacher.is_moe and not spec.train.gradient_checkpointing
    traced, _, peak = traced_and_estimated(spec)
    assert traced.phase.startswith("step 2 / forward / layer")          # the teacher's pass, after the student's
    assert_within(peak, traced.peak_allocated_bytes, 0.03)
