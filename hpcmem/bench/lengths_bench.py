"""Benchmark of `hpcmem lengths`: profile N examples of ~T tokens (SFT text, jsonl) with a fast BPE tokenizer.

    python -m hpcmem.bench.lengths_bench [--examples 100000] [--tokens 500] [--pre-tokenizer whitespace]

Builds a BPE tokenizer (the `tokenizers` library; transformers opens it as PreTrainedTokenizerFast) and a jsonl
file of random words in a temporary folder — not timed — then times the steps of `profile_dataset` end to end:
import and load the tokenizer, load the jsonl, tokenize, the statistics and TRL's pack_dataset for every candidate.
Prints the seconds. The target on the project's 2-core machine: 100k examples of ~500 tokens in ≤ 60 s.
`--pre-tokenizer bytelevel` shows the cost of a GPT-2/Llama-3 style regex pre-tokenizer, which dominates on slow
cores whatever hpcmem does.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import tempfile
import time
from pathlib import Path

from hpcmem.data.load import load_data, load_tokenizer
from hpcmem.data.profiler import build_profile
from hpcmem.data.tokenize import tokenize_lengths

WORDS = 3000


def make_tokenizer(folder: Path, texts: list[str], pre_tokenizer: str) -> None:
    """A BPE tokenizer.json + tokenizer_config.json that AutoTokenizer opens as a PreTrainedTokenizerFast; built
    with `tokenizers` alone so that importing transformers stays inside the timed run, as in the CLI."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = {"whitespace": pre_tokenizers.WhitespaceSplit(), "metaspace": pre_tokenizers.Metaspace(),
                         "bytelevel": pre_tokenizers.ByteLevel(add_prefix_space=False)}[pre_tokenizer]
    if pre_tokenizer == "bytelevel":
        tok.decoder = decoders.ByteLevel()
    alphabet = pre_tokenizers.ByteLevel.alphabet() if pre_tokenizer == "bytelevel" else []
    tok.train_from_iterator(texts, trainers.BpeTrainer(vocab_size=8000, initial_alphabet=alphabet,
                                                       special_tokens=["<unk>", "<pad>", "<s>", "</s>"]))
    folder.mkdir(parents=True, exist_ok=True)
    tok.save(str(folder / "tokenizer.json"))
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "unk_token": "<unk>", "pad_token": "<pad>",
              "bos_token": "<s>", "eos_token": "</s>"}
    (folder / "tokenizer_config.json").write_text(json.dumps(config))


def make_data(path: Path, examples: int, tokens: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    words = ["".join(rng.choices("abcdefghijklmnopqrstuvwxyz", k=rng.randint(2, 8))) for _ in range(WORDS)]
    spread = max(1, tokens // 5)
    sample = []
    with path.open("w") as f:
        for i in range(examples):
            text = " ".join(rng.choices(words, k=rng.randint(tokens - spread, tokens + spread)))
            f.write(json.dumps({"text": text}) + "\n")
            if i < 500:
                sample.append(text)
    return sample


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--examples", type=int, default=100_000)
    parser.add_argument("--tokens", type=int, default=500, help="mean words (≈ tokens) per example")
    parser.add_argument("--pre-tokenizer", choices=("whitespace", "metaspace", "bytelevel"), default="whitespace")
    parser.add_argument("--num-proc", type=int, default=None)
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import datasets

    datasets.disable_progress_bars()
    with tempfile.TemporaryDirectory(prefix="hpcmem-lengths-bench-") as tmp:
        tmp_path = Path(tmp)
        sample = make_data(tmp_path / "data.jsonl", args.examples, args.tokens)
        make_tokenizer(tmp_path / "tok", sample, args.pre_tokenizer)
        profile, phases, cpu = run(str(tmp_path / "data.jsonl"), str(tmp_path / "tok"), args.num_proc,
                                   str(tmp_path / "cache"))
        reference = bare_tokenization(tmp_path / "data.jsonl", tmp_path / "tok" / "tokenizer.json")
    stats = profile["stats"]
    total = sum(phases.values())
    print(f"profiled {profile['examples']:,} examples · {stats['total_tokens']:,} tokens (mean {stats['mean']:.0f}) "
          f"· {len(profile['candidates'])} max_length rows · BPE/{args.pre_tokenizer} tokenizer")
    print("phases: " + " · ".join(f"{name} {sec:.1f} s" for name, sec in phases.items()))
    print(f"seconds: {total:.1f} wall, {cpu:.1f} cpu (this process; tokenizer threads included, "
          "packing workers not) — target ≤ 60 s for 100k × 500 tokens")
    print(f"reference: the Rust tokenizer alone on the same texts {reference:.1f} s → profile = "
          f"{total / reference:.1f}× bare tokenization (machine load cancels out of this ratio)")


def bare_tokenization(data: Path, tokenizer_json: Path) -> float:
    """Seconds the `tokenizers` backend takes to encode every text + EOS in batches of 1000, nothing else."""
    from tokenizers import Tokenizer

    texts = [json.loads(line)["text"] + "</s>" for line in data.open()]
    tok = Tokenizer.from_file(str(tokenizer_json))
    start = time.perf_counter()
    for i in range(0, len(texts), 1000):
        tok.encode_batch_fast(texts[i:i + 1000])
    return time.perf_counter() - start


def run(data: str, tokenizer: str, num_proc: int | None, cache_dir: str) -> tuple[dict, dict, float]:
    """profile_dataset's steps, each timed: (profile, {phase: wall seconds}, cpu seconds)."""
    cpu = time.process_time()
    clock = [time.perf_counter()]
    phases = {}

    def lap(name: str) -> None:
        clock.append(time.perf_counter())
        phases[name] = clock[-1] - clock[-2]

    tok = load_tokenizer(tokenizer)
    lap("import + tokenizer")
    dataset = load_data(data, cache_dir=cache_dir)
    lap("load")
    fmt, parts = tokenize_lengths(dataset, tok, trainer="sft", num_proc=num_proc)
    lap("tokenize")
    profile = build_profile(parts, source={"trainer": "sft", "data": data, "format": fmt},
                            per_device_train_batch_size=8, pad_to_multiple_of=None, num_proc=num_proc)
    lap("statistics + packing")
    return profile, phases, time.process_time() - cpu


if __name__ == "__main__":
    main()
