"""The length profile JSON ("hpcmem.lengths/1", "/2" with images) and the questions the estimator asks of it
(stdlib only).

Schema `hpcmem.lengths/1` (written by `hpcmem lengths --save` for text data, read by `hpcmem estimate --lengths`):

    schema        "hpcmem.lengths/1"
    source        {data, split, tokenizer, trainer: sft|dpo|reward|grpo|kto, format, dataset_text_field,
                   trl_version, hpcmem_version, created}
    settings      {per_device_train_batch_size, pad_to_multiple_of, pack_batch_size}: what the table rows assume
    examples      number of examples
    row_parts     the per-example parts that become micro-batch rows: ["length"] (sft), ["chosen", "rejected"]
                  (dpo, reward: prompt included), ["prompt"] (grpo), ["length"] (kto: prompt + completion)
    stats         {count, total_tokens, min, mean, p50, p90, p95, p99, p99.9, max} over all rows (sequences)
    part_stats    {part: stats} for every part (incl. "prompt" where the trainer tokenizes it alone)
    histogram     [[length, count], …] over all rows, ascending: order-free, always present
    order         {"encoding": "zlib+base64 uint32le", "parts": {part: blob}} per-example lengths in dataset order,
                  or null when the dataset has more than MAX_ORDERED_EXAMPLES examples
    candidates    [{max_length (null = no truncation), label, examples, truncated_examples, dropped_examples,
                   tokens_total, tokens_lost,
                   strategies: {padded | padding_free | bfd | bfd_split | wrapped | kl (kto's KL rows):
                                {rows, micro_batches, tokens, tensor_tokens, padding_fraction, tokens_lost,
                                 worst_tokens_per_micro_batch, typical_tokens_per_micro_batch,
                                 padding_free (flattened rows?),
                                 row_lengths (packing only: packed row lengths in trl.pack_dataset order, a blob)
                                 | same_as (bfd_split when no sequence exceeds max_length: identical to bfd)}}}]
    recommendation {max_length, packing, packing_strategy, padding_free, reason}

Schema `hpcmem.lengths/2` (image-text data, `hpcmem lengths --processor`): /1, where the row lengths include the image
tokens, source.processor names the processor, the candidates hold only `padded` (TRL 1.16 refuses packing and
padding-free for image datasets) and each says `image_cut_examples` (examples whose image tokens that max_length cuts),
plus
    vision        {processor, image_processor, image_token, image_column, family: "grid" (Qwen2-VL family:
                   min_pixels, max_pixels, patch_size, merge_size, temporal_patch_size) | "tiles" (Idefics3,
                   SmolVLM: longest_edge, tile_size, image_splitting, image_seq_len, patches_per_tile),
                   rows_per_example   rows that each carry the example's images (2 for DPO: pixel_values holds
                                      them once per row),
                   stats      {images, image_tokens, patches, image_end (, tiles): per example; text_tokens: per
                              row} (stats as above: count, min, mean, p50 … p99.9, max),
                   per_micro_batch  {images, image_tokens, patches (, tiles): the worst micro-batch at
                                     settings.per_device_train_batch_size, in dataset order, no truncation},
                   order      {"encoding", "parts": {images, image_tokens, patches, image_end (, tiles): per
                              example}} or null}
`image_end` is the row position just past an example's last image token; `patches` what the vision encoder gets from
its images (grid: the `pixel_values` rows, image_grid_thw t·h·w summed; tiles: tiles × patches_per_tile),
`image_tokens` what the processor expanded its placeholders to (hpcmem.data.processor has the families).

Token counts of a micro-batch are tensor tokens: rows × padded length, or the one flattened row when padding-free.
"""

from __future__ import annotations

import base64
import binascii
import sys
import zlib
from array import array
from collections.abc import Iterable, Mapping

from hpcmem.data.batches import PACKING_STRATEGIES, ROW_PARTS, TRAINERS, kept_rows, kto_kl_rows, micro_batches, round_up
from hpcmem.data.errors import ProfileError
from hpcmem.data.profile_schema import (ENCODING, MAX_DECODED, SCHEMA, SCHEMA_VISION, SCHEMAS, VISION_PARTS,
                                        check_profile)
