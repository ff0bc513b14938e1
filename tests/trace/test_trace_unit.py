"""The trace's parts that need no training run: import hygiene, batch design, config rebuild, result contract, CLI."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from hpcmem.errors import SpecError
from hpcmem.job.jobspec import JobSpec
from hpcmem.job.spec import ParallelSpec, TrainSpec
from hpcmem.models.spec import ModelSpec
from hpcmem.trace.data import dataset_rows, design_batch
from hpcmem.trace.hf_config import SUPPORTED_MODEL_TYPES, hf_config_dict
from hpcmem.trace.result import TraceResult


def llama(**kw) -> ModelSpec:
    base = dict(name="x", model_type="llama", vocab_size=1000, hidden_size=64, intermediate_size=128,
                num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                tie_word_embeddings=False)
    return ModelSpec(**{**base, **kw})


def job(tokens: int | None = None, **train) -> JobSpec:
    return JobSpec(model=llama(), train=TrainSpec(trainer="sft", **train), tokens_per_micro_batch=tokens)


def test_import_does_not_load_torch():
    code = ("import sys, hpcmem.trace, hpcmem.trace.run, hpcmem.trace.tracker, hpcmem.cli.trace; "
            "print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


@pytest.mark.parametrize("train, layout, shape, docs", [
    ({"max_length": 100, "per_device_train_batch_size": 4}, "padded", (4, 100), (100, 100, 100, 99)),
    ({"max_length": 100, "per_device_train_batch_size": 1}, "padded", (1, 100), (100,)),
    ({"max_length": 100, "per_device_train_batch_size": 2, "pad_to_multiple_of": 64}, "padded", (2, 128),
     (100, 99)),
    ({"max_length": 100, "per_device_train_batch_size": 2, "packing": True}, "packing bfd", (1, 200),
     (50, 50, 50, 50)),
    ({"max_length": 101, "per_device_train_batch_size": 1, "packing": True, "packing_strategy": "bfd_split"},
     "packing bfd_split", (1, 101), (50, 51)),
    ({"max_length": 100, "per_device_train_batch_size": 3, "packing": True, "packing_strategy": "wrapped"},
     "packing wrapped", (3, 100), (100, 100, 99)),
])
def test_worst_case_batch_design(train, layout, shape, docs):
    d = design_batch(job(**train))
    assert (d.layout, d.batch_shape, d.documents) == (layout, shape, docs)
    assert d.tokens == shape[0] * shape[1]


def test_padding_free_needs_a_token_count():
    with pytest.raises(SpecError, match="tokens_per_micro_batch"):
        design_batch(job(padding_free=True, max_length=None))
    d = design_batch(job(tokens=1000, padding_free=True, max_length=None, per_device_train_batch_size=4))
    assert (d.layout, d.batch_shape, d.documents) == ("padding-free", (1, 1000), (250, 250, 250, 250))


def test_dataset_rows_avoid_special_tokens_and_repeat_the_design():
    d = design_batch(job(max_length=10, per_device_train_batch_size=2))
    rows = dataset_rows(d, 3, vocab_size=50)
    assert [len(r) for r in rows] == [10, 9] * 3
    assert min(min(r) for r in rows) >= 3 and max(max(r) for r in rows) < 50


def test_hf_config_rejects_unknown_types():
    with pytest.raises(SpecError, match="model_type"):
        hf_config_dict(llama(model_type="gpt2"))


def test_hf_config_moe_and_gemma_keys():
    mix = hf_config_dict(llama(model_type="mixtral", num_experts=8, num_experts_per_tok=2, moe_intermediate_size=96))
    assert (mix["num_local_experts"], mix["num_experts_per_tok"], mix["intermediate_size"]) == (8, 2, 96)
    q = hf_config_dict(llama(model_type="qwen3_moe", num_experts=16, num_experts_per_tok=4, moe_intermediate_size=32,
                             num_dense_layers=1))
    assert q["mlp_only_layers"] == [0] and q["moe_intermediate_size"] == 32
    g = hf_config_dict(llama(model_type="gemma2", hidden_act="gelu_pytorch_tanh", final_logit_softcapping=30.0))
    assert g["hidden_activation"] == "gelu_pytorch_tanh" and g["final_logit_softcapping"] == 30.0


def test_result_json_contract():
    r = TraceResult(model_name="m", num_params=10, peak_allocated_bytes=30, phase="step 2 / backward",
                    components={"param": 10, "grad": 20}, kernels="cuda", versions={"torch": "x"}, seconds=1.0)
    j = r.to_json()
    assert set(j) == {"model", "per_gpu", "gpu", "fits", "warnings", "not_modelled", "trace"}
    assert j["per_gpu"]["peak_reserved_bytes"] is None and j["per_gpu"]["device_peak_bytes"] is None
    assert sum(j["per_gpu"]["components"].values()) == j["per_gpu"]["peak_allocated_bytes"]
    assert {"kernels", "versions", "reimplemented", "seconds"} <= set(j["trace"])
    assert any("ZeRO" in n for n in j["not_modelled"])
    json.dumps(j)
    with pytest.raises(ValueError, match="add up"):
        TraceResult(model_name="m", num_params=1, peak_allocated_bytes=5, phase="", components={"param": 4},
                    kernels="cpu", versions={}, seconds=0.0)


def test_run_trace_refuses_what_it_cannot_run():
    from hpcmem.trace import run_trace

    with pytest.raises(SpecError, match="one GPU"):
        run_trace(JobSpec(model=llama(), train=TrainSpec(trainer="sft"),
                          parallel=ParallelSpec(num_processes=8, distributed_type="DEEPSPEED", zero_stage=3)))
    with pytest.raises(SpecError, match="use_vllm"):
        run_trace(JobSpec(model=llama(), train=TrainSpec(trainer="grpo", use_vllm=True)))
    with pytest.raises(SpecError, match="kernels"):
        run_trace(job(), kernels="tpu")


def test_cli_help_lists_trace_flags():
    from click.testing import CliRunner

    from hpcmem.cli import cli

    out = CliRunner().invoke(cli, ["trace", "--help"])
    assert out.exit_code == 0, out.output
    for flag in ("--kernels", "--json", "--max_length", "--gradient_checkpointing", "--use_peft"):
        assert flag in out.output


def test_supported_types_build_in_transformers():
    transformers = pytest.importorskip("transformers")
    for kind in SUPPORTED_MODEL_TYPES:
        extra = {}
        if kind in ("mixtral", "qwen3_moe"):
            extra = {"num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32}
        cfg = dict(hf_config_dict(llama(model_type=kind, **extra)))
        config = transformers.AutoConfig.for_model(cfg.pop("model_type"), **cfg)
        assert config.hidden_size == 64 and config.num_hidden_layers == 2


def test_cli_trace_runs_generation_and_the_allocator_model(tmp_path):
    """`hpcmem trace grpo --generation --allocator both` on a tiny config: generate's phase is named in the notes,
    both allocator models report a reserved peak ≥ the allocated one; --generation is refused for SFT."""
    pytest.importorskip("trl")
    from click.testing import CliRunner

    from hpcmem.cli import cli
    from tests.helpers.trace_helpers import TINY_LLAMA

    config = tmp_path / "config.json"
    config.write_text(json.dumps(hf_config_dict(TINY_LLAMA)))
    args = ["trace", "grpo", "--model_name_or_path", str(config), "--per_device_train_batch_size", "4",
            "--num_generations", "2", "--max_prompt_length", "16", "--max_completion_length", "8"]
    out = CliRunner().invoke(cli, args + ["--generation", "--allocator", "both", "--json"], catch_exceptions=False)
    assert out.exit_code == 0, out.output
    data = json.loads(out.stdout)      # `output` also holds stderr (DeepSpeed's accelerator warning)
    allocated = data["per_gpu"]["peak_allocated_bytes"]
    assert {"default", "expandable"} == set(data["trace"]["allocator"])
    assert all(s["peak_reserved_bytes"] >= allocated for s in data["trace"]["allocator"].values())
    assert any("generate runs as TRL calls it" in n for n in data["trace"]["reimplemented"])
    refused = CliRunner().invoke(cli, ["trace", "sft", "--model_name_or_path", str(config), "--generation"])
    assert refused.exit_code == 2 and "--generation is for grpo/rloo" in refused.output


def test_cli_trace_reports_reserved_by_default(tmp_path):
    """`hpcmem trace` (CUDA mapping) replays the traced allocations through the caching-allocator model in the job's
    own mode unless told `--allocator off`: per_gpu.peak_reserved_bytes is that model's reserved peak (≥ allocated:
    every block is rounded up and the cuBLAS workspace is reserved), and not_modelled says it is a model. Off, and
    under --kernels cpu (no CUDA caching allocator behind a CPU run), it stays null with the older note."""
    pytest.importorskip("trl")
    from click.testing import CliRunner

    from hpcmem.cli import cli
    from tests.helpers.trace_helpers import TINY_LLAMA

    config = tmp_path / "config.json"
    config.write_text(json.dumps(hf_config_dict(TINY_LLAMA)))
    base = ["trace", "sft", "--model_name_or_path", str(config), "--per_device_train_batch_size", "2",
            "--max_length", "64", "--json"]

    def run(*extra: str) -> dict:
        out = CliRunner().invoke(cli, base + list(extra), catch_exceptions=False)
        assert out.exit_code == 0, out.output
        return json.loads(out.stdout)

    on = run()
    g = on["per_gpu"]
    assert g["peak_reserved_bytes"] == on["trace"]["allocator"]["default"]["peak_reserved_bytes"]
    assert g["peak_reserved_bytes"] >= g["peak_allocated_bytes"]
    assert any("caching-allocator model" in n and "default mode" in n for n in on["not_modelled"])
    expandable = run("--expandable_segments", "true")
    assert set(expandable["trace"]["allocator"]) == {"expandable"}
    assert expandable["per_gpu"]["peak_reserved_bytes"] == \
        expandable["trace"]["allocator"]["expandable"]["peak_reserved_bytes"]
    for extra in (("--allocator", "off"), ("--kernels", "cpu")):
        off = run(*extra)
        assert off["per_gpu"]["peak_reserved_bytes"] is None and "allocator" not in off["trace"], extra
        assert any("the allocator model was off" in n for n in off["not_modelled"]), extra
