"""The specs: frozen, keyword-only dataclasses that every layer reads.

One name per setting: a field here carries the TRL / transformers / accelerate config field name it stands for
(`max_length`, `packing_strategy`, `zero_stage`, ...). The CLI flag, the preset key and the template variable use the
same name. Field defaults are TRL 1.16's defaults (trl/trainer/*_config.py, model_config.py); hpcmem-only fields are
marked as such. Basic ranges are checked here; TRL's cross-field verdicts live in `hpcmem.job.rules`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, fields
from typing import Any

from hpcmem.errors import Problems
from hpcmem.job.images import image_problems
from hpcmem.job.mesh import Layout, layout_of, layout_problems
from hpcmem.job.trainers import names as trainer_names

TRAINERS: tuple[str, ...] = trainer_names()      # hpcmem.job.trainers: one entry per TRL trainer
DTYPES: dict[str, int] = {"float32": 4, "bfloat16": 2, "float16": 2}
PACKING_STRATEGIES = ("bfd", "bfd_split", "wrapped")
OPTIMIZERS = (
    "adamw_torch_fused", "adamw_torch", "adamw_torch_foreach", "adamw_8bit", "adamw_bnb_8bit", "paged_adamw_8bit",
    "paged_adamw_32bit", "adafactor", "sgd",
)
DISTRIBUTED_TYPES = ("NO", "MULTI_GPU", "DEEPSPEED", "FSDP")
# DeepSpeed's "nvme" is refused: it needs nvme_path (deepspeed runtime/zero/offload_config.py), which hpcmem neither
# takes nor writes into the config, and its host swap buffers are not in the host estimate
OFFLOAD_DEVICES = ("none", "cpu")
VLLM_MODES = ("colocate", "server")
# transformers 5.24 modeling_utils.py: `get_correct_attn_implementation` accepts "eager" and AttentionInterface's keys;
# `_check_and_adjust_attn_implementation` also takes a hub kernel, integrations/hub_kernels.py `is_kernel`'s pattern
ATTN_IMPLEMENTATIONS = ("eager", "sdpa", "flash_attention_2", "flash_attention_3", "flash_attention_4",
                        "flex_attention", "paged|eager")
HUB_KERNEL = re.compile(r"[^/:]+/[^/:]+(?:@[^/:]+)?(?::[^/:]+)?")
EVAL_STRATEGIES = ("no", "steps", "epoch")                     # transformers IntervalStrategy
SAVE_STRATEGIES = ("no", "steps", "epoch", "best")             # transformers SaveStrategy
FSDP_STATE_DICT_TYPES = ("FULL_STATE_DICT", "SHARDED_STATE_DICT")   # FSDP2 has no LOCAL_STATE_DICT (accelerate)
ZERO_BUCKET_SIZES = ("auto", "deepspeed")   # hpcmem's DeepSpeed JSON ("auto" keys) | DeepSpeed's defaults (no JSON)


@dataclass(frozen=True, kw_only=True)
class TrainSpec:
    """The trainer and its TRL 1.16 config fields (SFTConfig/DPOConfig/RewardConfig/GRPOConfig/RLOOConfig + ModelConfig)."""

    trainer: str                                 # a name in hpcmem.job.trainers (`trl <trainer>`)
    # ModelConfig / model_init_kwargs
    dtype: str = "float32"                       # TRL loads in float32 unless model_init_kwargs/ModelConfig dtype is set
    attn_implementation: str = "sdpa"            # transformers' default when unset
    use_peft: bool = False
    lora_r: int = 16
    lora_alpha: int = 32
    lora_target_modules: tuple[str, ...] = ()    # empty: peft's per-architecture default (q_proj, v_proj for Llama)
    lora_dropout: float = 0.05                   # 0: peft puts nn.Identity where the dropout was (no mask, no copy)
    use_dora: bool = False                       # DoRA: a magnitude vector per adapted linear (peft/tuners/lora/dora.py)
    lora_modules_to_save: tuple[str, ...] = ()   # whole modules trained beside the adapters (peft ModulesToSaveWrapper)
    lora_target_parameters: tuple[str, ...] = ()     # LoRA on nn.Parameters by name (peft ParamWrapper: MoE experts)
    lora_task_type: str = "CAUSAL_LM"            # peft's PeftModel class; a reward model needs SEQ_CLS (lora_task_rules)
    load_in_4bit: bool = False
    load_in_8bit: bool = False
    use_bnb_nested_quant: bool = False
    # TrainingArguments as TRL's _BaseConfig overrides them
    per_device_train_batch_size: int = 8
    gradient_accumulation_steps: int = 1
    gradient_checkpointing: bool = True
    gradient_checkpointing_kwargs: dict[str, Any] = field(default_factory=dict)
    # TrainingArguments.accelerator_config (hpcmem.job.accelerator_config): its gradient_accumulation_kwargs
    # sync_each_batch is what changes memory
    accelerator_config: dict[str, Any] = field(default_factory=dict)
    bf16: bool = True                            # None in TRL → True unless fp16
    fp16: bool = False
    optim: str = "adamw_torch_fused"
    max_grad_norm: float = 1.0                   # gradient clipping; 0 (or None in TRL): none
    torch_compile: bool = False                  # torch.compile(inductor) of the model: estimated as eager, labelled
    torch_empty_cache_steps: int | None = None   # empty_cache every k steps: bounds hpcmem.estimate.shapes
    # TrainingArguments of the job around the steps (transformers 5.24 training_args.py defaults): evaluation,
    # checkpoints, data loading
    per_device_eval_batch_size: int = 8
    eval_strategy: str = "no"
    save_strategy: str = "steps"
    save_only_model: bool = False                # True: checkpoints skip the optimizer and scheduler states
    dataloader_num_workers: int = 0
    dataloader_pin_memory: bool = True
    # SFT / DPO / Reward data shape
    max_length: int | None = 1024
    packing: bool = False
    packing_strategy: str = "bfd"
    padding_free: bool = False
    pad_to_multiple_of: int | None = None
    activation_offloading: bool = False
    # DPO / Reward / GRPO / RLOO: sets every nn.Dropout to p=0 (trl/trainer/utils.py disable_dropout_in_model);
    # TRL's default is True for DPO and Reward (their registry entries' defaults), False for GRPO and RLOO
    disable_dropout: bool = False
    # DPO
    precompute_ref_log_probs: bool = False
    # GRPO / RLOO
    num_generations: int = 8                     # RLOO's default is 2 (its registry entry's default)
    steps_per_generation: int | None = None      # None → gradient_accumulation_steps
    generation_batch_size: int | None = None
    max_completion_length: int = 512
    num_iterations: int = 1                      # μ: optimisation passes over each generated batch
    beta: float = 0.0                            # GRPO 0.0 (no reference); RLOO 0.05; DPO 0.1 (unused for memory)
    use_vllm: bool = False
    vllm_mode: str = "colocate"
    vllm_gpu_memory_utilization: float = 0.3
    vllm_tensor_parallel_size: int = 1
    vllm_enable_sleep_mode: bool = False
    vllm_importance_sampling_correction: bool = True   # GRPO only
    ds3_gather_for_generation: bool = True
    cast_lm_head_to_fp32: bool = False
    # SFT: the MoE load-balancing loss's weight; None takes the model config's (sft_trainer.py SFTTrainer.__init__).
    # No memory effect (each MoE layer keeps its router logits for backward anyway); some types train only at 0.0
    # (hpcmem/models/coverage.json "requires")
    router_aux_loss_coef: float | None = None
    # Distillation: the teacher (DistillationConfig), loaded with teacher_model_init_kwargs (TRL's script passes
    # ModelConfig's dtype there unless the user's kwargs say otherwise)
    teacher_model_name_or_path: str | None = None
    teacher_model_init_kwargs: dict[str, Any] | None = None
    # hpcmem-only: the longest prompt of a GRPO/RLOO batch (TRL has no max_prompt_length any more)
    max_prompt_length: int = 512
    # Images of a vision-language SFT job (hpcmem.job.images). hpcmem-only: images_per_example (the length of each
    # row's "images" list in the dataset; 0: a text-only job), image_height × image_width (pixels of every image before
    # the processor resizes it). min_pixels / max_pixels: the Qwen2-VL image processor's resolution bounds, the names
    # transformers 5.24 image_processing_qwen2_vl.py `Qwen2VLImageProcessor.__init__` takes (size.shortest_edge /
    # size.longest_edge); None: the processor class's defaults
    images_per_example: int = 0
    image_height: int = 0
    image_width: int = 0
    min_pixels: int | None = None
    max_pixels: int | None = None
    # hpcmem-only, from an image-text length profile (`hpcmem lengths --processor`, then `--lengths`): the worst
    # micro-batch's images, vision patches and image tokens at this per_device_train_batch_size
    # (hpcmem.data.profile.vision_per_micro_batch), in place of images_per_example × one image's geometry; 0: none
    profile_images: int = 0
    profile_patches: int = 0
    profile_image_tokens: int = 0

    def __post_init__(self) -> None:
        p = Problems()
        p.check(self.trainer in TRAINERS, f"trainer must be one of {', '.join(TRAINERS)}; got {self.trainer!r}")
        p.check(self.dtype in DTYPES or self.dtype == "auto",
                f"dtype must be one of {', '.join(DTYPES)} or auto; got {self.dtype!r}")
        p.check(self.attn_implementation in ATTN_IMPLEMENTATIONS or HUB_KERNEL.fullmatch(self.attn_implementation),
                f"attn_implementation must be one of {', '.join(ATTN_IMPLEMENTATIONS)} or a hub kernel org/repo[:name] "
                f"(transformers raises on anything else); got {self.attn_implementation!r}")
        p.check(self.packing_strategy in PACKING_STRATEGIES,
                f"packing_strategy must be one of {', '.join(PACKING_STRATEGIES)}; got {self.packing_strategy!r}")
        p.check(self.optim in OPTIMIZERS, f"optim {self.optim!r} is not modelled; choose one of {', '.join(OPTIMIZERS)}")
        p.check(self.vllm_mode in VLLM_MODES, f"vllm_mode must be colocate or server; got {self.vllm_mode!r}")
        p.check(self.eval_strategy in EVAL_STRATEGIES,
                f"eval_strategy must be one of {', '.join(EVAL_STRATEGIES)}; got {self.eval_strategy!r}")
        p.check(self.save_strategy in SAVE_STRATEGIES,
                f"save_strategy must be one of {', '.join(SAVE_STRATEGIES)}; got {self.save_strategy!r}")
        p.check(self.dataloader_num_workers >= 0,
                f"dataloader_num_workers must be ≥ 0; got {self.dataloader_num_workers}")
        for name in ("per_device_train_batch_size", "per_device_eval_batch_size", "gradient_accumulation_steps", "lora_r", "num_generations",
                     "vllm_tensor_parallel_size", "max_completion_length", "max_prompt_length", "num_iterations"):
            p.check(getattr(self, name) >= 1, f"{name} must be ≥ 1; got {getattr(self, name)}")
        for name in ("max_length", "pad_to_multiple_of", "steps_per_generation", "generation_batch_size",
                     "torch_empty_cache_steps"):
            value = getattr(self, name)
            p.check(value is None or value >= 1, f"{name} must be ≥ 1 or None; got {value}")
        for problem in image_problems(self):
            p.add(problem)
        p.check(0.0 <= self.lora_dropout < 1.0, f"lora_dropout must be in [0, 1); got {self.lora_dropout}")
        p.check(self.max_grad_norm >= 0.0, f"max_grad_norm must be ≥ 0 (0: no clipping); got {self.max_grad_norm}")
        p.check(0.0 < self.vllm_gpu_memory_utilization <= 1.0,
                f"vllm_gpu_memory_utilization must be in (0, 1]; got {self.vllm_gpu_memory_utilization}")
        p.check(not (self.load_in_4bit and self.load_in_8bit), "load_in_4bit and load_in_8bit exclude each other")
        p.check(not (self.bf16 and self.fp16), "bf16 and fp16 exclude each other; set one of them")
        p.raise_if_any()

    @property
    def sync_each_batch(self) -> bool:
        """Gradients reduced on every micro-batch of an accumulation window (accelerate's GradientAccumulationPlugin,
        which the Trainer builds from accelerator_config's gradient_accumulation_kwargs)."""
        return bool(((self.accelerator_config or {}).get("gradient_accumulation_kwargs") or {}).get("sync_each_batch"))

    @property
    def selective_checkpointing(self) -> bool:
        """TRL's `gradient_checkpointing_kwargs={"selective": True}` (trl/models/selective_activation_checkpointing.py)."""
        return bool(self.gradient_checkpointing_kwargs.get("selective"))

    @property
    def has_images(self) -> bool:
        """Whether the job's rows carry images: by count and size (`images_per_example`) or from an image-text
        length profile (`profile_images`)."""
        return bool(self.images_per_example or self.profile_images)

    @property
    def teacher_dtype(self) -> str:
        """The teacher's load dtype: teacher_model_init_kwargs' dtype, else the student's (trl/scripts/distillation.py
        hands ModelConfig.dtype to both)."""
        dtype = (self.teacher_model_init_kwargs or {}).get("dtype") or self.dtype
        return str(dtype).removeprefix("torch.")

    @property
    def quantized(self) -> bool:
        return self.load_in_4bit or self.load_in_8bit

@dataclass(frozen=True, kw_only=True)
class ParallelSpec:
    """How the job is spread, in accelerate's own names (accelerate config YAML keys)."""

    num_processes: int = 1                      # total across machines, as accelerate counts it
    num_machines: int = 1
    distributed_type: str = "NO"
    zero_stage: int = 0
    offload_optimizer_device: str = "none"
    offload_param_device: str = "none"
    fsdp_version: int = 2
    fsdp_offload_params: bool = False
    fsdp_reshard_after_forward: bool = True
    # Loading and saving. Defaults: TRL's shipped zero3.yaml (zero3_init_flag, zero3_save_16bit_model — DeepSpeed's
    # stage3_gather_16bit_weights_on_model_save) and fsdp2.yaml (cpu_ram_efficient_loading); the state dict type is
    # accelerate's FSDP2 default (utils/dataclasses.py `set_state_dict_type`), which TRL's fsdp2.yaml sets to FULL.
    zero3_init_flag: bool = True
    zero3_save_16bit_model: bool = True
    fsdp_state_dict_type: str = "SHARDED_STATE_DICT"
    fsdp_cpu_ram_efficient_loading: bool = True
    # Where ZeRO's bucket sizes come from (hpcmem.estimate.zero_buckets): "auto", hpcmem's DeepSpeed JSON, whose
    # bucket keys transformers fills from the model's hidden size; "deepspeed", no DeepSpeed JSON (TRL's shipped
    # zero*.yaml run as they are: accelerate writes only the stage and offload), so DeepSpeed's own defaults apply.
    zero_bucket_sizes: str = "auto"
    # accelerate's ParallelismConfig (accelerate/parallelism_config.py; `parallelism_config_<name>` in an accelerate
    # YAML): 1 = dimension off. What each does per rank and accelerate's rules for them: hpcmem.job.mesh.
    dp_replicate_size: int = 1
    dp_shard_size: int = 1
    tp_size: int = 1
    cp_size: int = 1
    sp_size: int = 1
    cp_comm_strategy: str = "allgather"          # torch context parallelism's k/v rotation (accelerate's default)
    sp_attn_implementation: str = "sdpa"         # the kernel Ulysses wraps; must be the model's (accelerate's default)

    def __post_init__(self) -> None:
        p = Problems()
        p.check(self.fsdp_state_dict_type in FSDP_STATE_DICT_TYPES,
                f"fsdp_state_dict_type must be one of {', '.join(FSDP_STATE_DICT_TYPES)}; "
                f"got {self.fsdp_state_dict_type!r}")
        p.check(self.num_processes >= 1 and self.num_machines >= 1,
                f"num_processes ({self.num_processes}) and num_machines ({self.num_machines}) must be ≥ 1")
        p.check(self.num_processes % max(self.num_machines, 1) == 0,
                f"num_processes {self.num_processes} must be a multiple of num_machines {self.num_machines} "
                "(same GPUs on every node)")
        p.check(self.distributed_type in DISTRIBUTED_TYPES,
                f"distributed_type must be one of {', '.join(DISTRIBUTED_TYPES)}; got {self.distributed_type!r}")
        p.check(self.zero_stage in (0, 1, 2, 3), f"zero_stage must be 0–3; got {self.zero_stage}")
        p.check(self.zero_bucket_sizes in ZERO_BUCKET_SIZES,
                f"zero_bucket_sizes must be one of {', '.join(ZERO_BUCKET_SIZES)}; got {self.zero_bucket_sizes!r}")
        p.check(self.fsdp_version in (1, 2), f"fsdp_version must be 1 or 2; got {self.fsdp_version}")
        for name in ("offload_optimizer_device", "offload_param_device"):
            p.check(getattr(self, name) in OFFLOAD_DEVICES,
                    f"{name} must be one of {', '.join(OFFLOAD_DEVICES)}; got {getattr(self, name)!r}"
                    + (" (NVMe offload needs DeepSpeed's nvme_path, which hpcmem does not write, and host swap buffers "
                       "it does not estimate)" if getattr(self, name) == "nvme" else ""))
        if self.distributed_type == "DEEPSPEED":
            p.check(self.zero_stage >= 1 or self.offload_optimizer_device == "none",
                    "offload_optimizer_device needs ZeRO stage ≥ 1")
            p.check(self.zero_stage == 3 or self.offload_param_device == "none",
                    f"offload_param_device needs ZeRO-3 (zero_stage is {self.zero_stage})")
        else:
            # accelerate reads the DeepSpeed plugin's fields only when distributed_type is DEEPSPEED and FSDP's only
            # under FSDP (accelerate 1.15 commands/launch.py `launch_command` picks the launcher by it): elsewhere
            # they would be dropped without a word, and the job would not be the one asked for
            for name, off in (("zero_stage", 0), ("offload_optimizer_device", "none"),
                              ("offload_param_device", "none"), ("zero_bucket_sizes", "auto")):
                p.check(getattr(self, name) == off,
                        f"{name} {getattr(self, name)!r} needs distributed_type DEEPSPEED (--accelerate_config "
                        f"zero1|zero2|zero3); got {self.distributed_type}, where accelerate ignores it")
        if self.distributed_type != "FSDP":
            p.check(not self.fsdp_offload_params,
                    f"fsdp_offload_params True needs distributed_type FSDP (--accelerate_config fsdp1|fsdp2); got "
                    f"{self.distributed_type}, where accelerate ignores it")
        for problem in layout_problems(self):
            p.add(problem)
        p.raise_if_any()

    @property
    def world_size(self) -> int:
        """Processes accelerate starts: distributed_type NO is one process whatever num_processes says
        (accelerate commands/launch.py `launch_command` → `simple_launcher`; TRL's single_gpu.yaml says 8)."""
        return 1 if self.distributed_type == "NO" else self.num_processes

    @property
    def gpus_per_machine(self) -> int:
        return self.world_size // self.num_machines or 1

    @property
    def layout(self) -> Layout:
        """The device mesh per rank (hpcmem.job.mesh.Layout)."""
        return layout_of(self)

    @property
    def deepspeed(self) -> bool:
        return self.distributed_type == "DEEPSPEED"

    @property
    def fsdp(self) -> bool:
        return self.distributed_type == "FSDP"

    @property
    def flat_partitions(self) -> bool:
        """The optimizer states (and, under FSDP and ZeRO-3, the weights) live as flat partitions, not one tensor per
        parameter: ZeRO stage ≥ 1 or FSDP."""
        return self.fsdp or (self.deepspeed and self.zero_stage >= 1)


def load_dtype(dtype: str, checkpoint: str | None) -> str:
    """What from_pretrained loads in for a `dtype` setting: the setting itself, or for `auto` the `checkpoint`'s
    dtype (ModelSpec.dtype), the one its config.json names (transformers 5.24 modeling_utils.py `_get_dtype`:
    `config.dtype` when set, which configuration_utils.py `PreTrainedConfig.__post_init__` fills from `dtype`, else
    `torch_dtype`). Without one,
    transformers reads the checkpoint's weights: hpcmem.models.resolve reads a local folder's safetensors header into
    `model.dtype` (hpcmem.models.checkpoint); elsewhere bfloat16 is assumed, and `hpcmem.job.rules.job_warnings` says
    so."""
    if dtype != "auto":
        return dtype
    return checkpoint or "bfloat16"


def field_names(cls: type) -> tuple[str, ...]:
    return tuple(f.name for f in fields(cls))
