"""Types whose real trainer runs only with one setting (hpcmem/models/coverage.json "requires"), and types refused
because no setting avoids the failure. On a tiny config of each, TRL 1.16's SFTTrainer — built as the probe builds it
(TRL's create_model_from_path over random weights, one CPU step) — raises without the setting and trains with it;
hpcmem refuses exactly the jobs that raise, and its reason names TRL's exception."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

pytest.importorskip("trl")

from hpcmem.errors import SpecError  # noqa: E402
from hpcmem.job.jobspec import JobSpec
from hpcmem.job.spec import ParallelSpec, TrainSpec

pytestmark = [pytest.mark.torch, pytest.mark.slow]

_ATTN = {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
         "vocab_size": 256}
_MOE = {**_ATTN, "intermediate_size": 64, "num_local_experts": 4, "num_experts_per_tok": 2}
# The type's own keys, shrunk (hidden 32, 2 layers, vocab 256); the config class fills in the rest.
TINY = {
    "cpmant": {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4, "dim_head": 8, "dim_ff": 64,
               "vocab_size": 256, "prompt_length": 8, "segment_types": 4},
    "ctrl": {"n_embd": 32, "n_layer": 2, "n_head": 4, "dff": 64, "vocab_size": 256, "n_positions": 64},
    "openai-gpt": {"n_embd": 32, "n_layer": 2, "n_head": 4, "vocab_size": 256, "n_positions": 64},
    "gpt_neox_japanese": {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4,
                          "intermediate_multiple_size": 2, "vocab_size": 256, "max_position_embeddings": 64,
                          "bos_token_id": 1, "eos_token_id": 2},
    "jetmoe": {**_MOE, "kv_channels": 8},
    "granitemoe": _MOE, "granitemoe_swa": _MOE, "phimoe": _MOE,
    "granitemoeshared": {**_MOE, "shared_intermediate_size": 64},
    "deepseek_v4": {"vocab_size": 256, "hidden_size": 32, "moe_intermediate_size": 16, "num_hidden_layers": 2,
                    "num_attention_heads": 4, "head_dim": 16, "q_lora_rank": 16, "n_routed_experts": 4,
                    "num_experts_per_tok": 2, "o_groups": 2, "o_lora_rank": 16, "index_n_heads": 4,
                    "index_head_dim": 8, "index_topk": 4, "sliding_window": 8, "hc_mult": 2},
    "doge": {**_ATTN, "intermediate_size": 64},
    "llama4_text": {**_MOE, "intermediate_size_mlp": 64, "head_dim": 8},
    "mllama": {"text_config": {**_ATTN, "intermediate_size": 64, "cross_attention_layers": [1], "pad_token_id": 0},
               "vision_config": {"hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 1,
                                 "num_global_layers": 1, "attention_heads": 2, "image_size": 28, "patch_size": 14}},
}
SETTINGS = {"dtype": "float32", "bf16": False, "max_length": 16, "per_device_train_batch_size": 2, "lora_r": 4,
            "lora_target_modules": ("all-linear",)}


def tiny_config(model_type: str, folder) -> tuple[str, dict]:
    from transformers import AutoConfig

    cfg = AutoConfig.for_model(model_type, **TINY[model_type]).to_dict()
    cfg = {k: v for k, v in cfg.items() if k not in ("transformers_version", "architectures", "dtype", "torch_dtype")}
    path = folder / f"{model_type}.json"
    path.write_text(json.dumps(cfg, default=str))
    return str(path), json.loads(path.read_text())


def job_as_written(path: str, cfg: dict, **settings) -> JobSpec:
    """The job as the user wrote it, without hpcmem's rules (TRL is the judge); the model's parameters from its meta
    model, as the probe takes an unlearned type."""
    from hpcmem.trace.learn import provisional_spec

    job = object.__new__(JobSpec)
    for name, value in (("model", provisional_spec(cfg, path)), ("train", TrainSpec(trainer="sft", **{**SETTINGS, **settings})),
                        ("parallel", ParallelSpec()), ("gpu", None), ("expandable_segments", False),
                        ("tokens_per_micro_batch", None), ("teacher", None)):
        object.__setattr__(job, name, value)
    return job


def hpcmem_refusal(job: JobSpec) -> str | None:
    try:
        replace(job)                    # the dataclass constructor runs hpcmem.job.rules.check_job
    except SpecError as exc:
        return "; ".join(exc.problems)
    return None


def trl_outcome(job: JobSpec, path: str) -> str | None:
    from tests.job.test_trl_rejections import trl_verdict

    return trl_verdict(job, path)


# (type, the setting the trainer needs, the same setting as TRL's default leaves it)
NEEDS = [(t, {"gradient_checkpointing": False}, {"gradient_checkpointing": True})
         for t in ("cpmant", "ctrl", "openai-gpt", "gpt_neox_japanese", "jetmoe")]
NEEDS += [(t, {"router_aux_loss_coef": 0.0}, {}) for t in ("granitemoe", "granitemoe_swa", "granitemoeshared",
                                                            "phimoe", "deepseek_v4", "doge")]


@pytest.mark.parametrize("model_type, needed, default", NEEDS, ids=[n[0] for n in NEEDS])
def test_trainer_runs_exactly_with_the_required_setting(model_type, needed, default, tmp_path):
    from hpcmem.models.coverage import required_settings

    assert required_settings(model_type) == needed
    path, cfg = tiny_config(model_type, tmp_path)
    bad, good = job_as_written(path, cfg, **default), job_as_written(path, cfg, **needed)
    raised = trl_outcome(bad, path)
    assert raised is not None, f"{model_type}: TRL trains with {default or 'its defaults'}"
    refused = hpcmem_refusal(bad)
    assert refused is not None and raised.split(":")[0] in refused, (raised, refused)
    assert trl_outcome(good, path) is None
    assert hpcmem_refusal(good) is None


def test_lora_without_checkpointing_trains_where_checkpointing_is_refused(tmp_path):
    path, cfg = tiny_config("ctrl", tmp_path)
    job = job_as_written(path, cfg, gradient_checkpointing=False, use_peft=True)
    assert trl_outcome(job, path) is None and hpcmem_refusal(job) is None
    assert hpcmem_refusal(job_as_written(path, cfg, gradient_checkpointing=True, use_peft=True)) is not None


@pytest.mark.parametrize("model_type", ["llama4_text", "mllama"])
def test_fused_lm_head_refusals_hold_for_every_setting(model_type, tmp_path):
    """Llama-4's and Mllama's causal-LM classes name a base_model_prefix they do not have: TRL's fused head gets the
    causal-LM's own output back, with or without the MoE auxiliary loss and checkpointing."""
    from hpcmem.models.coverage import refusal

    path, cfg = tiny_config(model_type, tmp_path)
    for settings in ({}, {"router_aux_loss_coef": 0.0, "gradient_checkpointing": False}):
        raised = trl_outcome(job_as_written(path, cfg, **settings), path)
        assert raised is not None and "last_hidden_state" in raised, raised
    reason = refusal(model_type)
    assert reason.startswith("refused") and "last_hidden_state" in reason and "base_model_prefix" in reason


