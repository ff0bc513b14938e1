"""Benchmark of `run_trace`: two SFTTrainer steps of a Llama-3.1-8B-shaped model on fake tensors.

    python -m hpcmem.bench.trace_bench [--repeats 3] [--max-length 4096] [--batch 1] [--kernels cuda]

The model is built from its config (32 layers, hidden 4096, intermediate 14336, 32/8 heads, vocab 128256; bf16
weights, full fine-tune, gradient checkpointing on, adamw_torch_fused), so nothing is downloaded. Imports are done
once before timing; every repeat builds the fake model and the trainer and runs both steps. Prints each run and the
median. The target on the project's 2-core machine: median ≤ 15 s (timings on a shared machine vary ~2×).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

from hpcmem.job.jobspec import JobSpec
from hpcmem.job.spec import TrainSpec
from hpcmem.models.spec import ModelSpec
from hpcmem.trace import run_trace

TARGET_S = 15.0


def llama_8b_job(max_length: int, batch: int, **train):
    model = ModelSpec(name="Llama-3.1-8B-shaped", model_type="llama", vocab_size=128256, hidden_size=4096,
                      intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8,
                      head_dim=128, tie_word_embeddings=False, max_position_embeddings=131072)
    settings = {"dtype": "bfloat16", "max_length": max_length, "per_device_train_batch_size": batch, **train}
    return JobSpec(model=model, train=TrainSpec(trainer="sft", **settings))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--max-length", type=int, default=4096)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--kernels", choices=("cuda", "cpu"), default="cuda")
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    t0 = time.perf_counter()
    import torch  # noqa: F401
    import transformers  # noqa: F401
    import trl  # noqa: F401

    print(f"imports {time.perf_counter() - t0:.1f} s (not timed below)")
    job = llama_8b_job(args.max_length, args.batch)
    seconds = []
    for i in range(args.repeats):
        start = time.perf_counter()
        result = run_trace(job, kernels=args.kernels)
        seconds.append(time.perf_counter() - start)
        print(f"run {i + 1}: {seconds[-1]:.1f} s · peak {result.peak_allocated_bytes / 2**30:.2f} GiB at "
              f"{result.phase} · {result.num_ops:,} ops")
    median = statistics.median(seconds)
    verdict = "within" if median <= TARGET_S else "OVER"
    print(f"median of {len(seconds)}: {median:.1f} s ({verdict} the {TARGET_S:.0f} s target)")


if __name__ == "__main__":
    main()
