"""ModelConfig's `lora_task_type`, read as peft reads it: it picks the PeftModel class that wraps the model.

TRL 1.16 passes it to `LoraConfig(task_type=...)` (trl/trainer/utils.py `get_peft_config`; its default is
"CAUSAL_LM", trl/trainer/model_config.py), and peft's `get_peft_model` wraps the model in the class that
`MODEL_TYPE_TO_PEFT_MODEL_MAPPING` names for it (peft/mapping_func.py):

- `PeftModelForCausalLM.__init__` and `PeftModelForSeq2SeqLM.__init__` read the model's
  `prepare_inputs_for_generation` (peft/peft_model.py). A reward model is an `AutoModelForSequenceClassification`
  (trl/trainer/reward_trainer.py), and no `*ForSequenceClassification` class of transformers 5.24 has that method, so
  `trl reward --use_peft` with TRL's default task type stops in `get_peft_model` with an AttributeError (checked with
  the real RewardTrainer on CPU: tests/job/test_lora_task_type.py).
- `PeftModelForSequenceClassification` / `PeftModelForTokenClassification` add `classifier` and `score` to the
  modules to save (peft/peft_model.py `__init__`): a reward model's [hidden, 1] score head is trained as a full copy
  beside the adapters — what hpcmem estimates and traces for a reward job with LoRA.
- `QUESTION_ANS` (modules to save `qa_outputs`) and `FEATURE_EXTRACTION` (none) leave a reward model's score head
  frozen, and every task type but CAUSAL_LM wraps a causal LM in a class hpcmem has not traced: both are refused as
  unmodelled rather than read as "no memory effect".
- Any other value: `PeftConfigMixin.__post_init__` raises "Invalid task type" (peft/config.py); peft's `TaskType`
  enum (peft/utils/peft_types.py) is matched exactly, case included.

Without use_peft, `get_peft_config` returns None and the field is never read.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from hpcmem.job.trainers import entry

if TYPE_CHECKING:
    from hpcmem.job.protocol import Job

# peft 0.21 peft/utils/peft_types.py TaskType, in its order
TASK_TYPES = ("SEQ_CLS", "SEQ_2_SEQ_LM", "CAUSAL_LM", "TOKEN_CLS", "QUESTION_ANS", "FEATURE_EXTRACTION")
NEEDS_GENERATION = ("CAUSAL_LM", "SEQ_2_SEQ_LM")     # their PeftModel reads prepare_inputs_for_generation
TRAINS_SCORE = ("SEQ_CLS", "TOKEN_CLS")              # their PeftModel adds `score` to the modules to save
CAUSAL_LM = "CAUSAL_LM"
SCORE_TASK = "SEQ_CLS"


def lora_task_problems(job: Job) -> list[str]:
    """One line per reason the job's lora_task_type stops the run or leaves it unmodelled ([] without use_peft)."""
    t = job.train
    task = t.lora_task_type
    if not t.use_peft:
        return []
    if task not in TASK_TYPES:
        return [f"lora_task_type {task!r}: peft's LoraConfig raises 'Invalid task type' — one of "
                f"{', '.join(TASK_TYPES)}, spelled exactly"]
    if entry(t.trainer).head == "score":
        if task in NEEDS_GENERATION:
            return [f"lora_task_type {task}{' (TRL' + chr(39) + 's default)' if task == CAUSAL_LM else ''} on a "
                    f"reward model: peft's PeftModelFor{'CausalLM' if task == CAUSAL_LM else 'Seq2SeqLM'} reads "
                    "prepare_inputs_for_generation, which no *ForSequenceClassification model has, and "
                    "get_peft_model raises AttributeError; set lora_task_type SEQ_CLS (peft then trains the score "
                    "head beside the adapters)"]
        if task not in TRAINS_SCORE:
            return [f"lora_task_type {task} on a reward model leaves its score head frozen (peft adds no `score` to "
                    "the modules to save), which hpcmem does not model; use SEQ_CLS"]
        return []
    if task != CAUSAL_LM:
        return [f"lora_task_type {task} wraps the {t.trainer} model in peft's PeftModel class for {task}, which "
                "hpcmem has not traced; use CAUSAL_LM (TRL's default)"]
    return []


def planned_task_type(trainer: str) -> str:
    """The task type a plan that turns LoRA on writes: SEQ_CLS for a reward model (see above), else TRL's default."""
    return SCORE_TASK if entry(trainer).head == "score" else CAUSAL_LM
