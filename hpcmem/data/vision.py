"""Token and patch counts of image-text examples, by running the real processor as TRL 1.16's vision collators do
(datasets, torch, trl imported inside the functions).

TRL skips dataset preparation for an image dataset (`_is_vision_dataset`: an "image" or "images" column) and
processes each batch on the fly; each call below is the one the collator makes, without truncation:
- SFT `DataCollatorForVisionLanguageModeling._collate_language_modeling` (trl/trainer/sft_trainer.py): "messages" →
  `prepare_multimodal_messages(messages, images)`, then `processor.apply_chat_template(..., tokenize=True,
  processor_kwargs={padding, padding_side="right", add_special_tokens=False})`; a `dataset_text_field` column →
  `processor(images=, text=)`.
- SFT `_collate_prompt_completion`: the prompt (with the images) and the completion processed apart
  (`trl.data_utils.apply_chat_template` renders a conversational pair), each row = prompt + completion.
- DPO `DataCollatorForVisionPreference.torch_call` (trl/trainer/dpo_trainer.py): the prompt twice (its images
  repeated: `pixel_values` holds them once per row), then prompt + chosen and prompt + rejected.
- GRPO `_generate_and_score_completions` → `prepare_multimodal_messages(prompt, images)` and `_tokenize_prompts`:
  `processor.apply_chat_template(conversation=prompts, add_generation_prompt=True, tokenize=True)`.

Per example the counts are: the row part lengths (what the trainer's rows hold: text and image tokens), `images`,
`image_tokens` (the processor's `image_token_id` in the row: what it expanded each placeholder to), `patches`
(what the vision encoder gets from the example's images, once: grid family, the `pixel_values` rows, the sum of
`image_grid_thw.prod()`; tiles family, its tiles × patches per tile), `tiles` (tiles family: the example's
`pixel_values` tiles that are not all zeros), and `image_end` (the row position just past its last image token: a
max_length below it cuts into the image, which TRL cannot train — "Image features and image tokens do not match").
The families are hpcmem.data.processor's.
"""

from __future__ import annotations

from collections.abc import Mapping

from hpcmem.data.errors import LengthsError, MissingColumn

IMAGE_COLUMNS = ("images", "image")
VISION_PARTS = ("images", "image_tokens", "patches", "image_end")
# Trainers whose image-text data is counted here (reward and kto have vision collators in TRL 1.16 too, not counted)
VISION_TRAINERS = ("sft", "dpo", "grpo")
# examples per processor call: each call holds its images' pixel_values in memory (up to max_pixels × 3 floats each)
BATCH = 8


def image_column(columns) -> str | None:
    """The column TRL reads images from ("images": a list per example, "image": one), or None (text-only data)."""
    return next((c for c in IMAGE_COLUMNS if c in columns), None)


def detect_vision_format(trainer: str, columns: list[str], first: Mapping, text_field: str) -> str:
    """The dataset type TRL's vision collator sees, or a one-line error naming what it needs."""
    from trl.data_utils import is_conversational

    if trainer not in VISION_TRAINERS:
        raise LengthsError(f"image-text data is profiled for {', '.join(VISION_TRAINERS)}; --trainer {trainer} with "
                           "images is not counted by hpcmem lengths")
    have = ", ".join(columns)
    conv = is_conversational(first)
    if trainer == "sft":
        if "messages" in columns:
            return "conversational"
        if text_field in columns:
            return "text"
        if "prompt" in columns and "completion" in columns:
            return "conversational_prompt_completion" if conv else "prompt_completion"
        raise MissingColumn(f"SFT image-text data needs 'messages', a {text_field!r} column (--dataset-text-field) "
                            f"or 'prompt'+'completion' next to its images; found: {have}")
    if trainer == "dpo":
        missing = [c for c in ("prompt", "chosen", "rejected") if c not in columns]
        if missing:
            raise MissingColumn(f"DPO image-text data needs 'prompt', 'chosen' and 'rejected' columns (TRL's vision "
                                f"collator extracts no implicit prompt); missing {', '.join(missing)}; found: {have}")
        return "conversational_preference" if conv else "preference"
    if "prompt" not in columns:
        raise MissingColumn(f"GRPO data needs a 'prompt' column; found: {have}")
    if not conv:
        raise MissingColumn("GRPO image-text data needs conversational prompts (TRL: 'Multimodal training requires "
                            "conversational prompts'); the 'prompt' column holds plain text")
    return "conversational_prompt"


