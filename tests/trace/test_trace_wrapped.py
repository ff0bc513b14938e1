"""Wrapped packing's worst micro-batch: TRL cuts each map batch of the dataset into chunks of max_length, so every map
batch ends in a shorter chunk (trl/data_utils.py `_pack_wrapped`), and the micro-batch that draws it is padded —
transformers then builds a 4-D attention mask, which the estimate counts for every multi-row micro-batch
(hpcmem.job.shape `MicroBatch.masked`). The trace's design must reach that batch too.

Known answers: TRL's own `pack_dataset` on a dataset TRL would pack for a real run, and on the trace's dataset."""

from __future__ import annotations

import pytest

pytest.importorskip("trl")

from trl import pack_dataset  # noqa: E402

from hpcmem.job.jobspec import JobSpec  # noqa: E402
from hpcmem.job.spec import TrainSpec  # noqa: E402
from hpcmem.trace.data import design_batch, make_dataset  # noqa: E402
from tests.trace.test_trace_unit import llama  # noqa: E402


def _chunks(dataset, length: int) -> list[int]:
    return [len(r) for r in pack_dataset(dataset, length, strategy="wrapped")["input_ids"]]


def test_every_map_batch_ends_in_a_short_chunk() -> None:
    """Real data: 2,500 documents of 37 tokens packed to 128 — datasets.map's batches of 1,000 each end short."""
    from datasets import Dataset

    docs = Dataset.from_dict({"input_ids": [[5] * 37] * 2500})
    lengths = _chunks(docs, 128)
    assert sum(lengths) == 2500 * 37
    # one per map batch: 37,000 tokens = 289 × 128 + 8, twice, then 18,500 = 144 × 128 + 68
    assert [n for n in lengths if n < 128] == [8, 8, 68]


@pytest.mark.parametrize("micro_batches", [1, 4])
def test_trace_dataset_reaches_the_padded_micro_batch(micro_batches: int) -> None:
    """The trace's rows (sequential sampling) give full micro-batches of 3 rows and a last one whose last row is
    shorter: the padded batch a real run draws."""
    job = JobSpec(model=llama(), train=TrainSpec(trainer="sft", max_length=100, per_device_train_batch_size=3,
                                                 packing=True, packing_strategy="wrapped"))
    design = design_batch(job)
    lengths = _chunks(make_dataset(design, micro_batches, 1000), 100)
    assert len(lengths) == 3 * micro_batches
    assert lengths[:-1] == [100] * (3 * micro_batches - 1)
    assert lengths[-1] < 100
