"""Random `hpcmem estimate` / `plan` command lines, replayed through one tree's CLI, to hold a refactor to "behaviour
does not change" on jobs nobody chose.

    python hpcmem/lab/cli_replay.py gen --seed 7 -n 400 > jobs.json       # command lines (catalog models)
    PYTHONPATH=OLD_TREE python hpcmem/lab/cli_replay.py run jobs.json > old.json
    PYTHONPATH=NEW_TREE python hpcmem/lab/cli_replay.py run jobs.json > new.json
    python hpcmem/lab/cli_replay.py compare old.json new.json             # exit 1 when any output differs

Run as a file, so that `run` uses the hpcmem PYTHONPATH names (a tree of any layout that has `hpcmem.cli.run`):
hpcmem's own entry point, in-process, exit status, stdout and stderr per job. `compare` sets aside the search time a
plan reports.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import random
import re
import sys

from hpcmem.cli import run

MODELS = ("Qwen/Qwen2.5-0.5B", "Qwen/Qwen2.5-7B", "meta-llama/Llama-3.1-8B", "Qwen/Qwen3-8B", "google/gemma-3-1b-it",
          "Qwen/Qwen3-30B-A3B", "openai/gpt-oss-20b", "mistralai/Mistral-7B-v0.3",
          "microsoft/Phi-3-mini-4k-instruct", "meta-llama/Llama-3.2-1B", "HuggingFaceTB/SmolLM3-3B",
          "allenai/OLMo-2-1124-7B")
TRAINERS = ("sft", "dpo", "reward", "grpo", "rloo", "kto")
GPUS = ("H200", "H100-80GB", "A100-40GB", "L4", "RTX-4090")
SEARCH_TIME = re.compile(r'(?<="seconds": )[0-9.e+-]+|(?<=combinations in )\d+(?= ms)')


def estimate_line(rng: random.Random) -> list[str]:
    t = rng.choice(TRAINERS)
    a = ["estimate", t, "--model_name_or_path", rng.choice(MODELS), "--json", "--gpu", rng.choice(GPUS)]
    maybe = [(.5, ["--dtype", rng.choice(["bfloat16", "float32", "auto"])]),
             (.5, ["--per_device_train_batch_size", str(rng.choice([1, 2, 4, 8]))]),
             (.3, ["--gradient_accumulation_steps", str(rng.choice([1, 2, 4]))]),
             (.6 if t in ("sft", "dpo", "reward", "kto") else 0,
              ["--max_length", str(rng.choice([256, 1024, 4096, 8192]))]),
             (.5, ["--use_peft", "true", *(["--lora_target_modules", "all-linear"] if rng.random() < .5 else []),
                   *(["--lora_dropout", "0"] if rng.random() < .3 else [])]),
             (.3, ["--gradient_checkpointing", rng.choice(["true", "false"])]),
             (.2, ["--gradient_checkpointing_kwargs", '{"selective": true}']),
             (.4 if t == "sft" else 0,
              ["--packing", "true", "--packing_strategy", rng.choice(["bfd", "bfd_split", "wrapped"])]),
             (.2 if t == "sft" else 0, ["--padding_free", "true"]),
             (.3, ["--accelerate_config", rng.choice(["zero1", "zero2", "zero3", "fsdp2", "multi_gpu"]),
                   "--num_processes", str(rng.choice([2, 4, 8]))]),
             (.2, ["--expandable_segments", "true"]),
             (.4 if t in ("grpo", "rloo") else 0,
              ["--use_vllm", "true", "--vllm_enable_sleep_mode", rng.choice(["true", "false"])]),
             (.15, ["--activation_offloading", "true"]),
             (.1, ["--load_in_4bit", "true", "--use_peft", "true"])]
    for p, flags in maybe:
        if rng.random() < p:
            a += flags
    return a


def plan_line(rng: random.Random) -> list[str]:
    t = rng.choice(("sft", "dpo", "grpo", "kto", "reward"))
    a = ["plan", t, "--model_name_or_path", rng.choice(MODELS[:7]), "--gpu", rng.choice(GPUS[:4]), "--json"]
    for p, flags in ((.5, ["--allow_peft"]), (.4, ["--num_processes", str(rng.choice([2, 8]))]),
                     (.4, ["--dtype", "bfloat16"]),
                     (.5 if t != "grpo" else 0, ["--max_length", str(rng.choice([512, 2048, 8192]))])):
        if rng.random() < p:
            a += flags
    return a


def generate(seed: int, n: int, plans: int) -> list[list[str]]:
    rng = random.Random(seed)
    return [estimate_line(rng) for _ in range(n)] + [plan_line(rng) for _ in range(plans)]


def replay(jobs: list[list[str]]) -> list[dict]:
    out = []
    for argv in jobs:
        stdout, stderr = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
            status = run(argv)
        out.append({"argv": argv, "rc": status, "out": stdout.getvalue(), "err": stderr.getvalue()})
    return out


def differences(old: list[dict], new: list[dict]) -> list[str]:
    def norm(r: dict) -> tuple:
        return r["argv"], r["rc"], SEARCH_TIME.sub("<time>", r["out"]), r["err"]
    return [" ".join(a["argv"]) for a, b in zip(old, new, strict=True) if norm(a) != norm(b)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="what", required=True)
    gen = sub.add_parser("gen")
    gen.add_argument("--seed", type=int, default=7)
    gen.add_argument("-n", type=int, default=400, help="estimate command lines")
    gen.add_argument("--plans", type=int, default=40, help="plan command lines")
    sub.add_parser("run").add_argument("jobs")
    cmp = sub.add_parser("compare")
    cmp.add_argument("old")
    cmp.add_argument("new")
    args = parser.parse_args()
    if args.what == "gen":
        json.dump(generate(args.seed, args.n, args.plans), sys.stdout)
    elif args.what == "run":
        with open(args.jobs, encoding="utf-8") as f:
            json.dump(replay(json.load(f)), sys.stdout)
    else:
        with open(args.old, encoding="utf-8") as a, open(args.new, encoding="utf-8") as b:
            old, new = json.load(a), json.load(b)
        diff = differences(old, new)
        codes = {rc: sum(r["rc"] == rc for r in old) for rc in sorted({r["rc"] for r in old})}
        print(f"{len(old)} command lines; exit statuses {codes}; differing: {len(diff)}")
        for line in diff[:20]:
            print(f"  hpcmem {line}")
        sys.exit(1 if diff else 0)


if __name__ == "__main__":
    main()