def row_parts(trainer: str, fmt: str) -> tuple[str, ...]:
    """The length parts an example gives (as the text profiler's): rows, and the prompt where rows extend it."""
    if trainer == "dpo":
        return ("prompt", "chosen", "rejected")
    if trainer == "grpo":
        return ("prompt",)
    return ("length", "prompt") if fmt.endswith("prompt_completion") else ("length",)


def _images(example: Mapping, column: str) -> list:
    """The example's images as TRL takes them: "image" becomes a one-image list; None or a missing list is none."""
    value = example.get(column)
    if column == "image":
        return [] if value is None else [value]
    return list(value or [])


def _rows(output, image_token_id: int) -> list[tuple[int, int, int]]:
    """(length, image tokens, position past the last image token) of each row of a processor output, padding left
    out (its attention mask)."""
    out = []
    ids_rows, mask_rows = (v.tolist() if hasattr(v, "tolist") else v
                           for v in (output["input_ids"], output["attention_mask"]))
    for ids, mask in zip(ids_rows, mask_rows, strict=True):
        real = [t for t, m in zip(ids, mask, strict=True) if m]
        where = [i for i, t in enumerate(real) if t == image_token_id]
        out.append((len(real), len(where), where[-1] + 1 if where else 0))
    return out


def _tiles(output, n: int) -> list[int]:
    """Tiles family: per example, its tiles of `pixel_values` [examples, tiles, 3, side, side] that are not all zeros
    (what `Idefics3Model.get_image_features` keeps: `real_images_inds`)."""
    pixels = output.get("pixel_values")
    if pixels is None:
        return [0] * n
    return (pixels != 0).flatten(2).any(-1).sum(1).tolist()


def _patches(output, counts: list[int]) -> list[int]:
    """pixel_values rows per example: image_grid_thw's t·h·w of its images, in order; checked against pixel_values."""
    grid = output.get("image_grid_thw")
    if grid is None:
        if any(counts):
            raise LengthsError("the processor returned no image_grid_thw for images: its patches are not counted")
        return [0] * len(counts)
    per_image = [int(t) * int(h) * int(w) for t, h, w in grid.tolist()]
    pixels = output.get("pixel_values")
    if len(per_image) != sum(counts) or (pixels is not None and int(pixels.shape[0]) != sum(per_image)):
        shape = tuple(pixels.shape) if pixels is not None else None
        raise LengthsError(f"the processor returned {len(per_image)} image grids for {sum(counts)} images "
                           f"({sum(per_image)} patches, pixel_values {shape}): hpcmem cannot tell which patches "
                           "belong to which example")
    out, start = [], 0
    for n in counts:
        out.append(sum(per_image[start:start + n]))
        start += n
    return out


def _check_row(rows: list[tuple[int, int, int]], counts: list[int]) -> None:
    for i, ((_, image_tokens, _), n) in enumerate(zip(rows, counts)):
        if n and not image_tokens:
            raise LengthsError(f"an example with {n} image(s) has no image token after processing (batch row {i}): "
                               "its text has no image placeholder the processor expands")


