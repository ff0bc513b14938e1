"""peft's `modules_to_save` copy of the LM head is traced as the GPU holds it: one [V, H] copy, sliced into views.

peft deep-copies the module (peft/utils/other.py `ModulesToSaveWrapper.update`, `copy.deepcopy`). torch's deepcopy of
a fake tensor came back bound to a new FakeTensorMode, so every op on the copy converted it into the trace's mode as
a fresh tensor of the whole storage: each vocabulary slice of TRL's fused head (trl/kernels/chunked_logprob.py
`weight[start:end]`) counted one more [V, H] where a GPU run makes a view. The real CPU step (real tensors, no fake
mode) is the independent answer.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

pytest.importorskip("trl")

from hpcmem.job.jobspec import JobSpec  # noqa: E402
from hpcmem.job.spec import TrainSpec  # noqa: E402
from tests.helpers.trace_helpers import TINY_LLAMA, trace_matches_cpu  # noqa: E402

pytestmark = pytest.mark.torch


def test_the_real_cpu_step_agrees_with_the_trace_on_a_copied_lm_head():
    # a vocabulary of 70,000 spans three of the fused head's 32,768-wide slices and the head's [V, H] is the largest
    # tensor: the old trace was 5.7 % over the real step here (515,282,456 bytes, the trace now the same to the byte)
    model = replace(TINY_LLAMA, vocab_size=70_000, hidden_size=256, intermediate_size=512, head_dim=64)
    job = JobSpec(model=model, train=TrainSpec(trainer="sft", max_length=32, per_device_train_batch_size=2,
                                               use_peft=True, lora_target_modules=("q_proj", "v_proj"),
                                               lora_modules_to_save=("lm_head",), gradient_checkpointing=True))
    real, traced = trace_matches_cpu(job, "modules_to_save lm_head")
    copy = model.vocab_size * model.hidden_size * 4          # the copy of an fp32 head, counted once as a parameter
    assert traced.components["param"] >= 2 * copy            # the frozen head and its trained copy