from hpcmem.errors import SpecError
from hpcmem.inputs.files import load_json_file
from hpcmem.job.trainers import REGISTRY

__all__ = ["ENCODING", "SCHEMA", "SCHEMAS", "SCHEMA_VISION", "VISION_PARTS", "check_profile", "decode_lengths",
           "encode_lengths", "image_cut", "label_tokens_per_micro_batch", "load_profile", "longest_prompt",
           "tokens_per_micro_batch",
           "vision_per_micro_batch"]
MAX_ORDERED_EXAMPLES = 2_000_000   # above this, only the histogram is stored (a few MiB of JSON at most)


def encode_lengths(values: Iterable[int]) -> str:
    """Lengths → zlib-compressed little-endian uint32, base64 text."""
    data = array("I" if array("I").itemsize == 4 else "L", values)
    if sys.byteorder == "big":
        data.byteswap()
    return base64.b64encode(zlib.compress(data.tobytes(), 6)).decode("ascii")


def decode_lengths(text: str, max_values: int = MAX_DECODED) -> list[int]:
    """The lengths of `encode_lengths`; a blob that is not one, or that inflates past `max_values` lengths, is a
    ProfileError (a few KiB of zlib can stand for gigabytes)."""
    data = array("I" if array("I").itemsize == 4 else "L")
    try:
        inflate = zlib.decompressobj()
        raw = inflate.decompress(base64.b64decode(text, validate=True), max_values * data.itemsize + 1)
    except (binascii.Error, zlib.error, TypeError, ValueError) as exc:
        raise ProfileError(f"a length blob of the profile is corrupt ({exc}); profile the data again") from None
    if len(raw) > max_values * data.itemsize or not inflate.eof or len(raw) % data.itemsize:
        raise ProfileError(f"a length blob of the profile is corrupt (cut short, not whole uint32 values, or more "
                           f"than {max_values:,} lengths); profile the data again")
    data.frombytes(raw)
    if sys.byteorder == "big":
        data.byteswap()
    return data.tolist()


def load_profile(path: str) -> dict:
    """Read and check a profile file (`hpcmem lengths --save FILE`) within the input limits."""
    try:
        profile = load_json_file(path, "length profile")
    except SpecError as exc:
        raise ProfileError(exc.problems[0]) from None
    check_profile(profile)
    return profile


def ordered_parts(profile: Mapping) -> dict[str, list[int]] | None:
    """Per-example lengths by part, in dataset order (every part one value per example), or None."""
    order = profile.get("order")
    if order is None:
        return None
    parts = {name: decode_lengths(blob) for name, blob in order["parts"].items()}
    if len({len(values) for values in parts.values()}) > 1:
        counts = ", ".join(f"{name} {len(values):,}" for name, values in parts.items())
        raise ProfileError(f"length profile: its parts disagree on the number of examples ({counts})")
    return parts


def packed_rows(profile: Mapping, max_length: int, strategy: str) -> list[int] | None:
    """Packed row lengths stored for (max_length, strategy), or None when that max_length was not profiled."""
    for cand in profile.get("candidates", []):
        if cand["max_length"] == max_length and strategy in cand["strategies"]:
            entry = cand["strategies"][strategy]
            entry = cand["strategies"][entry["same_as"]] if "same_as" in entry else entry
            return decode_lengths(entry["row_lengths"])
    return None


