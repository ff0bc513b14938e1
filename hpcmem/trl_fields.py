"""Which TrainSpec fields each TRL 1.16 config class declares (trl/trainer/*_config.py, trl/trainer/model_config.py).

One table for the rules (a field the trainer's config does not have is an error) and the TRL YAML renderer (only
declared fields are written). tests/test_launch_parsers.py pins it against the installed TRL dataclasses.
"""

from __future__ import annotations

MODEL_CONFIG_FIELDS = ("dtype", "attn_implementation", "use_peft", "lora_r", "lora_alpha", "lora_target_modules",
                       "load_in_4bit", "load_in_8bit", "use_bnb_nested_quant")
_COMMON = ("per_device_train_batch_size", "gradient_accumulation_steps", "gradient_checkpointing",
           "gradient_checkpointing_kwargs", "bf16", "fp16", "optim", "pad_to_multiple_of",
           "per_device_eval_batch_size", "eval_strategy", "save_strategy", "save_only_model", "dataloader_num_workers",
           "dataloader_pin_memory")
_GENERATION = ("num_generations", "steps_per_generation", "generation_batch_size", "max_completion_length",
               "num_iterations", "beta",
               "use_vllm", "vllm_mode", "vllm_gpu_memory_utilization", "vllm_tensor_parallel_size",
               "vllm_enable_sleep_mode", "ds3_gather_for_generation")
TRAINER_FIELDS: dict[str, tuple[str, ...]] = {
    "sft": _COMMON + ("max_length", "packing", "packing_strategy", "padding_free", "activation_offloading"),
    "dpo": _COMMON + ("max_length", "padding_free", "activation_offloading", "precompute_ref_log_probs", "beta",
                      "disable_dropout"),
    "reward": _COMMON + ("max_length", "activation_offloading", "disable_dropout"),
    "grpo": _COMMON + _GENERATION + ("vllm_importance_sampling_correction", "cast_lm_head_to_fp32", "disable_dropout"),
    "rloo": _COMMON + _GENERATION + ("disable_dropout",),
}


def owners(field: str) -> tuple[str, ...]:
    """The trainers whose config class declares `field`, in hpcmem's trainer order."""
    return tuple(trainer for trainer, declared in TRAINER_FIELDS.items() if field in declared)
