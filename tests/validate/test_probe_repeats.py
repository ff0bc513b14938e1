"""A probe record that repeats an earlier run (`repeat_of`): its peaks count once in the accuracy and the margins'
scoring, its step times still count for speed. Held on the committed H200 records, where five jobs ran twice."""

from __future__ import annotations

from hpcmem.datapath import estimator_dir
from hpcmem.record import read_records
from hpcmem.validate.probes import load
from hpcmem.validate.speed import NOT_MODELLED, rows_for

H200 = estimator_dir() / "probes" / "nvidia-h200.jsonl"
PEAKS = ("peak_allocated_bytes", "peak_reserved_bytes", "device_peak_bytes")


def test_every_repeat_has_its_originals_peaks_byte_for_byte():
    records = {r.id: r for r in read_records(H200)}
    repeats = [r for r in records.values() if r.repeat_of]
    assert len(repeats) == 5
    for r in repeats:
        first = records[r.repeat_of]
        assert first.case == r.case and first.created < r.created
        assert [getattr(first.measured, k) for k in PEAKS] == [getattr(r.measured, k) for k in PEAKS]


def test_a_repeat_is_scored_once_and_timed():
    loaded = load([H200], gpu="nvidia-h200")
    repeats = {r.id for r in loaded.records if r.repeat_of}
    assert repeats and not any(p.record_id in repeats for p in loaded.points)
    timed = {row.record_id for row in rows_for(loaded) if row.source == "steps"}
    # every repeat the throughput model covers is a timed row (GRPO/RLOO: generation is not in that model)
    covered = {r.id for r in loaded.records if r.repeat_of and r.cell[0] not in NOT_MODELLED}
    assert len(covered) == 4 and covered <= timed
