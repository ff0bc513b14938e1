"""DoRA under DPO's disable_dropout, held to the trace of the real TRL/peft/transformers step: TRL sets every
nn.Dropout to p = 0 but peft keeps the module (not nn.Identity), so DoRA still recomputes the base output with
`F.linear` and saves the base weight's 16-bit copy (peft/tuners/lora/variants.py DoraLinearVariant.forward), while the
p = 0 dropout itself returns its input — no mask, no copy (`LoraLayout.dropout_module` beside `dropout`).

Expected values: the trace (hpcmem.trace.run_trace, CUDA kernel mapping) of DPO on a one-layer cut of the Qwen2 config
the random jobs use (H 896, I 4,864), 1 pair × 1,024 tokens (2,048 rows' tokens), bf16 weights and autocast, DoRA r 6
on all-linear, lora_dropout 0.05, checkpointing: 787,134,976 B at the recompute of layer 0, where the blocks alive
include `F.linear`'s outputs and weight copies (dora.py) and none from nn.Dropout. With the recompute's weight-norm
instants leaving out each linear's unmade saved terms, the rule that treated the trainer as dropout-free (no F.linear,
no weight copy) read −2.71 %."""

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
from hpcmem.lab.peak_blocks import live_at_peak  # noqa: E402
from hpcmem.trace import run_trace  # noqa: E402
from hpcmem.trace.snapshot import SnapshotRecorder  # noqa: E402
from hpcmem.validate.random_model import traced_model  # noqa: E402


def test_dpo_dora_with_a_zeroed_dropout_is_within_1_percent_of_the_trace() -> None:
    spec, _, _ = traced_model("qwen2", 1)
    job = build_job("dpo", {"dtype": "bfloat16", "bf16": True, "gradient_checkpointing": True, "use_peft": True,
                            "use_dora": True, "lora_r": 6, "lora_dropout": 0.05, "lora_target_modules": ["all-linear"],
                            "per_device_train_batch_size": 1, "max_length": 1024}, model=spec)[0]
    snap = SnapshotRecorder()
    traced = run_trace(job, kernels="cuda", snapshot=snap)
    assert traced.phase == "step 2 / backward / layer 0", traced.phase
    _, live = live_at_peak(snap.snapshot()["device_traces"][0])
    assert not [w for _, w in live if w.startswith("dropout.py") or "< dropout.py" in w], "a p = 0 dropout copied"
    assert any(w.startswith("dora.py:163") for _, w in live), "DoRA's F.linear path not taken"
    estimated = max(tensor_bytes(p) for p in estimate(job).phases)
    assert abs(estimated - traced.peak_allocated_bytes) <= 0.01 * traced.peak_allocated_bytes, \
        (estimated, traced.peak_allocated_bytes)
