"""Build the real TRL trainer for a JobSpec: its config class filled from the spec (same field names), TRL's own PEFT
config (`trl.get_peft_config(ModelConfig(...))`), the DeepSpeed / FSDP blocks the launcher would write
(`hpcmem.launch.configs`), a local tokenizer and dataset.

CPU runs of sharded jobs: DeepSpeed runs on its CPU accelerator over gloo as is. accelerate never enters FSDP on CPU
(state.py keeps MULTI_CPU and ignores the plugin), so `enable_fsdp_on_cpu` switches the accelerator state to FSDP with
the plugin the TrainingArguments already built — the same fully_shard path a GPU run takes, on gloo.
"""

from __future__ import annotations

import dataclasses
import os
import tempfile
from typing import Any

from hpcmem.errors import HpcmemError
from hpcmem.job.trainers import MODEL_CONFIG_FIELDS, REGISTRY, entry
from hpcmem.launch.configs import deepspeed_config, fsdp_config
from hpcmem.probe import fixtures
from hpcmem.probe.parallel_env import attach_parallelism_on_cpu, needs_cpu_fsdp_mesh, parallelism_env
from hpcmem.trace import vision
from hpcmem.trace.hf_config import attn_implementation_arg
from hpcmem.trace.pieces import peft_config as lora_config

# TrainSpec fields that are also TRL config fields of the same name (STYLE: one name per setting); ModelConfig's go
# through model_init_kwargs / peft_config instead.
SHARED_FIELDS = tuple(dict.fromkeys(name for e in REGISTRY.values() for name in e.fields
                                    if name not in MODEL_CONFIG_FIELDS))


class ProbeUnsupported(HpcmemError):
    """A job the probe cannot run here (the message says why and what to do)."""


def check_supported(job: Any, device: str) -> None:
    t = job.train
    problems = []
    if t.quantized and not (device == "cuda" and fixtures.has_weights(job.model.name)):
        problems.append("4/8-bit bases are quantized by bitsandbytes inside from_pretrained, on CUDA: the probe "
                        "builds random weights from a config — pass a local checkpoint folder (config.json + weights) "
                        "and --device cuda, or probe the unquantized LoRA job")
    if t.use_vllm:
        problems.append("use_vllm: the probe runs transformers generation; vLLM pools are not probed yet")
    if t.images_per_example and (t.trainer not in ("sft", "dpo", "grpo", "rloo") or job.parallel.world_size > 1):
        problems.append(f"images with {t.trainer} on {job.parallel.world_size} process(es): the probe runs SFT, DPO, "
                        "GRPO and RLOO with images, in one process")
    if device == "cpu" and job.parallel.fsdp and job.parallel.fsdp_version != 2:
        problems.append("FSDP1 on CPU is not supported by the probe (FSDP2 is)")
    if problems:
        raise ProbeUnsupported("; ".join(problems))


def trainer_config(job: Any, *, steps: int, device: str, output_dir: str) -> tuple[Any, list[str]]:
    """The TRL config object for the job, and the spec fields this TRL version's config does not have."""
    import trl

    t = job.train
    cls = getattr(trl, entry(t.trainer).config_class)
    names = {f.name for f in dataclasses.fields(cls)}
    kw: dict[str, Any] = {}
    dropped = []
    defaults = type(t)(trainer=t.trainer)
    for name in SHARED_FIELDS:
        value = getattr(t, name)
        if name in names:
            kw[name] = dict(value) if isinstance(value, dict) else value
        elif value != getattr(defaults, name):
            dropped.append(name)
    kw.update(
        # evaluation and checkpoints run once, after training, when the probe is asked (probe/job_phases.py)
        output_dir=output_dir, max_steps=steps, report_to="none", save_strategy="no", eval_strategy="no",
        disable_tqdm=True,
        logging_steps=10**6, dataloader_num_workers=0, learning_rate=1e-6, use_cpu=device == "cpu",
        model_init_kwargs=model_init_kwargs(t),
    )
    if entry(t.trainer).generates:
        # random weights emit EOS at random: force every completion to its full length (the estimate's worst case)
        kw["generation_kwargs"] = {"min_new_tokens": t.max_completion_length}
    kw["dataset_num_proc"] = None          # kept only where the config declares it (below)
    kw.update(_parallel_args(job))
    return cls(**{k: v for k, v in kw.items() if k in names or k in _TRAINING_ARGS}), dropped


def model_init_kwargs(t: Any) -> dict[str, Any]:
    """TRL's model_init_kwargs for the spec: the dtype, and attn_implementation only where the user set one (TRL's
    default is None: transformers then picks sdpa or, for Gemma-2, eager — hpcmem.trace.hf_config)."""
    attn = attn_implementation_arg(t)
    return {"dtype": t.dtype, **({"attn_implementation": attn} if attn else {})}


