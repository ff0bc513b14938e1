"""The gradients alive when a checkpointed layer's recompute starts under DoRA with down_proj adapted, held to the
trace of the real TRL/peft/transformers step: besides the gradient arriving at the layer, down_proj's DoRA output side
has made its own before the first node that unpacks a saved tensor (hpcmem.estimate.lora_variants
`recompute_output_gradients`); the fused head's returned gradient is gone by then.

Expected values: the trace (hpcmem.trace.run_trace, CUDA kernel mapping, allocation stream from SnapshotRecorder) of
SFT on a one-layer cut of the Qwen2 config the random jobs use (H 896, I 4,864), 2 × 1,024 tokens, DoRA r 6 on
all-linear, lora_dropout 0.05, checkpointing; its peak is down_proj's recompute (get_lora_weight's eye). The blocks
alive there that autograd's backward made, [tokens, H] each: bf16 weights under bf16 autocast, two fp32 and two bf16
(12 B per [tokens, H] element; the rule that put the fused head's fp32 gradient and its cast on the last layer
instead gave 8); fp32 weights without autocast, two fp32 (8 B; that rule gave 12)."""

from __future__ import annotations

import os

import pytest

pytestmark = [pytest.mark.torch, pytest.mark.slow]
os.environ.setdefault("HF_HUB_OFFLINE", "1")
pytest.importorskip("torch")
pytest.importorskip("peft")

from hpcmem.estimate.lora import lora_layout  # noqa: E402
from hpcmem.estimate.lora_variants import recompute_output_gradients  # noqa: E402
from hpcmem.job.shape import micro_batch, precision  # noqa: E402
from hpcmem.job.trl_config import build_job  # noqa: E402
from hpcmem.lab.peak_blocks import live_at_peak  # noqa: E402
from hpcmem.trace import run_trace  # noqa: E402
from hpcmem.trace.snapshot import SnapshotRecorder  # noqa: E402
from hpcmem.validate.random_model import traced_model  # noqa: E402

BACKWARD = "_engine_run_backward"      # the frame of every block autograd's engine allocates


@pytest.mark.parametrize(("settings", "bytes_per_hidden"), [
    ({"dtype": "bfloat16", "bf16": True}, 12),
    ({"dtype": "float32", "bf16": False}, 8),
], ids=["bf16-autocast", "fp32-no-autocast"])
def test_gradients_at_the_recompute_match_the_trace(settings: dict, bytes_per_hidden: int) -> None:
    spec, _, _ = traced_model("qwen2", 1)
    job = build_job("sft", {**settings, "gradient_checkpointing": True, "use_peft": True, "use_dora": True,
                            "lora_r": 6, "lora_dropout": 0.05, "lora_target_modules": ["all-linear"],
                            "per_device_train_batch_size": 2, "max_length": 1024}, model=spec)[0]
    snap = SnapshotRecorder()
    traced = run_trace(job, kernels="cuda", snapshot=snap)
    assert traced.phase == "step 2 / backward / layer 0", traced.phase
    _, live = live_at_peak(snap.snapshot()["device_traces"][0])
    tokens, hidden = 2 * 1024, spec.hidden_size
    # the [tokens, H] gradients (bf16 or fp32); the adapters' own gradients are far smaller
    traced_grads = sum(size for size, where in live if BACKWARD in where and size >= 2 * tokens * hidden)
    assert traced_grads == bytes_per_hidden * tokens * hidden, traced_grads

    prec, mb, lora = precision(job), micro_batch(job), lora_layout(job)
    down = next(m for m in lora.adapted if m.leaf == "down_proj")
    arriving = mb.tokens * hidden * prec.residual
    assert arriving + recompute_output_gradients(lora, down, mb.tokens, prec) == traced_grads
