"""The estimate's reserved term for varying batch shapes (hpcmem.estimate.shapes) against its independent oracle: the
caching-allocator model (hpcmem.estimate.caching_allocator) replaying stored streams of padded SFT jobs traced over
micro-batches drawn (seeded) from the shipped length profile (hpcmem/examples/lengths-sft.json), with and without
`torch_empty_cache_steps` (hpcmem.lab.shape_sequences; estimator/LOG.md). The hand-worked allocator case of the
Trainer's empty_cache cadence is in tests/trace/test_trace_replay.py."""

from __future__ import annotations

import dataclasses
import json
from functools import lru_cache
from pathlib import Path

import pytest

from hpcmem.data.profile import load_profile
from hpcmem.estimate import estimate
from hpcmem.estimate.shapes import COEFFICIENTS, GROUPS, NEEDED_SHARE, SAFETY, batch_bytes, cadence, group, shapes_bytes
from hpcmem.estimate.verdict import safe_bound
from hpcmem.gpus.lookup import gpu_spec
from hpcmem.job.trainers.fields import MODELLED, classify
from hpcmem.job.trl_config import build_job
from hpcmem.lab.shape_sequences import (
    draw_rows,
    excess,
    fitted,
    padded_lengths,
    reordered,
    step_blocks,
    stream_job,
    survey,
)
from hpcmem.trace.events import load

ROOT = Path(__file__).resolve().parents[2]
STREAMS_DIR = ROOT / "estimator" / "allocator" / "shapes"
STREAMS = sorted(STREAMS_DIR.glob("*.json.gz"))
FIT = json.loads((ROOT / "estimator" / "shapes-fit.json").read_text())
GIB = 1024**3
QWEN = {"model_name_or_path": "Qwen/Qwen2.5-0.5B", "dtype": "bfloat16", "max_length": 1024}


@lru_cache(maxsize=None)
def stored(path: Path) -> dict:
    return load(path)


def test_streams_are_shipped():
    assert len(STREAMS) >= 3


@pytest.mark.parametrize("path", STREAMS, ids=[p.name.removesuffix(".json.gz") for p in STREAMS])
def test_stream_is_the_profiles_seeded_draw(path):
    # the stored sequence's shapes are the ones the seed draws from the shipped profile: padded to the longest row
    data = stored(path)
    t = stream_job(data, None).train
    rows = draw_rows(load_profile(ROOT / data["profile"])["histogram"],
                     data["steps"] * t.per_device_train_batch_size * t.gradient_accumulation_steps, data["seed"],
                     t.max_length)
    assert padded_lengths(rows, t.per_device_train_batch_size, t.pad_to_multiple_of) == data["widths"]
    assert len(set(data["widths"])) > data["steps"] // 2          # the shape changes nearly every step


def test_survey_replays_as_stored():
    # the first two orders of the first stream (the drawn one and one shuffle), both modes, with and without
    # empty_cache, replayed again through the allocator model give the excess the shipped fit holds
    first = STREAMS[0]
    again = survey({first.name.removesuffix(".json.gz"): stored(first)}, 2, FIT["seed"], cadences=(None, 1))
    kept = {key(r): r["excess_bytes"] for r in FIT["rows"]}
    assert {key(r): r["excess_bytes"] for r in again} == {key(r): kept[key(r)] for r in again}


def key(row: dict) -> tuple:
    return row["stream"], row["order"], row["mode"], row["cadence"]


def test_coefficients_are_the_fit_of_the_survey():
    assert FIT["coefficients"] == fitted(FIT["rows"]) == COEFFICIENTS
    assert FIT["orders"] >= 10 and len({r["stream"] for r in FIT["rows"]}) == len(STREAMS)


def test_estimate_covers_every_surveyed_sequence():
    # what each replayed sequence reserved above the constant worst batch, in the allocator model, is within the
    # estimate's term for that job, mode and cadence
    for r in FIT["rows"]:
        assert r["excess_bytes"] <= term(r["stream"], r["mode"], r["cadence"]), key(r)


@lru_cache(maxsize=None)
def term(stream: str, mode: str, every: int | None) -> int:
    job = stream_job(stored(STREAMS_DIR / f"{stream}.json.gz"), every, mode == "expandable")
    return shapes_bytes(job, estimate(job).phases)


