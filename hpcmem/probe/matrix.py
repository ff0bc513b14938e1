"""The GPU kit: a representative probe matrix that fits one short GPU lease (≤ 8 minutes on one H100/H200).

    python -m hpcmem.probe.matrix --device cuda --out $OUT/probes.jsonl      # on the GPU node
    python -m hpcmem.probe.matrix --device cpu --tiny --only sft-qwen05-full  # the same cases, shrunk, on a CPU

Cases run in priority order, one `hpcmem probe` subprocess each (a fresh CUDA context per case, so the device peak
and the allocator start clean); a case is skipped when the time left is below its expected cost. Every case appends
its record to `--out`; an OOM is a record too. `--tiny` keeps each case's architecture (model_type, layout) but
shrinks it to a few MB and its lengths to 64 tokens, which is how tests run the kit without a GPU.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hpcmem.job.trainers import entry
from hpcmem.probe.fixtures import hf_config
from hpcmem.record import records_path

BF16 = {"dtype": "bfloat16"}


@dataclass(frozen=True)
class Case:
    name: str
    trainer: str
    model: str
    flags: dict[str, Any] = field(default_factory=dict)
    cost_s: float = 25.0                       # expected wall time on one H100/H200, start-up included
    capacity_gib: float | None = None          # simulate a smaller GPU (an OOM data point)
    env: dict[str, str] = field(default_factory=dict)
    new: bool = False                          # a cell no GPU record has measured yet: the kit runs these early
    requires: tuple[str, ...] = ()             # importable modules it needs (skipped, and said so, without them)
    solo: bool = False                         # never shares the GPU (DeepSpeed workers, simulated capacities)
    sized: bool = False                        # flags sized for this GPU at run time: --tiny keeps them
    capacity_bytes: int | None = None          # an exact simulated capacity (boundary runs in --tiny dry runs)


Q05, L1, L8, M7, Q7 = ("Qwen/Qwen2.5-0.5B", "meta-llama/Llama-3.2-1B", "meta-llama/Llama-3.1-8B",
                       "mistralai/Mistral-7B-v0.3", "Qwen/Qwen2.5-7B")
QVL7 = "Qwen/Qwen2.5-VL-7B-Instruct"
SFT = {"max_length": 2048, "per_device_train_batch_size": 4}
CASES: tuple[Case, ...] = (
    Case("sft-qwen05-full", "sft", Q05, {**SFT, **BF16}),
    # tied embeddings with short rows: the estimate's peak is the last backward instant, one [V, H] above the
    # gradients (two until the trace stopped its observer effect; estimator/LOG.md) — this case checks it there
    Case("sft-qwen05-tied-short", "sft", Q05, {"max_length": 512, "per_device_train_batch_size": 2, **BF16}),
    Case("reward-qwen05-full", "reward", Q05, {"max_length": 1024, "per_device_train_batch_size": 4, **BF16}),
    Case("rloo-qwen05-lora", "rloo", Q05, {"per_device_train_batch_size": 8, "num_generations": 4,
                                           "max_prompt_length": 128, "max_completion_length": 128, **BF16,
                                           "use_peft": True}, 40.0),
    Case("sft-qwen05-full-fp32load", "sft", Q05, dict(SFT)),
    Case("sft-qwen05-full-nogc", "sft", Q05, {**SFT, **BF16, "gradient_checkpointing": False}),
    Case("sft-qwen05-lora", "sft", Q05, {**SFT, **BF16, "use_peft": True}),
    Case("sft-qwen05-pack-bfd", "sft", Q05, {**SFT, **BF16, "packing": True}),
    Case("sft-llama1b-sac", "sft", L1, {**SFT, **BF16, "gradient_checkpointing_kwargs": {"selective": True}}),
    Case("sft-llama1b-expandable", "sft", L1, {**SFT, **BF16},
         env={"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True", "PYTORCH_ALLOC_CONF": "expandable_segments:True"}),
    Case("dpo-qwen05-full", "dpo", Q05, {"max_length": 1024, "per_device_train_batch_size": 4, **BF16}),
    Case("dpo-qwen05-lora", "dpo", Q05, {"max_length": 1024, "per_device_train_batch_size": 4, **BF16,
                                         "use_peft": True}),
    Case("grpo-qwen05-full", "grpo", Q05, {"per_device_train_batch_size": 8, "num_generations": 4,
                                           "max_prompt_length": 128, "max_completion_length": 256, **BF16}, 40.0),
    Case("sft-llama8b-lora", "sft", L8, {"max_length": 2048, "per_device_train_batch_size": 2, **BF16,
                                         "use_peft": True}, 45.0),
    Case("sft-llama8b-full", "sft", L8, {"max_length": 1024, "per_device_train_batch_size": 1, **BF16}, 60.0),
    Case("sft-mistral7b-lora-pack", "sft", M7, {"max_length": 2048, "per_device_train_batch_size": 2, **BF16,
                                                "use_peft": True, "packing": True}, 45.0),
    Case("sft-qwen7b-lora", "sft", Q7, {"max_length": 4096, "per_device_train_batch_size": 1, **BF16,
                                        "use_peft": True}, 45.0),
    Case("sft-gemma3-1b-lora", "sft", "google/gemma-3-1b-pt", {**SFT, **BF16, "use_peft": True}),
    Case("sft-phi3-mini-lora", "sft", "microsoft/Phi-3-mini-4k-instruct", {**SFT, **BF16, "use_peft": True,
                                                                            "lora_target_modules": "all-linear"}, 35.0),
    Case("grpo-qwen05-lora", "grpo", Q05, {"per_device_train_batch_size": 8, "num_generations": 4,
                                           "max_prompt_length": 128, "max_completion_length": 256, **BF16,
                                           "use_peft": True}, 40.0),
    Case("sft-llama8b-full-oom", "sft", L8, {"max_length": 2048, "per_device_train_batch_size": 2}, 45.0,
         capacity_gib=40.0),
    Case("sft-qwen3moe-lora", "sft", "Qwen/Qwen3-30B-A3B", {"max_length": 1024, "per_device_train_batch_size": 1,
                                                             **BF16, "use_peft": True,
                                                             "lora_target_modules": "q_proj,k_proj,v_proj,o_proj"},
         90.0),
    # cells no GPU has measured yet (the kit runs them right after the boundary sweep)
    # images: no GPU has measured a vision-language job. Qwen2.5-VL-7B, one 1024×768 image a row (smart_resize to
    # 1036×756: 3,996 patches, 999 image tokens), LoRA all-linear with GC (peft has no default targets for it), and
    # full fine-tuning with two 896×672 images a row (768 image tokens each) without GC
    Case("sft-qwen25vl7b-lora-img", "sft", QVL7, {"max_length": 2048, "per_device_train_batch_size": 2, **BF16,
                                                  "use_peft": True, "lora_target_modules": "all-linear",
                                                  "images_per_example": 1,
                                                  "image_height": 768, "image_width": 1024}, 60.0, new=True),
    Case("sft-qwen25vl7b-full-img-nogc", "sft", QVL7, {"max_length": 2048, "per_device_train_batch_size": 1, **BF16,
                                                       "gradient_checkpointing": False, "images_per_example": 2,
                                                       "image_height": 672, "image_width": 896}, 70.0, new=True),
    # DPO with images: one image a prompt, repeated for chosen and rejected (DataCollatorForVisionPreference)
    Case("dpo-qwen25vl7b-lora-img", "dpo", QVL7, {"max_length": 2048, "per_device_train_batch_size": 1, **BF16,
                                                  "use_peft": True, "lora_target_modules": "all-linear",
                                                  "images_per_example": 1, "image_height": 768,
                                                  "image_width": 1024}, 70.0, new=True),
    # GRPO with images: one 448×448 image a prompt (256 image tokens), generation by transformers on the GPU
    Case("grpo-qwen25vl7b-lora-img", "grpo", QVL7, {"per_device_train_batch_size": 4, "num_generations": 4,
                                                    "max_prompt_length": 512, "max_completion_length": 256, **BF16,
                                                    "use_peft": True, "lora_target_modules": "all-linear",
                                                    "images_per_example": 1, "image_height": 448,
                                                    "image_width": 448}, 90.0, new=True),
    # images on three more types no GPU has measured (each estimate traced within 3 % on CPU): Gemma 3's SigLIP at its
    # one resolution (896 px, 256 image tokens an image), Qwen3-VL's deepstack tower at 1024×768, Mllama's tiles and
    # cross-attention layers (a 448×448 image is one 560-px tile, padded to max_num_tiles)
    Case("sft-gemma3-4b-lora-img", "sft", "google/gemma-3-4b-it", {"max_length": 1024, "per_device_train_batch_size": 2,
                                                                   **BF16, "use_peft": True,
                                                                   "lora_target_modules": "all-linear",
                                                                   "images_per_example": 1, "image_height": 896,
                                                                   "image_width": 896}, 45.0, new=True),
    Case("sft-qwen3vl8b-lora-img", "sft", "Qwen/Qwen3-VL-8B-Instruct", {"max_length": 2048,
                                                                        "per_device_train_batch_size": 2, **BF16,
                                                                        "use_peft": True,
                                                                        "lora_target_modules": "all-linear",
                                                                        "images_per_example": 1, "image_height": 768,
                                                                        "image_width": 1024}, 60.0, new=True),
    Case("sft-mllama11b-lora-img", "sft", "meta-llama/Llama-3.2-11B-Vision-Instruct",
         {"max_length": 1024, "per_device_train_batch_size": 1, **BF16, "use_peft": True,
          "lora_target_modules": "all-linear", "images_per_example": 1, "image_height": 448, "image_width": 448},
         75.0, new=True),
    # activation offloading without GC under LoRA on Qwen3 (q/k norms between the projections): traced +3.85 % over
    Case("sft-qwen3-06-actoffload-nogc-lora", "sft", "Qwen/Qwen3-0.6B", {"max_length": 2048,
                                                                         "per_device_train_batch_size": 4, **BF16,
                                                                         "use_peft": True, "activation_offloading": True,
                                                                         "gradient_checkpointing": False}, 35.0,
         new=True),
    # LoRA all-linear on fused experts: peft 0.21 wraps each expert parameter (lora.ParamWrapper), which needs
    # lora_dropout 0 — the derived profile's expert adapters, held on a GPU
    Case("sft-qwen3moe-lora-all-linear", "sft", "Qwen/Qwen3-30B-A3B",
         {"max_length": 1024, "per_device_train_batch_size": 1, **BF16, "use_peft": True,
          "lora_target_modules": "all-linear", "lora_dropout": 0.0}, 90.0, new=True),
    # a learned type (SmolLM3: learned from rows of 512-8,192 tokens, held by the trace to 32,768) at 16k
    Case("sft-smollm3-lora-16k", "sft", "HuggingFaceTB/SmolLM3-3B",
         {"max_length": 16384, "per_device_train_batch_size": 1, **BF16, "use_peft": True,
          "lora_target_modules": "all-linear"}, 40.0, new=True),
    Case("sft-qwen05-actoffload", "sft", Q05, {**SFT, **BF16, "activation_offloading": True}, 30.0, new=True),
    Case("sft-llama1b-actoffload-nogc", "sft", L1, {**SFT, **BF16, "activation_offloading": True,
                                                    "gradient_checkpointing": False}, 35.0, new=True),
    Case("sft-qwen05-zero2-offload", "sft", Q05, {**SFT, **BF16, "accelerate_config": "zero2",
                                                  "offload_optimizer_device": "cpu"}, 60.0, new=True, solo=True,
         requires=("deepspeed",)),
    Case("sft-qwen05-zero3-offload", "sft", Q05, {**SFT, **BF16, "accelerate_config": "zero3",
                                                  "offload_optimizer_device": "cpu", "offload_param_device": "cpu"},
         60.0, new=True, solo=True, requires=("deepspeed",)),
    Case("sft-gemma2-9b-lora-eager", "sft", "google/gemma-2-9b", {"max_length": 1024, "per_device_train_batch_size": 1,
                                                                   **BF16, "use_peft": True,
                                                                   "attn_implementation": "eager"}, 60.0, new=True),
    Case("sft-qwen05-qlora", "sft", Q05, {**SFT, **BF16, "use_peft": True, "load_in_4bit": True}, 40.0, new=True,
         requires=("bitsandbytes",), solo=True),
)
TINY = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 2, "head_dim": 16, "vocab_size": 512}
TINY_LENGTHS = {"max_length": 64, "per_device_train_batch_size": 2, "max_prompt_length": 16,
                "max_completion_length": 16, "num_generations": 2, "image_height": 56, "image_width": 56}
# Qwen2.5-VL's vision tower shrunk with the text part (its merger projects to the text width)
TINY_VISION = {"depth": 2, "hidden_size": 64, "intermediate_size": 128, "num_heads": 4,
               "out_hidden_size": TINY["hidden_size"], "fullatt_block_indexes": [1]}


def tiny_config(model: str, folder: Path) -> str:
    """The catalog model's config with tiny dimensions, written as folder/<name>.json."""
    full = hf_config(model)
    cfg = {**full, **TINY}
    layers = full.get("num_hidden_layers")
    for key, value in full.items():      # per-layer lists (layer_types, no_rope_layers, …) follow the layer count
        if isinstance(value, list) and layers and len(value) == layers:
            cfg[key] = value[:TINY["num_hidden_layers"]]
    for key in ("pad_token_id", "bos_token_id", "eos_token_id"):      # special tokens inside the tiny vocabulary
        value = cfg.get(key)
        if isinstance(value, (int, list)):
            ids = [v % TINY["vocab_size"] for v in (value if isinstance(value, list) else [value])]
            cfg[key] = ids if isinstance(value, list) else ids[0]
    for key in ("num_local_experts", "num_experts"):
        if key in cfg:
            cfg[key] = min(int(cfg[key]), 4)
    if "num_experts_per_tok" in cfg:
        cfg["num_experts_per_tok"] = min(int(cfg["num_experts_per_tok"]), 2)
    for key in ("moe_intermediate_size", "shared_expert_intermediate_size"):
        if key in cfg:
            cfg[key] = 32
    if cfg.get("model_type") == "qwen2_5_vl":
        cfg["vision_config"] = {**cfg["vision_config"], **TINY_VISION}
        # M-RoPE's sections split half the head (16 / 2 = 8 rotary pairs) over time, height and width
        cfg["rope_scaling"] = {**cfg.get("rope_scaling", {}), "mrope_section": [2, 3, 3]}
    path = folder / (model.replace("/", "--") + ".json")
    path.write_text(json.dumps(cfg))
    return str(path)


