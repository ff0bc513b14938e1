"""FSDP2 under gradient accumulation, measured for real on 2 CPU ranks (gloo) through TRL's SFTTrainer: between the
micro-batches of a window each rank keeps every gradient unsharded — transformers' Trainer runs all but the window's
last micro-batch under `accelerator.no_sync`, FSDP2's `set_requires_gradient_sync(False)` — in the mixed-precision
dtype, and only the last micro-batch reduce-scatters them. The estimate's `States.accumulated` is held to that, and
both to hand counts of the tiny Llama below (Ψ = 1,705,216; LoRA r 8 on q_proj and v_proj: 2 layers × (8 · (256 +
256) + 8 · (256 + 128)) = 14,336 adapter parameters). Slow: ~1 min of CPU."""

from __future__ import annotations

import json
import os

import pytest

pytestmark = [pytest.mark.torch, pytest.mark.slow]
os.environ.setdefault("HF_HUB_OFFLINE", "1")
pytest.importorskip("torch")

TINY = {"model_type": "llama", "vocab_size": 1024, "hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64, "tie_word_embeddings": False,
        "max_position_embeddings": 4096}
PSI = 1_705_216
ADAPTERS = 2 * (8 * (256 + 256) + 8 * (256 + 128))
LORA = {"use_peft": True, "lora_r": 8, "lora_target_modules": ["q_proj", "v_proj"]}


@pytest.fixture(scope="module")
def tiny_config(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = tmp_path_factory.mktemp("models") / "tiny-llama.json"
    path.write_text(json.dumps(TINY))
    return str(path)


@pytest.mark.parametrize("settings, kept, synced", [
    ({"dtype": "float32", "bf16": False}, 4 * PSI, 4 * PSI // 2),   # fp32 throughout: unsharded 4 B, then /2 ranks
    ({"dtype": "bfloat16"}, 2 * PSI, 4 * PSI // 2),                 # bf16 policy: unsharded 2 B; fp32 shards
    ({"dtype": "bfloat16", **LORA}, 2 * ADAPTERS, 4 * ADAPTERS // 2),
], ids=["fp32", "bf16-mixed", "lora-bf16-mixed"])
def test_fsdp2_keeps_gradients_unsharded_between_micro_batches(tiny_config, settings, kept, synced):
    from hpcmem.estimate.lora import lora_layout
    from hpcmem.estimate.states import model_states
    from hpcmem.job.shape import precision
    from hpcmem.job.trl_config import build_job
    from hpcmem.probe import run_probe

    job, _ = build_job("sft", {"model_name_or_path": tiny_config, "max_length": 256, "per_device_train_batch_size": 1,
                               "pad_to_multiple_of": 4, "distributed_type": "FSDP", "fsdp_version": 2,
                               "num_processes": 2, "gradient_accumulation_steps": 2, **settings})
    record = run_probe(job, device="cpu", steps=2, write=False).to_json()
    ranks = record["measured"].get("ranks", [])
    assert len(ranks) == 2 and all(r["status"] == "ok" for r in ranks), [r.get("log_tail", "")[-2000:] for r in ranks]
    states = model_states(job, precision(job), lora_layout(job))
    assert states.accumulated == kept
    for rank in ranks:
        snaps = rank["shards"]["snapshots"]
        assert snaps["between_micro_batches"]["grads_bytes"] == kept          # what the next micro-batch runs beside
        assert snaps["pre_step"]["grads_bytes"] == synced                     # reduce-scattered on the last one
