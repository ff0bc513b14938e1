"""`hpcmem lengths`: profile a dataset's token lengths for a TRL trainer and advise on max_length and packing."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import click

from hpcmem.cli.outputs import PNG, PROFILE
from hpcmem.data.batches import TRAINERS
from hpcmem.data.processor import check_resolution
from hpcmem.data.profiler import profile_dataset
from hpcmem.data.render import plot, report
from hpcmem.errors import HpcmemError

FILE = click.Path(dir_okay=False, path_type=Path)


def _names(field: str, *more: str) -> list[str]:
    """A TRL field's flag spellings, as elsewhere in hpcmem: --max_length and --max-length."""
    return [f"--{field}", f"--{field.replace('_', '-')}", *more]


@click.command("lengths")
@click.argument("data")
@click.option("--tokenizer", default=None, help="Text data: a local tokenizer folder, or a Hub name already in the "
              "local cache.")
@click.option("--processor", default=None,
              help="Image-text data (an 'images' or 'image' column): the model's processor (AutoProcessor), a local "
                   "folder or a cached Hub name; image tokens and patches are counted for the Qwen2-VL family "
                   "(Qwen2-VL, Qwen2.5-VL, Qwen3-VL, PaddleOCR-VL) and the tiling Idefics3 and SmolVLM.")
@click.option(*_names("min_pixels"), type=int, default=None,
              help="With a Qwen2-VL-family --processor: its min_pixels (size.shortest_edge; default: the "
                   "processor's).")
@click.option(*_names("max_pixels"), type=int, default=None,
              help="With a Qwen2-VL-family --processor: its max_pixels (size.longest_edge; default: the "
                   "processor's).")
@click.option("--trainer", type=click.Choice(TRAINERS), default="sft", show_default=True,
              help="Tokenize as this trainer does: sft (text / messages / prompt+completion), dpo and reward "
                   "(prompt+chosen and prompt+rejected), grpo (the prompt), kto (prompt+completion, paired data "
                   "unpaired as TRL does; the KL rows from them).")
@click.option("--split", default="train", show_default=True, help="Split of a DatasetDict folder or a cached dataset.")
@click.option(*_names("dataset_text_field"), default="text", show_default=True, help="SFT column holding plain text.")
@click.option(*_names("per_device_train_batch_size"), type=click.IntRange(min=1), default=8, show_default=True,
              help="Examples per micro-batch for the padded / padding-free figures.")
@click.option(*_names("pad_to_multiple_of"), type=click.IntRange(min=1), default=None,
              help="Round each micro-batch's sequence length up to a multiple of this (default: no rounding).")
@click.option(*_names("max_length", "max_lengths"), type=click.IntRange(min=1), multiple=True,
              help="Also profile this max_length (repeatable); powers of two, p95 and p99 always are.")
@click.option(*_names("dataset_num_proc", "--num_proc", "--num-proc"), type=click.IntRange(min=1), default=None,
              help="Processes that tokenize (default one) and that run the packing candidates (default: every "
                   "core, from 20k examples up).")
@click.option("--plot", "plot_path", type=PNG, default=None, help="Also write a histogram PNG here (matplotlib).")
@click.option("--log-x", "--log_x", "log_x", is_flag=True, help="Logarithmic length axis for the histograms.")
@click.option("--json", "as_json", is_flag=True,
              help="Print the profile JSON (hpcmem.lengths/1; /2 with images), not the report.")
@click.option("--save", "save_path", type=PROFILE, default=None,
              help="Write the profile JSON here, for `hpcmem estimate --lengths FILE`.")
def command(data, tokenizer, processor, min_pixels, max_pixels, trainer, split, dataset_text_field,
            per_device_train_batch_size, pad_to_multiple_of, max_lengths, dataset_num_proc, plot_path, log_x, as_json,
            save_path):
    """Token lengths of DATA as TRL's TRAINER tokenizes it: percentiles, histogram, what each max_length truncates,
    and rows, padding and worst / typical tokens per micro-batch for padded, padding-free and packing bfd /
    bfd_split / wrapped (TRL's own pack_dataset). Image-text data (--processor): text and image tokens, patches and
    images per example, as TRL's vision collator runs the processor. DATA: a .jsonl/.json/.csv/.parquet file, a
    save_to_disk folder, a folder of data files or a dataset name in the local cache. Never contacts the Hub."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import datasets

    # progress: datasets' bars on a terminal; plain stage lines when stderr is piped; nothing with --json
    bars = not as_json and sys.stderr.isatty()
    if not bars:
        datasets.disable_progress_bars()
    say = None if as_json or bars else (lambda text: click.echo(f"lengths: {text}", err=True))
    resolution = check_resolution(min_pixels, max_pixels)
    profile = profile_dataset(data, tokenizer, processor=processor, resolution=resolution, trainer=trainer,
                              split=split, dataset_text_field=dataset_text_field,
                              per_device_train_batch_size=per_device_train_batch_size,
                              pad_to_multiple_of=pad_to_multiple_of, max_lengths=max_lengths,
                              num_proc=dataset_num_proc, say=say)
    if save_path:
        try:
            save_path.write_text(json.dumps(profile, indent=1) + "\n")
        except OSError as exc:
            raise HpcmemError(f"--save {save_path}: cannot write the profile ({exc.strerror or exc})") from None
    if plot_path:
        plot(profile, str(plot_path), log_x=log_x)
    click.echo(json.dumps(profile, indent=1) if as_json else report(profile, log_x=log_x))
