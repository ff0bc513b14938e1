"""The attention's backward instant of a checkpointed layer in full fine-tuning, against the trace of TRL's SFTTrainer
on a one-layer Llama whose weights outweigh its tokens (2,048 wide, MLP 8,192, 2,048-token vocabulary, 1 × 1,024
tokens): by the attention's backward the layer's whole weight gradient exists, but the MLP's recomputed saved tensors
are freed, which is more than the attention's own gradients add. The trace's largest live bytes in step 2's backward
of the layer against the estimate's "backward (layer 0)" phase, tensors only, within 3 % (+1.3 %; +10.9 % while the
attention's instant kept the freed MLP tensors counted)."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("trl")
pytestmark = pytest.mark.torch

CONFIG = {"model_type": "llama", "hidden_size": 2048, "intermediate_size": 8192, "num_hidden_layers": 1,
          "num_attention_heads": 16, "num_key_value_heads": 16, "vocab_size": 2048, "max_position_embeddings": 4096}


def test_the_checkpointed_layers_backward_is_the_traces(tmp_path):
    from hpcmem.estimate import estimate
    from hpcmem.estimate.workspaces import tensor_bytes
    from hpcmem.trace.run import run_trace
    from hpcmem.validate.cases import case_job

    path = tmp_path / "llama-1-layer.json"
    path.write_text(json.dumps(CONFIG))
    job = case_job({"trainer": "sft", "model_name_or_path": str(path), "dtype": "bfloat16", "bf16": True,
                    "gradient_checkpointing": True, "max_length": 1024, "per_device_train_batch_size": 1})
    traced = max(p.current_bytes for p in run_trace(job, kernels="cuda", timeline=True).timeline
                 if p.phase.startswith("step 2 / backward / layer 0"))
    phase = next(p for p in estimate(job).phases if p.name == "backward (layer 0)")
    assert abs(tensor_bytes(phase) - traced) <= 0.03 * traced, (tensor_bytes(phase), traced)
