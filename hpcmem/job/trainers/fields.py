"""Every field of TRL 1.16's ModelConfig, its seven trainer configs and transformers' TrainingArguments, classified.

- modelled: read into the spec (hpcmem.job.spec) and estimated; `why` says where or as what.
- no memory effect: accepted and listed back; `why` says why the GPU does not see it.
- refused: a value other than TRL's default (`default`) is refused before anything is estimated or submitted; `why`
  gives TRL's reason when TRL itself rejects it, else what the field would change that hpcmem does not model.

TrainSpec fields are modelled by definition (`classify` says so without an entry here). `declared.json` lists which
class declares which field; tests/job/test_trl_fields.py rebuilds both from TRL's own dataclasses and fails on a field
that is unclassified or has moved.
"""

from __future__ import annotations

import difflib
import json
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from hpcmem.errors import Problems
from hpcmem.job.spec import TrainSpec, field_names

MODELLED, NO_EFFECT, REFUSED = "modelled", "no memory effect", "refused"


@dataclass(frozen=True)
class Field:
    kind: str
    why: str
    default: Any = None        # refused fields: TRL's default, the one value accepted


def _no(why: str) -> Field:
    return Field(NO_EFFECT, why)


def _mod(why: str) -> Field:
    return Field(MODELLED, why)


def _ref(why: str, default: Any = None) -> Field:
    return Field(REFUSED, why, default)


_RUN = _no("bookkeeping of the run (names, schedule, logging): nothing on the GPU")
_HYPER = _no("a number inside the optimizer's or the loss's arithmetic: the same tensors, other values")
_DATA = _no("dataset preparation on the host, before training: the batch shapes are max_length's")
_HUB = _no("Hub upload after saving: host and network only")
_SAMPLING = _no("sampling of the next token: a [rows, vocab] transform beside the generation logits, below the KV "
                "cache and the step")
_VLLM_SIDE = _no("vLLM's own process or pool (server address, model implementation): outside the trainer's memory")
_LOG = _no("logging of completions or metrics on the host")
_LOSS = _no("a term of the loss computed on per-token or per-sequence scalars: the same tensors")

