"""Probe records (fast tier, no torch): atomic appends under many concurrent writers, slugs, spec round trip."""

from __future__ import annotations

import json
import multiprocessing as mp
from pathlib import Path

import pytest

from hpcmem.gpus.catalog import gpu_slug
from hpcmem.record import (
    append_record,
    job_from_dict,
    job_to_dict,
    package_versions,
    read_lines,
    read_records,
    records_path,
    relevant_env,
)

NUM_WRITERS = 64
LINES_EACH = 12


def _writer(path: str, writer: int) -> None:
    for seq in range(LINES_EACH):
        # sizes from tiny to well past PIPE_BUF (4 KiB) and a page: a torn line would show as bad JSON
        pad = "x" * ((writer * 7919 + seq * 104729) % 200_000)
        append_record(path, {"writer": writer, "seq": seq, "pad": pad, "nested": {"w": writer, "list": [seq] * 5}})


def test_many_concurrent_writers_keep_every_line_whole(tmp_path: Path) -> None:
    path = str(tmp_path / "probes" / "cpu.jsonl")
    ctx = mp.get_context("fork")
    procs = [ctx.Process(target=_writer, args=(path, w)) for w in range(NUM_WRITERS)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=120)
        assert p.exitcode == 0
    raw = Path(path).read_bytes()
    assert raw.endswith(b"\n")
    lines = raw.split(b"\n")[:-1]
    assert len(lines) == NUM_WRITERS * LINES_EACH
    seen = set()
    for line in lines:
        rec = json.loads(line)                      # every line parses: none torn or interleaved
        assert rec["nested"]["w"] == rec["writer"]
        assert len(rec["pad"]) == (rec["writer"] * 7919 + rec["seq"] * 104729) % 200_000
        seen.add((rec["writer"], rec["seq"]))
    assert seen == {(w, s) for w in range(NUM_WRITERS) for s in range(LINES_EACH)}
    assert len(read_lines(path)) == NUM_WRITERS * LINES_EACH


def test_read_records_names_the_bad_line(tmp_path: Path) -> None:
    path = tmp_path / "x.jsonl"
    append_record(path, {"a": 1})
    with open(path, "a") as fh:
        fh.write('{"torn": \n')
    with pytest.raises(ValueError, match=r"x.jsonl:2"):
        read_records(path)


@pytest.mark.parametrize(("name", "slug"), [("NVIDIA H200", "nvidia-h200"),
                                            ("NVIDIA A100-SXM4-80GB", "nvidia-a100-sxm4-80gb"),
                                            (None, "cpu"), ("", "cpu")])
def test_gpu_slug(name: str | None, slug: str) -> None:
    assert gpu_slug(name) == slug


def test_records_live_per_gpu(tmp_path: Path) -> None:
    assert records_path(None, tmp_path) == tmp_path / "probes" / "cpu.jsonl"
    assert records_path("NVIDIA H100 80GB HBM3", tmp_path) == tmp_path / "probes" / "nvidia-h100-80gb-hbm3.jsonl"


def test_job_round_trips_through_a_record() -> None:
    from hpcmem.job.trl_config import build_job

    job, _ = build_job("sft", {"model_name_or_path": "Qwen/Qwen2.5-0.5B", "use_peft": True,
                               "lora_target_modules": "q_proj,v_proj", "packing": True,
                               "distributed_type": "DEEPSPEED", "zero_stage": 3, "num_processes": 4})
    data = json.loads(json.dumps(job_to_dict(job)))
    assert job_from_dict(data) == job


