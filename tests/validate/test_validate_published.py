"""Published measurements (fast tier, no torch): every row of estimator/published/ loads and builds as a job, the set
holds its thresholds, `hpcmem validate published` prints the table and the summary, and a malformed file is refused
in one line. Expected numbers are the sources' own (the rows), never the estimate's."""

from __future__ import annotations

import io
import json
from contextlib import redirect_stderr, redirect_stdout

import pytest
from click.testing import CliRunner

from hpcmem.cli import cli, run
from hpcmem.validate.published import PublishedError, load, read_file
from hpcmem.validate.published_score import score, summary


@pytest.fixture(scope="module")
def rows():
    return load().rows


@pytest.fixture(scope="module")
def scored(rows):
    return [score(r) for r in rows if r.scored]


def test_the_set_holds_its_thresholds(rows):
    scored = [r for r in rows if r.scored]
    assert len(scored) >= 30
    assert len({r.source for r in scored}) >= 5
    assert sum(1 for r in scored if r.gpus > 1) >= 8
    assert any(r.gpus == 1 for r in scored)
    assert {r.peak for r in scored} >= {"allocated", "reserved", "device"}
    assert any(not r.raw for r in scored) and any(r.raw for r in scored)       # TRL's loop and others
    techniques = {(r.settings.get("use_peft", False), r.settings.get("load_in_4bit", False)) for r in scored}
    assert {(False, False), (True, False), (True, True)} <= techniques          # full, LoRA, QLoRA
    layouts = {r.settings.get("accelerate_config") for r in scored}
    assert {"zero3", "fsdp1"} <= layouts
    for r in rows:
        assert r.citation and r.loop_name and r.where, r.id
        assert r.scored or r.reason, r.id


def test_every_scored_row_builds_and_estimates(scored):
    failed = {p.id: p.error for p in scored if p.error or p.estimated_gib is None}
    assert not failed


def test_measured_values_are_the_sources(rows):
    by_id = {r.id: r for r in rows}
    # benchmarks_03_2024.md, 'Llama-2 7B with a batch size of one': QLoRA at 2048 tokens peaks at 5.21 GiB reserved
    r = by_id["aai-3090-7b-qlora-b1-c2048"]
    assert (r.measured, r.unit, r.peak, r.gpus) == (5.21, "GiB", "reserved", 2)
    assert r.measured_bytes == round(5.21 * 2**30)
    # peft's results/lora--llama-3.2-3B-rank32.json: accelerator_memory_max in bytes
    assert by_id["pmc-lora-r32-qv"].measured_bytes == 22292725760
    # PEFT's deepspeed guide: 36.6 GB per GPU for Llama-2-70B QLoRA under ZeRO-3 on 2 GPUs
    r = by_id["peftdocs-ds-z3-qlora-70b-2xa100-40"]
    assert (r.measured_bytes, r.peak, r.gpus, r.raw) == (36_600_000_000, "device", 2, False)


def test_summary_classes_and_fits_column(scored):
    classes = {(s["class"], s["loop"]) for s in summary(scored)}
    assert ("multi-GPU device", "trl") in classes
    assert any(c.startswith("single-GPU") for c, _ in classes)
    # the column says whether `fits` agreed with the reported outcome, for every row with a GPU
    assert all(p.outcome in ("ran", "oom") and p.fits_agrees is not None for p in scored)


def test_the_command_prints_the_table_and_summary(rows):
    res = CliRunner().invoke(cli, ["validate", "published"])
    assert res.exit_code == 0, res.output
    assert "summary" in res.output and "median |err|" in res.output
    assert "aai-3090-7b-qlora-b1-c2048" in res.output
    assert "other loops (raw error" in res.output
    for r in rows:
        if not r.scored:
            assert f"unscored {r.id}" in res.output


def test_json_and_the_against_spelling(rows):
    res = CliRunner().invoke(cli, ["validate", "--against", "published", "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.output)
    assert len(out["rows"]) == sum(1 for r in rows if r.scored)
    assert {u["id"] for u in out["unscored"]} == {r.id for r in rows if not r.scored}
    pmc = next(p for p in out["rows"] if p["id"] == "pmc-full-finetuning")
    assert pmc["measured_gib"] == pytest.approx(38868615168 / 2**30, abs=1e-3)
    assert pmc["loop"].startswith("plain PyTorch loop") and pmc["raw"] is True


GOOD = """
source: {id: s, citation: {url: "https://example.org/post"}, loop: trl, loop_name: SFTTrainer, peak: device, unit: GB}
defaults: {trainer: sft, settings: {model_name_or_path: Qwen/Qwen2.5-0.5B}, gpu: H100-80GB}
rows:
  - {id: r1, where: table 1, measured: 12.5, outcome: ran}
"""


@pytest.mark.parametrize("edit, message", [
    (("measured: 12.5", "measured: -1"), "row 1 (r1): measured must be a positive number"),
    (("outcome: ran", "outcome: maybe"), "row 1 (r1): outcome must be one of ran, oom"),
    (("outcome: ran", "outcome: ran, scored: false"), "row 1 (r1): a row with scored: false needs a reason"),
    (("outcome: ran", "outcome: ran, mesured: 3"), "row 1 (r1): unknown key 'mesured'"),
    (("unit: GB", "unit: gigs"), "source: unit must be one of"),
    (("peak: device", "peak: max"), "row 1 (r1): peak must be one of allocated, reserved, device"),
    (('{url: "https://example.org/post"}', "{repo: a/b, path: x.md}"), "citation: a repo needs commit"),
    ((", gpu: H100-80GB", ""), "row 1 (r1): gpu is required"),
])
def test_a_malformed_file_is_one_line(tmp_path, edit, message):
    path = tmp_path / "bad.yaml"
    path.write_text(GOOD.replace(*edit))
    with pytest.raises(PublishedError) as info:
        read_file(path)
    assert message in str(info.value) and str(path) in str(info.value)
    assert "\n" not in str(info.value)


def test_the_good_file_reads(tmp_path):
    path = tmp_path / "good.yaml"
    path.write_text(GOOD)
    (row,) = read_file(path)
    assert (row.measured_bytes, row.peak, row.gpus, row.raw) == (12_500_000_000, "device", 1, False)


def test_rows_reads_one_file(tmp_path):
    path = tmp_path / "one.yaml"
    path.write_text(GOOD)
    res = CliRunner().invoke(cli, ["validate", "published", "--rows", str(path), "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.output)
    assert [p["id"] for p in out["rows"]] == ["r1"] and out["files"] == [str(path)]
    assert out["rows"][0]["measured_gib"] == pytest.approx(12.5e9 / 2**30, abs=1e-3)
    bad = tmp_path / "bad.yaml"
    bad.write_text(GOOD.replace("outcome: ran", "outcome: fine"))
    err = io.StringIO()
    with redirect_stdout(io.StringIO()), redirect_stderr(err):
        status = run(["validate", "published", "--rows", str(bad)])
    assert status == 2 and err.getvalue().count("\n") == 1, err.getvalue()
    assert "row 1 (r1): outcome must be one of ran, oom" in err.getvalue()
