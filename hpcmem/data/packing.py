"""Packed row lengths from TRL's own `trl.pack_dataset` (datasets, pyarrow, trl imported inside the functions).

Packing sees only how long each sequence is, so the profiler hands it a stand-in dataset: one `input_ids` list per
example of the right length, of Arrow nulls (no memory for values; token values never matter to bfd, bfd_split or
wrapped, and a test pins the rows against `pack_dataset` on real token ids).
It is packed as SFTTrainer packs it: `pack_dataset(dataset, max_length, strategy, map_kwargs)` over the
untruncated sequences in dataset order (shuffle_dataset=False, TRL's default), in `datasets.map`'s default batches
of PACK_BATCH_SIZE examples, in one process (dataset_num_proc=None, TRL's default). Different (max_length,
strategy) runs are independent, so large datasets spread the runs over worker processes; each run itself is
exactly TRL's.
"""

from __future__ import annotations

import multiprocessing
import os
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor

PACK_BATCH_SIZE = 1000           # datasets.Dataset.map's default batch_size, which pack_dataset keeps
PARALLEL_MIN_EXAMPLES = 20_000   # below this, worker start-up costs more than it saves


def stand_in(lengths: Sequence[int]):
    """A datasets.Dataset with one `input_ids` row of nulls per length."""
    import numpy as np
    import pyarrow as pa
    from datasets import Dataset

    sizes = np.asarray(lengths, dtype=np.int64)
    offsets = np.zeros(len(sizes) + 1, dtype=np.int64)
    np.cumsum(sizes, out=offsets[1:])
    values = pa.nulls(int(offsets[-1]))
    if offsets[-1] < 2**31 - 1:
        column = pa.ListArray.from_arrays(pa.array(offsets.astype(np.int32)), values)
    else:
        column = pa.LargeListArray.from_arrays(pa.array(offsets), values)
    return Dataset(pa.table({"input_ids": column}))


def packed_row_lengths(dataset, max_length: int, strategy: str) -> list[int]:
    """Row lengths of `trl.pack_dataset(dataset, max_length, strategy)`, in the packed dataset's order."""
    import pyarrow.compute as pc
    from trl import pack_dataset

    packed = pack_dataset(dataset, max_length, strategy,
                          {"keep_in_memory": True, "desc": f"Packing max_length={max_length} {strategy}"})
    return pc.list_value_length(packed.data.column("input_ids")).to_pylist()


_WORKER_DATASET = None


def _init_worker(lengths: Sequence[int]) -> None:
    global _WORKER_DATASET
    import datasets

    datasets.disable_progress_bars()
    _WORKER_DATASET = stand_in(lengths)


def _run(job: tuple[int, str]) -> tuple[tuple[int, str], list[int]]:
    return job, packed_row_lengths(_WORKER_DATASET, *job)


def pack_all(lengths: Sequence[int], jobs: Sequence[tuple[int, str]], *,
             num_proc: int | None = None) -> dict[tuple[int, str], list[int]]:
    """{(max_length, strategy): packed row lengths} for every job; worker processes when the data is large."""
    import datasets
    from datasets.utils.tqdm import tqdm

    workers = min(len(jobs), num_proc or os.cpu_count() or 1)
    if workers <= 1 or len(lengths) < PARALLEL_MIN_EXAMPLES:
        bar = tqdm(total=len(jobs), desc="Packing with trl.pack_dataset")
        dataset = stand_in(lengths)
        quiet = datasets.are_progress_bars_disabled()
        datasets.disable_progress_bars()   # one bar for all runs, not one per run
        try:
            out = {}
            for job in jobs:
                out[job] = packed_row_lengths(dataset, *job)
                bar.update()
            return out
        finally:
            bar.close()
            if not quiet:
                datasets.enable_progress_bars()
    method = "fork" if "fork" in multiprocessing.get_all_start_methods() else None
    out = {}
    with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context(method), initializer=_init_worker,
                             initargs=(list(lengths),)) as pool:
        runs = tqdm(pool.map(_run, jobs), total=len(jobs), desc=f"Packing with trl.pack_dataset ({workers} processes)")
        for job, rows in runs:
            out[job] = rows
    return out