_VISION = {
    "llama4": {"hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2,
               "image_size": 28, "patch_size": 14, "vision_output_dim": 32, "projector_input_dim": 32,
               "projector_output_dim": 32},
    "mllama": TINY["mllama"]["vision_config"],
}


@pytest.mark.parametrize("model_type, architecture, trains", [("mllama", "MllamaForConditionalGeneration", True),
                                                               ("llama4", "Llama4ForConditionalGeneration", False)])
def test_fused_lm_head_on_the_class_the_checkpoints_name(model_type, architecture, trains):
    """Meta's checkpoints name the ConditionalGeneration class in config.json's architectures, which TRL's
    create_model_from_path loads: Mllama's has a real self.model (MllamaModel) and TRL's fused head trains through
    it on text; Llama-4's names base_model_prefix 'model' without one and fails like its causal-LM class."""
    import torch
    import transformers
    from transformers import AutoConfig
    from trl.trainer.utils import add_fused_lm_head

    text = TINY["llama4_text"] if model_type == "llama4" else TINY["mllama"]["text_config"]
    cfg = AutoConfig.for_model(model_type, text_config=text, vision_config=_VISION[model_type])
    model = getattr(transformers, architecture)._from_config(cfg)
    add_fused_lm_head(model, outputs=("log_probs", "entropy", "is_top1"))
    ids = torch.randint(3, 200, (2, 16))
    try:
        model(input_ids=ids, attention_mask=torch.ones_like(ids), labels=ids, fused_lm_head=True).loss.backward()
    except AttributeError:
        assert not trains
    else:
        assert trains and model.model.language_model.embed_tokens.weight.grad is not None


