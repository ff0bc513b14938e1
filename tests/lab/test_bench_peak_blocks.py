"""The GPU-history reader of hpcmem.lab.peak_blocks, on hand-made histories and streams (no GPU)."""

from collections import Counter

from hpcmem.lab.peak_blocks import live_at_peak, more_on_gpu, origin, trace_live_at_peak

MIB = 1024**2
PEFT = [{"filename": "/x/site-packages/peft/tuners/lora/layer.py", "line": 7, "name": "forward"},
        {"filename": "/x/app.py", "line": 1, "name": "main"}]


def test_live_at_peak_frees_at_free_completed():
    # a (4) and b (2) live → 6; a's free is requested but not completed when c (3) arrives → 9 is the peak
    ev = [{"action": "alloc", "addr": 1, "size": 4 * MIB, "frames": PEFT},
          {"action": "alloc", "addr": 2, "size": 2 * MIB, "frames": []},
          {"action": "free_requested", "addr": 1, "size": 4 * MIB},
          {"action": "alloc", "addr": 3, "size": 3 * MIB, "frames": []},
          {"action": "free_completed", "addr": 1, "size": 4 * MIB},
          {"action": "alloc", "addr": 4, "size": 1 * MIB, "frames": []}]
    peak, live = live_at_peak(ev)
    assert peak == 9 * MIB
    assert sorted(s for s, _ in live) == [2 * MIB, 3 * MIB, 4 * MIB]
    assert (4 * MIB, "layer.py:7 forward") in live
    # without completed frees (older torch) the requested free counts: peak 6, then 2 + 3 + 1
    peak, _ = live_at_peak([e for e in ev if e["action"] != "free_completed"])
    assert peak == 6 * MIB


def test_trace_side_and_difference():
    # setup 10; step 1: +5 +5 (peak 20), −5; step 2: +7 → 22 at the peak: {10, 5, 7}
    stream = [["phase", None], 10, ["phase", "step 1 / forward"], 5, 5, -1, ["phase", "step 2 / forward"], 7]
    assert trace_live_at_peak(stream) == Counter({10: 1, 5: 1, 7: 1})
    gpu = [(10, ""), (5, ""), (7, "a"), (7, "a"), (3, "b")]
    rows = more_on_gpu(gpu, trace_live_at_peak(stream))
    assert [(r["size"], r["extra"]) for r in rows] == [(7, 1), (3, 1)]
    assert rows[0]["origins"] == [("a", 2)]
    assert origin(PEFT) == "layer.py:7 forward"


def test_bad_inputs_get_one_line_and_exit_2(tmp_path, capsys):
    """Bench tools read what a lease brought back: a missing file, bytes that are not UTF-8, a line that names no
    stored stream, and a stream that is not gzip are refused in one line on stderr, never a traceback."""
    from hpcmem.lab import peak_blocks, schedule_coarsening

    binary = tmp_path / "bad.bin"
    binary.write_bytes(b"\xff\xfe not text")
    wrong = tmp_path / "wrong.jsonl"
    wrong.write_text('{"case": "no-such-case", "live": [], "history_peak_bytes": 0}\n')
    runs = [(peak_blocks.main, ["--read", str(tmp_path / "missing.jsonl")], "missing.jsonl: No such file"),
            (peak_blocks.main, ["--read", str(binary)], "UnicodeDecodeError"),
            (peak_blocks.main, ["--read", str(wrong), "--events", str(tmp_path)], "no-such-case.json.gz"),
            (schedule_coarsening.main, [str(binary)], "cannot read it: Not a gzipped file")]
    for main, argv, says in runs:
        assert main(argv) == 2
        err = capsys.readouterr().err.strip()
        assert says in err and "\n" not in err and "Traceback" not in err, err
