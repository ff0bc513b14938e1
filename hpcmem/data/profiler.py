"""Build an `hpcmem.lengths/1` profile: load, tokenize as the trainer does, statistics, candidates × strategies.

`profile_dataset` touches the user's files; `build_profile` takes lengths (tests feed it known distributions).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Iterable, Mapping, Sequence

from hpcmem.data.batches import PACKING_STRATEGIES, ROW_PARTS, kept_rows, kto_kl_rows, micro_batches, summarize
from hpcmem.data.errors import EmptyDataset, LengthsError
from hpcmem.data.load import load_data, load_tokenizer
from hpcmem.data.packing import PACK_BATCH_SIZE, pack_all
from hpcmem.data.profile import ENCODING, MAX_ORDERED_EXAMPLES, SCHEMA, encode_lengths
from hpcmem.data.stats import candidates, histogram, length_stats, recommend
from hpcmem.data.tokenize import tokenize_lengths
from hpcmem.job.trainers import REGISTRY


def profile_dataset(data: str, tokenizer: str, *, trainer: str = "sft", split: str = "train",
                    dataset_text_field: str = "text", per_device_train_batch_size: int = 8,
                    pad_to_multiple_of: int | None = None, max_lengths: Iterable[int] = (),
                    num_proc: int | None = None, cache_dir: str | None = None,
                    say: Callable[[str], None] | None = None) -> dict:
    """Profile DATA with the tokenizer at TOKENIZER for TRAINER; see hpcmem.data.profile for the schema. `say` hears
    each stage as it starts (the CLI prints them as plain lines when its progress bars are off)."""
    say = say or (lambda _text: None)
    say(f"loading the tokenizer {tokenizer} and the data {data}")
    tok = load_tokenizer(tokenizer)
    dataset = load_data(data, split=split, cache_dir=cache_dir)
    say(f"tokenizing {len(dataset):,} examples as {trainer} does")
    fmt, parts = tokenize_lengths(dataset, tok, trainer=trainer, dataset_text_field=dataset_text_field,
                                  num_proc=num_proc)
    source = {"data": data, "split": split, "tokenizer": tokenizer, "trainer": trainer, "format": fmt,
              "dataset_text_field": dataset_text_field}
    say("statistics, truncation and packing per max_length candidate")
    return build_profile(parts, source=source, per_device_train_batch_size=per_device_train_batch_size,
                         pad_to_multiple_of=pad_to_multiple_of, max_lengths=max_lengths, num_proc=num_proc)


def build_profile(parts: Mapping[str, Sequence[int]], *, source: Mapping, per_device_train_batch_size: int,
                  pad_to_multiple_of: int | None, max_lengths: Iterable[int] = (), num_proc: int | None = None) -> dict:
    """The profile of per-example part lengths (dataset order); `source["trainer"]` says which rules apply."""
    trainer = source["trainer"]
    names = ROW_PARTS[trainer]
    num_examples = len(parts[names[0]])
    if num_examples == 0:
        raise EmptyDataset("the dataset has no rows")
    max_lengths = tuple(max_lengths)
    if any(m < 1 for m in max_lengths) or per_device_train_batch_size < 1:
        raise LengthsError(f"max_length and per_device_train_batch_size must be ≥ 1; got max_length "
                           f"{list(max_lengths)}, per_device_train_batch_size {per_device_train_batch_size}")
    rows = [n for example in zip(*(parts[name] for name in names)) for n in example]
    stats = length_stats(sorted(rows))
    e = REGISTRY[trainer]
    sized = candidates(stats, max_lengths) if e.lengths.truncates else []
    packed = pack_candidates(parts["length"], [m for m, _ in sized], num_proc) if e.packs else {}
    settings = {"per_device_train_batch_size": per_device_train_batch_size, "pad_to_multiple_of": pad_to_multiple_of,
                "pack_batch_size": PACK_BATCH_SIZE}
    table = [candidate_row(trainer, parts, max_length, label, settings, packed)
             for max_length, label in [(None, "none"), *sized]]
    order = None
    if num_examples <= MAX_ORDERED_EXAMPLES:
        order = {"encoding": ENCODING, "parts": {name: encode_lengths(parts[name]) for name in parts}}
    return {
        "schema": SCHEMA,
        "source": {**source, **_versions(), "created": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")},
        "settings": settings,
        "examples": num_examples,
        "row_parts": list(names),
        "stats": stats,
        "part_stats": {name: length_stats(sorted(values)) for name, values in parts.items()},
        "histogram": histogram(rows),
        "order": order,
        "candidates": table,
        "recommendation": recommend(trainer, table, stats),
    }


def pack_candidates(lengths: Sequence[int], max_lengths: Sequence[int],
                    num_proc: int | None) -> dict[tuple[int, str], list[int]]:
    """trl.pack_dataset rows for every (max_length, strategy). bfd_split is not packed where no sequence exceeds
    max_length: TRL's docs say it behaves exactly as bfd then (candidate_row marks it `same_as` bfd)."""
    longest = max(lengths)
    jobs = [(m, s) for m in max_lengths for s in PACKING_STRATEGIES if not (s == "bfd_split" and longest <= m)]
    return pack_all(lengths, jobs, num_proc=num_proc)


