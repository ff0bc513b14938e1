"""Pictures and progress: the trace's memory snapshot read back by PyTorch's own snapshot tooling, the timeline PNG,
and the progress line on a terminal and in a pipe."""

from __future__ import annotations

import io
import pickle
import subprocess
import sys

import pytest

from hpcmem.job.jobspec import JobSpec
from hpcmem.job.spec import TrainSpec
from hpcmem.progress import Progress
from tests.helpers.trace_helpers import TINY_LLAMA


def _job(**train) -> JobSpec:
    return JobSpec(model=TINY_LLAMA, train=TrainSpec(trainer="sft", dtype="bfloat16", max_length=64,
                                                     per_device_train_batch_size=2, **train))


@pytest.mark.torch
@pytest.mark.parametrize("train", [{}, {"gradient_checkpointing": False, "use_peft": True}])
def test_snapshot_opens_in_torch_tooling_and_peaks_with_the_trace(tmp_path, train):
    from torch.cuda import _memory_viz

    from hpcmem.trace import run_trace
    from hpcmem.trace.snapshot import SnapshotRecorder

    recorder = SnapshotRecorder()
    result = run_trace(_job(**train), snapshot=recorder)
    path = recorder.write(tmp_path / "step.pickle")
    with path.open("rb") as fh:
        data = pickle.load(fh)
    events = data["device_traces"][0]
    # torch's readers: segsum asserts that every segment's blocks add up; trace replays the event stream
    summary = _memory_viz.segsum(data)
    assert "total_reserved" in summary
    assert _memory_viz.trace(data).startswith(f"Device 0 ----------------\n{len(events)} entries")
    assert "snapshot.pickle" in _memory_viz.trace_plot(data)
    # the peak, summed here from the pickle's alloc / free_completed events, is the trace's peak
    live, peak = 0, 0
    for e in events:
        live += e["size"] if e["action"] == "alloc" else -e["size"] if e["action"] == "free_completed" else 0
        peak = max(peak, live)
    assert peak == result.peak_allocated_bytes
    # what is still allocated at the end is what the segment's active blocks hold
    active = sum(b["size"] for s in data["segments"] for b in s["blocks"] if b["state"] == "active_allocated")
    assert active == live
    # every allocation says where it was born: the hpcmem phase first, then Python frames of the real code
    names = {f["filename"].rsplit("/", 1)[-1] for e in events[:200] if e["action"] == "alloc" for f in e["frames"]}
    assert "hpcmem phase" in names and "trainer.py" in names


@pytest.mark.torch
def test_trace_cli_writes_snapshot_and_timeline(tmp_path):
    snap, png = tmp_path / "s.pickle", tmp_path / "t.png"
    out = subprocess.run([sys.executable, "-m", "hpcmem", "trace", "sft", "--model_name_or_path",
                          "estimator/probes/models/tiny-llama-2l-256h.json", "--dtype", "bfloat16", "--max_length",
                          "64", "--per_device_train_batch_size", "2", "--snapshot", str(snap), "--timeline", str(png),
                          "--json"], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with snap.open("rb") as fh:
        assert pickle.load(fh)["device_traces"][0]


def test_timeline_keeps_the_peak_when_it_thins_the_series():
    from hpcmem.plots.timeline import downsample, spans

    series = [i % 97 for i in range(50_000)] + [10_000] + [0] * 10
    xs, ys = downsample(series, limit=500)
    assert len(xs) <= 510 and max(ys) == 10_000 and xs[ys.index(10_000)] == 50_000
    assert spans(["step 1 / forward", "step 1 / forward / layer 3", "step 1 / backward", ""]) == [
        (0, 2, "step 1 / forward"), (2, 3, "step 1 / backward"), (3, 4, "setup (before step 1)")]


def test_progress_redraws_on_a_terminal_and_writes_lines_in_a_pipe():
    tty, pipe, quiet = io.StringIO(), io.StringIO(), io.StringIO()
    for stream, interactive, enabled in ((tty, True, True), (pipe, False, True), (quiet, False, False)):
        with Progress(20, "trace", stream=stream, interactive=interactive, enabled=enabled) as bar:
            for i in range(20):
                bar.advance(detail="case x" if i == 7 else "")
    assert tty.getvalue().count("\r") == 20 and tty.getvalue().endswith("\n")
    lines = pipe.getvalue().splitlines()
    assert "\r" not in pipe.getvalue() and lines[-1] == "trace: [20/20]"
    assert len(lines) == 10 and lines[3] == "trace: [8/20] case x"     # every tenth (2 items); a detail rides along
    assert quiet.getvalue() == ""


def test_estimate_and_plan_pictures(tmp_path):
    """Both pictures are drawn from the estimate and the plan the commands print (sharded: the host-RAM panel too)."""
    est_png, plan_png = tmp_path / "e.png", tmp_path / "p.png"
    base = [sys.executable, "-m", "hpcmem"]
    job = ["sft", "--model_name_or_path", "meta-llama/Llama-3.1-8B", "--dtype", "bfloat16", "--max_length", "2048",
           "--gpu", "H100-80GB"]
    done = subprocess.run([*base, "estimate", *job, "--accelerate_config", "zero3", "--num_processes", "8", "--plot",
                           str(est_png), "--json"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert json_of(done)["plot"] == str(est_png) and est_png.read_bytes()[:4] == b"\x89PNG"
    done = subprocess.run([*base, "plan", *job, "--plot", str(plan_png), "--json"], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert json_of(done)["plot"] == str(plan_png) and plan_png.read_bytes()[:4] == b"\x89PNG"


def json_of(done) -> dict:
    import json

    return json.loads(done.stdout)


def test_plan_picture_points_are_the_walked_estimates():
    """Every point drawn is a combination the search estimated in full, at its safe bound ((device + half the
    spread + the varying-shapes term) × (1 + margin))."""
    from hpcmem.cli.options import job_from_cli
    from hpcmem.estimate.verdict import device_margin
    from hpcmem.plan import search
    from hpcmem.plots.plan_plot import points

    job, _ = job_from_cli("sft", {"model_name_or_path": "Qwen/Qwen2.5-0.5B", "gpu": "L4", "dtype": "bfloat16"})
    report = search(job, job.gpu, top=3)
    drawn = points(report)
    estimated = [v for v in report.walked if v.how == "estimate" and v.knobs not in {p.knobs for p in report.plans}]
    assert sum(len(v) for v in drawn.values()) == len(estimated)
    margin = device_margin(report.gpu, job.parallel.world_size).margin      # the margin the verdict uses
    for safe, _speed in drawn["fits"]:
        assert safe <= report.gpu.usable_bytes / 2**30 + 1e-9
    some = estimated[0]
    bound = (some.device_peak_bytes + some.spread_bytes / 2 + some.shapes_bytes) * (1 + margin) / 2**30
    assert any(abs(safe - bound) < 1e-6 for pts in drawn.values()
               for safe, _ in pts)
