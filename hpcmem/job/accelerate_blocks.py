"""The deepspeed_config / fsdp_config block of an accelerate config, read as `accelerate launch` reads it.

accelerate's launcher copies every key of the block onto the launch argument of that name (accelerate 1.x
commands/launch.py `_validate_launch_command`; in fsdp_config a key without the `fsdp_` prefix gets it), and the
arguments of the "DeepSpeed Arguments" / "FSDP Arguments" groups of `launch_command_parser` reach the processes.
A key of neither group lands on an argument nothing reads, silently: hpcmem asks instead (a misspelt zero_stage would
leave the estimate on the wrong stage). A key accelerate reads but hpcmem does not model is refused where it changes
one GPU's memory, so that nothing the user wrote is taken as having no effect.
"""

from __future__ import annotations

import difflib
from typing import Any

from hpcmem.errors import Problems
from hpcmem.inputs.values import shown
from hpcmem.job.accelerate_keys import block_keys

# block → (hpcmem setting read from it, accelerate launch argument group of its keys)
READ = {
    "deepspeed_config": ("zero_stage", "offload_optimizer_device", "offload_param_device", "zero3_init_flag",
                         "zero3_save_16bit_model"),
    "fsdp_config": ("fsdp_version", "fsdp_offload_params", "fsdp_reshard_after_forward", "fsdp_state_dict_type",
                    "fsdp_cpu_ram_efficient_loading"),
}
GROUP = {"deepspeed_config": "DeepSpeed Arguments", "fsdp_config": "FSDP Arguments"}
# Read by accelerate with no effect on one GPU's memory: the launcher's own plumbing (hostfile, node filters,
# multinode launcher) and values transformers resolves from TrainingArguments anyway ("auto").
NO_EFFECT = frozenset({
    "gradient_accumulation_steps", "gradient_clipping", "deepspeed_hostfile", "deepspeed_exclusion_filter",
    "deepspeed_inclusion_filter", "deepspeed_multinode_launcher",
})
# Read by accelerate, not modelled, returned as "<block>.<key>" so that the estimate lists them back as ignored:
# hpcmem.estimate.fsdp_units assumes no forward prefetch and BACKWARD_PRE (TRL's fsdp1.yaml sets forward prefetch
# on), one unit per decoder layer class, and counts no effect of the others.
LISTED = frozenset({
    "fsdp_sync_module_states", "fsdp_use_orig_params", "fsdp_transformer_layer_cls_to_wrap", "fsdp_min_num_params",
    "fsdp_backward_prefetch", "fsdp_forward_prefetch",
})
# Accepted only at the value hpcmem estimates (hpcmem.estimate.fsdp_units: decoder-layer units; activation
# checkpointing is TRL's gradient_checkpointing) — what hpcmem.launch.configs writes and TRL's shipped files hold.
ASSUMED: dict[str, tuple[Any, str]] = {
    "fsdp_auto_wrap_policy": ("TRANSFORMER_BASED_WRAP", "hpcmem estimates one FSDP unit per decoder layer"),
    "fsdp_activation_checkpointing": (False, "set TRL's gradient_checkpointing instead (one name per setting)"),
    "fsdp_activation_checkpointing_offload": (False, "hpcmem does not model checkpoint offload; use TRL's "
                                                     "activation_offloading"),
    "deepspeed_moe_layer_cls_names": (None, "hpcmem does not model DeepSpeed's MoE leaf partitioning"),
}
WHY = {
    "deepspeed_config_file": "hpcmem does not read DeepSpeed JSONs (the ZeRO stage and offload in it would be "
                             "estimated as accelerate's defaults); write zero_stage, offload_optimizer_device and "
                             "offload_param_device in deepspeed_config instead — hpcmem submit writes the JSON itself",
    "fsdp_sharding_strategy": "accelerate deprecates it for fsdp_reshard_after_forward; write fsdp_reshard_after_forward "
                              "(FULL_SHARD or SHARD_GRAD_OP under FSDP1, true or false under FSDP2)",
    "offload_optimizer_nvme_path": "NVMe offload is not modelled; offload to cpu or none",
    "offload_param_nvme_path": "NVMe offload is not modelled; offload to cpu or none",
}


def block_settings(block: str, section: dict[str, Any], source: str) -> dict[str, Any]:
    """The hpcmem settings of READ[block] found in `section` (fsdp keys under their prefixed name, as accelerate
    adds it), and LISTED keys as "<block>.<key>"; every other key is checked: unknown to accelerate, or read by it with a memory effect hpcmem does not
    model, is a problem naming the key, its value and the rule. Raises SpecError listing all of them."""
    p = Problems()
    known = block_keys(GROUP[block])
    out: dict[str, Any] = {}
    for raw_key, value in section.items():
        key = str(raw_key)
        if block == "fsdp_config" and not key.startswith("fsdp"):
            key = "fsdp_" + key
        name = raw_key if isinstance(raw_key, str) and raw_key.isprintable() else shown(raw_key)
        where = f"{source}: {block}.{name}"
        if key in READ[block]:
            out[key] = value
        elif key not in known:
            close = difflib.get_close_matches(key, known, n=1, cutoff=0.75)
            p.add(f"{where} is not an accelerate launch argument (accelerate would drop it without a word)"
                  + (f"; did you mean {close[0]}?" if close else ""))
        elif key in NO_EFFECT:
            continue
        elif key in LISTED:
            out[f"{block}.{key}"] = value
        elif key in ASSUMED:
            expected, why = ASSUMED[key]
            if value != expected and not (expected is None and value in ([], "", "none")):
                p.add(f"{where}={shown(value)} is not modelled: {why}")
        else:
            p.add(f"{where}={shown(value, 200)} is refused: {WHY.get(key, 'hpcmem does not model it')}")
    p.raise_if_any()
    return out