_TRAINING_ARGS = {"output_dir", "max_steps", "report_to", "save_strategy", "eval_strategy", "disable_tqdm",
                  "logging_steps",
                  "dataloader_num_workers", "learning_rate", "use_cpu", "deepspeed", "fsdp", "fsdp_config"}


def quantization_config(t: Any) -> Any:
    """The BitsAndBytesConfig TRL's own scripts hand the trainer for a 4/8-bit base (trl/scripts/sft.py main:
    `quantization_config=get_quantization_config(model_args)`), or None."""
    if not t.quantized:
        return None
    from trl import ModelConfig, get_quantization_config

    return get_quantization_config(ModelConfig(load_in_4bit=t.load_in_4bit, load_in_8bit=t.load_in_8bit,
                                               use_bnb_nested_quant=t.use_bnb_nested_quant, dtype=t.dtype))


def _parallel_args(job: Any) -> dict[str, Any]:
    par = job.parallel
    if par.deepspeed:
        return {"deepspeed": deepspeed_config(job)}
    if par.fsdp:
        block = {k.removeprefix("fsdp_"): v for k, v in fsdp_config(job).items()}
        block["cpu_ram_efficient_loading"] = False       # every rank builds its own random weights
        return {"fsdp": "full_shard", "fsdp_config": block}
    return {}


def peft_config(job: Any) -> Any:
    """TRL's own LoRA config from ModelConfig fields, as the trace builds it (hpcmem.trace.pieces)."""
    return lora_config(job)


def build_trainer(job: Any, *, steps: int, device: str, model_id: str, cfg: dict[str, Any]) -> tuple[Any, list[str]]:
    """The trainer, ready to `train()`; call inside `fixtures.random_weights(cfg, model_id)` unless real weights."""
    import trl

    check_supported(job, device)
    t = job.train
    out = tempfile.mkdtemp(prefix="hpcmem-probe-")
    args, dropped = trainer_config(job, steps=steps, device=device, output_dir=out)
    if device == "cpu" and job.parallel.deepspeed and job.parallel.world_size > 1:
        # accelerate stays MULTI_CPU on CPU and never starts deepspeed.comm; ZeRO-3's zero.Init (run inside
        # from_config) would then see a world of 1
        import deepspeed

        deepspeed.init_distributed(dist_backend="gloo")
    # a parallelism config reaches Accelerator through the environment, as from `accelerate launch`
    if not needs_cpu_fsdp_mesh(job, device):
        os.environ.update(parallelism_env(job))
    e = entry(t.trainer)
    cls = getattr(trl, e.trainer_class)
    kw: dict[str, Any] = {"model": model_id, "args": args,
                          "train_dataset": fixtures.dataset(job, steps),
                          "processing_class": fixtures.tokenizer(job.model.vocab_size),
                          "peft_config": peft_config(job)}
    if t.images_per_example:
        kw.update(train_dataset=fixtures.image_dataset(job, steps), processing_class=vision.processor(job))
    extra = e.hook("probe_kwargs")
    if extra is not None:
        kw.update(extra(job))
    if t.quantized:
        kw["quantization_config"] = quantization_config(t)
    trainer = cls(**kw)
    from transformers.trainer_callback import PrinterCallback

    trainer.remove_callback(PrinterCallback)        # no log lines from the probe's steps
    if device == "cpu" and job.parallel.fsdp:
        enable_fsdp_on_cpu(trainer)
    if needs_cpu_fsdp_mesh(job, device):
        attach_parallelism_on_cpu(trainer, job)
    return trainer, dropped


def enable_fsdp_on_cpu(trainer: Any) -> None:
    from accelerate.state import PartialState
    from accelerate.utils import DistributedType, FullyShardedDataParallelPlugin

    state = trainer.accelerator.state
    plugin = FullyShardedDataParallelPlugin(**dict(trainer.args.fsdp_plugin_args or {}))
    if trainer.accelerator.mixed_precision != "no":
        plugin.set_mixed_precision(trainer.accelerator.mixed_precision)
    if getattr(plugin.cpu_offload, "pin_memory", False):
        # a CPU-only torch cannot pin memory (no accelerator); the offloaded shards are the same bytes, unpinned
        from torch.distributed.fsdp import CPUOffloadPolicy

        plugin.cpu_offload = CPUOffloadPolicy(pin_memory=False)
    state.distributed_type = DistributedType.FSDP
    state.fsdp_plugin = plugin
    # accelerate writes the type into PartialState's shared state too (state.py, the end of
    # `AcceleratorState.__init__`): every later AcceleratorState() — AcceleratedOptimizer makes one — copies it back
    # from there. Without it the optimizer's preparation turns the run into MULTI_CPU again, and what follows
    # (Accelerator.no_sync → FSDP2's set_requires_gradient_sync under gradient accumulation, the FSDP gradient
    # clipping) takes the CPU branches, not the ones a GPU run takes.
    PartialState._shared_state["distributed_type"] = DistributedType.FSDP
    trainer.is_fsdp_enabled = True