def test_reformer_trains_only_full_without_checkpointing_at_its_axial_length(tmp_path):
    """Reformer's refusal, held to the real trainer on a tiny config whose axial_pos_shape multiplies to 32 tokens:
    checkpointing raises, rows not padded to exactly 32 tokens raise, LoRA raises (no grad_fn through the reversible
    layers), and only full fine-tuning with pad_to_multiple_of = max_length = 32 trains."""
    from hpcmem.models.coverage import refusal

    path, cfg = tiny_reformer(tmp_path)
    no_gc = {"gradient_checkpointing": False}
    outcomes = {name: trl_outcome(job_as_written(path, cfg, **settings), path) for name, settings in {
        "defaults": {},
        "chunk": no_gc,
        "axial": {**no_gc, "pad_to_multiple_of": 8, "max_length": 32},
        "lora": {**no_gc, "pad_to_multiple_of": 32, "max_length": 32, "use_peft": True},
        "full": {**no_gc, "pad_to_multiple_of": 32, "max_length": 32}}.items()}
    assert "does not support activation checkpointing" in outcomes["defaults"]
    assert "multiple of least common multiple chunk_length" in outcomes["chunk"]
    assert "axial_pos_shape" in outcomes["axial"]
    assert "does not require grad" in outcomes["lora"]
    assert outcomes["full"] is None
    reason = refusal("reformer")
    assert "prod(axial_pos_shape)" in reason and "LoRA raises" in reason


def tiny_reformer(folder) -> tuple[str, dict]:
    from transformers import AutoConfig

    cfg = AutoConfig.for_model("reformer", is_decoder=True, hidden_size=32, attention_head_size=8,
                               num_attention_heads=4, feed_forward_size=64, axial_pos_shape=(4, 8),
                               axial_pos_embds_dim=(16, 16), local_attn_chunk_length=8, lsh_attn_chunk_length=8,
                               num_buckets=4, vocab_size=256, max_position_embeddings=32).to_dict()
    cfg = {k: v for k, v in cfg.items() if k not in ("transformers_version", "architectures", "dtype", "torch_dtype")}
    path = folder / "reformer.json"
    path.write_text(json.dumps(cfg, default=str))
    return str(path), json.loads(path.read_text())


def test_jetmoe_trace_bytes_do_not_depend_on_the_routing_split(tmp_path):
    """Under fake tensors JetMoe's routing counts read as zeros, and the trace hands its experts an even split
    (hpcmem.trace.fakeenv). The split cannot change the bytes (outputs concatenated, saved inputs are views of one
    tensor): the same trace with the most skewed split it could see (all tokens but one per expert on expert 0) gives
    the same peak."""
    from transformers.models.jetmoe.modeling_jetmoe import JetMoeParallelExperts

    from hpcmem.trace import run_trace
    from hpcmem.trace.learn import provisional_spec

    path, cfg = tiny_config("jetmoe", tmp_path)
    spec = provisional_spec(cfg, path)

    def peaks() -> int:
        return run_trace(JobSpec(model=spec, train=TrainSpec(
            trainer="sft", dtype="bfloat16", gradient_checkpointing=False, max_length=32,
            per_device_train_batch_size=2))).peak_allocated_bytes

    even = peaks()
    original = JetMoeParallelExperts.forward

    def skewed(self, inputs, expert_size):
        return original(self, inputs, [inputs.size(0) - self.num_experts + 1] + [1] * (self.num_experts - 1))

    JetMoeParallelExperts.forward = skewed
    try:
        assert peaks() == even
    finally:
        JetMoeParallelExperts.forward = original
