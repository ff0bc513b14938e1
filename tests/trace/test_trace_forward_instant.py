"""The forward's instant inside the last decoder layer (hpcmem.estimate.step `_last_layer_forward`) against the trace
of TRL's own trainers on a two-layer Llama (1,024 wide, MLP 4,096, 2,048-token vocabulary, so nothing outside the
layer hides it): LoRA all-linear without checkpointing, 4 × 1,024 tokens; SFT (its adapters' dropout active) and DPO
(disable_dropout, chosen and rejected). The trace's largest live bytes in step 2's forward of its last layer against the
estimate's "forward (last layer)" phase, tensors only, within 3 %."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("trl")
pytestmark = pytest.mark.torch

CONFIG = {"model_type": "llama", "hidden_size": 1024, "intermediate_size": 4096, "num_hidden_layers": 2,
          "num_attention_heads": 8, "num_key_value_heads": 8, "vocab_size": 2048, "max_position_embeddings": 4096}


@pytest.mark.parametrize("trainer", ["sft", "dpo"])
def test_the_last_layers_forward_instant_is_the_traces(trainer, tmp_path):
    from hpcmem.estimate import estimate
    from hpcmem.estimate.workspaces import tensor_bytes
    from hpcmem.trace.run import run_trace
    from hpcmem.validate.cases import case_job

    path = tmp_path / "llama-2-layers.json"
    path.write_text(json.dumps(CONFIG))
    job = case_job({"trainer": trainer, "model_name_or_path": str(path), "dtype": "bfloat16", "bf16": True,
                    "use_peft": True, "lora_target_modules": "all-linear", "gradient_checkpointing": False,
                    "max_length": 1024, "per_device_train_batch_size": 4})
    traced = max(p.current_bytes for p in run_trace(job, kernels="cuda", timeline=True).timeline
                 if p.phase == "step 2 / forward / layer 1")
    phase = next(p for p in estimate(job).phases if p.name == "forward (last layer)")
    assert abs(tensor_bytes(phase) - traced) <= 0.03 * traced, (tensor_bytes(phase), traced)
    # the instant's temporaries: down_proj's [tokens, 4,096] input, peft's fp32 copy of it (and under SFT the
    # dropout's fp32 output) — more than the end of the forward holds beyond the layers' saved tensors
    temporaries = next(c.bytes for c in phase.components if c.name == "forward temporaries")
    assert temporaries >= 4 * 1024 * 4096 * (2 + 4 + (4 if trainer == "sft" else 0))
