"""`hpcmem probe sft --device cpu` on a tiny model: a real record, the trace agrees, an OOM is a result.

The tiny Llama (2 layers, hidden 256, vocab 1024) runs three real SFTTrainer steps in seconds; its tracked tensor
peak (after the warm-up step) must land within 1 % of `run_trace(job, kernels="cpu")`, which counts the same steps
on fake tensors.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from click.testing import CliRunner

pytestmark = [pytest.mark.torch, pytest.mark.slow]
os.environ.setdefault("HF_HUB_OFFLINE", "1")
pytest.importorskip("torch")
pytest.importorskip("trl")

TINY = {"model_type": "llama", "vocab_size": 1024, "hidden_size": 256, "intermediate_size": 512,
        "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64,
        "tie_word_embeddings": False, "max_position_embeddings": 512}
FLAGS = ["--max_length", "64", "--per_device_train_batch_size", "2"]


@pytest.fixture(scope="module")
def tiny_config(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = tmp_path_factory.mktemp("models") / "tiny-llama.json"
    path.write_text(json.dumps(TINY))
    return str(path)


def _probe(args: list[str]) -> dict:
    from hpcmem.cli import cli

    res = CliRunner().invoke(cli, ["probe", *args, "--json"], catch_exceptions=False)
    assert res.exit_code == 0, res.output
    return json.loads(res.output[res.output.index("{"):])


@pytest.fixture(scope="module")
def sft_record(tiny_config: str, tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, Path]:
    out = tmp_path_factory.mktemp("records") / "cpu.jsonl"
    return _probe(["sft", "--model_name_or_path", tiny_config, *FLAGS, "--device", "cpu", "--out", str(out)]), out


def test_probe_writes_one_whole_record(sft_record: tuple[dict, Path]) -> None:
    from hpcmem.record import SCHEMA, read_records

    record, out = sft_record
    (stored,) = read_records(out)
    assert stored.id == record["id"] and stored.status == "ok" and record["schema"] == SCHEMA
    assert stored.cell == ("sft", "full+gc") and record["cell"] == {"trainer": "sft", "technique": "full+gc"}
    assert {"python", "torch", "transformers", "trl", "peft", "accelerate", "deepspeed"} <= set(stored.versions)
    assert stored.job["train"]["max_length"] == 64 and stored.run.steps == 3
    m = stored.measured
    assert m.extra["measured_steps"] == [1, 2]                          # step 0 is the warm-up
    assert {"forward", "backward", "optimizer"} <= set(m.extra["phases"])
    assert m.peak_allocated_bytes == max(p["allocated_bytes"] for p in m.extra["phases"].values())
    assert m.peak_reserved_bytes is None and m.extra["totals"]["rss_peak_bytes"] > m.peak_allocated_bytes
    assert m.extra["timings"]["train_s"] > 0 and stored.timings["wall_s"] >= m.extra["timings"]["train_s"]
    assert stored.estimate is None or stored.estimate["per_gpu"]["peak_allocated_bytes"] > 0
    # speed: steps 1 and 2 timed (step 0 is not); each held rows of 64 and 63 tokens (FLAGS; the probe's batch makes
    # its last row one token shorter so that it carries padding and an attention mask), one padding token unmasked
    assert len(m.step_times_s) == 2 and all(t > 0 for t in m.step_times_s)
    assert m.tokens_per_step == (64 + 63, 64 + 63)
    assert m.tokens_per_s == pytest.approx(2 * 127 / sum(m.step_times_s))


def test_probe_peak_matches_the_cpu_trace(sft_record: tuple[dict, Path]) -> None:
    """The probe and the trace count the same steps of the same trainer: within 1 %."""
    from hpcmem.record import job_from_dict

    run_trace = pytest.importorskip("hpcmem.trace.run").run_trace
    record, _ = sft_record
    traced = run_trace(job_from_dict(record["job"]), kernels="cpu")
    measured = record["measured"]["peak_allocated_bytes"]
    assert abs(measured - traced.peak_allocated_bytes) <= 0.01 * traced.peak_allocated_bytes, (
        measured, traced.peak_allocated_bytes)


def test_reward_probe_runs_the_rows_the_trace_assumes(tiny_config: str, tmp_path: Path) -> None:
    """Reward: B chosen + B rejected rows of max_length each in both (the probe once gave each row max_length // 2
    words, so its H200 record read 9 % under the estimate); the peaks agree within 1 %."""
    from hpcmem.record import job_from_dict

    run_trace = pytest.importorskip("hpcmem.trace.run").run_trace
    record = _probe(["reward", "--model_name_or_path", tiny_config, *FLAGS, "--device", "cpu",
                     "--out", str(tmp_path / "cpu.jsonl")])
    traced = run_trace(job_from_dict(record["job"]), kernels="cpu")
    measured = record["measured"]["peak_allocated_bytes"]
    assert abs(measured - traced.peak_allocated_bytes) <= 0.01 * traced.peak_allocated_bytes, (
        measured, traced.peak_allocated_bytes)


def test_oom_is_recorded_not_raised(tiny_config: str, tmp_path: Path) -> None:
    out = tmp_path / "cpu.jsonl"
    record = _probe(["sft", "--model_name_or_path", tiny_config, *FLAGS, "--device", "cpu", "--out", str(out),
                     "--capacity-bytes", "12000000", "--steps", "2"])
    assert record["status"] == "oom"
    oom = record["measured"]["oom"]
    assert oom["need_at_least_bytes"] == 12_000_000 and oom["verdict"].startswith("did not fit; measured ≥ capacity")
    assert oom["phase"] in ("forward", "backward", "optimizer") and oom["step"] == 0
    from hpcmem.record import read_records

    assert [r.status for r in read_records(out)] == ["oom"]


def test_probe_refuses_cuda_without_a_gpu(tiny_config: str) -> None:
    import torch

    from hpcmem.cli import cli

    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    res = CliRunner().invoke(cli, ["probe", "sft", "--model_name_or_path", tiny_config, "--device", "cuda",
                                   "--no-record"])
    assert res.exit_code != 0 and "--device cpu" in str(res.exception)


def test_a_local_checkpoint_is_loaded_for_real(sft_record: tuple[dict, Path], tmp_path: Path) -> None:
    """Weights from safetensors are counted too (their storages are born outside any op the tracker sees)."""
    import transformers

    cfg = dict(TINY)
    model = transformers.AutoModelForCausalLM.from_config(transformers.AutoConfig.for_model(cfg.pop("model_type"),
                                                                                            **cfg))
    model.save_pretrained(tmp_path / "ckpt")
    record = _probe(["sft", "--model_name_or_path", str(tmp_path / "ckpt"), *FLAGS, "--device", "cpu", "--no-record"])
    random_weights = sft_record[0]["measured"]["peak_allocated_bytes"]
    assert record["measured"]["peak_allocated_bytes"] == pytest.approx(random_weights, rel=1e-3)


def test_a_job_the_real_trainer_refuses_is_one_line_and_no_record(tmp_path: Path) -> None:
    """peft has no default LoRA targets for Qwen2.5-VL (its table has no qwen2_5_vl row): get_peft_model raises
    before the first step. The probe says so in one line, writes nothing, and `hpcmem estimate` refuses the same job
    for the same reason."""
    from hpcmem.cli import cli

    root = Path(__file__).resolve().parents[2]
    out = tmp_path / "cpu.jsonl"
    args = ["sft", "--model_name_or_path", str(root / "tests" / "fixtures" / "vlm" / "qwen2_5_vl-tiny.json"),
            "--dtype", "bfloat16", "--max_length", "128", "--use_peft", "true", "--images_per_example", "1",
            "--image_height", "56", "--image_width", "56"]
    got = CliRunner().invoke(cli, ["probe", *args, "--device", "cpu", "--out", str(out)])
    assert got.exit_code != 0 and "the real trainer refused the job" in str(got.exception)
    assert "target_modules" in str(got.exception) and not out.exists()
    refused = CliRunner().invoke(cli, ["estimate", *args])
    assert refused.exit_code != 0 and "no default LoRA target_modules" in str(refused.exception)
