"""What TRL rejects at runtime is refused before the queue: over the cross product of techniques per trainer, hpcmem
refuses a job (`build_job` raises) exactly when TRL's real trainer raises — in its constructor or in one tiny
training step on the CPU — and says TRL's reason.

Each combination builds TRL's trainer the way `trl <trainer>` does (the probe's builder: model and reference loaded
through TRL's own `create_model_from_path`, random weights of one shared tiny config) and runs one step only when
construction passed. A few single combinations are added per trainer (EXTRA: PEFT settings that TRL or peft
refuse at construction). Activation offloading runs with torch's CPU device standing in for the accelerator TRL's
offloader asks for (it raises without one; a CUDA machine is what the job runs on). The test prints the count of
combinations per trainer.
"""

from __future__ import annotations

import contextlib
import itertools
import json
from collections import Counter
from dataclasses import fields
from typing import Any

import pytest

pytest.importorskip("trl")

from hpcmem.errors import SpecError  # noqa: E402
from hpcmem.job.jobspec import JobSpec
from hpcmem.job.spec import TrainSpec
from hpcmem.job.trainers import MODEL_CONFIG_FIELDS, REGISTRY  # noqa: E402
from hpcmem.job.trl_config import build_job  # noqa: E402

pytestmark = [pytest.mark.torch, pytest.mark.slow]

TINY = {"model_type": "llama", "vocab_size": 256, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8, "tie_word_embeddings": False,
        "max_position_embeddings": 128}
BASE = {"max_length": 16, "per_device_train_batch_size": 2, "max_prompt_length": 4, "max_completion_length": 4,
        "dtype": "float32", "bf16": False, "lora_r": 4}
GC = {"gc-off": {"gradient_checkpointing": False}, "gc-full": {},
      "gc-selective": {"gradient_checkpointing_kwargs": {"selective": True}}}
PEFT = {"full": {}, "lora": {"use_peft": True}}
# per trainer: the techniques beyond checkpointing and PEFT
AXES: dict[str, list[dict[str, dict[str, Any]]]] = {
    "sft": [{"padded": {}, "packing": {"packing": True}, "padding-free": {"padding_free": True},
             "padding-free-unbounded": {"padding_free": True, "max_length": None}},
            {"": {}, "offload": {"activation_offloading": True}}],
    "dpo": [{"ref": {}, "precompute": {"precompute_ref_log_probs": True}},
            {"": {}, "padding-free": {"padding_free": True}, "offload": {"activation_offloading": True}}],
    "reward": [{"": {}, "offload": {"activation_offloading": True}}],
    "kto": [{"ref": {}, "precompute": {"precompute_ref_log_probs": True}},
            {"b2": {}, "b1": {"per_device_train_batch_size": 1}}],
    "grpo": [{"beta0": {}, "beta": {"beta": 0.04}}, {"g2": {"num_generations": 2}, "g3": {"num_generations": 3}}],
    "rloo": [{"beta": {}, "beta0": {"beta": 0.0}}, {"g2": {"num_generations": 2}, "g3": {"num_generations": 3}}],
    "distillation": [{"rkl": {"beta": 1.0}, "out-of-range": {"beta": 1.5}}],
}

# per trainer: single combinations beyond the cross product (PEFT settings TRL or peft refuse at construction)
EXTRA: dict[str, dict[str, dict[str, Any]]] = {
    "sft": {"lora+target-parameters": {"use_peft": True, "lora_target_parameters": ["mlp.gate_proj.weight"],
                                       "lora_dropout": 0.0},
            "lora+target-parameters-dropout": {"use_peft": True, "lora_target_parameters": ["mlp.gate_proj.weight"]},
            "lora+target-parameters-dora": {"use_peft": True, "lora_target_parameters": ["mlp.gate_proj.weight"],
                                            "lora_dropout": 0.0, "use_dora": True},
            "lora+one-target": {"use_peft": True, "lora_target_modules": ["q_proj"]},
            "lora+two-targets": {"use_peft": True, "lora_target_modules": ["q_proj", "v_proj"]}},
    # the PEFT axis above runs a reward model's LoRA with TRL's default task type (CAUSAL_LM), which peft refuses
    "reward": {"lora+seq-cls": {"use_peft": True, "lora_task_type": "SEQ_CLS"},
               "lora+seq2seq": {"use_peft": True, "lora_task_type": "SEQ_2_SEQ_LM"},
               "lora+lowercase-task": {"use_peft": True, "lora_task_type": "seq_cls"}},
    "kto": {"lora+head-adapter": {"use_peft": True, "lora_target_modules": ["q_proj", "lm_head"]}},
    "distillation": {"lora+head-adapter": {"use_peft": True, "lora_target_modules": ["q_proj", "lm_head"],
                                           "beta": 1.0}},
}