def tokens_per_micro_batch(profile: Mapping, *, max_length: int | None, per_device_train_batch_size: int,
                           packing: bool, packing_strategy: str, padding_free: bool,
                           pad_to_multiple_of: int | None, trainer: str | None = None) -> int:
    """Tensor tokens of the worst (largest) micro-batch this profile's dataset makes with these settings.

    worst = the max over the micro-batches taken in dataset order, per_device_train_batch_size examples each, after
    the trainer's max_length rules (hpcmem.data.batches). Exact whenever the profile holds the lengths in order
    (always, up to MAX_ORDERED_EXAMPLES examples) and, with packing, when max_length was one of the profiled
    candidates (TRL's packed rows are stored). Otherwise an upper bound: padded = rows × longest kept sequence,
    padding-free = the sum of the longest rows, packing = rows × max_length.
    GRPO: the prompt part only (max_length is ignored; add B × max_completion_length for the completions).
    DPO: padding_free falls back to padding in TRL 1.16, as here.
    Image-text (/2) profiles: rows cut to max_length, none dropped, always padded (hpcmem.data.batches); packing,
    padding-free, a pad_to_multiple_of TRL's vision collator does not implement, and a max_length that cuts into an
    example's image tokens are ProfileErrors (TRL refuses or fails on each).
    `trainer`, when given, must be the one the profile was tokenized for (a grpo profile also serves rloo, which
    tokenizes prompts the same way).
    """
    check_profile(profile)
    made_for = _made_for(profile, trainer)
    if trainer is not None and (REGISTRY[trainer].lengths.profile_as or trainer) != made_for:
        raise ProfileError(f"the length profile was made for {made_for}, not {trainer}: profile again with "
                           f"`hpcmem lengths DATA --tokenizer PATH --trainer {trainer}`")
    trainer = made_for
    batch = per_device_train_batch_size
    if batch < 1:
        raise ProfileError(f"per_device_train_batch_size must be ≥ 1; got {batch}")
    if profile["schema"] == SCHEMA_VISION:
        return _vision_tokens(profile, trainer, max_length, batch, packing=packing, padding_free=padding_free,
                              pad_to_multiple_of=pad_to_multiple_of)
    if packing:
        if not REGISTRY[trainer].packs:
            raise ProfileError(f"packing is an SFTTrainer feature; this profile was made for {trainer}")
        if packing_strategy not in PACKING_STRATEGIES:
            raise ProfileError(f"packing_strategy must be one of {', '.join(PACKING_STRATEGIES)}; "
                               f"got {packing_strategy!r}")
        if max_length is None:
            raise ProfileError("packing needs a max_length (the packed row length)")
        flatten = padding_free or packing_strategy != "wrapped"
        rows = packed_rows(profile, max_length, packing_strategy)
        if rows is None:  # every packed row is at most max_length long
            return round_up(batch * max_length, pad_to_multiple_of) if flatten else \
                batch * round_up(max_length, pad_to_multiple_of)
        batches = micro_batches(rows, batch, flatten=flatten, pad_to_multiple_of=pad_to_multiple_of)
        return max((tensor for _, tensor in batches), default=0)
    if REGISTRY[trainer].lengths.kl_rows:
        return _kl_tokens(profile, trainer, max_length, batch, pad_to_multiple_of)
    flatten = padding_free and REGISTRY[trainer].packs
    parts = ordered_parts(profile)
    if parts is not None:
        kept = kept_rows(trainer, parts, max_length)
        batches = micro_batches(kept.rows, batch * kept.rows_per_example, flatten=flatten,
                                pad_to_multiple_of=pad_to_multiple_of)
        return max((tensor for _, tensor in batches), default=0)
    return _bound_from_histogram(profile, trainer, max_length, batch, flatten, pad_to_multiple_of)


def label_tokens_per_micro_batch(profile: Mapping, *, max_length: int | None, per_device_train_batch_size: int,
                                 trainer: str | None = None) -> int | None:
    """The most tokens one micro-batch scores, for DPO and KTO: each row's completion, its length less the prompt —
    DPOTrainer and KTOTrainer label the prompt -100 (trl/trainer/dpo_trainer.py, kto_trainer.py) and TRL's fused LM
    head gathers the labelled positions only. Over the micro-batches taken in dataset order after the trainer's
    max_length rules (an example whose prompt reaches max_length is dropped, rows are cut to max_length: as
    `tokens_per_micro_batch`); KTO's KL rows run without gradients and are not counted. None where the profile cannot
    say: another trainer, or no per-example order with a prompt part (the estimate then scores every position)."""
    check_profile(profile)
    made_for = _made_for(profile, trainer)
    parts = ordered_parts(profile) if made_for in ("dpo", "kto") and profile["schema"] != SCHEMA_VISION else None
    if parts is None or "prompt" not in parts:
        return None
    batch = per_device_train_batch_size
    if batch < 1:
        raise ProfileError(f"per_device_train_batch_size must be ≥ 1; got {batch}")
    cut = max_length
    scored: list[int] = []
    for i, prompt in enumerate(parts["prompt"]):
        if cut is not None and prompt >= cut:
            continue
        rows = [parts[name][i] for name in REGISTRY[made_for].lengths.row_parts]
        scored.append(sum(max((n if cut is None else min(n, cut)) - prompt, 0) for n in rows))
    return max((sum(scored[s:s + batch]) for s in range(0, len(scored), batch)), default=0) or None