FIELDS: dict[str, Field] = {
    # transformers TrainingArguments ------------------------------------------------------------------------------
    "output_dir": _RUN, "num_train_epochs": _RUN, "max_steps": _RUN, "learning_rate": _HYPER,
    "lr_scheduler_type": _HYPER, "lr_scheduler_kwargs": _HYPER, "warmup_steps": _HYPER, "optim_args": _no(
        "keyword arguments of the chosen optimizer (betas, eps): its states are the same"),
    "weight_decay": _HYPER, "adam_beta1": _HYPER, "adam_beta2": _HYPER, "adam_epsilon": _HYPER,
    "optim_target_modules": _no("used only by GaLore/APOLLO-type optimizers, which `optim` does not accept"),
    "average_tokens_across_devices": _no("a scalar all-reduce of the token count"),
    "max_grad_norm": _mod("gradient clipping's per-parameter norms in the optimizer step (0 or None: no clipping)"),
    "label_smoothing_factor": _no("Trainer's label smoother; TRL's trainers compute their own loss (SFT: refused)"),
    "bf16_full_eval": _no("casts the model only in a standalone evaluate(); TRL's scripts evaluate inside train()"),
    "fp16_full_eval": _no("casts the model only in a standalone evaluate(); TRL's scripts evaluate inside train()"),
    "tf32": _no("matmul precision mode: the same tensors"),
    "activation_checkpointing": _mod("transformers' new name for gradient_checkpointing; it wins when set"),
    "activation_checkpointing_kwargs": _mod("transformers' new name for gradient_checkpointing_kwargs"),
    "torch_compile_backend": _mod("sets torch_compile (TrainingArguments.__post_init__)"),
    "torch_compile_mode": _mod("sets torch_compile (TrainingArguments.__post_init__)"),
    "use_liger_kernel": _ref("Liger's kernels replace the model's RMSNorm, SwiGLU and RoPE, whose saved tensors "
                             "hpcmem models from transformers' code; TRL 1.16 deprecates it (use_kernels)", False),
    "liger_kernel_config": _ref("configures Liger's kernels (see use_liger_kernel)"),
    "use_cache": _ref("keeps every layer's keys and values in a DynamicCache through the training forward (copies, "
                      "transformers cache_utils.py DynamicLayer.update); not modelled — TRL's default is False", False),
    "neftune_noise_alpha": _no("one [tokens, hidden] noise tensor added at the embedding, freed before the first layer"),
    "auto_find_batch_size": _no("halves the batch only after an out-of-memory error; the estimate is of the batch "
                                "asked for"),
    "logging_strategy": _RUN, "logging_steps": _RUN, "logging_first_step": _RUN, "log_on_each_node": _RUN,
    "logging_nan_inf_filter": _RUN, "include_num_input_tokens_seen": _RUN, "log_level": _RUN,
    "log_level_replica": _RUN, "disable_tqdm": _RUN, "report_to": _RUN, "run_name": _RUN, "project": _RUN,
    "trackio_space_id": _RUN, "trackio_bucket_id": _RUN, "trackio_static_space_id": _RUN,
    "eval_steps": _RUN, "eval_delay": _RUN,
    "prediction_loss_only": _no("TRL's scripts pass no compute_metrics: evaluation keeps no logits either way"),
    "eval_on_start": _no("an evaluation before the first step, when no optimizer state exists yet: below the "
                         "evaluation phase"),
    "eval_do_concat_batches": _no("how kept predictions are joined; TRL's scripts keep none"),
    "eval_use_gather_object": _no("how kept predictions are gathered; TRL's scripts keep none"),
    "eval_accumulation_steps": _no("moves kept predictions to the host; TRL's scripts keep none"),
    "include_for_metrics": _no("what compute_metrics receives; TRL's scripts pass no compute_metrics"),
    "batch_eval_metrics": _no("how compute_metrics is called; TRL's scripts pass no compute_metrics"),
    "save_steps": _RUN, "save_on_each_node": _no("every node writes its copy: the same per-node save phase"),
    "save_total_limit": _RUN,
    "enable_jit_checkpoint": _no("a checkpoint save on SIGTERM: the checkpoint-save phase"),
    "push_to_hub": _HUB, "hub_token": _HUB, "hub_private_repo": _HUB, "hub_model_id": _HUB, "hub_strategy": _HUB,
    "hub_always_push": _HUB, "hub_revision": _HUB,
    "load_best_model_at_end": _no("loads a checkpoint after training ends"),
    "metric_for_best_model": _RUN, "greater_is_better": _RUN, "ignore_data_skip": _RUN,
    "restore_callback_states_from_checkpoint": _RUN, "full_determinism": _no(
        "deterministic kernels (CUBLAS_WORKSPACE_CONFIG=:4096:8, within cuBLAS's modelled workspaces)"),
    "seed": _RUN, "data_seed": _RUN,
    "use_cpu": _no("the job runs on the CPU: nothing on a GPU to estimate"),
    "parallelism_config": _ref("the layout (cp_size, sp_size, dp_shard_size, …) is read from the accelerate config "
                               "(its parallelism_config_* keys) or hpcmem's flags; one in the TRL YAML is not read"),
    "dataloader_drop_last": _RUN,
    "dataloader_persistent_workers": _no("keeps the dataloader workers (host RAM: dataloader_num_workers) alive"),
    "dataloader_prefetch_factor": _no("batches queued on the host by each worker"),
    "dataloader_multiprocessing_context": _RUN, "dataloader_in_order": _RUN,
    "remove_unused_columns": _DATA, "label_names": _DATA,
    "train_sampling_strategy": _no("the order of the examples (KTO requires sequential: its rules check it)"),
    "length_column_name": _DATA,
    "ddp_find_unused_parameters": _no("a DDP graph walk on the host"),
    "ddp_bucket_cap_mb": _no("DDP's buckets cover every gradient whatever their size (the gradient buckets term)"),
    "ddp_broadcast_buffers": _no("broadcasts the model's buffers in place"),
    "ddp_static_graph": _no("DDP bookkeeping on the host"), "ddp_backend": _RUN, "ddp_timeout": _RUN,
    "fsdp": _ref("the layout comes from the accelerate config (--accelerate_config fsdp2 or a file); an FSDP "
                 "setting in the TRL YAML is not read"),
    "fsdp_config": _ref("the layout comes from the accelerate config (--accelerate_config fsdp2 or a file)"),
    "deepspeed": _ref("the layout comes from the accelerate config (--accelerate_config zero3 or a file); a DeepSpeed "
                      "JSON named in the TRL YAML is not read"),
    "debug": _RUN, "skip_memory_metrics": _RUN, "do_train": _RUN, "do_eval": _RUN, "do_predict": _RUN,
    "resume_from_checkpoint": _no("loads the states the step holds anyway"), "local_rank": _RUN,
    # trl ModelConfig ------------------------------------------------------------------------------------------------
    "model_name_or_path": _mod("the model (hpcmem models)"), "model_revision": _RUN,
    "lora_task_type": _mod("peft's model class: a reward model needs SEQ_CLS, which also trains its [hidden, 1] score "
                           "head; other trainers CAUSAL_LM (hpcmem.job.lora_task_rules)"),
    "use_rslora": _no("rank-stabilised scaling, a number: the same adapters"),
    "bnb_4bit_quant_type": _no("nf4 or fp4: both pack two weights per byte with the same absmax blocks"),
    "bnb_4bit_quant_storage": _no("the dtype the packed 4-bit weights are stored in: the same bytes"),
    # trl trainer configs ---------------------------------------------------------------------------------------------
    "model_init_kwargs": _mod("its dtype is the load dtype"),
    "trust_remote_code": _no("allows custom modelling code; the estimate covers the transformers architectures"),
    "chat_template_path": _DATA, "dataset_text_field": _DATA, "dataset_kwargs": _DATA, "dataset_num_proc": _DATA,
    "eos_token": _DATA, "pad_token": _DATA, "shuffle_dataset": _DATA,
    "truncation_mode": _no("which end of a long row is cut: rows stay max_length long"),
    "eval_packing": _ref("an eval batch packed differently from training is not modelled (None follows packing)"),
    "completion_only_loss": _no("masks prompt tokens: fewer positions scored by the fused head; estimated as every "
                                "position scored (the worst case)"),
    "assistant_only_loss": _no("masks non-assistant tokens: fewer positions scored by the fused head; estimated as "
                               "every position scored (the worst case)"),
    "loss_type": _LOSS,
    "precompute_ref_batch_size": _no("the batch of the reference pass TRL runs before training (no optimizer states "
                                     "yet): not the step's peak"),
    "loss_weights": _LOSS, "ld_alpha": _LOSS, "f_divergence_type": _LOSS, "f_alpha_divergence_coef": _LOSS,
    "label_smoothing": _LOSS, "use_weighting": _LOSS, "discopop_tau": _LOSS,
    "sync_ref_model": _no("mixes the reference weights into the policy's in place every ref_model_sync_steps"),
    "ref_model_mixup_alpha": _HYPER, "ref_model_sync_steps": _RUN,
    "center_rewards_coefficient": _LOSS,
    "num_generations_eval": _no("how eval completions are grouped; the eval batch is per_device_eval_batch_size"),
    "temperature": _SAMPLING, "top_p": _SAMPLING, "top_k": _SAMPLING, "min_p": _SAMPLING,
    "repetition_penalty": _SAMPLING,
    "generation_kwargs": _ref("can change the generation's shape (num_beams, max_new_tokens), which is not modelled "
                              "— set the fields TRL names instead"),
    "chat_template_kwargs": _DATA,
    "cache_implementation": _no("the estimate's KV cache already holds every row at full length (what a static "
                                "cache allocates up front)"),
    "vllm_model_impl": _VLLM_SIDE, "vllm_structured_outputs_regex": _VLLM_SIDE, "vllm_server_base_url": _VLLM_SIDE,
    "vllm_server_host": _VLLM_SIDE, "vllm_server_port": _VLLM_SIDE, "vllm_server_timeout": _VLLM_SIDE,
    "vllm_group_port": _VLLM_SIDE, "vllm_max_model_length": _no("caps vLLM's context; its pool is "
                                                                "vllm_gpu_memory_utilization's share either way"),
    "epsilon": _LOSS, "delta": _LOSS, "epsilon_high": _LOSS, "sapo_temperature_neg": _LOSS,
    "sapo_temperature_pos": _LOSS, "vespo_k_pos": _LOSS, "vespo_lambda_pos": _LOSS, "vespo_k_neg": _LOSS,
    "vespo_lambda_neg": _LOSS, "importance_sampling_level": _LOSS, "reward_weights": _LOSS,
    "multi_objective_aggregation": _LOSS, "scale_rewards": _LOSS, "mask_truncated_completions": _LOSS,
    "top_entropy_quantile": _LOSS, "entropy_coef": _LOSS, "use_adaptive_entropy": _LOSS, "entropy_coef_min": _LOSS,
    "entropy_coef_max": _LOSS, "entropy_coef_delta": _LOSS, "entropy_target": _LOSS,
    "max_tool_calling_iterations": _no("tool-calling turns; each generation still stops at max_completion_length"),
    "vllm_importance_sampling_mode": _LOSS, "vllm_importance_sampling_clip_max": _LOSS,
    "vllm_importance_sampling_clip_min": _LOSS, "vllm_importance_sampling_cap": _LOSS,
    "off_policy_mask_threshold": _LOSS, "use_bias_correction_kl": _LOSS,
    "log_completions": _LOG, "log_multimodal": _LOG, "num_completions_to_print": _LOG, "log_unique_prompts": _LOG,
    "log_completions_hub_repo": _LOG,
    "use_transformers_continuous_batching": _ref("generation with transformers' continuous batching allocates its "
                                                 "paged KV cache, which is not modelled", False),
    "transformers_continuous_batching_config": _ref("configures transformers' continuous batching (not modelled)"),
    "use_transformers_paged": _ref("generation with transformers' paged attention allocates its paged KV cache, "
                                   "which is not modelled", False),
    "normalize_advantages": _LOSS, "reward_clip_range": _LOSS,
    "desirable_weight": _LOSS, "undesirable_weight": _LOSS,
    "teacher_model_revision": _RUN,
    # trl/scripts/utils.py ScriptArguments and DatasetMixtureConfig, beside every trainer's config in `trl <trainer>`
    "dataset_name": _DATA, "dataset_config": _DATA, "dataset_train_split": _DATA, "dataset_test_split": _DATA,
    "dataset_streaming": _DATA, "datasets": _DATA, "streaming": _DATA, "test_split_size": _DATA,
    "ignore_bias_buffers": _no("which boolean buffers DDP skips when it broadcasts (trl/scripts/dpo.py): no tensor "
                               "is allocated for it"),
    # trl/scripts/grpo.py and rloo.py: GRPOScriptArguments / RLOOScriptArguments
    "reward_funcs": _no("reward functions by name (trl.rewards), computed on the host from decoded completions"),
    "reward_model_name_or_path": _ref("a reward model the script loads beside the policy on every GPU "
                                      "(trl/scripts/grpo.py main): its weights and forward are not modelled"),
}

