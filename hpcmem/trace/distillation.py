"""TRL 1.16's own `DistillationTrainer` for a `JobSpec` (trl/trainer/distillation_trainer.py): on-policy
distillation — the student generates, then learns the teacher's next-token distribution on its own completions.

As for GRPO/RLOO (hpcmem.trace.rl), the generated tokens are not TRL's: `_generate_single_turn` answers every prompt
with max_completion_length copies of one ordinary token (all rows but the first one token shorter, so every
micro-batch is padded like real completions of different lengths: hpcmem.trace.rl `PAD_COMPLETIONS`); with
`generation=True` TRL's own `generate` call runs first, to full length, and its output is dropped. Everything after
is TRL's: the prompt + completion batch, the split into micro-batches, the student's backbone forward, the teacher's
no-grad forward, `_chunked_divergence_loss`, backward, optimizer step.

The teacher: TRL loads `teacher_model_name_or_path` with `create_model_from_path(**teacher_model_init_kwargs)` and
prepares it for evaluation (no DDP wrapper); here the same call builds it from its config (the catalog, a
config.json) in the dtype TRL asks for, with random weights.
"""

from __future__ import annotations

from typing import Any

from hpcmem.job.jobspec import JobSpec
from hpcmem.job.shape import rows_needed
from hpcmem.job.spec import TrainSpec
from hpcmem.trace import pieces
from hpcmem.trace.data import BatchDesign
from hpcmem.trace.fakeenv import patched
from hpcmem.trace.pieces import FIRST_TOKEN_ID, WORD
from hpcmem.trace.rl import design_rl as design  # noqa: F401  (the same prompt + completion rows)
from hpcmem.trace.rl import traced_completions, traced_generate
from hpcmem.trace.trainer import TRACE_STEPS, build_model_in_dtype, common_args, traced_accumulation

GENERATION_NOTE = ("DISTILLATION: generation is not traced — the trainer's _generate_single_turn is replaced by fixed "
                   "completions of max_completion_length tokens (no EOS); the teacher's forward, the divergence loss, "
                   "backward and optimizer step run as in a real run")
TRACED_GENERATION_NOTE = ("DISTILLATION: transformers' generate runs as TRL calls it (phase 'generation'), every row "
                          "to max_completion_length; its output is then replaced by fixed completions of that length")
TEACHER_NOTE = ("DISTILLATION: the teacher ({name}) is built from its config in the dtype TRL loads it in ({dtype}), "
                "with random weights")


def check_traceable(job: JobSpec) -> list[str]:
    t, problems = job.train, []
    if t.use_vllm:
        problems.append("distillation: use_vllm is not traced (vLLM's engine lives outside torch's allocator); the "
                        "analytic estimate covers it")
    if t.activation_offloading:
        problems.append("distillation: activation_offloading is traced for SFT only")
    if job.teacher is None:
        problems.append("distillation: the trace needs teacher_model_name_or_path")
    return problems


def notes(job: JobSpec, generation: bool = False) -> list[str]:
    teacher = job.teacher.name if job.teacher else "?"
    return [TRACED_GENERATION_NOTE if generation else GENERATION_NOTE,
            TEACHER_NOTE.format(name=teacher, dtype=job.train.teacher_dtype)]


def prompts(job: JobSpec, num_rows: int) -> Any:
    from datasets import Dataset

    return Dataset.from_dict({"prompt": [" ".join([WORD] * job.train.max_prompt_length) for _ in range(num_rows)]})


def build_teacher(job: JobSpec, dtype: Any = None) -> Any:
    """The teacher from its config, in `dtype` (TRL's teacher_model_init_kwargs), else the job's teacher dtype: a
    causal LM like the student's (attention implementation included)."""
    name = dtype if isinstance(dtype, str) else str(dtype).removeprefix("torch.") if dtype is not None else None
    train = TrainSpec(trainer="sft", dtype=name or job.train.teacher_dtype,
                      attn_implementation=job.train.attn_implementation)
    return build_model_in_dtype(JobSpec(model=job.teacher, train=train))


def build(job: JobSpec, model: Any, design: BatchDesign, *, fake: bool, generation: bool = False) -> Any:
    import trl
    import trl.trainer.distillation_trainer as distill

    t = job.train
    args = common_args(job)
    for key in ("max_length", "activation_offloading"):     # not DistillationConfig fields
        args.pop(key)
    config = trl.DistillationConfig(
        **args, beta=t.beta, max_completion_length=t.max_completion_length, disable_dropout=t.disable_dropout,
        use_vllm=False, teacher_model_name_or_path=job.teacher.name,
        teacher_model_init_kwargs={**(t.teacher_model_init_kwargs or {}), "dtype": t.teacher_dtype})
    rows = prompts(job, TRACE_STEPS * traced_accumulation(job) * t.per_device_train_batch_size)
    with patched(distill, "create_model_from_path", lambda name, **kw: build_teacher(job, kw.get("dtype"))):
        return _distillation_class(fake, t.max_completion_length, generation)(
            model=model, teacher_model=job.teacher.name, args=config, train_dataset=rows,
            processing_class=pieces.tokenizer(), peft_config=pieces.peft_config(job))


def probe_kwargs(job: JobSpec) -> dict[str, Any]:
    """The probe's teacher: built from its config with random weights, handed over as a model (TRL then takes no
    teacher_model_init_kwargs)."""
    return {"teacher_model": build_teacher(job)}


def probe_dataset(job: JobSpec, steps: int) -> Any:
    return prompts(job, rows_needed(job, steps))


def _distillation_class(fake: bool, completion_length: int, generation: bool) -> type:
    from trl import DistillationTrainer

    class TracedDistillationTrainer(DistillationTrainer):
        def _generate_single_turn(self, prompt_ids: Any, images: Any, multimodal_fields: Any,
                                  has_tool_images: bool = False) -> Any:
            if fake and generation:
                self._traced_generate(prompt_ids)
            return traced_completions(len(prompt_ids), completion_length, FIRST_TOKEN_ID)

        _traced_generate = traced_generate

        if fake:
            def _move_model_to_device(self, model: Any, device: Any) -> None:
                return None

    return TracedDistillationTrainer

