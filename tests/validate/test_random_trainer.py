"""The real-trainer oracle of random jobs (hpcmem.validate.random_trainer): the shrinker keeps a model's structure,
the shrunken model trains under TRL's real trainer, and a slice of fixed random jobs gets the verdicts TRL itself
gives (read off the real trainer on CPU: peft refuses LoRA on a Mamba mixer's out_proj, which hpcmem misses; an LFM2
SFT job runs and its trace lands within 1 % of the real step; RLOO refuses a generation batch num_generations does not
divide, as hpcmem does)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from hpcmem.validate.shrink import shrink_config

ROOT = Path(__file__).resolve().parents[2]
TINY = json.loads((ROOT / "tests" / "fixtures" / "tiny-configs.json").read_text())
QWEN3_MOE = json.loads((ROOT / "hpcmem" / "models" / "catalog" / "Qwen--Qwen3-30B-A3B.json").read_text())["config"]


def test_shrink_by_hand_qwen3_moe():
    """Qwen3-30B-A3B: 32 heads over 4 key-value heads (grouped), head_dim 128 = 2 × hidden/heads (2048/32), 128
    experts routing 8: by hand, 4 heads over 2, head_dim 2 × 16 = 32, 4 experts routing 2, widths 64/128/32."""
    small = shrink_config(QWEN3_MOE, full_length=4096, max_length=64)
    got = {k: small[k] for k in ("hidden_size", "num_attention_heads", "num_key_value_heads", "head_dim",
                                 "intermediate_size", "moe_intermediate_size", "num_experts", "num_experts_per_tok",
                                 "vocab_size", "num_hidden_layers", "max_position_embeddings", "tie_word_embeddings")}
    assert got == {"hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32,
                   "intermediate_size": 128, "moe_intermediate_size": 32, "num_experts": 4, "num_experts_per_tok": 2,
                   "vocab_size": 512, "num_hidden_layers": 48, "max_position_embeddings": 40960,
                   "tie_word_embeddings": False}
    assert small["bos_token_id"] < 512 and small["eos_token_id"] < 512
    assert QWEN3_MOE["hidden_size"] == 2048          # a copy: the input is not changed


def test_shrink_keeps_length_relations():
    """A window shorter than the full length stays shorter than the shrunken one; positions below the full length
    (a job hpcmem refuses for its length) stay below the shrunken length; longer ones stay as they are."""
    cfg = dict(QWEN3_MOE, sliding_window=1024, max_position_embeddings=2048)
    small = shrink_config(cfg, full_length=4096, max_length=64)
    assert small["sliding_window"] < 64 and small["max_position_embeddings"] < 64
    small = shrink_config(cfg, full_length=512, max_length=16)
    assert small["sliding_window"] == 1024 and small["max_position_embeddings"] == 2048


# one of each structure: MoE, SSM hybrid, MLA + grouped routing, sliding/global layers, linear attention, dense
SAMPLE = ("qwen3_moe", "jamba", "deepseek_v3", "gemma3_text", "qwen3_next", "llama")


def full_width(model_type: str) -> dict:
    """transformers' config class defaults (the published full-size model of most types) with the fixture's depth
    and per-layer patterns (a per-layer list of the defaults would not match the cut depth)."""
    from transformers import AutoConfig

    tiny = TINY[model_type]
    full = AutoConfig.for_model(model_type).to_dict()
    full.update({k: v for k, v in tiny.items() if not isinstance(v, int) or isinstance(v, bool) or "layer" in k})
    for key in ("layer_types", "mlp_layer_types"):
        if key not in tiny:
            full.pop(key, None)
    return full


def _modules(config: dict) -> tuple[set[str], int]:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    data = {k: v for k, v in config.items() if k != "model_type"}
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(AutoConfig.for_model(config["model_type"], **data))
    return {type(m).__name__ for m in model.modules()}, sum(p.numel() for p in model.parameters())


@pytest.mark.torch
@pytest.mark.parametrize("model_type", SAMPLE)
def test_shrink_keeps_the_module_structure(model_type):
    """The shrunken full-width config builds the same kinds of modules as the hand-made tiny config of the type
    (tests/fixtures/tiny-configs.json), at a tiny size. The full width is transformers' config class defaults with the
    fixture's depth and layer pattern."""
    tiny = TINY[model_type]
    full = full_width(model_type)
    small = shrink_config(full, full_length=2048, max_length=64)
    kinds, params = _modules(small)
    assert kinds == _modules(tiny)[0]
    assert params < 3_000_000


