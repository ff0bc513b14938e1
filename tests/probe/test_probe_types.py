"""Every supported model type runs through the probe on CPU: one real step of TRL's SFTTrainer on a shrunken config
(tests/fixtures/tiny-configs.json, one per type), with transformers' own attention choice (TRL passes no
attn_implementation), and a record is written. Types without a family descriptor or profile are probed too: their
record says the estimate is missing, the measurement is there."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytestmark = [pytest.mark.torch, pytest.mark.slow]
pytest.importorskip("trl")

ROOT = Path(__file__).resolve().parents[2]
TINY = json.loads((ROOT / "tests" / "fixtures" / "tiny-configs.json").read_text())


def supported() -> list[str]:
    from hpcmem.models.coverage import coverage_rows

    return [r["model_type"] for r in coverage_rows() if r["status"] in ("derived", "learned")]


def test_every_supported_type_has_a_tiny_config():
    missing = sorted(set(supported()) - set(TINY) - set(NOT_PROBED))
    assert not missing, f"add shrunken configs to tests/fixtures/tiny-configs.json for {missing}"


# Types whose shrunken config cannot be built the generic way, and why.
NOT_PROBED = {
    "qwen4_exp": "its config class defaults do not build a model (indexer sizes unset) and no published config is known",
    "qwen4_exp_text": "its config class defaults do not build a model (indexer sizes unset) and no published config is "
                      "known",
}
# Settings a type needs to train at all: those coverage.json requires (no gradient checkpointing where transformers
# raises, router_aux_loss_coef 0 where TRL's MoE loss fails: tests/models/test_coverage_requires.py), and DBRX's experts
# index_add_ bf16 outputs into an fp32 buffer under TRL's default fp32 load (modeling_dbrx.py), so bf16; RWKV's WKV
# CUDA kernel stops on fp32 weights under bf16 autocast (hpcmem/trace/kernels_rwkv.py), which hpcmem refuses, so bf16.
SETTINGS = {"dbrx": {"dtype": "bfloat16"}, "rwkv": {"dtype": "bfloat16"}}


@pytest.mark.parametrize("model_type", sorted(set(TINY) & set(supported())))
def test_probe_records_one_step(model_type, tmp_path):
    from hpcmem.cli.probe import probe_model
    from hpcmem.job.trl_config import build_job
    from hpcmem.models.coverage import required_settings
    from hpcmem.probe import run_probe

    config = tmp_path / "config.json"
    config.write_text(json.dumps(TINY[model_type]))
    settings = {"model_name_or_path": str(config), "max_length": 32, "per_device_train_batch_size": 2,
                **required_settings(model_type), **SETTINGS.get(model_type, {})}
    job, _ = build_job("sft", settings, model=probe_model(settings))
    out = tmp_path / "probe.jsonl"
    record = run_probe(job, device="cpu", steps=1, warmup_steps=0, out=out)
    assert record.status == "ok", record.measured
    assert record.measured.peak_allocated_bytes > 0
    assert (record.estimate is None) == (record.estimate_error is not None)
    assert json.loads(out.read_text().splitlines()[-1])["id"] == record.id
