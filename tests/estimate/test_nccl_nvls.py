"""NCCL's NVLS buffers: sizes against NCCL's own log line and hand calculations from its code, when a job has them,
and the published row that ran on an older NCCL."""

from __future__ import annotations

import pytest

from hpcmem.estimate import estimate
from hpcmem.estimate.device import device_terms
from hpcmem.estimate.nccl import nvls_bytes, parse_version
from hpcmem.gpus.lookup import gpu_spec
from hpcmem.job.trl_config import build_job
from hpcmem.validate.published import PublishedError, load, read_file
from hpcmem.validate.published_score import score

MIB = 2**20


def test_nccl_2_20_matches_its_own_log_line_on_eight_h200s() -> None:
    # "NVLS comm … headRank 3 nHeads 8 buffSize 4194304 memSize 2097152 nvlsPerRankSize 301989888
    # nvlsTotalSize 2415919104" — NCCL 2.20.5's INFO line on 8 H200s (vllm-project/vllm#9699)
    assert nvls_bytes(gpu_spec("H200"), 8, version=(2, 20)) == 2_415_919_104


@pytest.mark.parametrize("version, gpu, on_node, machines, expected", [
    ((2, 19), "H100", 8, 1, 16 * 2 * (4 + 2) * 8 * MIB),      # nvlsChannels 16, SIMPLE 4 MiB + 2 MiB, 8 heads
    ((2, 21), "H100", 8, 1, 24 * 2 * (1 + 2) * 8 * MIB),      # chunk 128 KiB × 8 steps, still + 2 MiB
    ((2, 29), "H100", 8, 1, 16 * 2 * 1 * 8 * MIB),            # no memSize since 2.22
    ((2, 29), "H100", 4, 1, 16 * 2 * 1 * 4 * MIB),
    ((2, 29), "B200", 8, 1, 24 * 2 * 1 * 8 * MIB),            # NVLS_NCHANNELS_SM100_NVL
    ((2, 29), "B200", 8, 2, 32 * 2 * 1 * 8 * MIB),            # NVLS_NCHANNELS_SM100 across nodes
    ((2, 22), "B200", 8, 1, 16 * 2 * 1 * 8 * MIB),            # before 2.28 every arch took 16
])
def test_sizes_by_hand_from_nccls_code(version, gpu, on_node, machines, expected) -> None:
    assert nvls_bytes(gpu_spec(gpu), on_node, machines, version) == expected


@pytest.mark.parametrize("gpu, on_node", [("H100", 2), ("H100", 1), ("H100-PCIE", 8), ("A100-80GB", 8),
                                          ("RTX-4090", 4)])
def test_none_without_an_nvls_board_or_with_two_gpus_on_the_node(gpu, on_node) -> None:
    # ncclNvlsInit: `gpuCount <= 2` leaves NVLS off; PCIe boards and pre-Hopper GPUs have no NVLink SHARP
    assert nvls_bytes(gpu_spec(gpu), on_node) == 0


def _terms(num_processes: int, num_machines: int = 1, gpu: str = "H100") -> dict[str, int]:
    job, _ = build_job("sft", {"model_name_or_path": "Qwen/Qwen2.5-0.5B", "accelerate_config": "zero3",
                               "num_processes": num_processes, "num_machines": num_machines}, gpu=gpu_spec(gpu))
    return {t.name: t.bytes for t in device_terms(job, 0).terms}


def test_the_estimate_holds_it_as_a_device_term_only_where_nccl_sets_it_up() -> None:
    eight = _terms(8)
    assert eight["NCCL NVLS"] == 256 * MIB and "NCCL" in eight
    assert "NCCL NVLS" not in _terms(2)
    assert _terms(16, 2)["NCCL NVLS"] == 256 * MIB          # 8 GPUs on each node
    assert "NCCL NVLS" not in _terms(8, gpu="A100-80GB")
    job, _ = build_job("sft", {"model_name_or_path": "Qwen/Qwen2.5-0.5B", "accelerate_config": "zero3",
                               "num_processes": 8}, gpu=gpu_spec("H100"))
    est = estimate(job)
    assert "NCCL NVLS 256 MiB" in est.device_note
    assert est.device_peak_bytes - est.peak_reserved_bytes == sum(_terms(8).values())


def test_a_published_row_is_adjusted_to_the_nccl_its_run_had() -> None:
    row = next(r for r in load().rows if r.id == "peftdocs-ds-z3-lora-70b-8xh100")
    assert row.nccl == (2, 19)
    s = score(row)
    # 2.19's 1,536 MiB in place of torch 2.13's 256 MiB; the loop's loss is not at this row's peak
    assert s.adjusted_gib - s.estimated_gib == pytest.approx((1536 - 256) / 1024, abs=2e-3)
    assert "NCCL 2.19's NVLS buffers" in s.adjust_note


@pytest.mark.parametrize("value, rule", [('"2.9"', "known from 2.18 on"), ('"two"', "major.minor"),
                                         ('"2"', "major.minor"), ("2.20", "a quoted release")])
def test_a_source_naming_an_nccl_it_cannot_size_is_refused(tmp_path, value, rule) -> None:
    path = tmp_path / "x.yaml"
    path.write_text(f"""source:
  id: x
  citation: {{url: "https://example.org"}}
  loop: trl
  loop_name: TRL
  peak: device
  unit: GB
  nccl: {value}
rows:
  - {{id: r, gpu: H100, measured: 1, outcome: ran, settings: {{model_name_or_path: Qwen/Qwen2.5-0.5B}}}}
""")
    with pytest.raises(PublishedError, match=rf"source: nccl: .*{rule}"):
        read_file(path)


def test_parse_version() -> None:
    assert parse_version("2.21.5") == (2, 21) and parse_version("2.19") == (2, 19)