def test_term_is_the_coefficient_times_the_batch_bytes():
    job = build_job("sft", {**QWEN, "torch_empty_cache_steps": 1})[0]
    phases = estimate(job).phases
    c = COEFFICIENTS["default, checkpointed"]["1"]
    assert shapes_bytes(job, phases) == int(c * SAFETY * batch_bytes(phases))
    # W is the peak phase's activations and temporaries: below the whole peak, above the checkpointed layer inputs
    assert 0 < batch_bytes(phases) < max(p.bytes for p in phases)


PADDING_FREE = {"padding_free": True, "attn_implementation": "flash_attention_2", "max_length": None}


@pytest.mark.parametrize("change", [{"packing": True}, {"use_peft": True, "packing": True}, PADDING_FREE])
def test_no_term_where_the_shape_does_not_follow_the_rows(change):
    job = build_job("sft", {**QWEN, "torch_empty_cache_steps": 1, **change})[0]
    assert shapes_bytes(job, estimate(job).phases) == 0


@pytest.mark.parametrize(("every", "cls"),
                         [(None, "never"), (1, "1"), (2, "2-4"), (4, "2-4"), (5, "≥5"), (50, "≥5")])
def test_cadence_classes(every, cls):
    job = build_job("sft", {**QWEN, "torch_empty_cache_steps": every})[0]
    assert cadence(job) == cls
    # k ≥ 5 was not replayed: the larger of never emptying and emptying every 2–4 steps
    c = COEFFICIENTS["default, checkpointed"]
    expected = max(c["never"], c["2-4"]) if cls == "≥5" else c[cls]
    assert shapes_bytes(job, estimate(job).phases) == int(expected * SAFETY * batch_bytes(estimate(job).phases))


def test_groups_by_mode_and_checkpointing():
    # every group the estimate can ask for has been fitted, and without checkpointing (every layer's activations
    # alive) never emptying fragments more than with it
    assert set(COEFFICIENTS) == set(GROUPS) == {r["group"] for r in FIT["rows"]}
    assert COEFFICIENTS["default, not checkpointed"]["never"] > COEFFICIENTS["default, checkpointed"]["never"]
    job = build_job("sft", {**QWEN, "gradient_checkpointing": False})[0]
    assert group(job) == "default, not checkpointed"
    assert group(dataclasses.replace(job, expandable_segments=True)) == "expandable, not checkpointed"


def test_torch_empty_cache_steps_is_a_modelled_field():
    assert classify("SFTConfig", "torch_empty_cache_steps").kind == MODELLED
    job, ignored = build_job("sft", {**QWEN, "torch_empty_cache_steps": 4})
    assert job.train.torch_empty_cache_steps == 4 and "torch_empty_cache_steps" not in ignored


def test_verdict_adds_the_needed_share_of_the_term_to_the_safe_bound():
    job = build_job("sft", {**QWEN, "gpu": "H200", "torch_empty_cache_steps": 1})[0]
    est = estimate(job)
    v = est.verdict
    assert v.shapes_bytes == est.shapes_needed_bytes > 0
    assert est.shapes_needed_bytes == int(est.reserved_shapes_bytes * NEEDED_SHARE[group(job)])
    assert v.safe_device_peak_bytes == safe_bound(est.device_peak_bytes, gpu_spec("H200"), est.reserved_spread_bytes,
                                                  shapes_bytes=est.shapes_needed_bytes)
    assert v.safe_device_peak_bytes > safe_bound(est.device_peak_bytes, gpu_spec("H200"), est.reserved_spread_bytes)
    assert "shapes" in v.line()


def test_reordering_in_the_drawn_order_replays_the_stream_itself():
    # the survey's shuffles rebuild the stream from per-step blocks; in the drawn order that is the traced stream
    # (the few scalars a later step frees are freed at the end of their own step: too small to move reserved)
    data = stored(STREAMS[0])
    n = len(step_blocks(data["events"])[1])
    again = reordered(data["events"], list(range(n)))
    for every in (None, 1):
        assert excess(again, 0, every) == excess(data["events"], 0, every)
