"""Build an `hpcmem.lengths/1` profile (`/2` for image-text data): load, tokenize (or process the images) as the
trainer does, statistics, candidates × strategies.

`profile_dataset` touches the user's files; `build_profile` takes lengths (tests feed it known distributions).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Iterable, Mapping, Sequence

from hpcmem.data.batches import PACKING_STRATEGIES, ROW_PARTS, kept_rows, kto_kl_rows, micro_batches, summarize
from hpcmem.data.errors import EmptyDataset, LengthsError, ProcessorUnfit
from hpcmem.data.load import load_data, load_tokenizer
from hpcmem.data.packing import PACK_BATCH_SIZE, pack_all
from hpcmem.data.processor import Resolution, family, load_processor, tile_patches
from hpcmem.data.processor import settings as processor_settings
from hpcmem.data.profile import ENCODING, MAX_ORDERED_EXAMPLES, SCHEMA, SCHEMA_VISION, VISION_PARTS, encode_lengths
from hpcmem.data.stats import candidates, histogram, length_stats, recommend
from hpcmem.data.tokenize import tokenize_lengths
from hpcmem.data.vision import image_column, vision_lengths
from hpcmem.job.trainers import REGISTRY


def profile_dataset(data: str, tokenizer: str | None, *, trainer: str = "sft", split: str = "train",
                    dataset_text_field: str = "text", per_device_train_batch_size: int = 8,
                    pad_to_multiple_of: int | None = None, max_lengths: Iterable[int] = (),
                    num_proc: int | None = None, cache_dir: str | None = None,
                    say: Callable[[str], None] | None = None, processor: str | None = None,
                    resolution: Resolution = Resolution()) -> dict:
    """Profile DATA with the tokenizer at TOKENIZER (text data) or the processor at PROCESSOR (image-text data) for
    TRAINER; see hpcmem.data.profile for the schema. `say` hears each stage as it starts (the CLI prints them as
    plain lines when its progress bars are off)."""
    say = say or (lambda _text: None)
    if processor is None and (resolution.min_pixels is not None or resolution.max_pixels is not None):
        raise ProcessorUnfit("--min_pixels / --max_pixels set the processor's image resolution: pass --processor")
    if (tokenizer is None) == (processor is None):
        raise LengthsError("pass --tokenizer (text data) or --processor (image-text data)"
                           + (", not both" if tokenizer else ""))
    say(f"loading the {'processor ' + processor if processor else 'tokenizer ' + tokenizer} and the data {data}")
    proc = load_processor(processor, resolution) if processor else None
    tok = load_tokenizer(tokenizer) if tokenizer else None
    dataset = load_data(data, split=split, cache_dir=cache_dir)
    column = image_column(dataset.column_names)
    if column and proc is None:
        raise LengthsError(f"{data} has an {column!r} column: TRL trains image-text data with the model's processor, "
                           "which expands each image into image tokens; pass --processor PATH instead of --tokenizer")
    if proc is not None and not column:
        raise LengthsError(f"{data} has no 'images' or 'image' column (columns: {', '.join(dataset.column_names)}): "
                           "--processor is for image-text data; pass --tokenizer for text data")
    source = {"data": data, "split": split, "tokenizer": tokenizer, "trainer": trainer,
              "dataset_text_field": dataset_text_field}
    if proc is not None:
        say(f"processing the images and text of {len(dataset):,} examples as {trainer}'s vision collator does")
        per_tile = tile_patches(proc, processor) if family(proc) == "tiles" else None
        fmt, parts = vision_lengths(dataset, proc, trainer=trainer, dataset_text_field=dataset_text_field,
                                    num_proc=num_proc, patches_per_tile=per_tile)
        counts = {name: parts.pop(name) for name in (*VISION_PARTS, "tiles") if name in parts}
        source = {**source, "tokenizer": processor, "processor": processor, "format": fmt}
        vision = {**processor_settings(proc, per_tile), "image_column": column, "counts": counts}
    else:
        say(f"tokenizing {len(dataset):,} examples as {trainer} does")
        fmt, parts = tokenize_lengths(dataset, tok, trainer=trainer, dataset_text_field=dataset_text_field,
                                      num_proc=num_proc)
        source = {**source, "format": fmt}
        vision = None
    say("statistics, truncation and packing per max_length candidate")
    return build_profile(parts, source=source, per_device_train_batch_size=per_device_train_batch_size,
                         pad_to_multiple_of=pad_to_multiple_of, max_lengths=max_lengths, num_proc=num_proc,
                         vision=vision)


def build_profile(parts: Mapping[str, Sequence[int]], *, source: Mapping, per_device_train_batch_size: int,
                  pad_to_multiple_of: int | None, max_lengths: Iterable[int] = (), num_proc: int | None = None,
                  vision: Mapping | None = None) -> dict:
    """The profile of per-example part lengths (dataset order); `source["trainer"]` says which rules apply.
    `vision`: the processor's settings and `counts` {VISION_PARTS: per example} of image-text data (a /2 profile)."""
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
    packs = e.packs and vision is None          # TRL 1.16 refuses packing for image datasets
    packed = pack_candidates(parts["length"], [m for m, _ in sized], num_proc) if packs else {}
    settings = {"per_device_train_batch_size": per_device_train_batch_size, "pad_to_multiple_of": pad_to_multiple_of,
                "pack_batch_size": PACK_BATCH_SIZE}
    image_end = vision["counts"]["image_end"] if vision is not None else None
    table = [candidate_row(trainer, parts, max_length, label, settings, packed, image_end=image_end)
             for max_length, label in [(None, "none"), *sized]]
    order = None
    if num_examples <= MAX_ORDERED_EXAMPLES:
        order = {"encoding": ENCODING, "parts": {name: encode_lengths(parts[name]) for name in parts}}
    extra = {}
    if vision is not None:
        extra["vision"] = vision_section(vision, parts, names, per_device_train_batch_size, ordered=order is not None)
    return {
        "schema": SCHEMA if vision is None else SCHEMA_VISION,
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
        **extra,
    }


