"""Speed, measured (fast tier, no torch): Kendall's tau by hand, the MFU fit recovering a known curve, the planner
reading a fitted curve, and `validate --against probes --speed` on the committed H200 records."""

from __future__ import annotations

import json
import math

import pytest
from click.testing import CliRunner

from hpcmem.cli import cli
from hpcmem.validate.speed import SpeedRow, fit_mfu, kendall_tau


def test_kendall_tau_by_hand():
    # 6 pairs of [1,2,3,4] vs [1,3,2,4]: only (2,3) is discordant → (5 − 1) / 6
    assert kendall_tau([1, 2, 3, 4], [1, 3, 2, 4]) == pytest.approx(4 / 6)
    assert kendall_tau([1, 2, 3], [3, 2, 1]) == pytest.approx(-1.0)
    # a tie in x: 2 concordant, 0 discordant, 1 tied in x only → tau-b = 2 / sqrt((2 + 1) · 2)
    assert kendall_tau([1, 1, 2], [1, 2, 3]) == pytest.approx(2 / math.sqrt(6))
    assert kendall_tau([1.0], [2.0]) is None


def _row(tokens: int, mfu: float, i: int) -> SpeedRow:
    return SpeedRow(case=f"c{i}", record_id=f"r{i}", trainer="sft", technique="full+gc", gpu="g", tokens_per_step=tokens,
                    measured_tokens_per_s=1.0, predicted_tokens_per_s=1.0, source="steps", mfu_achieved=mfu,
                    micro_tokens=tokens)


def test_the_fit_recovers_a_known_curve():
    m, h = 0.42, 3000.0
    rows = [_row(t, m * t / (t + h), i) for i, t in enumerate((512, 2048, 8192, 32768))]
    fit = fit_mfu(rows)
    assert fit["n"] == 4 and fit["mfu_max"] == pytest.approx(m, abs=0.01)
    assert fit["mfu_half_tokens"] == pytest.approx(h, rel=0.05)                # the grid's step is 2^(1/8) ≈ 9 %
    assert fit_mfu(rows[:2]) is None                                            # fewer than MIN_FIT runs
    assert fit_mfu([_row(512, 0.1, i) for i in range(5)]) is None               # one micro-batch size only


def test_the_planner_uses_a_fitted_curve(tmp_path, monkeypatch):
    """Twice the MFU at every size (mfu_max doubled, same half point) halves a single-GPU step: compute only."""
    from hpcmem.gpus.lookup import gpu_spec
    from hpcmem.job.trl_config import build_job
    from hpcmem.plan.speed import job_throughput
    from hpcmem.plan.throughput import MFU_HALF_TOKENS, MFU_MAX

    job, _ = build_job("sft", {"model_name_or_path": "Qwen/Qwen2.5-0.5B", "dtype": "bfloat16", "max_length": 1024})
    before = job_throughput(job, gpu_spec("L40S"))
    folder = tmp_path / "calibrations"
    folder.mkdir()
    (folder / "l40s.json").write_text(json.dumps({"catalog_name": "L40S", "throughput": {
        "mfu_max": 2 * MFU_MAX, "mfu_half_tokens": MFU_HALF_TOKENS, "n": 5, "fitted_at": "2026-12-01T00:00:00"}}))
    monkeypatch.setenv("HPCMEM_DATA", str(tmp_path))
    after = job_throughput(job, gpu_spec("L40S"))
    assert before.comm_s == before.offload_s == 0
    assert after.step_s == pytest.approx(before.step_s / 2) and after.mfu == pytest.approx(2 * before.mfu)


@pytest.fixture(scope="module")
def h200_speed() -> dict:
    out = CliRunner().invoke(cli, ["validate", "--against", "probes", "--gpu", "nvidia-h200", "--speed", "--no-png",
                                   "--json"], catch_exceptions=False)
    assert out.exit_code == 0, out.output
    return json.loads(out.output)["speed"]


def test_the_h200_records_give_a_speed_table_and_a_fit_from_timed_steps_only(h200_speed, tmp_path):
    """The 2026-11-29 records kept only train_s (all steps, step 0 included): their rows say so and none enters a fit.
    The 2026-12-04 runs timed their steps: the fit reads those alone. Runs that shared the GPU have no row."""
    rows = h200_speed["rows"]
    s = h200_speed["summary"]["nvidia-h200"]
    # the first 22 records: 15 SFT and 2 DPO runs that finished; GRPO ×2 and RLOO (no modelled generation), the OOM
    # and the excluded Reward run have no row. Three Qwen2.5-VL image runs of 2026-12-04 timed their steps but
    # counted no tokens (a BatchFeature is not a dict): train_s too; the fourth, GRPO, has no modelled generation.
    untimed = [r for r in rows if r["source"] == "train_s"]
    assert len(untimed) == 17 + 3 and all(r["mfu_achieved"] is None for r in untimed)
    assert s["timed_steps"] == len(rows) - 20 >= 10
    assert not any(r["case"].endswith("+shared") for r in rows)
    assert -1 <= s["kendall_tau"] <= 1
    from hpcmem.validate import against_probes

    report = against_probes(None, gpu="nvidia-h200", fit=True, fit_dir=tmp_path)
    curve = json.loads(open(report.calibrations[0]).read())["throughput"]
    assert 0 < curve["mfu_max"] < 1 and 10 <= curve["n"] <= s["timed_steps"]
    assert set(curve["records"]) <= {r["record_id"] for r in rows if r["source"] == "steps"}


def test_leaving_a_run_out_of_a_curve_it_lies_on_changes_nothing():
    """Runs exactly on MFU(t) = 0.3 · t / (t + 2000): fitted with or without any one of them, the curve predicts each
    within the half-point grid's step (2^(1/8)); a run off the curve by ×2 is seen ×2 off when left out."""
    from hpcmem.validate.speed import held_out_ratios

    on = [_row(t, 0.3 * t / (t + 2000.0), i) for i, t in enumerate((256, 1024, 4096, 16384, 65536))]
    for _, inside, loo in held_out_ratios(on):
        assert inside == pytest.approx(1.0, abs=0.05) and loo == pytest.approx(1.0, abs=0.05)
    off = on + [_row(2048, 0.3 * 2048 / 4048 / 2, 9)]
    last = held_out_ratios(off)[-1]
    assert last[2] == pytest.approx(2.0, rel=0.1) and last[2] > last[1]


def test_fit_speed_writes_the_curve_and_leaves_the_margins_alone(tmp_path):
    """`--fit-speed` adds the MFU curve to the shipped H200 calibration; its margins, context and allocator terms —
    fitted before the boundary runs, which are scored against them — are the shipped ones, unchanged."""
    from hpcmem.gpus.calibration import load_calibration

    shipped = load_calibration("nvidia-h200")
    out = CliRunner().invoke(cli, ["validate", "probes", "--gpu", "nvidia-h200", "--fit-speed", "--fit-dir",
                                   str(tmp_path), "--no-png"], catch_exceptions=False)
    assert out.exit_code == 0, out.output
    assert "each run left out of its own fit" in out.output
    written = json.loads((tmp_path / "h200.json").read_text())
    for key in ("margins", "context", "allocator", "held_out", "provenance"):
        assert written[key] == shipped[key]
    assert 0 < written["throughput"]["mfu_max"] < 1
    both = CliRunner().invoke(cli, ["validate", "probes", "--fit", "--fit-speed", "--no-png"])
    assert both.exit_code != 0 and "give one of them" in str(both.exception)
