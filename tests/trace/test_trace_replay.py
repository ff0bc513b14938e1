"""The recorded device stream (hpcmem.trace.events) and its replay with cuBLAS's workspaces (hpcmem.trace.replay).

Expected numbers are worked by hand from the allocator's rules (see tests/estimate/test_trace_allocator.py: 1–10 MiB
requests get a 20 MiB segment, ≥ 10 MiB ones their size rounded to 2 MiB, ≤ 1 MiB ones a 2 MiB small-pool segment) and
from CublasHandlePool.cpp (a 32 MiB cuBLAS workspace per thread on sm_90, a 1 MiB cuBLASLt one per thread at its first
bias GEMM). The last test holds the model to GPU measurements: stored streams of H200 probe runs.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from hpcmem.trace.events import step_of, thread_of
from hpcmem.trace.replay import NO_WORKSPACES, Workspaces, replay

MIB = 1024**2
ROOT = Path(__file__).resolve().parents[2]


def stream() -> list:
    return [
        ["phase", "step 1 / forward"],
        3 * MIB,                            # index 1: 20 MiB segment
        ["gemm", "main", "blas"],           # Python thread's cuBLAS workspace: new 32 MiB segment
        ["phase", "step 1 / backward / layer 0"],
        ["gemm", "autograd", "lt"],         # autograd's: 32 MiB segment, then cuBLASLt's 1 MiB: a 2 MiB small segment
        -4,                                 # the 3 MiB block (4 items back) returns to its 20 MiB segment
        ["phase", "step 2 / forward"],
        ["gemm", "main", "blas"],           # the thread has its workspace already
        5 * MIB,                            # best fit: the free 20 MiB segment, split (remainder 15 MiB > 1 MiB)
    ]


def test_replay_adds_one_workspace_per_thread():
    r = replay(stream(), workspaces=Workspaces(cublas=32 * MIB, cublaslt=1 * MIB))
    assert r.workspace_bytes == 65 * MIB                    # 32 + 32 + 1
    assert r.stats["peak_reserved_bytes"] == (20 + 32 + 32 + 2) * MIB
    assert r.step_peaks[1] == (68 * MIB, 86 * MIB)          # 3 + 32 + 32 + 1 live before the free
    assert r.step_peaks[2] == (70 * MIB, 86 * MIB)          # 65 + 5
    assert (r.steady_allocated_bytes, r.steady_reserved_bytes) == (70 * MIB, 86 * MIB)


def test_replay_without_workspaces_is_the_tensors_alone():
    r = replay(stream(), workspaces=NO_WORKSPACES)
    assert r.workspace_bytes == 0
    assert r.stats["peak_reserved_bytes"] == 20 * MIB
    assert r.steady_allocated_bytes == 5 * MIB


def test_expandable_replay_maps_pages():
    # expandable segments: 3 MiB maps one 20 MiB page; the 32 MiB workspace takes the 17 MiB left on it + one more
    # page (40 MiB mapped), the second 32 MiB needs two more pages (80 MiB); cuBLASLt's 1 MiB maps a 2 MiB small page
    r = replay(stream(), expandable=True, workspaces=Workspaces(cublas=32 * MIB, cublaslt=1 * MIB))
    assert r.stats["peak_reserved_bytes"] == 82 * MIB


def test_phase_names():
    assert step_of("step 12 / backward / layer 3") == 12
    assert step_of("") == 0 and step_of(None) == 0
    assert thread_of("step 2 / backward / lm head / loss") == "autograd"
    assert thread_of("step 2 / forward / layer 0") == "main"
    assert thread_of("step 2 / scoring / step 2 / generation") == "main"


@pytest.mark.torch
def test_event_log_marks_gemms_after_their_output():
    torch = pytest.importorskip("torch")
    from hpcmem.trace.events import EventLog
    from hpcmem.trace.tracker import StorageTracker

    log = EventLog()
    tr = StorageTracker(round_to=512, allocator=log)
    with tr, tr.phase("step 1 / forward"):
        a = torch.ones(64, 64)                                  # 16 KiB
        b = torch.ones(64, 64)
        c = a @ b                                               # mm: output born, then the GEMM marker
        bias = torch.ones(64)
        d = torch.nn.functional.linear(a, b, bias)              # addmm with a 1-D bias: cuBLASLt
        with tr.phase("backward"):
            e = a @ b
        del c, d, e
    ev = log.events
    assert ev[0] == ["phase", "step 1 / forward"]
    gemms = [(i, x) for i, x in enumerate(ev) if isinstance(x, list) and x[0] == "gemm"]
    assert [x for _, x in gemms] == [["gemm", "main", "blas"], ["gemm", "main", "lt"], ["gemm", "autograd", "blas"]]
    first = gemms[0][0]
    assert ev[first - 1] == 64 * 64 * 4                         # c's malloc comes right before its marker
    assert sum(1 for x in ev if isinstance(x, int) and x < 0) == 3   # c, d, e freed


def test_h200_streams_reproduce_the_measured_reserved_peak():
    """The allocator model + workspaces, replaying the traced step of an H200 probe run, against that run's
    torch.cuda.max_memory_reserved() (estimator/allocator/nvidia-h200: `python -m hpcmem.lab.allocator_records`)."""
    from hpcmem.lab.allocator_records import EVENTS, RECORDS, score, scored
    from hpcmem.record import read_lines as read_records
    from hpcmem.trace.events import load

    records = {r["case"]: r for r in scored(read_records(RECORDS))}
    for case in ("sft-qwen05-lora", "sft-gemma3-1b-lora"):
        row = score(records[case], load(EVENTS / f"{case}.json.gz"))
        assert abs(row["resv_err_pct"]) < 0.1, (case, row["resv_model"], row["resv_gpu"])
        assert abs(row["alloc_err_pct"]) < 0.1, (case, row["alloc_model"], row["alloc_gpu"])


def test_a_perturbed_stream_keeps_its_frees_paired():
    """One more 2 MiB tensor before everything (hpcmem.lab.allocator_records.perturbed): every free still names its
    own malloc, so each step's allocated peak is the old one + 2 MiB (68 → 70, 70 → 72 MiB); by hand the reserved
    peak stays 86 MiB (the 2 MiB request takes a 20 MiB segment whose 18 MiB remainder holds the 3 MiB and later the
    5 MiB block)."""
    from hpcmem.lab.allocator_records import perturbed

    before = replay(stream(), expandable=False, workspaces=Workspaces())
    after = replay(perturbed(stream(), 2 * MIB), expandable=False, workspaces=Workspaces())
    assert [after.step_peaks[s][0] - before.step_peaks[s][0] for s in (1, 2)] == [2 * MIB, 2 * MIB]
    assert max(r for _, r in after.step_peaks.values()) == 86 * MIB
    with pytest.raises(ValueError):
        perturbed(stream()[1:], 2 * MIB)


def test_the_h200_full_fine_tune_stream_flips_with_one_small_tensor():
    """The model's sensitivity that `reserved_spread_bytes` reports: sft-qwen05-full's stored stream, one 2 MiB tensor
    before the weights, maps the LM head's bf16 [V, H] gradient (151,936 × 896 × 2 B = 259.7 MiB) again in step 2
    under the default allocator — the reserved peak moves by 264 MiB, as the replay of 2026-12-01 measured
    (estimator/LOG.md) — and not under expandable segments. The GPU kit replays the same perturbation on a GPU."""
    from hpcmem.estimate.workspaces import HOPPER_BYTES
    from hpcmem.lab.allocator_records import EVENTS, perturbed
    from hpcmem.trace.events import load

    events = load(EVENTS / "sft-qwen05-full.json.gz")["events"]
    ws = Workspaces(cublas=HOPPER_BYTES)
    for expandable, moved in ((False, 264 * MIB), (True, 0)):
        base = replay(events, expandable=expandable, workspaces=ws).steady_reserved_bytes
        assert replay(perturbed(events, 2 * MIB), expandable=expandable,
                      workspaces=ws).steady_reserved_bytes - base == moved


def test_the_kits_cuda_replay_lines_read_as_moves(tmp_path: Path):
    """`allocator_records --read`: the steady reserved peak is the largest of steps ≥ 2 (step 1's 900 MiB is not it);
    a perturbed line is compared with the same stream's unperturbed one in the same mode. Numbers by hand."""
    import json

    from hpcmem.lab.allocator_records import cuda_replay_rows, main

    def line(perturb: int, gpu: tuple[int, int], model: tuple[int, int]) -> dict:
        return {"case": "c", "expandable": False, "perturb_bytes": perturb,
                "real": {"1": [0, 900 * MIB], "2": [0, gpu[0] * MIB], "3": [0, gpu[1] * MIB]},
                "model": {"1": [0, 900 * MIB], "2": [0, model[0] * MIB], "3": [0, model[1] * MIB]}}

    lines = [line(0, (500, 520), (510, 505)), line(2 * MIB, (784, 700), (774, 700))]
    plain, moved = cuda_replay_rows(lines)
    assert (plain["resv_gpu"], plain["resv_model"], plain["gpu_moved"]) == (520 * MIB, 510 * MIB, None)
    assert plain["err_pct"] == pytest.approx(100 * (510 - 520) / 520)
    assert (moved["gpu_moved"], moved["model_moved"]) == (264 * MIB, 264 * MIB)
    f = tmp_path / "replay.jsonl"
    f.write_text("\n".join(json.dumps(x) for x in lines))
    assert main(["--read", str(f)]) == 0
    f.write_text("not json")
    assert main(["--read", str(f)]) == 2


@pytest.mark.parametrize("text, named", [
    ("[1, 2]", "line 1: '[1, 2]': each line must be one --cuda-replay JSON object"),
    ('{"case": "c", "expandable": false, "real": {"2": [5]}, "model": {"2": [1, 2]}}',
     'line 1: real = {"2": [5]}: must be {step: [allocated, reserved]}'),
    ('{"case": "c", "expandable": false, "real": [1], "model": {"2": [1, 2]}}', "line 1: real = [1]: must be"),
    ('{"case": "c", "expandable": false, "real": {"2": [1, 2]}, "model": {"2": [null, 2]}}', "line 1: model = "),
    ('{"case": "c", "expandable": false, "perturb_bytes": "x", "real": {"2": [1, 2]}, "model": {"2": [1, 2]}}',
     'line 1: perturb_bytes = "x": must be a byte count'),
    ('{"case": "c", "expandable": "no", "real": {"2": [1, 2]}, "model": {"2": [1, 2]}}', 'expandable = "no"'),
    ('\n{"case": "c"', "line 2: not JSON"),
    ('{"case": "c", "expandable": false, "real": {"2": [1, 2]}, "model": null}',
     "line 1: cublas_workspace_bytes = null: must be a byte count"),
    ('{"case": "c", "expandable": false, "real": {"²": [1, 2]}, "model": {"2": [1, 2]}}', 'line 1: real = '),
])
def test_read_refuses_what_is_not_a_replay_line_in_one_line(tmp_path: Path, capsys, text: str, named: str):
    """`allocator_records --read` on lines that are not the kit's: exit 2 and one line naming the line, the field, its
    value and what it must be — no traceback."""
    from hpcmem.lab.allocator_records import main

    f = tmp_path / "replay.jsonl"
    f.write_text(text)
    assert main(["--read", str(f)]) == 2
    err = capsys.readouterr().err
    assert named in err and len(err.strip().splitlines()) == 1
    assert main(["--read", str(tmp_path / "missing.jsonl")]) == 2
    assert "cannot read it" in capsys.readouterr().err


@pytest.mark.parametrize("argv", [["--perturb", "x", "--cuda-replay"], ["--perturb", "-5", "--cuda-replay"],
                                  ["--perturb", "²", "--cuda-replay"], ["--perturb", "8388608"]])
def test_perturb_refuses_bad_sizes_and_use_without_cuda_replay(capsys, argv: list[str]):
    """--perturb is checked before anything runs (also on a machine without CUDA), and only sizes --cuda-replay."""
    from hpcmem.lab.allocator_records import main

    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    assert f"--perturb {argv[1]!r}" in capsys.readouterr().err


def shapes_stream() -> list:
    """Three steps whose working block grows, shrinks back and grows past both: 12, 16 and 20 MiB (each ≥ 10 MiB:
    a segment of its own size), born and freed in the forward, before the backward marker."""
    out: list = []
    for step, size in ((1, 12 * MIB), (2, 16 * MIB), (3, 20 * MIB)):
        out += [["phase", f"step {step} / forward"], size, -1, ["phase", f"step {step} / backward / layer 0"]]
    return out


def test_varying_shapes_keep_every_segment_without_empty_cache():
    # no segment holds the next, larger block: 12, then 12 + 16, then 12 + 16 + 20 MiB reserved
    r = replay(shapes_stream(), workspaces=NO_WORKSPACES)
    assert [r.step_peaks[s][1] for s in (1, 2, 3)] == [12 * MIB, 28 * MIB, 48 * MIB]


@pytest.mark.parametrize(("every", "reserved"), [
    (1, [12, 16, 20]),      # each backward marker releases the free segment the step's forward left
    (2, [12, 16, 36]),      # steps 1 and 3 empty (global_step 0 and 2): 12 is gone before step 2, but step 3's
                            # forward runs before its own release and finds only the 16 cached: 16 + 20
])
def test_empty_cache_steps_releases_at_the_trainers_cadence(every, reserved):
    # transformers Trainer.training_step: empty_cache when global_step % torch_empty_cache_steps == 0, after the
    # loss and before backward; traced step s has global_step s − 1
    r = replay(shapes_stream(), workspaces=NO_WORKSPACES, empty_cache_steps=every)
    assert [r.step_peaks[s][1] // MIB for s in (1, 2, 3)] == reserved