@pytest.mark.torch
@pytest.mark.slow
@pytest.mark.parametrize("model_type", ("qwen3_moe", "jamba", "gemma3_text"))
def test_shrunk_model_trains_one_step(model_type):
    pytest.importorskip("trl")
    from hpcmem.validate.trl_run import run_trl

    full = full_width(model_type)
    small = shrink_config(full, full_length=2048, max_length=32)
    verdict = run_trl("sft", {"max_length": 32, "per_device_train_batch_size": 2, "router_aux_loss_coef": 0.0}
                      if "experts" in json.dumps(small) else {"max_length": 32, "per_device_train_batch_size": 2},
                      small, steps=1)
    assert verdict.ran, verdict.reason


# (seed, index) → the verdicts of the jobs today's generator draws (s1-0: LoRA all-linear on a learned OLMoE with
# checkpointing, whose expert adapters hpcmem adds to the profile's LoRA cell: both run; s1-3: LoRA all-linear on Mamba,
# which peft and hpcmem refuse)
SLICE = {(1, 0): ("ran", None), (1, 3): ("parity", None), (1, 6): ("parity", None)}


@pytest.mark.torch
@pytest.mark.slow
def test_ci_slice_of_random_jobs():
    """A few fixed random jobs through the oracle, under 60 s on one core (measured: see estimator/LOG.md)."""
    pytest.importorskip("trl")
    from hpcmem.validate.random_jobs import draw
    from hpcmem.validate.random_trainer import run_one

    start = time.perf_counter()
    for (seed, index), (verdict, peak) in SLICE.items():
        rec = run_one(draw(seed, index))
        assert rec["verdict"] == verdict, (rec["id"], rec["trainer"], rec.get("hpcmem_refused"))
        if peak:
            assert rec["peak"]["verdict"] == peak, rec["peak"]
    assert time.perf_counter() - start < 120        # the bar is 60 s on an idle machine; shared cores double it


def test_summary_groups_one_cause_across_types():
    from hpcmem.validate.random_trainer_summary import summary

    def rec(i, model_type):
        return {"id": f"s1-{i}", "verdict": "missed refusal", "job": {"model_type": model_type},
                "trainer": {"reason": f"ValueError: Module 'out_proj' is incompatible with Mamba-based models "
                                      f"(model_type='{model_type}'). Incompatible modules: {{'conv1d', 'out_proj'}}."}}

    s = summary([rec(0, "nemotron_h"), rec(1, "falcon_h1"), {"id": "s1-2", "verdict": "parity"}])
    assert s["verdicts"] == {"missed refusal": 2, "parity": 1}
    assert [(c["count"], c["example"], c["types"]) for c in s["causes"]] == [(2, "s1-0", ["falcon_h1", "nemotron_h"])]


@pytest.mark.torch
def test_a_distillation_job_is_held_to_trl_s_config_before_the_missing_teacher():
    """The oracle builds no teacher, but DistillationConfig still refuses a field it has not (TRL's own dataclass:
    no `packing`), before any model is built."""
    import dataclasses

    trl = pytest.importorskip("trl")
    from hpcmem.validate.trl_run import NO_TEACHER, run_trl

    assert "packing" not in {f.name for f in dataclasses.fields(trl.DistillationConfig)}
    refused = run_trl("distillation", {"packing": True, "max_completion_length": 16}, {})
    assert refused.ran is False and "unexpected keyword argument 'packing'" in refused.reason
    assert run_trl("distillation", {"max_completion_length": 16}, {}).reason == NO_TEACHER