def candidate_row(trainer: str, parts: Mapping[str, Sequence[int]], max_length: int | None, label: str,
                  settings: Mapping, packed: Mapping[tuple[int, str], list[int]]) -> dict:
    """Truncation figures and one summary per batching strategy for one max_length (None: no truncation)."""
    batch, multiple = settings["per_device_train_batch_size"], settings["pad_to_multiple_of"]
    kept = kept_rows(trainer, parts, max_length)
    strategies = {}
    e = REGISTRY[trainer]
    flat_options = (("padded", False), ("padding_free", True)) if e.packs else (("padded", False),)
    for name, flatten in flat_options:
        batches = micro_batches(kept.rows, batch * kept.rows_per_example, flatten=flatten,
                                pad_to_multiple_of=multiple)
        strategies[name] = {**summarize(batches, num_rows=len(kept.rows)), "padding_free": flatten,
                            "tokens_lost": kept.tokens_lost}
    if e.lengths.kl_rows:       # the KL rows, run without gradients through the policy and the reference
        kl = kto_kl_rows(parts["prompt"], parts["length"], max_length, batch)
        batches = micro_batches(kl, batch, flatten=False, pad_to_multiple_of=multiple)
        strategies["kl"] = {**summarize(batches, num_rows=len(kl)), "padding_free": False,
                            "tokens_lost": kept.tokens_lost}
    for strategy in PACKING_STRATEGIES if e.packs and max_length is not None else ():
        rows = packed.get((max_length, strategy))
        if rows is None:  # bfd_split with nothing to split
            strategies[strategy] = {**{k: v for k, v in strategies["bfd"].items() if k != "row_lengths"},
                                    "same_as": "bfd"}
            continue
        flatten = strategy != "wrapped"  # SFTTrainer forces padding_free for bfd and bfd_split
        batches = micro_batches(rows, batch, flatten=flatten, pad_to_multiple_of=multiple)
        strategies[strategy] = {**summarize(batches, num_rows=len(rows)), "padding_free": flatten,
                                "tokens_lost": kept.tokens_total - sum(rows), "row_lengths": encode_lengths(rows)}
    return {"max_length": max_length, "label": label, "examples": kept.num_examples,
            "truncated_examples": kept.num_truncated, "dropped_examples": kept.num_dropped,
            "tokens_total": kept.tokens_total, "tokens_lost": kept.tokens_lost, "strategies": strategies}


def _versions() -> dict:
    from importlib import metadata

    out = {}
    for dist in ("trl", "hpcmem"):
        try:
            out[f"{dist}_version"] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            out[f"{dist}_version"] = None
    return out