# A field whose meaning differs in one config class.
BY_CLASS: dict[tuple[str, str], Field] = {
    ("SFTConfig", "label_smoothing_factor"): _ref(
        "SFTTrainer then computes the full [B, S, V] logits for transformers' label smoother, and the fused head "
        "again without gradients for its metrics (sft_trainer.py compute_loss); not modelled", 0.0),
    ("KTOConfig", "loss_type"): _no("apo_zero_unpaired skips the KL rows' no-grad passes, which run before the "
                                     "forward or beside it without gradients: never the step's peak"),
}


@lru_cache(maxsize=1)
def declared() -> dict[str, tuple[str, ...]]:
    """config class → the fields it declares (TrainingArguments' own under "TrainingArguments"; each TRL config's
    beyond those), TRL 1.16 / transformers 5.24 (declared.json, pinned by tests/job/test_trl_fields.py)."""
    # read beside this module, as every packaged data file is (importlib.resources costs ~10 ms of imports: tempfile,
    # zipfile, shutil and the compressors, on the path of every cold estimate)
    text = Path(__file__).with_name("declared.json").read_text(encoding="utf-8")
    return {cls: tuple(names) for cls, names in json.loads(text).items()}


def classify(config_class: str, name: str) -> Field | None:
    """How hpcmem treats TRL field `name` of `config_class` (TrainSpec fields: modelled), or None if unclassified."""
    own = BY_CLASS.get((config_class, name))
    if own is not None:
        return own
    if name in field_names(TrainSpec):
        return _mod("a spec field of the same name (hpcmem.job.spec.TrainSpec)")
    return FIELDS.get(name)


