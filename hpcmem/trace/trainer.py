"""Build TRL 1.16's own `SFTTrainer` for a `JobSpec`: the model from its config, the SFTConfig, PEFT, the dataset.

Shared by the trace (inside a FakeTensorMode) and the self-check (real tensors): what differs is only where the
tensors live. The TRL pieces are the real ones — `SFTTrainer.__init__` applies `get_peft_model`,
`enable_input_require_grads`, selective checkpointing (`enable_selective_activation_checkpointing`), the fused LM
head (`add_fused_lm_head`), and `Trainer` applies `gradient_checkpointing_enable(gradient_checkpointing_kwargs)`.
"""

from __future__ import annotations

import tempfile
from typing import Any

from hpcmem.errors import SpecError
from hpcmem.job.jobspec import JobSpec
from hpcmem.job.trainers import REGISTRY, entry
from hpcmem.trace import pieces, text_heads, vision
from hpcmem.trace.data import BatchDesign, make_dataset
from hpcmem.trace.hf_config import attn_implementation_arg

# Optimizers the trace can build on CPU (bitsandbytes kernels need a GPU). "adamw_torch_foreach" is hpcmem's name for
# torch AdamW with foreach=True (HF's "adamw_torch" leaves foreach to torch, which picks it on CUDA).
TRACEABLE_OPTIMIZERS = ("adamw_torch_fused", "adamw_torch", "adamw_torch_foreach", "adafactor", "sgd")
TRACEABLE_TRAINERS = tuple(name for name, e in REGISTRY.items() if e.hooks.trace_build)
TRACE_STEPS = 2          # optimizer states are born in step 1; the steady peak is in step 2
MAX_TRACED_ACCUMULATION = 2   # SFT/DPO/Reward: from the second micro-batch on, every one holds the same memory


def check_traceable(job: JobSpec) -> list[str]:
    """Problems that keep the trace from running this job (the analytic estimate may still cover it)."""
    t, problems = job.train, []
    if t.trainer not in TRACEABLE_TRAINERS:
        problems.append(f"the trace runs {', '.join(TRACEABLE_TRAINERS)}; trainer {t.trainer!r} is estimated "
                        "analytically")
    trainer_check = entry(t.trainer).hook("trace_check") if t.trainer in TRACEABLE_TRAINERS else None
    if trainer_check is not None:
        problems += trainer_check(job)
    if t.quantized:
        problems.append("load_in_4bit/load_in_8bit need bitsandbytes on a GPU; the trace cannot run QLoRA")
    if t.optim not in TRACEABLE_OPTIMIZERS:
        problems.append(f"optim {t.optim!r} needs bitsandbytes; traceable: {', '.join(TRACEABLE_OPTIMIZERS)}")
    if t.fp16:
        problems.append("fp16 autocast with a GradScaler is not traced on CPU; use bf16 (the TRL default)")
    if t.profile_images:
        problems.append("a length profile's images: the trace draws images_per_example images of image_height × "
                        "image_width each; give those instead of an image-text --lengths profile")
    if t.torch_compile:
        problems.append("torch_compile: inductor's compiled graph is not traced on fake tensors (the estimate is the "
                        "eager step's)")
    if t.attn_implementation not in ("sdpa", "eager"):
        problems.append(f"attn_implementation {t.attn_implementation!r}: the trace runs sdpa or eager "
                        "(flash-attn kernels need CUDA)")
    return problems


def require_traceable(job: JobSpec) -> None:
    problems = check_traceable(job)
    if problems:
        raise SpecError(problems)


def model_config(job: JobSpec) -> Any:
    """The model's transformers config, found and built as the probe builds it (hpcmem.trace.pieces: a learned
    profile's own config.json first); the trace sets the dtype itself and never quantizes. A vision-language
    model's image/video token ids are the trace processor's (hpcmem.trace.vision)."""
    config = pieces.auto_config(pieces.config_dict(job.model.name, job.model))
    if job.model.vision is not None:
        for key, value in vision.token_ids(vision.processor(job)).items():
            setattr(config, key, value)
    return config


def load_dtype(job: JobSpec) -> Any:
    """TRL's `create_model_from_path` dtype: float32 unless model_init_kwargs set one; `auto` takes the checkpoint's
    (JobSpec.load_dtype)."""
    import torch

    return {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}.get(
        job.load_dtype, torch.bfloat16)


def build_model(job: JobSpec) -> Any:
    """`AutoModelForCausalLM.from_config` in the load dtype (random weights: from_pretrained's tensors, no file)."""
    from transformers import AutoModelForCausalLM

    text_heads.register()       # a text config transformers maps to no causal-LM class (Cosmos3 Edge's, Mistral Large 4's)
    attn = attn_implementation_arg(job.train)
    if entry(job.train.trainer).head == "score":
        # RewardTrainer's create_model_from_path: AutoModelForSequenceClassification with num_labels=1; the pad id
        # tells the head which position is the last token of each row (the trace's tokenizer pads with 0)
        from transformers import AutoModelForSequenceClassification
        from transformers.models.auto.modeling_auto import MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES

        outer = job.model.learned.config if job.model.learned is not None else None
        if outer and outer.get("model_type") not in MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES:
            # a learned type traced as its text part (Fuyu as Persimmon): TRL loads the checkpoint's own config, and
            # transformers' auto class raises on a type it maps to no sequence-classification class — raised here
            # by transformers itself, on that config
            AutoModelForSequenceClassification.from_config(pieces.auto_config(dict(outer)))
        config = model_config(job)
        config.num_labels = 1
        config.pad_token_id = 0
        return AutoModelForSequenceClassification.from_config(config, dtype=load_dtype(job), attn_implementation=attn)
    if job.model.vision is not None:
        return vision.build_vlm(model_config(job), load_dtype(job), attn)
    return AutoModelForCausalLM.from_config(model_config(job), dtype=load_dtype(job), attn_implementation=attn)