def _vision_tokens(profile: Mapping, trainer: str, max_length: int | None, batch: int, *, packing: bool,
                   padding_free: bool, pad_to_multiple_of: int | None) -> int:
    """tokens_per_micro_batch of an image-text profile (see there)."""
    if packing or (padding_free and REGISTRY[trainer].packs):
        what = "packing" if packing else "padding_free"
        raise ProfileError(f"{what} is refused for image-text data by TRL 1.16 (SFTTrainer: 'not supported for vision "
                           f"datasets'); this profile holds images: set {what} false")
    if pad_to_multiple_of and (trainer == "dpo" or profile["source"].get("format", "").endswith("prompt_completion")):
        raise ProfileError(f"pad_to_multiple_of {pad_to_multiple_of}: TRL 1.16's vision collator for "
                           f"{profile['source'].get('format')} data does not implement it (NotImplementedError); "
                           "leave it unset")
    cut = max_length if REGISTRY[trainer].lengths.truncates else None
    cut_into = image_cut(profile, cut)
    if cut_into:
        raise ProfileError(f"max_length {cut} cuts into the image tokens of {cut_into:,} example(s) (the last image "
                           f"token of one ends at position {profile['vision']['stats']['image_end']['max']:,}): TRL "
                           "fails there ('Image features and image tokens do not match'); raise max_length or set it "
                           "to none")
    parts = ordered_parts(profile)
    if parts is not None:
        kept = kept_rows(trainer, parts, max_length, vision=True)
        batches = micro_batches(kept.rows, batch * kept.rows_per_example, flatten=False,
                                pad_to_multiple_of=pad_to_multiple_of)
        return max((tensor for _, tensor in batches), default=0)
    longest = max((n for n, c in profile["histogram"] if c > 0), default=0)
    rows = min(sum(c for _, c in profile["histogram"]), batch * len(ROW_PARTS[trainer]))
    return rows * round_up(min(longest, cut) if cut is not None else longest, pad_to_multiple_of)


def image_cut(profile: Mapping, max_length: int | None) -> int:
    """Examples of an image-text profile whose image tokens a cut at max_length reaches (0 for a text profile or no
    cut); without the per-example order, 1 when the longest image end passes it (at least one)."""
    vision = profile.get("vision")
    if vision is None or max_length is None or vision["stats"]["image_end"]["max"] <= max_length:
        return 0
    order = vision.get("order")
    if order is None:
        return 1
    return sum(1 for end in decode_lengths(order["parts"]["image_end"]) if end > max_length)


def vision_per_micro_batch(profile: Mapping, *, per_device_train_batch_size: int) -> dict:
    """The worst micro-batch's images, image tokens, vision patches (DPO runs each example's images twice) and, for a
    tiling processor, tiles, for this batch size, micro-batches taken in dataset order; from the stored maxima (an
    upper bound: B examples each as large as the largest) when the profile has no order. {} for a text-only
    profile."""
    check_profile(profile)
    vision = profile.get("vision")
    if vision is None:
        return {}
    if per_device_train_batch_size < 1:
        raise ProfileError(f"per_device_train_batch_size must be ≥ 1; got {per_device_train_batch_size}")
    copies = vision["rows_per_example"]
    order = vision.get("order")
    out = {}
    for name in ("images", "image_tokens", "patches", "tiles"):
        if not isinstance(vision["stats"].get(name), Mapping):
            continue
        blob = order["parts"].get(name) if order is not None else None
        if not isinstance(blob, str):
            out[name] = per_device_train_batch_size * copies * vision["stats"][name]["max"]
            continue
        values = decode_lengths(blob)
        out[name] = copies * max((sum(values[i:i + per_device_train_batch_size])
                                  for i in range(0, len(values), per_device_train_batch_size)), default=0)
    return out