def vision_section(vision: Mapping, parts: Mapping[str, Sequence[int]], names: Sequence[str], batch: int, *,
                   ordered: bool) -> dict:
    """The profile's `vision` section (hpcmem.data.profile): per-example counts' stats, text tokens per row (the row
    less its image tokens), the worst micro-batch's images / image tokens / patches at `batch` examples."""
    counts = vision["counts"]
    copies = len(names)                     # every row of an example carries its images (DPO: chosen and rejected)
    text = [n - counts["image_tokens"][i] for name in names for i, n in enumerate(parts[name])]
    stats = {name: length_stats(sorted(counts[name])) for name in counts}
    stats["text_tokens"] = length_stats(sorted(text))
    worst = {name: copies * max(sum(counts[name][i:i + batch]) for i in range(0, len(counts[name]), batch))
             for name in ("images", "image_tokens", "patches", "tiles") if name in counts}
    order = {"encoding": ENCODING, "parts": {name: encode_lengths(counts[name]) for name in counts}} \
        if ordered else None
    return {**{k: v for k, v in vision.items() if k != "counts"}, "rows_per_example": copies, "stats": stats,
            "per_micro_batch": worst, "order": order}


def pack_candidates(lengths: Sequence[int], max_lengths: Sequence[int],
                    num_proc: int | None) -> dict[tuple[int, str], list[int]]:
    """trl.pack_dataset rows for every (max_length, strategy). bfd_split is not packed where no sequence exceeds
    max_length: TRL's docs say it behaves exactly as bfd then (candidate_row marks it `same_as` bfd)."""
    longest = max(lengths)
    jobs = [(m, s) for m in max_lengths for s in PACKING_STRATEGIES if not (s == "bfd_split" and longest <= m)]
    return pack_all(lengths, jobs, num_proc=num_proc)


def candidate_row(trainer: str, parts: Mapping[str, Sequence[int]], max_length: int | None, label: str,
                  settings: Mapping, packed: Mapping[tuple[int, str], list[int]], *,
                  image_end: Sequence[int] | None = None) -> dict:
    """Truncation figures and one summary per batching strategy for one max_length (None: no truncation).
    `image_end` (image-text data): vision rules, padded only, and the examples whose image tokens the cut reaches."""
    batch, multiple = settings["per_device_train_batch_size"], settings["pad_to_multiple_of"]
    vision = image_end is not None
    kept = kept_rows(trainer, parts, max_length, vision=vision)
    strategies = {}
    e = REGISTRY[trainer]
    flat_options = (("padded", False), ("padding_free", True)) if e.packs and not vision else (("padded", False),)
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
    for strategy in PACKING_STRATEGIES if e.packs and max_length is not None and not vision else ():
        rows = packed.get((max_length, strategy))
        if rows is None:  # bfd_split with nothing to split
            strategies[strategy] = {**{k: v for k, v in strategies["bfd"].items() if k != "row_lengths"},
                                    "same_as": "bfd"}
            continue
        flatten = strategy != "wrapped"  # SFTTrainer forces padding_free for bfd and bfd_split
        batches = micro_batches(rows, batch, flatten=flatten, pad_to_multiple_of=multiple)
        strategies[strategy] = {**summarize(batches, num_rows=len(rows)), "padding_free": flatten,
                                "tokens_lost": kept.tokens_total - sum(rows), "row_lengths": encode_lengths(rows)}
    row = {"max_length": max_length, "label": label, "examples": kept.num_examples,
           "truncated_examples": kept.num_truncated, "dropped_examples": kept.num_dropped,
           "tokens_total": kept.tokens_total, "tokens_lost": kept.tokens_lost, "strategies": strategies}
    if vision:
        cut = max_length if e.lengths.truncates else None
        row["image_cut_examples"] = 0 if cut is None else sum(1 for end in image_end if end > cut)
    return row


def _versions() -> dict:
    from importlib import metadata

    out = {}
    for dist in ("trl", "hpcmem"):
        try:
            out[f"{dist}_version"] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            out[f"{dist}_version"] = None
    return out