def command_line(case: Case, *, device: str, out: str, model: str, tiny: bool, steps: int) -> list[str]:
    flags = dict(case.flags)
    if tiny and not case.sized:
        flags.update({k: v for k, v in TINY_LENGTHS.items() if k in flags or k in ("max_length",)})
        if entry(case.trainer).generates:
            flags.pop("max_length", None)
    argv = [sys.executable, "-m", "hpcmem", "probe", case.trainer, "--model_name_or_path", model,
            "--device", device, "--steps", str(steps), "--out", out]
    for key, value in flags.items():
        argv += [f"--{key}", json.dumps(value) if isinstance(value, dict) else str(value).lower()
                 if isinstance(value, bool) else str(value)]
    if case.capacity_bytes is not None:
        argv += ["--capacity-bytes", str(case.capacity_bytes)]
    elif case.capacity_gib is not None:
        capacity = int(case.capacity_gib * 1024**3) if not tiny else 4 * 1024**2
        argv += ["--capacity-bytes", str(capacity)]
    return argv


def missing(case: Case, device: str) -> str | None:
    """Why the case cannot run here (a module it needs; QLoRA or activation offloading off CUDA), or None."""
    import importlib.util

    gone = [m for m in case.requires if importlib.util.find_spec(m) is None]
    if gone:
        return f"{', '.join(gone)} not importable"
    if case.flags.get("load_in_4bit") and device != "cuda":
        return "bitsandbytes quantizes on CUDA only"
    if case.flags.get("activation_offloading") and device != "cuda":
        # TRL 1.16 trl/models/activation_offloading.py OffloadActivations.__init__ reads
        # torch.accelerator.current_accelerator().type: None on a machine without one
        return "activation offloading needs an accelerator (TRL's OffloadActivations)"
    return None


