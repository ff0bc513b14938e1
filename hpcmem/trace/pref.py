"""TRL 1.16's own `DPOTrainer` and `RewardTrainer` for a `JobSpec` (the preference trainers the trace runs).

DPO reference model, as TRL decides it (trl/trainer/dpo_trainer.py `__init__`):

| job | reference | where its forward runs |
|---|---|---|
| full fine-tuning | a second model of the same class, in the policy's dtype (TRL loads it with `dtype=model.dtype`); the trace builds it from the config, as it does the policy | `_compute_loss`, after the policy forward, under `no_grad` with the fused LM head (log-probs only) |
| use_peft | none: the policy with its adapters disabled (`use_adapter(model, None)`) | same place, same head |
| precompute_ref_log_probs | none (unless given): one pass over the dataset in `__init__` (`_precompute_ref_logps`) stores `ref_chosen_logps`/`ref_rejected_logps` columns | before training; the trace adds the columns without running the pass (its memory is one no-grad forward, less than a step) and traces the training steps only |

Reward: `AutoModelForSequenceClassification.from_config(config, num_labels=1)` (what RewardTrainer's
`create_model_from_path` loads), a pre-tokenized `chosen_ids`/`rejected_ids` dataset; LoRA with task_type SEQ_CLS
(peft then trains the `score` head as a module to save, TRL's documented reward setup).
"""

from __future__ import annotations

import contextlib
from typing import Any

from hpcmem.job.jobspec import JobSpec
from hpcmem.trace import pieces, vision
from hpcmem.trace.data import BatchDesign, make_preference_dataset
from hpcmem.trace.fakeenv import patched
from hpcmem.trace.trainer import TRACE_STEPS, build_model_in_dtype, common_args, peft_config, traced_accumulation
from hpcmem.trace.vision_pref import make_vision_preference_dataset

PRECOMPUTE_NOTE = ("precompute_ref_log_probs: TRL's reference pass over the dataset (in DPOTrainer.__init__, before "
                   "training) is not traced; its ref_chosen_logps/ref_rejected_logps columns are filled with 0.0 and "
                   "only the training steps are traced")


def check_preference(job: JobSpec) -> list[str]:
    """What keeps the DPO / reward trace from running (the analytic estimate may still cover it)."""
    t, problems = job.train, []
    if t.packing or t.padding_free:
        problems.append(f"{t.trainer}: packing/padding_free are not traced (TRL {t.trainer} pads every pair)")
    if t.max_length is None or t.max_length < 4:
        problems.append(f"{t.trainer}: the trace needs max_length ≥ 4 (the longest chosen/rejected sequence)")
    if t.activation_offloading:
        problems.append(f"{t.trainer}: activation_offloading is traced for SFT only")
    return problems


def dpo_notes(job: JobSpec, generation: bool = False) -> list[str]:
    t = job.train
    notes = ["DPO: the reference model (full fine-tuning) is a second model built from the config in the "
             "policy's dtype, as TRL's create_model_from_path(dtype=model.dtype) loads it"] \
        if not (t.use_peft or t.precompute_ref_log_probs) else []
    return notes + ([PRECOMPUTE_NOTE] if t.precompute_ref_log_probs else [])


def reward_notes(job: JobSpec, generation: bool = False) -> list[str]:
    return ["reward: AutoModelForSequenceClassification.from_config(num_labels=1) stands for the checkpoint TRL "
            "loads" + ("; LoRA task_type SEQ_CLS (score head trained as a module to save)" if job.train.use_peft
                       else "")]


def build_dpo(job: JobSpec, model: Any, design: BatchDesign, *, fake: bool, generation: bool = False) -> Any:
    from trl import DPOConfig

    t = job.train
    args = DPOConfig(**common_args(job), beta=t.beta, precompute_ref_log_probs=t.precompute_ref_log_probs)
    ref = None
    if not t.use_peft and not t.precompute_ref_log_probs:
        ref = build_model_in_dtype(job)     # TRL would load the same checkpoint again in the policy's dtype
    steps = TRACE_STEPS * traced_accumulation(job)
    if t.images_per_example:     # DataCollatorForVisionPreference, transformers' processor (hpcmem.trace.vision_pref)
        dataset, processing = make_vision_preference_dataset(job, design, steps), vision.processor(job)
    else:
        dataset, processing = make_preference_dataset(job, design, steps), pieces.tokenizer()
    cls = _dpo_class(fake)
    import trl.trainer.dpo_trainer as dpo_module

    with no_hash(dpo_module) if t.precompute_ref_log_probs else contextlib.nullcontext():
        trainer = cls(model=model, ref_model=ref, args=args, train_dataset=dataset,
                      processing_class=processing, peft_config=peft_config(job))
    return trainer


def build_reward(job: JobSpec, model: Any, design: BatchDesign, *, fake: bool, generation: bool = False) -> Any:
    from trl import RewardConfig

    args = RewardConfig(**common_args(job))
    dataset = make_preference_dataset(job, design, TRACE_STEPS * traced_accumulation(job))
    return _reward_class(fake)(model=model, args=args, train_dataset=dataset, processing_class=pieces.tokenizer(),
                               peft_config=peft_config(job))


@contextlib.contextmanager
def no_hash(trainer_module: Any) -> Any:
    """`hash_module` reads every weight's bytes (the precompute cache key): fake weights have none."""
    with patched(trainer_module, "hash_module", lambda module: "hpcmem-trace"):
        yield


def _dpo_class(fake: bool) -> type:
    from trl import DPOTrainer

    return traced_trainer_class(DPOTrainer, ("ref_chosen_logps", "ref_rejected_logps"), fake)


def traced_trainer_class(base: type, ref_columns: tuple[str, ...], fake: bool) -> type:
    """`base` with precomputed reference log-probs as zero columns (no reference forward over the dataset) and,
    under fake tensors, no move of the model to a device (DPO and KTO precompute the same way)."""

    class Traced(base):  # type: ignore[misc, valid-type]
        def _precompute_ref_logps(self, dataset: Any, name: str, batch_size: int) -> Any:
            for column in ref_columns:
                dataset = dataset.add_column(column, [0.0] * len(dataset))
            return dataset

        if fake:
            def _move_model_to_device(self, model: Any, device: Any) -> None:
                return None

    Traced.__name__ = Traced.__qualname__ = f"Traced{base.__name__}"
    return Traced


def _reward_class(fake: bool) -> type:
    from trl import RewardTrainer

    if not fake:
        return RewardTrainer

    class FakeModelRewardTrainer(RewardTrainer):
        def _move_model_to_device(self, model: Any, device: Any) -> None:
            return None

    return FakeModelRewardTrainer


def hook_reference(tracker: Any, trainer: Any) -> Any:
    """Label the reference forward "step N / forward / reference forward": in DPO and KTO both reference paths (a ref
    model, the policy with adapters off) run inside `disable_gradient_checkpointing` (dpo_trainer.py /
    kto_trainer.py `_compute_loss`), looked up in the module of the TRL class the trainer derives from. Returns the
    undo."""
    import sys

    module = next(sys.modules[c.__module__] for c in type(trainer).__mro__ if c.__module__.startswith("trl.trainer."))
    original = module.disable_gradient_checkpointing

    @contextlib.contextmanager
    def labelled(*args: Any, **kwargs: Any) -> Any:
        with tracker.phase("reference forward"), tracker.label("activation"), original(*args, **kwargs):
            yield

    module.disable_gradient_checkpointing = labelled
    return lambda: setattr(module, "disable_gradient_checkpointing", original)
