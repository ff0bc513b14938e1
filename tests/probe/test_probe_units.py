"""Probe pieces that need no trainer (fast tier): the phase clock, rank merging, cells, the matrix plan, and the
committed CPU records staying readable by `hpcmem validate`."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from hpcmem.datapath import estimator_dir
from hpcmem.probe.dist import merge_ranks, supervise
from hpcmem.probe.matrix import CASES, command_line, main
from hpcmem.probe.runner import PhaseClock
from hpcmem.record import read_records
from hpcmem.record.cells import cell_of


class FakeMeter:
    """Peaks handed out per segment, in order."""

    def __init__(self, peaks: list[int]) -> None:
        self.peaks = list(peaks)
        self.phases: list[str] = []

    def segment(self) -> dict[str, int]:
        return {"allocated_bytes": self.peaks.pop(0)}

    def set_phase(self, name: str) -> None:
        self.phases.append(name)


def test_phase_clock_takes_the_peak_after_warm_up() -> None:
    clock = PhaseClock(FakeMeter([5, 50, 80, 30, 60, 90, 40, 70, 85, 35, 1]))
    for step in range(3):
        clock.switch("forward", step=step)      # closes setup (5) or the previous step's tail
        clock.switch("backward")
        clock.switch("optimizer")
    clock.switch("end")
    out = clock.summary(warmup_steps=1)
    assert out["setup"] == {"setup": {"allocated_bytes": 5}}
    assert out["measured_steps"] == [1, 2]
    # step 0: fwd 50, bwd 80, opt 30 | step 1: 60, 90, 40 | step 2: 70, 85, 35 (+ end 1)
    assert out["phases"]["backward"]["allocated_bytes"] == 90 and out["phases"]["forward"]["allocated_bytes"] == 70
    assert out["peak_allocated_bytes"] == 90 and out["peak_phase"] == "backward"
    assert [s["peak_allocated_bytes"] for s in out["steps"]] == [80, 90, 85]


def test_merge_ranks_keeps_the_worst_rank() -> None:
    ranks = [{"rank": 0, "status": "ok", "peak_allocated_bytes": 10, "peak_phase": "backward", "phases": {}},
             {"rank": 1, "status": "oom", "peak_allocated_bytes": 12, "peak_phase": "forward", "phases": {},
              "oom": {"step": 1}}]
    merged = merge_ranks(ranks)
    assert merged["status"] == "oom" and merged["peak_allocated_bytes"] == 12 and merged["worst_rank"] == 1
    assert merged["oom"] == {"step": 1} and merged["ranks"] == ranks


def test_cells_name_the_technique() -> None:
    base = {"train": {"trainer": "sft", "gradient_checkpointing": True}, "parallel": {}}
    assert cell_of(base) == ("sft", "full+gc")
    lora_sac = {"train": {"trainer": "sft", "use_peft": True, "gradient_checkpointing": True,
                          "gradient_checkpointing_kwargs": {"selective": True}, "packing": True,
                          "packing_strategy": "bfd"},
                "parallel": {"distributed_type": "DEEPSPEED", "zero_stage": 3, "num_processes": 8}}
    assert cell_of(lora_sac) == ("sft", "lora+sac+pack-bfd+zero3x8")
    q = {"train": {"trainer": "dpo", "use_peft": True, "load_in_4bit": True, "gradient_checkpointing": False},
         "parallel": {"num_processes": 2, "distributed_type": "MULTI_GPU"}}
    assert cell_of(q) == ("dpo", "qlora+nogc+ddpx2")


def test_matrix_cases_and_command_lines(tmp_path: Path, capsys) -> None:
    names = [c.name for c in CASES]
    assert len(names) == len(set(names)) and {c.trainer for c in CASES} >= {"sft", "dpo", "grpo"}
    assert any(c.capacity_gib for c in CASES) and any(c.env for c in CASES)
    case = next(c for c in CASES if c.name == "sft-llama1b-sac")
    argv = command_line(case, device="cuda", out="o.jsonl", model=case.model, tiny=False, steps=3)
    assert argv[2:6] == ["hpcmem", "probe", "sft", "--model_name_or_path"]
    assert argv[argv.index("--gradient_checkpointing_kwargs") + 1] == '{"selective": true}'
    oom = next(c for c in CASES if c.capacity_gib)
    assert "--capacity-bytes" in command_line(oom, device="cpu", out="o", model="m", tiny=True, steps=2)
    assert main(["--list", "--only", "sft-qwen05-full,dpo-qwen05-lora"]) == 0
    assert "dpo-qwen05-lora" in capsys.readouterr().out


def test_committed_cpu_records_validate() -> None:
    """estimator/probes/cpu.jsonl (data in the repo) stays readable and re-estimable by the current specs."""
    from hpcmem.validate import against_probes

    path = estimator_dir() / "probes" / "cpu.jsonl"
    records = read_records(path)
    assert len(records) >= 5 and {r.cell[0] for r in records} >= {"sft", "dpo", "grpo"}
    report = against_probes([path])
    assert report.rows and not [n for n in report.notes if "failed" in n or "no estimate" in n]
    assert {r.technique for r in report.rows} >= {"full+gc", "lora+gc", "full+gc+zero3x2", "full+gc+fsdp2x2"}


def _rank_process(tmp: Path, rank: int, status: str | None, sleep_s: float) -> subprocess.Popen:
    """A real process standing in for one rank: writes its result file (if given a status) after `sleep_s`."""
    write = (f"import json, pathlib; pathlib.Path({str(tmp)!r}, 'rank{rank}.json').write_text(json.dumps("
             f"{{'status': {status!r}, 'rank': {rank}}}))") if status else "pass"
    return subprocess.Popen([sys.executable, "-c", f"import time; time.sleep({sleep_s}); {write}"])


def test_a_rank_that_ran_out_of_memory_does_not_leave_its_peer_hanging(tmp_path: Path) -> None:
    # rank 0 records an OOM at once; rank 1 is "blocked in a collective" (sleeps far past the grace period)
    procs = [_rank_process(tmp_path, 0, "oom", 0.0), _rank_process(tmp_path, 1, None, 300.0)]
    t0 = time.monotonic()
    codes, stopped = supervise(procs, tmp_path, timeout_s=600, grace_s=1.0)
    assert time.monotonic() - t0 < 30
    assert codes[0] == 0 and codes[1] != 0
    assert list(stopped) == [1] and "rank 0 finished with 'oom'" in stopped[1]


def test_healthy_ranks_are_left_to_finish(tmp_path: Path) -> None:
    # rank 0 finishes ok early; rank 1 takes longer than the grace period: an ok peer is no reason to stop it
    procs = [_rank_process(tmp_path, 0, "ok", 0.0), _rank_process(tmp_path, 1, "ok", 2.5)]
    codes, stopped = supervise(procs, tmp_path, timeout_s=600, grace_s=0.5)
    assert codes == [0, 0] and stopped == {}


def test_aborted_peer_does_not_hide_the_oom() -> None:
    merged = merge_ranks([{"status": "oom", "rank": 0, "peak_allocated_bytes": 5, "oom": {"phase": "backward"}},
                          {"status": "aborted", "rank": 1, "reason": "stopped after rank 0 finished with 'oom'"}])
    assert merged["status"] == "oom" and merged["oom"]["phase"] == "backward"


def test_tokens_are_counted_in_a_vision_language_batch():
    """TRL's vision-language collators return transformers' BatchFeature, a Mapping that is not a dict: its masked
    tokens count like a text batch's (the 2026-12-04 Qwen2.5-VL runs on the H200 recorded 0 tokens per step)."""
    import pytest

    torch = pytest.importorskip("torch")
    from transformers import BatchFeature

    from hpcmem.probe.runner import count_tokens

    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]])            # 3 + 5 real tokens by hand
    batch = BatchFeature({"input_ids": torch.ones(2, 5, dtype=torch.long), "attention_mask": mask,
                          "pixel_values": torch.zeros(8, 1176)})
    assert not isinstance(batch, dict) and count_tokens(batch) == 8
    assert count_tokens(dict(batch)) == 8 and count_tokens([1, 2]) == 0
