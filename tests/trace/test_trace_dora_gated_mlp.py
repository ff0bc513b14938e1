"""DoRA on a checkpointed layer's gated MLP, held to the trace of the real TRL/peft/transformers step: each adapted
linear's DoRA backward at its place in autograd's order (gate_proj's runs after the product's and act_fn's backward
have freed the MLP's saved [tokens, I] tensors), and each one's forward in the recompute beside only what exists by
then (hpcmem.estimate.lora_variants `gated_mlp_backward`, `gated_mlp_recompute`).

Expected values: the trace (hpcmem.trace.run_trace, CUDA kernel mapping) of SFT on a one-layer cut of the Qwen2
config the random jobs use (H 896, I 4,864), 2 × 1,024 tokens, bf16 weights and autocast, DoRA r 6, lora_dropout 0.05,
checkpointing. Traced: gate/k/o/v_proj 626,645,504 B (estimated −0.00 %; the rule that put every adapted linear's DoRA
backward on the whole recomputed layer and the MLP's two [tokens, I] gradients read +10.4 %); all-linear 847,952,896 B
(−0.03 %; that rule read −4.7 %: its recompute instant left out down_proj's fp32 input copies and the adapter and
base weights DoRA's forward holds in fp32). Within 1 %: the recompute instant that also counted each linear's own
saved terms at its weight norm, the fused head's gradient and three of down_proj's output products read +1.75 and
+2.32 %."""

from __future__ import annotations

import os

import pytest

pytestmark = [pytest.mark.torch, pytest.mark.slow]
os.environ.setdefault("HF_HUB_OFFLINE", "1")
pytest.importorskip("torch")
pytest.importorskip("peft")

from hpcmem.estimate import estimate  # noqa: E402
from hpcmem.estimate.workspaces import tensor_bytes  # noqa: E402
from hpcmem.job.trl_config import build_job  # noqa: E402
from hpcmem.trace import run_trace  # noqa: E402
from hpcmem.validate.random_model import traced_model  # noqa: E402


@pytest.mark.parametrize("targets", [["gate_proj", "k_proj", "o_proj", "v_proj"], ["all-linear"]],
                         ids=["gate-and-attention", "all-linear"])
def test_dora_gated_mlp_with_checkpointing_is_within_1_percent_of_the_trace(targets: list[str]) -> None:
    spec, _, _ = traced_model("qwen2", 1)
    job = build_job("sft", {"dtype": "bfloat16", "bf16": True, "gradient_checkpointing": True, "use_peft": True,
                            "use_dora": True, "lora_r": 6, "lora_dropout": 0.05, "lora_target_modules": targets,
                            "per_device_train_batch_size": 2, "max_length": 1024}, model=spec)[0]
    traced = run_trace(job, kernels="cuda")
    estimated = max(tensor_bytes(p) for p in estimate(job).phases)
    assert traced.phase == "step 2 / backward / layer 0", traced.phase
    assert abs(estimated - traced.peak_allocated_bytes) <= 0.01 * traced.peak_allocated_bytes, \
        (estimated, traced.peak_allocated_bytes)