def declaring_classes(name: str) -> tuple[str, ...]:
    return tuple(cls for cls, names in declared().items() if name in names)


# Fields an older TRL or transformers read under another name: a key spelled the old way is refused with the new one,
# never read as "no memory effect" (the job would run at the new field's default).
RENAMED = {
    "max_seq_length": ("max_length", "SFTConfig's max_seq_length is max_length in TRL 1.x"),
    "torch_dtype": ("dtype", "ModelConfig's torch_dtype is dtype in TRL 1.x (transformers 5 renamed it)"),
    "evaluation_strategy": ("eval_strategy", "TrainingArguments' evaluation_strategy is eval_strategy"),
    "per_gpu_train_batch_size": ("per_device_train_batch_size", "TrainingArguments has no per_gpu_* fields"),
    "per_gpu_eval_batch_size": ("per_device_eval_batch_size", "TrainingArguments has no per_gpu_* fields"),
}
SCRIPT_CLASSES = ("ScriptArguments", "DatasetMixtureConfig")


def unknown_field(config_class: str, name: str, known: set[str], script_class: str = "ScriptArguments") -> str:
    """Why `name` is refused: no class `trl <trainer>` parses declares it. `trl <trainer> --config` hands an unknown
    YAML key to `accelerate launch` as a flag (trl/cli/commands/training.py TrainingCommand.run), which stops on it;
    the script run directly drops it (parse_args_and_config(fail_with_unknown_args=False)) — either way the job would
    not be the one described."""
    classes = f"{config_class}, ModelConfig, TrainingArguments, {script_class} or DatasetMixtureConfig"
    if name in RENAMED and RENAMED[name][0] != name:
        new, why = RENAMED[name]
        return f"{name} is not a field of TRL 1.16 ({why}): write {new}"
    if name == "env":
        # TrlParser.parse_args_and_config (trl/scripts/utils.py) pops `env` and exports it in the training process
        return ("env (variables TrlParser exports in the training process) is not read by hpcmem: give them to "
                "`hpcmem submit --env NAME=VALUE`, and PYTORCH_CUDA_ALLOC_CONF as --expandable_segments")
    close = difflib.get_close_matches(name, sorted(known), n=1, cutoff=0.75)
    hint = f"; did you mean {close[0]}?" if close else ""
    return f"{name} is not a field of {classes} (TRL 1.16), nor one of hpcmem's{hint}"


