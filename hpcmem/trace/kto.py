"""TRL 1.16's own `KTOTrainer` for a `JobSpec` (trl/trainer/kto_trainer.py), and its worst-case unpaired batch.

The dataset is unpaired text — `prompt`, `completion`, `label` (desirable or not, alternating) — which KTOTrainer
tokenizes itself (EOS appended to each completion), filters, and extends with the KL completions (each batch of
per_device_train_batch_size rows rotated by one). Prompts are half of max_length; completions run past it, so
`DataCollatorForUnpairedPreference` truncates every row to max_length but the last, one token shorter (padding: an
attention mask, as real rows of unequal length give). The KL rows are the same prompts with the rotated completions:
one is the short completion, the others are cut at max_length.

Reference model, as TRL decides it (`KTOTrainer.__init__`): full fine-tuning → a second model from
`create_model_from_path(model id, dtype=policy dtype)`, here built from the config in the policy's dtype; PEFT → none
(adapters disabled); precompute_ref_log_probs → none: TRL's pass over the dataset in `__init__` is not traced (its
`ref_logps`/`ref_KL_logps` columns are filled with 0.0), only the training steps are.
"""

from __future__ import annotations

import contextlib
from typing import Any

from hpcmem.errors import SpecError
from hpcmem.job.jobspec import JobSpec
from hpcmem.trace import pieces
from hpcmem.trace.data import BatchDesign
from hpcmem.trace.fakeenv import patched
from hpcmem.trace.pieces import WORD
from hpcmem.trace.pref import no_hash, traced_trainer_class
from hpcmem.trace.trainer import TRACE_STEPS, build_model_in_dtype, common_args, traced_accumulation

REF_NOTE = ("KTO: the reference model (full fine-tuning) is a second model built from the config in the policy's "
            "dtype, as TRL's create_model_from_path(dtype=model.dtype) loads it")
PRECOMPUTE_NOTE = ("precompute_ref_log_probs: TRL's reference pass over the dataset (in KTOTrainer.__init__, before "
                   "training) is not traced; its ref_logps/ref_KL_logps columns are filled with 0.0 and only the "
                   "training steps are traced")
OVERRUN = 8          # completions run this many tokens past max_length, so the collator truncates them


def check_traceable(job: JobSpec) -> list[str]:
    t, problems = job.train, []
    if t.max_length is None or t.max_length < 4:
        problems.append("kto: the trace needs max_length ≥ 4 (the longest prompt + completion)")
    if t.activation_offloading:
        problems.append("kto: activation_offloading is traced for SFT only")
    return problems


def notes(job: JobSpec, generation: bool = False) -> list[str]:
    t = job.train
    out = [REF_NOTE] if not (t.use_peft or t.precompute_ref_log_probs) else []
    return out + ([PRECOMPUTE_NOTE] if t.precompute_ref_log_probs else [])


def design(job: JobSpec) -> BatchDesign:
    """B rows of max_length tokens, the last one token shorter; the KL rows take the same shape."""
    t = job.train
    b, length = t.per_device_train_batch_size, t.max_length
    if length is None or length < 4:
        raise SpecError("the kto trace needs max_length ≥ 4 (the longest prompt + completion)")
    rows = (length,) * (b - 1) + (length - 1,)
    mult = t.pad_to_multiple_of or 1
    width = -(-length // mult) * mult
    return BatchDesign("unpaired", rows, (b, width), b * width,
                       f"{b} rows of {length} tokens (last one token shorter), and as many KL rows")


def prompt_length(job: JobSpec) -> int:
    """Prompt tokens per row of this design: half of max_length."""
    return (job.train.max_length or 4) // 2


def label_tokens(job: JobSpec) -> int:
    """The tokens a KTO micro-batch of this design scores, at most: each of the B rows' completion, max_length less
    the prompt (KTOTrainer labels the prompt -100; the KL rows run without gradients)."""
    t = job.train
    return t.per_device_train_batch_size * max((t.max_length or 4) - prompt_length(job), 1)


def dataset(job: JobSpec, num_micro_batches: int) -> Any:
    """Unpaired text rows of the word tokenizer: a prompt of max_length // 2 words, a completion past max_length
    (+ EOS), the last row of each micro-batch one token shorter; labels alternate."""
    from datasets import Dataset

    t = job.train
    b, length = t.per_device_train_batch_size, t.max_length or 4
    prompt = prompt_length(job)
    words = lambda n: " ".join([WORD] * n)      # noqa: E731
    rows: dict[str, list[Any]] = {"prompt": [], "completion": [], "label": []}
    for _ in range(num_micro_batches):
        for i in range(b):
            completion = length - prompt - 2 if i == b - 1 else length - prompt - 1 + OVERRUN    # + EOS
            rows["prompt"].append(words(prompt))
            rows["completion"].append(" " + words(completion))
            rows["label"].append(i % 2 == 0)
    return Dataset.from_dict(rows)


def probe_dataset(job: JobSpec, steps: int) -> Any:
    """The probe's rows: the trace's, for every micro-batch the probe's steps read."""
    t = job.train
    return dataset(job, t.gradient_accumulation_steps * job.parallel.world_size * (steps + 2))


def build(job: JobSpec, model: Any, design: BatchDesign, *, fake: bool, generation: bool = False) -> Any:
    import trl
    import trl.trainer.kto_trainer as kto

    t = job.train
    args = trl.KTOConfig(**common_args(job), beta=t.beta, precompute_ref_log_probs=t.precompute_ref_log_probs,
                         disable_dropout=t.disable_dropout)
    rows = dataset(job, TRACE_STEPS * traced_accumulation(job))
    with contextlib.ExitStack() as stack:
        stack.enter_context(patched(kto, "create_model_from_path", lambda *a, **k: build_model_in_dtype(job)))
        if t.precompute_ref_log_probs:
            stack.enter_context(no_hash(kto))
        return _kto_class(fake)(model=model, args=args, train_dataset=rows, processing_class=pieces.tokenizer(),
                                peft_config=pieces.peft_config(job))


def _kto_class(fake: bool) -> type:
    from trl import KTOTrainer

    return traced_trainer_class(KTOTrainer, ("ref_logps", "ref_KL_logps"), fake)
