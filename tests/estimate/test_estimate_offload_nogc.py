"""Activation offloading without gradient checkpointing: TRL's hook keeps a storage that is saved twice on the GPU
(trl/models/activation_offloading.py `pack_tensor`), so each layer leaves its RMSNorms' fp32 upcasts and the inputs
several linears read there for the whole step. Known answers from two sources the estimate does not read: an H200
run of the job, and the trace of the same job (which runs TRL's policy over the real modeling code)."""

import json
from pathlib import Path

import pytest

from hpcmem.estimate import estimate
from hpcmem.estimate.workspaces import tensor_bytes
from hpcmem.record import Record
from hpcmem.validate.cases import case_job
from hpcmem.validate.probes import record_job

ROOT = Path(__file__).resolve().parents[2]
H200 = ROOT / "estimator" / "probes" / "nvidia-h200.jsonl"
JOB = {"trainer": "sft", "dtype": "bfloat16", "max_length": 2048, "per_device_train_batch_size": 4,
       "activation_offloading": True, "gradient_checkpointing": False}


def test_h200_run_of_llama_1b_offloaded_without_checkpointing():
    """Llama-3.2-1B, 4 × 2,048 tokens, full fine-tuning: the H200 measured 12.38 GiB allocated at its peak; counting
    only the five newest saved tensors on the GPU the estimate was 5.1 % under it."""
    rec = next(json.loads(line) for line in H200.read_text().splitlines()
               if json.loads(line)["case"] == "sft-llama1b-actoffload-nogc")
    predicted = estimate(record_job(Record.from_json(rec))).to_json()["per_gpu"]["peak_allocated_bytes"]
    measured = rec["measured"]["peak_allocated_bytes"]
    assert abs(predicted - measured) <= 0.01 * measured, (predicted, measured)


@pytest.mark.parametrize("model", ["Qwen/Qwen3-0.6B", "meta-llama/Llama-3.2-1B"])
def test_trace_of_offloading_without_checkpointing(model):
    """Qwen3's q/k norms run between q_proj and k_proj, so the hook has let go of q/k/v's input by k_proj and copies
    it out twice (nothing stays); Llama's k_proj and v_proj save it again in time (it stays). Both within 1.5 % of the
    trace, neither under it by more than 0.5 % (counting only the five newest saved tensors on the GPU: −41 % and
    −5 %)."""
    from hpcmem.trace.run import run_trace

    job = case_job({**JOB, "model_name_or_path": model})
    traced = run_trace(job).peak_allocated_bytes
    peak = max(tensor_bytes(p) for p in estimate(job).phases)
    assert -0.005 * traced <= peak - traced <= 0.015 * traced, (peak, traced, (peak - traced) / traced)


def test_lora_on_qwen3_counts_the_kept_qk_norm_upcasts_once():
    """Qwen3-0.6B LoRA, 4 × 2,048, offloaded without checkpointing (the stored trace, estimator/traces/sft.jsonl): the
    q/k norms' fp32 upcasts stay on the GPU with the layer (its `stays`), so the attention's backward does not get them
    back again; and the attention's saved tensors come back for SDPA's backward and go with it, before the q/k/v
    adapters' come back for the projections' (their instants apart): the estimate is over the trace, by less than
    3 % (+2.1 %; +3.85 % with both attention instants stacked, +5.5 % with the upcasts counted twice too)."""
    rec = next(json.loads(line) for line in (ROOT / "estimator" / "traces" / "sft.jsonl").read_text().splitlines()
               if json.loads(line)["case"]["id"] == "qwen3-06-offload-nogc-lora-2k")
    peak = max(tensor_bytes(p) for p in estimate(case_job(rec["case"])).phases)
    assert 0 <= peak - rec["traced"] <= 0.03 * rec["traced"], (peak, rec["traced"])