def check_fields(config_class: str, settings: dict[str, Any], *, own: set[str] = frozenset(),
                 script_class: str = "ScriptArguments") -> list[str]:
    """The settings hpcmem reads nothing from (no memory effect), after refusing a refused field's non-default value,
    a field another trainer's classes declare but this one's do not (TrlParser would hand it to `accelerate
    launch`), and a name no class of `trl <trainer>` declares (`unknown_field`). `own`: hpcmem's own setting names,
    which pass. Raises SpecError listing every problem."""
    p = Problems()
    passed: list[str] = []
    table = declared()
    shared = {n for cls in ("TrainingArguments", "ModelConfig", *SCRIPT_CLASSES) for n in table[cls]}
    mine = shared | set(table[config_class]) | set(table.get(script_class, ()))
    for name, value in settings.items():
        owners = declaring_classes(name)
        if not owners:
            if name in own:
                passed.append(name)
            else:
                p.add(unknown_field(config_class, name, mine | set(own) | set(field_names(TrainSpec)), script_class))
            continue
        if name not in mine:
            p.add(f"{name} is a {'/'.join(owners)} field; {config_class} has no {name} field — remove it")
            continue
        field = classify(config_class, name)
        if field is None:
            passed.append(name)
        elif field.kind == REFUSED and value != field.default:
            p.add(f"{name}={value!r} is refused: {field.why}")
        elif field.kind == NO_EFFECT:
            passed.append(name)
    p.raise_if_any()
    return sorted(passed)