def vision_batch(batch: dict[str, list], *, processor, trainer: str, fmt: str, text_field: str, column: str,
                 patches_per_tile: int | None = None) -> dict:
    """datasets.map(batched=True) body: a batch of raw image-text examples → their part lengths and vision counts;
    `patches_per_tile` set: the tiles family (hpcmem.data.processor), else the grid family."""
    from trl.data_utils import apply_chat_template, prepare_multimodal_messages

    n = len(next(iter(batch.values())))
    examples = [{k: batch[k][i] for k in batch} for i in range(n)]
    images = [_images(ex, column) for ex in examples]
    counts = [len(imgs) for imgs in images]
    batch_images = None if all(c == 0 for c in counts) else images   # "Transformers requires at least one image"
    token = processor.image_token_id
    pad = {"padding": True, "return_tensors": "pt", "add_special_tokens": False}
    if fmt == "conversational" or trainer == "grpo":
        key = "messages" if trainer == "sft" else "prompt"
        convs = [prepare_multimodal_messages(ex[key], images=imgs) for ex, imgs in zip(examples, images)]
        if trainer == "grpo":
            out = processor.apply_chat_template(conversation=convs, add_generation_prompt=True, tokenize=True,
                                                return_dict=True, padding=True, return_tensors="pt")
        else:
            out = processor.apply_chat_template(convs, tokenize=True, return_dict=True, return_tensors="pt",
                                                processor_kwargs={**pad, "padding_side": "right"})
        rows = _rows(out, token)
        _check_row(rows, counts)
        return {row_parts(trainer, fmt)[0]: [r[0] for r in rows], **_vision(rows, counts, out, patches_per_tile)}
    if fmt == "text":
        out = processor(images=batch_images, text=[ex[text_field] for ex in examples], padding_side="right", **pad)
        rows = _rows(out, token)
        _check_row(rows, counts)
        return {"length": [r[0] for r in rows], **_vision(rows, counts, out, patches_per_tile)}
    seconds = ("chosen", "rejected") if trainer == "dpo" else ("completion",)
    if fmt.startswith("conversational"):
        for ex, imgs in zip(examples, images):
            ex["prompt"] = prepare_multimodal_messages(ex["prompt"], images=imgs)
            for k in seconds:
                ex[k] = prepare_multimodal_messages(ex[k])
        examples = [apply_chat_template(ex, processor) for ex in examples]
    prompts = processor(images=batch_images, text=[ex["prompt"] for ex in examples], padding_side="left", **pad)
    prompt_rows = _rows(prompts, token)
    _check_row(prompt_rows, counts)
    out = {"prompt": [r[0] for r in prompt_rows]}
    for k in seconds:
        done = processor(text=[ex[k] for ex in examples], padding_side="right", **pad)
        extra = _rows(done, token)
        out["length" if k == "completion" else k] = [p[0] + e[0] for p, e in zip(prompt_rows, extra)]
    return {**out, **_vision(prompt_rows, counts, prompts, patches_per_tile)}


def _vision(rows: list[tuple[int, int, int]], counts: list[int], output, patches_per_tile: int | None) -> dict:
    out = {"images": counts, "image_tokens": [r[1] for r in rows], "image_end": [r[2] for r in rows]}
    if patches_per_tile is None:
        return {**out, "patches": _patches(output, counts)}
    tiles = _tiles(output, len(counts))
    return {**out, "tiles": tiles, "patches": [t * patches_per_tile for t in tiles]}


def vision_lengths(dataset, processor, *, trainer: str, dataset_text_field: str = "text", num_proc: int | None = None,
                   patches_per_tile: int | None = None) -> tuple[str, dict[str, list[int]]]:
    """(format, {part: values in dataset order}): the row parts and VISION_PARTS (and `tiles`, tiles family) of every
    example."""
    columns = list(dataset.column_names)
    column = image_column(columns)
    fmt = detect_vision_format(trainer, columns, dataset[0], dataset_text_field)
    names = row_parts(trainer, fmt) + VISION_PARTS + (("tiles",) if patches_per_tile is not None else ())
    try:
        out = dataset.map(vision_batch, batched=True, batch_size=BATCH, num_proc=num_proc, remove_columns=columns,
                          keep_in_memory=True, desc=f"Processing images and text for {trainer} ({fmt})",
                          fn_kwargs={"processor": processor, "trainer": trainer, "fmt": fmt,
                                     "text_field": dataset_text_field, "column": column,
                                     "patches_per_tile": patches_per_tile})
    except LengthsError:
        raise
    except Exception as exc:  # the processor raises ValueError / TypeError / KeyError / OSError on bad rows
        text = " ".join(str(exc).split())
        raise LengthsError(f"the processor {type(processor).__name__} could not process the {fmt} image-text data "
                           f"for {trainer}: {exc.__class__.__name__}: {text[:300]}") from exc
    return fmt, {name: out.data.column(name).to_pylist() for name in names}
