"""`hpcmem models learn` end to end on a tiny model of a type no family descriptor covers (OLMo-3: sliding and full
attention layers): the CLI learns a profile from 5 of its 8 layers at 256, 1,024 and 4,096 tokens per row (its 4,096
positions end the lengths), then the torch-free estimate of the full 8-layer model at 2 × 1024 tokens is held to a trace
of that very job (out of sample in depth)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.torch, pytest.mark.slow]
pytest.importorskip("trl")

ROOT = Path(__file__).resolve().parents[2]
TINY_OLMO3 = {"model_type": "olmo3", "vocab_size": 512, "hidden_size": 64, "intermediate_size": 128,
              "num_hidden_layers": 8, "num_attention_heads": 4, "num_key_value_heads": 2,
              "max_position_embeddings": 4096, "sliding_window": 16,
              "layer_types": ["sliding_attention"] * 3 + ["full_attention"] + ["sliding_attention"] * 3
              + ["full_attention"]}


def test_learn_cli_then_estimate_within_3_percent_of_the_trace(tmp_path, monkeypatch):
    from hpcmem.estimate import estimate
    from hpcmem.estimate.workspaces import tensor_bytes
    from hpcmem.job.trl_config import build_job
    from hpcmem.models import resolve_model
    from hpcmem.trace import run_trace

    config = tmp_path / "config.json"
    config.write_text(json.dumps(TINY_OLMO3))
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1"}
    out = subprocess.run([sys.executable, "-m", "hpcmem", "models", "learn", str(config), "--dtype", "bfloat16",
                          "--workers", "1", "--out", str(tmp_path / "data"), "--json"],
                         capture_output=True, text=True, env=env, check=True)
    summary = json.loads(out.stdout)
    assert summary["depth"] == 5 and summary["not_learned"] == {}
    # the rows check: a two-step trace at 1, 4, 8 and 16 rows (4,096 tokens) against the profile's estimate; learned at
    # 2 rows only, the tiny model's row-independent terms are scaled per row: both miss (+12 % / +64 % when written;
    # −40.7 % / +62.6 % since an unpadded row keeps its sliding layers' masks). One row under by more than 3 % is
    # tried again with the rows·seq² terms kept (the trace's own [seq, seq] tensors): −40.3 %, not held either; so
    # each cell is traced again on one unpadded row (hpcmem/trace/learn.py `one_row_cells`): −0.02 % at one row, −5.4 %
    # on one packed row (not held there)
    (rows_errors,) = summary["held"]["rows_err_pct"].values()
    assert set(rows_errors) == {"1", "1 with rows·seq²", "4", "8", "16", "1 with one-row cells",
                                "1 packed with one-row cells"}, summary["held"]
    assert abs(rows_errors["1 with one-row cells"]) <= 3.0 < abs(rows_errors["1 packed with one-row cells"])
    assert summary["held"]["rows_held"] == [1, 2] and "one_row_packed" not in summary["held"], summary["held"]
    assert summary["held"]["unmasked_scores"] is False
    assert Path(summary["profile"]).is_file()

    # the same config through `hpcmem estimate` with torch, transformers, trl and peft unimportable
    blocked = ("import sys; sys.modules.update(dict.fromkeys(('torch', 'transformers', 'trl', 'peft'))); "
               "from hpcmem.cli import main; sys.argv[0] = 'hpcmem'; main()")
    cli = subprocess.run([sys.executable, "-c", blocked, "estimate", "sft", "--model_name_or_path", str(config),
                          "--dtype", "bfloat16", "--max_length", "1024", "--json"], capture_output=True, text=True,
                         env={**env, "HPCMEM_DATA": str(tmp_path / "data")})
    assert cli.returncode == 0, cli.stderr
    assert "learned profile" in cli.stdout

    monkeypatch.setenv("HPCMEM_DATA", str(tmp_path / "data"))
    spec = resolve_model(str(config))
    assert spec.learned is not None and spec.num_hidden_layers == 8
    base = {"model_name_or_path": str(config), "dtype": "bfloat16", "max_length": 1024,
            "per_device_train_batch_size": 2}
    # at one row the one-row cells hold it; at four rows the estimate says the rows are not held
    one_row = build_job("sft", {**base, "per_device_train_batch_size": 1})[0]
    est = estimate(one_row)
    traced = run_trace(one_row).peak_allocated_bytes
    assert abs(max(tensor_bytes(p) for p in est.phases) - traced) <= 0.03 * traced
    assert "traced on one row" in str(est.to_json()) and not any("micro-batch" in w for w in est.warnings)
    four = estimate(build_job("sft", {**base, "per_device_train_batch_size": 4})[0])
    assert any("held at 1–2 rows per micro-batch" in w for w in four.warnings), four.warnings
    for extra in ({}, {"use_peft": True, "lora_target_modules": "q_proj,v_proj"},
                  {"gradient_checkpointing": False}):
        job = build_job("sft", {**base, **extra})[0]
        est = estimate(job)
        assert est.made.startswith("learned profile") and not any("micro-batch" in w for w in est.warnings)
        traced = run_trace(job).peak_allocated_bytes
        err = 100 * (max(tensor_bytes(p) for p in est.phases) - traced) / traced
        assert abs(err) < 3.0, (extra, err)

    # `--add-missing` on the profile with its variant cells taken out — LoRA without dropout, reentrant checkpointing:
    # a profile learned before the learner traced them — puts them back, held; an SFT LoRA job at lora_dropout 0 on
    # every Linear and a full fine-tune with reentrant checkpointing are each within 3 % of their trace
    path = Path(summary["profile"])
    doc = json.loads(path.read_text())

    def variant(name: str) -> bool:
        return "lora-nodrop" in name or "-reentrant" in name

    learned = {k: v for k, v in doc["cells"].items() if variant(k)}
    assert {"w2a2/lora-nodrop/gc", "w2a2/lora-nodrop/nogc", "w2a2/full-reentrant/gc", "w2a2/lora-reentrant/gc",
            "w2a2/lora-nodrop-reentrant/gc"} <= set(learned), sorted(doc["cells"])
    doc["cells"] = {k: v for k, v in doc["cells"].items() if k not in learned}
    techniques = doc["provenance"]["held"]["techniques"]
    doc["provenance"]["held"]["techniques"] = {k: v for k, v in techniques.items() if not variant(k)}
    path.write_text(json.dumps(doc))
    reentrant_args = {**base, "gradient_checkpointing_kwargs": {"use_reentrant": True}}
    assert any("non-reentrant" in w for w in estimate(build_job("sft", reentrant_args)[0]).warnings)
    nodrop_args = {**base, "use_peft": True, "lora_target_modules": "all-linear", "lora_dropout": 0.0}
    assert any("not held" in w for w in estimate(build_job("sft", nodrop_args)[0]).warnings)
    added = subprocess.run([sys.executable, "-m", "hpcmem", "models", "learn", str(config), "--workers", "1",
                            "--out", str(tmp_path / "data"), "--add-missing", "--json"],
                           capture_output=True, text=True, env=env, check=True)
    report = json.loads(added.stdout)
    assert sorted(report["added"]) == sorted(learned) and report["held"], report
    for args in (nodrop_args, reentrant_args):
        job = build_job("sft", args)[0]       # (a job carries the profile it was built with)
        est = estimate(job)
        assert not any("not held" in w for w in est.warnings), est.warnings
        traced = run_trace(job).peak_allocated_bytes
        err = 100 * (max(tensor_bytes(p) for p in est.phases) - traced) / traced
        assert abs(err) < 3.0, (args, err)
