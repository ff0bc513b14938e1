"""Run under torchrun on 2 CPU ranks (gloo): which FSDP units hold all-gathered storage at each instant of a step.

Printed by rank 0 as one JSON line: {"instants": [[what, [unit names]], ...]}. Layouts (env FSDP_UNITS_LAYOUT):
fsdp1-lora (PEFT's policy: LoRA leaves their own units, as transformers' Trainer sets it for FSDP1), fsdp1-full,
fsdp2-lora (decoder layers with their adapters, as accelerate's FSDP2 wraps a PEFT model), fsdp2-full. Reentrant
activation checkpointing, bf16, the 4-layer tiny Llama. A unit counts when its all-gather output has storage (FSDP1
`_full_param_padded`; FSDP2 an all-gather result pending or the group unsharded) — allocated, not only in use.
"""

import functools
import json
import os

import torch
import torch.distributed as dist
from peft import LoraConfig, get_peft_model
from peft.utils.other import fsdp_auto_wrap_policy
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
    CheckpointImpl, apply_activation_checkpointing, checkpoint_wrapper)
from transformers import LlamaConfig, LlamaForCausalLM
from transformers.models.llama.modeling_llama import LlamaDecoderLayer

from hpcmem.probe.rank_exit import end_rank

TARGETS = ["q_proj", "k_proj", "v_proj", "gate_proj", "up_proj", "down_proj"]
WATCHED = ("q_proj", "up_proj", "down_proj")
BIG = 100_000          # bytes: decoder units and the root, not single LoRA leaves


def _short(name: str) -> str:
    for junk in ("_fsdp_wrapped_module.", "_checkpoint_wrapped_module.", "base_model.model."):
        name = name.replace(junk, "")
    return name.replace("model.layers.", "L") or "root"


def _fsdp1(model, lora: bool):
    from torch.distributed.fsdp import BackwardPrefetch, FullyShardedDataParallel, ShardingStrategy
    from torch.distributed.fsdp.wrap import transformer_auto_wrap_policy
    policy = fsdp_auto_wrap_policy(model) if lora else functools.partial(
        transformer_auto_wrap_policy, transformer_layer_cls={LlamaDecoderLayer})
    fsdp = FullyShardedDataParallel(model, sharding_strategy=ShardingStrategy.FULL_SHARD, auto_wrap_policy=policy,
                                    use_orig_params=False, limit_all_gathers=True, device_id=torch.device("cpu"),
                                    backward_prefetch=BackwardPrefetch.BACKWARD_PRE)
    apply_activation_checkpointing(fsdp, check_fn=lambda m: isinstance(m, LlamaDecoderLayer), checkpoint_wrapper_fn=
                                   functools.partial(checkpoint_wrapper, checkpoint_impl=CheckpointImpl.REENTRANT))
    units = [(n, m._handle) for n, m in fsdp.named_modules()
             if isinstance(m, FullyShardedDataParallel) and m._handle is not None]

    def gathered():
        out = []
        for n, h in units:
            full = getattr(h.flat_param, "_full_param_padded", None)
            if full is not None and full.untyped_storage().size() > 0 and h.flat_param.numel() * 2 > BIG:
                out.append(_short(n))
        return out
    return fsdp, gathered


def _fsdp2(model):
    from torch.distributed.fsdp import fully_shard
    units = {}
    for n, m in reversed(list(model.named_modules())):
        if isinstance(m, LlamaDecoderLayer):
            fully_shard(m)
            units[n] = m
    fully_shard(model)
    units[""] = model
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": True})

    def gathered():
        out = []
        for n, m in units.items():
            pg = m._get_fsdp_state()._fsdp_param_group
            held = pg.is_unsharded or getattr(pg, "_all_gather_result", None) is not None
            if held and sum(p.sharded_size.numel() for p in pg.fsdp_params) * 2 > BIG:
                out.append(_short(n))
        return out
    return model, gathered


def main() -> None:
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    layout = os.environ["FSDP_UNITS_LAYOUT"]
    lora = layout.endswith("lora")
    cfg = LlamaConfig(vocab_size=1024, hidden_size=256, intermediate_size=512, num_hidden_layers=4,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=64, tie_word_embeddings=False,
                      max_position_embeddings=512)
    model = LlamaForCausalLM(cfg).to(torch.bfloat16)
    if lora:
        model = get_peft_model(model, LoraConfig(r=8, target_modules=TARGETS))
    model.enable_input_require_grads()
    run, gathered = _fsdp1(model, lora) if layout.startswith("fsdp1") else _fsdp2(model)
    log = []
    for n, m in run.named_modules():
        short = _short(n)
        leaf = n.endswith("base_layer") if lora else n.endswith("_proj")
        if leaf and any(w in n for w in WATCHED):
            name = short.replace(".base_layer", "")
            m.register_forward_pre_hook(lambda *_, x=name: log.append(("forward " + x, gathered())))
            m.register_full_backward_pre_hook(lambda *_, x=name: log.append(("backward " + x, gathered())))
        if n.endswith("lm_head"):
            m.register_full_backward_pre_hook(lambda *_: log.append(("backward lm_head", gathered())))
    x = torch.randint(0, 1024, (1, 64))
    for _ in range(2):             # the second step: execution order recorded, prefetching on
        log.clear()
        run(input_ids=x, labels=x).loss.backward()
    if dist.get_rank() == 0:
        print(json.dumps({"instants": log}))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
    end_rank(0)     # FSDP2's device mesh keeps the gloo group past destroy_process_group (see rank_exit)