def build_model_in_dtype(job: JobSpec) -> Any:
    """`build_model` with torch's default dtype set to the load dtype (as the trace builds its policy)."""
    import torch

    previous = torch.get_default_dtype()
    torch.set_default_dtype(load_dtype(job))
    try:
        return build_model(job)
    finally:
        torch.set_default_dtype(previous)


def peft_config(job: JobSpec) -> Any:
    """TRL's LoRA config of the job (hpcmem.trace.pieces, shared with the probe)."""
    return pieces.peft_config(job)


def common_args(job: JobSpec, output_dir: str | None = None) -> dict[str, Any]:
    """TrainingArguments every traced trainer shares: two steps, the job's batch/precision/checkpointing, nothing
    that writes, logs or shuffles."""
    t = job.train
    optim = "adamw_torch" if t.optim == "adamw_torch_foreach" else t.optim
    return dict(
        output_dir=output_dir or tempfile.mkdtemp(prefix="hpcmem-trace-"),
        max_steps=TRACE_STEPS, per_device_train_batch_size=t.per_device_train_batch_size,
        gradient_accumulation_steps=traced_accumulation(job),
        gradient_checkpointing=t.gradient_checkpointing,
        gradient_checkpointing_kwargs=dict(t.gradient_checkpointing_kwargs) or None,
        bf16=t.bf16, fp16=t.fp16, optim=optim, max_grad_norm=t.max_grad_norm, max_length=t.max_length,
        pad_to_multiple_of=t.pad_to_multiple_of,
        activation_offloading=False,     # emulated by hpcmem.trace.offload (TRL's needs a CUDA/XPU accelerator)
        train_sampling_strategy="sequential", report_to="none", disable_tqdm=True, logging_steps=10_000,
        save_strategy="no", use_cpu=True, dataloader_num_workers=0, seed=0,
        # the MoE auxiliary loss's weight, where the trainer's config has the field (trl/trainer/{sft,dpo,kto,grpo,
        # rloo}_config.py): None takes the model config's coefficient (e.g. kto_trainer.py `router_aux_loss_coef`)
        **({"router_aux_loss_coef": t.router_aux_loss_coef} if entry(t.trainer).declares("router_aux_loss_coef")
           else {}),
    )


def sft_config(job: JobSpec, output_dir: str | None = None) -> Any:
    from trl import SFTConfig

    t = job.train
    return SFTConfig(**common_args(job, output_dir), packing=t.packing, packing_strategy=t.packing_strategy,
                     padding_free=t.padding_free)


def traced_accumulation(job: JobSpec) -> int:
    """Micro-batches per traced step. GRPO/RLOO keep all of them: one generation round covers B × steps_per_generation
    (= gradient_accumulation_steps) rows, so the generation batch and its buffers grow with the accumulation."""
    if entry(job.train.trainer).generates:
        return job.train.gradient_accumulation_steps
    return min(job.train.gradient_accumulation_steps, MAX_TRACED_ACCUMULATION)


def build_trainer(job: JobSpec, model: Any, design: BatchDesign, *, fake: bool, generation: bool = False) -> Any:
    """TRL's own trainer around `model`, built by the trainer's registry hook (`trace_build`). With `fake`, the
    adjustments a fake model needs (no `_move_model_to_device`, no device placement)."""
    trainer = entry(job.train.trainer).hook("trace_build")(job, model, design, fake=fake, generation=generation)
    from transformers.trainer_callback import PrinterCallback, ProgressCallback

    for callback in (PrinterCallback, ProgressCallback):    # they print the final metrics to stdout
        trainer.remove_callback(callback)
    if fake:
        # accelerate's prepare_model calls model.to(device): a module of fake parameters cannot swap them.
        trainer.accelerator.device_placement = False
    return trainer


def build_sft(job: JobSpec, model: Any, design: BatchDesign, *, fake: bool, generation: bool = False) -> Any:
    """TRL's SFTTrainer around `model` on the design's pre-tokenized rows."""
    from trl import SFTTrainer

    num_micro_batches = TRACE_STEPS * traced_accumulation(job)
    cls = _fake_trainer() if fake else SFTTrainer
    if job.train.images_per_example:
        dataset = vision.make_image_dataset(job, design.documents, num_micro_batches)
        return cls(model=model, args=sft_config(job), train_dataset=dataset, processing_class=vision.processor(job),
                   peft_config=peft_config(job))
    dataset = make_dataset(design, num_micro_batches, job.model.vocab_size)
    trainer = cls(model=model, args=sft_config(job), train_dataset=dataset, processing_class=pieces.tokenizer(),
                  peft_config=peft_config(job))
    if job.model_dropout_off:
        # SFTConfig has no disable_dropout; the learner's cells with the model's dropout off (hpcmem.trace.learn
        # `learn_job`) turn it off as DPO, KTO and Reward do, after peft wrapped the model (trl/trainer/utils.py)
        from trl.trainer.utils import disable_dropout_in_model

        disable_dropout_in_model(trainer.model)
    return trainer


def _fake_trainer() -> type:
    from trl import SFTTrainer

    class FakeModelSFTTrainer(SFTTrainer):
        """SFTTrainer minus `Trainer._move_model_to_device` (the fake model already sits on the fake CPU)."""

        def _move_model_to_device(self, model: Any, device: Any) -> None:
            return None

    return FakeModelSFTTrainer