@pytest.mark.parametrize("model", ["Qwen/Qwen2.5-VL-7B-Instruct", "google/gemma-3-4b-it", "llava-hf/llava-1.5-7b-hf"])
def test_an_image_job_round_trips_with_its_config(model: str) -> None:
    """A vision-language job's tower spec (a nested dataclass per family) comes back from the record's config.json;
    without the config the record says so in one line instead of handing the estimate a dict."""
    from hpcmem.errors import SpecError
    from hpcmem.job.trl_config import build_job
    from hpcmem.probe.fixtures import hf_config

    job, _ = build_job("sft", {"model_name_or_path": model, "use_peft": True, "lora_target_modules": "all-linear",
                               "images_per_example": 2, "image_height": 480, "image_width": 640, "max_length": 4096})
    data = json.loads(json.dumps(job_to_dict(job)))
    assert job_from_dict(data, model_config=hf_config(model)) == job
    with pytest.raises(SpecError, match="model_config"):
        job_from_dict(data)


def test_versions_and_env_are_read_without_importing_torch(monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")
    before = "torch" in sys.modules
    versions = package_versions()
    assert {"python", "torch", "transformers", "trl", "peft", "accelerate", "deepspeed"} <= set(versions)
    assert relevant_env()["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:True"
    assert ("torch" in sys.modules) == before


@pytest.mark.parametrize("env, expected", [
    ({"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}, True),
    ({"PYTORCH_ALLOC_CONF": "max_split_size_mb:128, expandable_segments:True"}, True),
    # torch's parser accepts only True/False (tests/job/test_job_env.py holds it to torch's own): "true" ran nothing
    ({"PYTORCH_ALLOC_CONF": "max_split_size_mb:128, expandable_segments:true"}, False),
    ({"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:False"}, False),
    ({"PYTORCH_CUDA_ALLOC_CONF": "garbage_collection_threshold:0.6"}, False),
    ({}, False),
    (None, False),
])
def test_expandable_segments_read_from_the_allocator_env(env, expected):
    from hpcmem.record import expandable_in_env

    assert expandable_in_env(env) is expected


def test_record_job_is_the_job_as_it_ran():
    """A record made under expandable_segments:True with a spec that said otherwise, on a GPU the spec did not name,
    re-estimates as an expandable job on that catalog GPU (its calibration and cuBLAS workspace size)."""
    from hpcmem.cli.options import job_from_cli
    from hpcmem.record import Record, job_to_dict
    from hpcmem.validate.probes import record_job

    job, _ = job_from_cli("sft", {"model_name_or_path": "Qwen/Qwen2.5-0.5B", "max_length": 512})
    rec = Record.from_json({"job": job_to_dict(job), "env": {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"},
                            "gpu": {"gpu_name": "NVIDIA H200", "memory_bytes": 150109880320}})
    ran = record_job(rec)
    assert ran.expandable_segments and ran.gpu is not None and ran.gpu.name == "H200"
    assert ran.gpu.compute_capability == "9.0"
    assert not record_job(Record.from_json({"job": job_to_dict(job)})).expandable_segments


def test_probe_sets_the_allocator_env_the_spec_asks_for(monkeypatch):
    from hpcmem.cli.options import job_from_cli
    from hpcmem.probe import align_allocator

    job, _ = job_from_cli("sft", {"model_name_or_path": "Qwen/Qwen2.5-0.5B", "expandable_segments": True})
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "max_split_size_mb:64")
    assert align_allocator(job, "cuda") is job
    import os

    assert os.environ["PYTORCH_CUDA_ALLOC_CONF"] == "max_split_size_mb:64,expandable_segments:True"
    plain, _ = job_from_cli("sft", {"model_name_or_path": "Qwen/Qwen2.5-0.5B"})
    assert align_allocator(plain, "cuda").expandable_segments          # the env now says so: the job follows
    assert align_allocator(plain, "cpu") is plain


@pytest.mark.parametrize("reported, memory, expected", [
    ("NVIDIA H200", 150109880320, "H200"),                       # what the H200 of 2026-11-29 reported
    ("NVIDIA H100 80GB HBM3", 85520809984, "H100-80GB"),
    ("NVIDIA A100-SXM4-40GB", 42298834944, "A100-40GB"),
    ("Tesla T4", 15835660288, None),                             # not in the catalog: no GPU, no calibration
])
def test_driver_names_map_to_catalog_gpus(reported, memory, expected):
    from hpcmem.gpus.lookup import gpu_for_device

    gpu = gpu_for_device(reported, memory)
    assert (gpu.name if gpu else None) == expected


# -- the typed, versioned record -----------------------------------------------------------------------------------
COMMITTED = sorted((Path(__file__).resolve().parents[2] / "estimator" / "probes").glob("*.jsonl"))


@pytest.mark.parametrize("path", COMMITTED, ids=lambda p: p.name)
def test_committed_records_upgrade_and_lose_nothing(path: Path) -> None:
    """Every committed line reads as a Record and is written back at the current schema with every key and value it
    had, and reads again to the same Record: a schema-1 line (the first lease's, and the CPU runs) with the new fields
    empty, a schema-2 line (runs since) as it was."""
    from hpcmem.record import SCHEMA, Record

    lines = [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
    assert lines and {x["schema"] for x in lines} <= {1, 2} and lines[0]["schema"] == 1
    for line in lines:
        rec = Record.from_json(line, str(path))
        out = json.loads(json.dumps(rec.to_json()))
        assert out["schema"] == SCHEMA == 2
        for key, value in line.items():
            if key != "schema":
                assert _contains(out[key], value), key
        if line["schema"] == 1:
            assert out["measured"]["step_times_s"] == [] and out["campaign"] is None
        assert Record.from_json(out, "again") == rec


def _contains(big, small) -> bool:
    """`small` is `big` with some keys left out (the upgrade only adds)."""
    if isinstance(small, dict):
        return isinstance(big, dict) and all(k in big and _contains(big[k], v) for k, v in small.items())
    if isinstance(small, list):
        return isinstance(big, list) and len(big) == len(small) and all(map(_contains, big, small))
    return big == small


def test_a_newer_schema_and_bad_speed_fields_are_refused_by_line() -> None:
    from hpcmem.record import Record, RecordError

    base = {"job": {"model": {}, "train": {"trainer": "sft"}}, "status": "ok"}
    with pytest.raises(RecordError, match=r"f.jsonl:3: schema 3 is newer than this hpcmem reads \(2\)"):
        Record.from_json({**base, "schema": 3}, "f.jsonl:3")
    with pytest.raises(RecordError, match=r"f:1: measured.tokens_per_step must be a list of whole numbers ≥ 0"):
        Record.from_json({**base, "measured": {"step_times_s": [1.0], "tokens_per_step": [2.5]}}, "f:1")
    with pytest.raises(RecordError, match=r"f:1: measured.step_times_s must be a list of numbers ≥ 0"):
        Record.from_json({**base, "measured": {"step_times_s": [-1.0]}}, "f:1")
    with pytest.raises(RecordError, match=r"f:1: measured.ranks\[1\].peak_allocated_bytes must be a byte count"):
        Record.from_json({**base, "measured": {"ranks": [{}, {"peak_allocated_bytes": "7"}]}}, "f:1")
    rec = Record.from_json({**base, "measured": {"step_times_s": [0.5, 1.5], "tokens_per_step": [100, 300]}})
    assert rec.measured.tokens_per_s == 200.0               # (100 + 300) tokens / (0.5 + 1.5) s, by hand


def test_record_readers_do_not_import_probe_and_validate_does_not_either() -> None:
    """The record is its own module: probe → record ← validate, no cycle (imports read from the source)."""
    import ast

    root = Path(__file__).resolve().parents[2] / "hpcmem"

    def imported(folder: str) -> set[str]:
        out = set()
        for path in (root / folder).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.ImportFrom) and node.module:
                    out.add(node.module)
                elif isinstance(node, ast.Import):
                    out.update(a.name for a in node.names)
        return out

    assert not {m for m in imported("record") if m.startswith(("hpcmem.probe", "hpcmem.validate"))}
    assert not {m for m in imported("validate") if m.startswith("hpcmem.probe")}
    assert not {m for m in imported("probe") if m.startswith("hpcmem.validate")}
