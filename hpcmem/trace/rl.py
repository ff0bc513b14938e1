"""TRL 1.16's own `GRPOTrainer` and `RLOOTrainer` for a `JobSpec` (the online RL trainers the trace runs).

The training step is TRL's: `_prepare_inputs` → `_generate_and_score_completions` (tokenize the prompts, build the
[B·steps_per_generation, P + C] prompt+completion batch, the reference log-prob pass when beta > 0, rewards,
advantages) → `compute_loss` (per-token log-probs through the fused LM head, the loss) → backward → optimizer step.

What is not TRL's: the generated tokens. HF `generate` on fake tensors cannot decide which token comes next, so the
trainer's `_generate_single_turn` is replaced by one that answers every prompt (all but the first one token shorter, so
every micro-batch is padded like real completions of different lengths: `PAD_COMPLETIONS`) with `max_completion_length`
copies of one ordinary token (no EOS: every completion runs to the limit, the longest batch TRL can build), and the
reward is a constant function. Prompts are `max_prompt_length` words of the word tokenizer (one token per word); with
images, conversational prompts of the images and words, through the processor (hpcmem.trace.vision_rl). With
`generation=True` (`run_trace(..., generation=True)`) the replacement first runs TRL's own `generate` call to full
length — KV cache, logits, sampling — under the phase "generation", then drops its output; off by default because a
decode step costs a whole forward of fake-tensor dispatch (~1.4 s per token for a 0.5B model with LoRA).

Reference model (beta > 0), as TRL decides it (grpo_trainer.py / rloo_trainer.py `__init__`):
full fine-tuning → a second model from `create_model_from_path(model id, dtype=policy dtype)`, here built from the
config in the policy's dtype; LoRA → none (adapters disabled for the reference pass); beta 0 → none.
"""

from __future__ import annotations

import contextlib
from typing import Any

from hpcmem.job.jobspec import JobSpec
from hpcmem.job.trainers import entry
from hpcmem.trace import pieces, vision
from hpcmem.trace.data import BatchDesign
from hpcmem.trace.fakeenv import patched
from hpcmem.trace.pieces import FIRST_TOKEN_ID, WORD
from hpcmem.trace.vision_rl import generate_fields, make_image_prompt_dataset
from hpcmem.trace.trainer import TRACE_STEPS, build_model_in_dtype, common_args, peft_config, traced_accumulation

GENERATION_NOTE = ("{name}: generation is not traced — the trainer's _generate_single_turn is replaced by fixed "
                   "completions of max_completion_length tokens (no EOS) and the reward by a constant function; "
                   "TRL's scoring pass (reference log-probs when beta > 0), loss, backward and optimizer step run as "
                   "in a real run")
TRACED_GENERATION_NOTE = ("{name}: transformers' generate runs as TRL calls it (phase 'generation'), every row to "
                          "max_completion_length (no token is known, so none reads as finished); its output is then "
                          "replaced by fixed completions of that length and the reward by a constant function")
REF_NOTE = ("{name}: the reference model (beta > 0, full fine-tuning) is a second model built from the config in the "
            "policy's dtype, as TRL's create_model_from_path(dtype=model.dtype) loads it")


def check_rl(job: JobSpec) -> list[str]:
    """What keeps the RL trace from running (the analytic estimate may still cover it)."""
    t, problems = job.train, []
    name = t.trainer
    if t.use_vllm:
        problems.append(f"{name}: use_vllm is not traced (vLLM's engine and KV cache live outside torch's allocator "
                        "on the trainer's side); the analytic estimate covers it")
    if t.packing or t.padding_free:
        problems.append(f"{name}: packing/padding_free do not apply to {name} (TRL pads prompt+completion)")
    if t.activation_offloading:
        problems.append(f"{name}: activation_offloading is traced for SFT only")
    if t.steps_per_generation is not None and t.steps_per_generation != t.gradient_accumulation_steps:
        problems.append(f"{name}: the trace runs steps_per_generation = gradient_accumulation_steps (TRL's default); "
                        f"got {t.steps_per_generation}")
    if t.generation_batch_size is not None:
        problems.append(f"{name}: generation_batch_size is not traced (leave it to TRL's default)")
    rows = t.per_device_train_batch_size * traced_steps_per_generation(job)
    if rows % t.num_generations:
        problems.append(f"{name}: per_device_train_batch_size × steps_per_generation ({rows}) must be a multiple of "
                        f"num_generations ({t.num_generations}) — TRL's own rule")
    return problems