def run_case(case: Case, *, device: str, out: str, model: str, tiny: bool, steps: int, timeout_s: float,
             env: dict[str, str] | None = None) -> dict[str, Any]:
    """One `hpcmem probe` subprocess (a fresh CUDA context); its record goes to `out`. Returns the kit's result."""
    argv = command_line(case, device=device, out=out, model=model, tiny=tiny, steps=steps)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HPCMEM_PROBE_CASE": case.name, **case.env, **(env or {})}
    t0 = time.monotonic()
    try:
        proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=max(timeout_s, 1.0))
        status = "ok" if proc.returncode == 0 else f"exit {proc.returncode}"
        tail = (proc.stdout + proc.stderr)[-1500:]
    except subprocess.TimeoutExpired:
        status, tail = "timeout", ""
    return {"case": case.name, "status": status, "seconds": round(time.monotonic() - t0, 1),
            **({"tail": tail} if status != "ok" else {})}


def run(cases: list[Case], *, device: str, out: str, budget_s: float, tiny: bool, steps: int,
        case_timeout_s: float) -> list[dict[str, Any]]:
    start = time.monotonic()
    results = []
    with tempfile.TemporaryDirectory(prefix="hpcmem-matrix-") as tmp:
        for case in cases:
            left = budget_s - (time.monotonic() - start)
            why = missing(case, device)
            if why or left < case.cost_s:
                results.append({"case": case.name, "status": "skipped",
                                "why": why or f"{left:.0f} s left < {case.cost_s}"})
                continue
            model = tiny_config(case.model, Path(tmp)) if tiny else case.model
            results.append(run_case(case, device=device, out=out, model=model, tiny=tiny, steps=steps,
                                    timeout_s=min(case_timeout_s, left)))
            print(json.dumps(results[-1]), flush=True)
    return results


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m hpcmem.probe.matrix", description=__doc__.splitlines()[0])
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    ap.add_argument("--out", default=None, help="records file (default estimator/probes/<gpu>.jsonl)")
    ap.add_argument("--budget-s", type=float, default=480.0, help="stop starting cases after this (default 8 min)")
    ap.add_argument("--case-timeout-s", type=float, default=180.0)
    ap.add_argument("--only", default=None, help="comma-separated case names")
    ap.add_argument("--tiny", action="store_true", help="shrink every model (CPU tests)")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--list", action="store_true", help="print the cases and exit")
    args = ap.parse_args(argv)
    cases = list(CASES)
    if args.only:
        wanted = [n.strip() for n in args.only.split(",") if n.strip()]
        unknown = sorted(set(wanted) - {c.name for c in cases})
        if unknown:
            ap.error(f"unknown case(s) {', '.join(unknown)}; --list shows them")
        cases = [c for c in cases if c.name in wanted]
    if args.list:
        for c in cases:
            print(f"{c.name:28} {c.trainer:5} {c.model:28} ~{c.cost_s:.0f}s {json.dumps(c.flags)}")
        return 0
    out = args.out or str(_default_out(args.device))
    results = run(cases, device=args.device, out=out, budget_s=args.budget_s, tiny=args.tiny, steps=args.steps,
                  case_timeout_s=args.case_timeout_s)
    failed = [r for r in results if r["status"] not in ("ok", "skipped")]
    print(json.dumps({"records": out, "ran": sum(r["status"] == "ok" for r in results), "failed": len(failed),
                      "skipped": sum(r["status"] == "skipped" for r in results)}))
    return 1 if failed else 0


def _default_out(device: str) -> Path:
    if device == "cpu":
        return records_path(None)
    import torch

    return records_path(torch.cuda.get_device_name(0))


if __name__ == "__main__":
    sys.exit(main())