def _made_for(profile: Mapping, trainer: str | None) -> str:
    """The trainer the profile was tokenized for; a trainer `hpcmem lengths` cannot tokenize for is a ProfileError
    that says what to pass instead."""
    e = REGISTRY.get(trainer) if trainer is not None else None
    if trainer is not None and trainer not in TRAINERS and not (e and e.lengths.profile_as):
        why, instead = (e and e.lengths.unprofiled) or (f"{trainer} is not one of them", "--max_length")
        readers = ", ".join(f"{n}, as {r.lengths.profile_as}" for n, r in REGISTRY.items() if r.lengths.profile_as)
        raise ProfileError(f"--lengths: hpcmem lengths profiles data as {', '.join(TRAINERS)} (and {readers}) "
                           f"tokenize it, not {trainer}: {why}; estimate {trainer} from {instead} instead")
    return profile["source"]["trainer"]


def longest_prompt(profile: Mapping, trainer: str) -> int:
    """GRPO / RLOO: the longest prompt of a grpo profile (its rows are the prompts; the histogram holds every one) —
    what hpcmem's max_prompt_length stands for."""
    check_profile(profile)
    made_for = _made_for(profile, trainer)
    if not REGISTRY[made_for].generates:
        kind = REGISTRY[trainer].lengths.profile_as or trainer
        raise ProfileError(f"the length profile was made for {made_for}, not {trainer}: profile again with "
                           f"`hpcmem lengths DATA --tokenizer PATH --trainer {kind}`")
    return max((n for n, c in profile["histogram"] if c > 0), default=0)


def _kl_tokens(profile: Mapping, trainer: str, max_length: int | None, batch: int,
               pad_to_multiple_of: int | None) -> int:
    """KTO: the worst of its B-row micro-batches and of their KL rows (batches.kto_kl_rows), each padded to its
    longest — both run through the model, so the micro-batch is sized by the longer. Without the order, a bound:
    B rows of max_length, or of twice the longest sequence (a prompt and a completion, each at most that long)."""
    parts = ordered_parts(profile)
    if parts is None or "prompt" not in parts:
        longest = max((n for n, c in profile["histogram"] if c > 0), default=0)
        return batch * round_up(max_length if max_length is not None else 2 * longest, pad_to_multiple_of)
    kept = kept_rows(trainer, parts, max_length)
    kl = kto_kl_rows(parts["prompt"], parts["length"], max_length, batch)
    batches = micro_batches(kept.rows, batch, flatten=False, pad_to_multiple_of=pad_to_multiple_of) + \
        micro_batches(kl, batch, flatten=False, pad_to_multiple_of=pad_to_multiple_of)
    return max((tensor for _, tensor in batches), default=0)


def _bound_from_histogram(profile: Mapping, trainer: str, max_length: int | None, batch: int, flatten: bool,
                          pad_to_multiple_of: int | None) -> int:
    """From the [length, count] pairs alone (work in the number of pairs, not in the counts they hold)."""
    rules = REGISTRY[trainer].lengths
    cap = max_length if rules.truncates else None
    pairs = [(n, c) for n, c in profile["histogram"] if c > 0]
    if cap is not None:
        pairs = [(n, c) for n, c in pairs if n <= cap] if rules.drops_overlong else [(min(n, cap), c) for n, c in pairs]
    rows = min(sum(c for _, c in pairs), batch * len(ROW_PARTS[trainer]))
    if rows == 0:
        return 0
    if not flatten:
        return rows * round_up(max(n for n, _ in pairs), pad_to_multiple_of)
    longest, left = 0, rows                      # the sum of the `rows` longest sequences
    for n, c in sorted(pairs, reverse=True):
        take = min(c, left)
        longest, left = longest + n * take, left - take
        if not left:
            break
    return round_up(longest, pad_to_multiple_of)