def traced_steps_per_generation(job: JobSpec) -> int:
    return traced_accumulation(job)


def design_rl(job: JobSpec) -> BatchDesign:
    t = job.train
    b, p, c = t.per_device_train_batch_size, t.max_prompt_length, t.max_completion_length
    mult = t.pad_to_multiple_of or 1
    width = -(-p // mult) * mult + -(-c // mult) * mult
    return BatchDesign("prompt+completion", (p + c,) * b, (b, width), b * width,
                       f"{b} rows of {p} prompt + {c} completion tokens (completions run to max_completion_length)")


def build_rl(job: JobSpec, model: Any, design: BatchDesign, *, fake: bool, generation: bool = False) -> Any:
    import trl
    from datasets import Dataset

    t = job.train
    e = entry(t.trainer)
    args = common_args(job)
    for key in ("max_length", "activation_offloading"):     # SFT/DPO-only fields
        args.pop(key)
    config = getattr(trl, e.config_class)(
        **args, beta=t.beta, num_generations=t.num_generations, max_completion_length=t.max_completion_length,
        num_iterations=t.num_iterations, use_vllm=False, disable_dropout=t.disable_dropout,
        **({"cast_lm_head_to_fp32": t.cast_lm_head_to_fp32} if e.declares("cast_lm_head_to_fp32") else {}))
    rows = TRACE_STEPS * traced_accumulation(job) * t.per_device_train_batch_size
    if t.images_per_example:        # conversational prompts with images, the processor (hpcmem.trace.vision_rl)
        dataset, processing = make_image_prompt_dataset(job, rows), vision.processor(job)
    else:
        dataset = Dataset.from_dict({"prompt": [" ".join([WORD] * t.max_prompt_length) for _ in range(rows)]})
        processing = pieces.tokenizer()
    module = _module(t.trainer)

    ref_builder = lambda *a, **k: build_model_in_dtype(job)    # noqa: E731
    with patched(module, "create_model_from_path", ref_builder):
        trainer = _rl_class(t.trainer, fake, t.max_completion_length, generation)(
            model=model, reward_funcs=_constant_reward, args=config, train_dataset=dataset,
            processing_class=processing, peft_config=peft_config(job))
    return trainer


def rl_notes(job: JobSpec, generation: bool = False) -> list[str]:
    t = job.train
    name = t.trainer.upper()
    notes = [(TRACED_GENERATION_NOTE if generation else GENERATION_NOTE).format(name=name)]
    if t.beta != 0.0 and not t.use_peft:
        notes.append(REF_NOTE.format(name=name))
    return notes


# the trace's worst case: every completion but the first one token shorter, so every micro-batch of the generation
# batch is padded. TRL shuffles the generation batch before it splits it into micro-batches
# (grpo_trainer.py / rloo_trainer.py / distillation_trainer.py `_prepare_inputs`: shuffle_sequence_dict, then
# split_tensor_dict), and real completions end at many lengths, so each micro-batch carries padding and its 4-D
# attention mask; with only one shorter row, only the micro-batch that drew it did. A GPU probe forces every
# completion to max_completion_length (hpcmem.probe.fixtures.dataset), so hpcmem.lab.allocator_records turns this off
# to replay the probe's own batches.
PAD_COMPLETIONS = True


def traced_completions(prompts: int, completion_length: int, token: int) -> list[list[int]]:
    """What the replaced `_generate_single_turn` answers: `prompts` completions of `completion_length` copies of
    `token`, all but the first one token shorter (`PAD_COMPLETIONS`)."""
    completions = [[token] * completion_length for _ in range(prompts)]
    if PAD_COMPLETIONS and completion_length > 1:
        completions[1:] = [c[:-1] for c in completions[1:]]
    return completions


def _constant_reward(completions: Any, **kwargs: Any) -> list[float]:
    return [0.0] * len(completions)


def _module(trainer: str) -> Any:
    """The module that defines the trainer class (trl/trainer/<name>_trainer.py)."""
    import importlib

    return importlib.import_module(f"trl.trainer.{trainer}_trainer")


@contextlib.contextmanager
def _scalar_metrics(module: Any) -> Any:
    """TRL's `nanmin`/`nanmax` (metrics only) as a zero scalar: their boolean index needs values nobody knows."""
    names = [n for n in ("nanmin", "nanmax") if hasattr(module, n)]
    with contextlib.ExitStack() as stack:
        for name in names:
            stack.enter_context(patched(module, name, lambda tensor: tensor.new_zeros(())))
        yield


def _rl_class(trainer: str, fake: bool, completion_length: int, generation: bool = False) -> type:
    import trl

    Base = getattr(trl, entry(trainer).trainer_class)
    # GRPO's _generate_single_turn also returns the sampling log-probs (for its importance-sampling correction)
    with_logprobs = entry(trainer).declares("vllm_importance_sampling_correction")

    class TracedRLTrainer(Base):
        def _generate_single_turn(self, prompt_ids: Any, *args: Any, **kwargs: Any) -> Any:
            if fake and generation:
                # GRPO/RLOO pass (images, multimodal_fields, ...) after the prompt ids: a vision-language prompt's
                # pixel_values and image_grid_thw go to generate as TRL hands them (hpcmem.trace.vision_rl)
                self._traced_generate(prompt_ids, args[1] if len(args) > 1 else None)
            # the first completion runs to max_completion_length, the others one token shorter: real completions end
            # at different lengths, so every micro-batch carries a padding mask (`PAD_COMPLETIONS`)
            completions = traced_completions(len(prompt_ids), completion_length, FIRST_TOKEN_ID)
            return (completions, None) if with_logprobs else completions     # GRPO: (ids, sampling logprobs)

        _traced_generate = traced_generate

        if fake:
            def _move_model_to_device(self, model: Any, device: Any) -> None:
                return None

            def _compute_loss(self, model: Any, inputs: Any) -> Any:
                # the clip-ratio metrics' nanmin/nanmax boolean-index a scalar computed from fake weights
                with _scalar_metrics(_module(trainer)):
                    return super()._compute_loss(model, inputs)

    TracedRLTrainer.__name__ = f"Traced{Base.__name__}"
    return TracedRLTrainer


def traced_generate(self: Any, prompt_ids: Any, multimodal_fields: dict[str, Any] | None = None) -> None:
    """TRL's own generate call (grpo_trainer.py / rloo_trainer.py `_generate_single_turn`, transformers path):
    left-padded prompts, `unwrap_model_for_generation`, no_grad, `generation_config`. On fake tensors no
    token is known, so no row ever reads as finished: all run to max_completion_length, the KV cache grows
    to its largest. The output is dropped; the caller answers with fixed completions. Bound as the trainer's
    `_traced_generate`, which hpcmem.trace.phases labels "generation". `multimodal_fields`: the processor's
    pixel_values, image_grid_thw … of a vision-language prompt batch (hpcmem.trace.vision_rl `generate_fields`)."""
    import sys

    import torch
    from transformers import Trainer
    from transformers.generation.utils import GenerationMixin
    from trl.models import unwrap_model_for_generation

    width = max(len(p) for p in prompt_ids)
    pad = self.pad_token_id if getattr(self, "pad_token_id", None) is not None else 0
    ids = torch.tensor([[pad] * (width - len(p)) + list(p) for p in prompt_ids])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompt_ids])
    inputs = Trainer._prepare_inputs(self, {"input_ids": ids, "attention_mask": mask,
                                            **generate_fields(multimodal_fields or {}, width)})
    with unwrap_model_for_generation(self.model_wrapped, self.accelerator,
                                     gather_deepspeed3_params=self.args.ds3_gather_for_generation,
                                     generation_kwargs=self.generation_kwargs,
                                     gradient_checkpointing_kwargs=self.args.gradient_checkpointing_kwargs
                                     ) as unwrapped, torch.no_grad():
        total = self.generation_config.max_new_tokens
        steps = [total]
        every = max(1, total // 10)

        def has_unfinished(*args: Any, **kwargs: Any) -> bool:
            # generate's stop test reads `unfinished_sequences.max() == 0` (StopCheck): a value no fake
            # tensor has; the loop instead runs exactly max_new_tokens times (one token per iteration)
            steps[0] -= 1
            done = total - steps[0] - 1
            if done and done % every == 0:      # a long trace says where it is (stderr: --json stays clean)
                print(f"hpcmem trace: generate {done}/{total} tokens (step {self.state.global_step + 1})",
                      file=sys.stderr, flush=True)
            return steps[0] >= 0

        # on the mixin: a PeftModel's generate runs its base model's loop
        with patched(GenerationMixin, "_has_unfinished_sequences", has_unfinished):
            out = unwrapped.generate(**inputs, generation_config=self.generation_config)
    del out
