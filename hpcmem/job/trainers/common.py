"""Field groups several TRL 1.16 config classes share (trl/trainer/*_config.py, model_config.py), as TrainSpec names."""

from __future__ import annotations

from hpcmem.job.trainers.entry import Hooks

MODEL_CONFIG_FIELDS = ("dtype", "attn_implementation", "use_peft", "lora_r", "lora_alpha", "lora_target_modules",
                       "lora_dropout", "use_dora", "lora_modules_to_save", "lora_target_parameters",
                       "lora_task_type", "load_in_4bit", "load_in_8bit", "use_bnb_nested_quant")
# TrainingArguments fields hpcmem models, as every TRL config inherits them (TRL's _BaseConfig overrides some defaults)
COMMON = ("per_device_train_batch_size", "gradient_accumulation_steps", "gradient_checkpointing",
          "gradient_checkpointing_kwargs", "accelerator_config", "bf16", "fp16", "optim", "max_grad_norm",
          "torch_compile",
          "torch_empty_cache_steps",
          "pad_to_multiple_of",
          "per_device_eval_batch_size", "eval_strategy", "save_strategy", "save_only_model", "dataloader_num_workers",
          "dataloader_pin_memory")
# GRPOConfig / RLOOConfig: the generation round and vLLM
GENERATION = ("num_generations", "steps_per_generation", "generation_batch_size", "max_completion_length",
              "num_iterations", "beta",
              "use_vllm", "vllm_mode", "vllm_gpu_memory_utilization", "vllm_tensor_parallel_size",
              "vllm_enable_sleep_mode", "ds3_gather_for_generation")
# GRPO's and RLOO's shared rules, trace (hpcmem.trace.rl: prompts, generation, scoring) and probe pieces
RL_HOOKS = Hooks(rules="hpcmem.job.rules:check_generation", trace_design="hpcmem.trace.rl:design_rl",
                 trace_build="hpcmem.trace.rl:build_rl", trace_check="hpcmem.trace.rl:check_rl",
                 trace_notes="hpcmem.trace.rl:rl_notes", probe_dataset="hpcmem.probe.fixtures:prompt_dataset",
                 probe_kwargs="hpcmem.probe.fixtures:reward_kwargs")