def combinations(trainer: str) -> list[tuple[str, dict[str, Any]]]:
    out = []
    for picks in itertools.product(GC.items(), PEFT.items(), *(axis.items() for axis in AXES[trainer])):
        name = "+".join(k for k, _ in picks if k)
        settings = {k: v for k, v in BASE.items() if REGISTRY[trainer].declares(k) or k in MODEL_CONFIG_FIELDS
                    or k == "max_prompt_length"}      # hpcmem's own: the prompt length of generating trainers
        for _, extra in picks:
            settings.update(extra)
        out.append((name, settings))
    for name, extra in EXTRA.get(trainer, {}).items():
        out.append((name, {**out[0][1], **extra}))
    return out


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tiny")
    (folder / "config.json").write_text(json.dumps(TINY))
    return str(folder / "config.json")


def hpcmem_verdict(trainer: str, settings: dict[str, Any], model: str) -> str | None:
    try:
        build_job(trainer, {**settings, "model_name_or_path": model,
                            **({"teacher_model_name_or_path": model} if trainer == "distillation" else {})})
    except SpecError as exc:
        return str(exc)
    return None


def unchecked_job(trainer: str, settings: dict[str, Any], model: str) -> JobSpec:
    """The job as the user wrote it, without hpcmem's rules (TRL is the judge here)."""
    from hpcmem.models import resolve_model

    names = {f.name for f in fields(TrainSpec)}
    train = TrainSpec(trainer=trainer, **{**REGISTRY[trainer].defaults, **{k: v for k, v in settings.items()
                                                                        if k in names}},
                      **({"teacher_model_name_or_path": model} if trainer == "distillation" else {}))
    job = object.__new__(JobSpec)
    spec = resolve_model(model)
    for name, value in (("model", spec), ("train", train), ("gpu", None), ("expandable_segments", False),
                        ("tokens_per_micro_batch", None), ("teacher", spec if trainer == "distillation" else None)):
        object.__setattr__(job, name, value)
    from hpcmem.job.spec import ParallelSpec

    object.__setattr__(job, "parallel", ParallelSpec())
    return job


def sft_rows(job: JobSpec) -> Any:
    from datasets import Dataset

    return Dataset.from_dict({"input_ids": [[3 + (i + k) % 200 for k in range(12 - i % 3)] for i in range(16)]})


@contextlib.contextmanager
def cpu_accelerator():
    """TRL's activation offloader asks torch for the accelerator's device type and, by default, its streams; a
    CPU-only torch has neither: the CPU device stands in, without streams or pinned host memory."""
    import functools
    import importlib

    import torch

    modules = [importlib.import_module(f"trl.trainer.{name}_trainer") for name in REGISTRY]
    saved = [(m, m.get_act_offloading_ctx_manager) for m in modules if hasattr(m, "get_act_offloading_ctx_manager")]
    original = torch.accelerator.current_accelerator
    torch.accelerator.current_accelerator = lambda *a, **k: torch.device("cpu")
    for module, make in saved:
        module.get_act_offloading_ctx_manager = functools.partial(make, use_streams=False, use_pin_memory=False)
    try:
        yield
    finally:
        torch.accelerator.current_accelerator = original
        for module, make in saved:
            module.get_act_offloading_ctx_manager = make


def trl_verdict(job: JobSpec, model: str) -> str | None:
    """Build TRL's trainer as the probe does and run one step; the exception text, or None when it trains."""
    from hpcmem.probe import fixtures
    from hpcmem.probe.trainers import build_trainer

    cfg = fixtures.hf_config(model)
    model_id = f"hpcmem-random/{model}"
    try:
        with fixtures.random_weights(cfg, model_id), cpu_accelerator(), _sft_rows(job):
            trainer, _ = build_trainer(job, steps=1, device="cpu", model_id=model_id, cfg=cfg)
            from transformers.trainer_callback import ProgressCallback

            trainer.remove_callback(ProgressCallback)
            trainer.train()
    except Exception as exc:  # noqa: BLE001 — any failure is TRL's verdict on the combination
        return f"{type(exc).__name__}: {exc}"
    return None


@contextlib.contextmanager
def _sft_rows(job: JobSpec):
    """SFT's probe rows follow hpcmem's own batch design, which refuses what TRL should judge: plain rows instead."""
    if job.train.trainer != "sft":
        yield
        return
    from hpcmem.probe import fixtures

    original = fixtures.dataset
    fixtures.dataset = lambda j, steps: sft_rows(j)
    try:
        yield
    finally:
        fixtures.dataset = original


@pytest.mark.parametrize("trainer", list(AXES))
def test_hpcmem_refuses_exactly_what_trl_rejects(trainer, tiny, capsys):
    mismatches, counts = [], Counter()
    for name, settings in combinations(trainer):
        ours = hpcmem_verdict(trainer, settings, tiny)
        theirs = trl_verdict(unchecked_job(trainer, settings, tiny), tiny)
        counts["refused" if ours else "accepted"] += 1
        if (ours is None) != (theirs is None):
            mismatches.append(f"{name}: hpcmem {'refuses: ' + ours if ours else 'accepts'} | TRL "
                              f"{'raises: ' + theirs[:300] if theirs else 'trains'}")
    with capsys.disabled():
        print(f"\n{trainer}: {sum(counts.values())} combinations, {counts['refused']} refused by hpcmem and TRL")
    assert not mismatches, "\n".join(mismatches)
