"""The analytic estimator's invariants, known answers from the ZeRO paper, and import hygiene."""

import json
import subprocess
import sys

import pytest

from hpcmem.estimate import estimate
from hpcmem.estimate.lora import lora_layout
from hpcmem.estimate.states import model_states
from hpcmem.job.jobspec import JobSpec
from hpcmem.job.shape import micro_batch, precision
from hpcmem.job.spec import ParallelSpec, TrainSpec
from hpcmem.models import resolve_model

LLAMA = resolve_model("meta-llama/Llama-3.1-8B")


def job(model=LLAMA, par=None, **train):
    return JobSpec(model=model, train=TrainSpec(trainer=train.pop("trainer", "sft"), **train),
                   parallel=par or ParallelSpec())


def test_estimate_core_does_not_import_torch():
    code = ("import sys, hpcmem.estimate, hpcmem.cli.estimate, hpcmem.job.trl_config; "
            "assert 'torch' not in sys.modules, 'torch imported'; "
            "assert 'transformers' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.parametrize("kw", [
    {}, {"gradient_checkpointing": False, "per_device_train_batch_size": 1},
    {"use_peft": True, "dtype": "bfloat16"}, {"load_in_4bit": True, "use_peft": True},
    {"packing": True, "activation_offloading": True}, {"gradient_checkpointing_kwargs": {"selective": True}},
    {"optim": "adamw_torch", "gradient_accumulation_steps": 4},
])
def test_every_phase_total_is_the_sum_of_its_parts(kw):
    est = estimate(job(**kw))
    out = est.to_json()
    assert sum(out["per_gpu"]["components"].values()) == out["per_gpu"]["peak_allocated_bytes"]
    for phase in est.phases:
        assert phase.bytes == sum(c.bytes for c in phase.components)
    assert out["per_gpu"]["peak_reserved_bytes"] >= out["per_gpu"]["peak_allocated_bytes"]
    assert out["per_gpu"]["device_peak_bytes"] >= out["per_gpu"]["peak_reserved_bytes"]


def _deepspeed_state_bytes(stage, n):
    j = job(par=ParallelSpec(num_processes=n, distributed_type="DEEPSPEED", zero_stage=stage), dtype="bfloat16")
    s = model_states(j, precision(j), lora_layout(j))
    return s.weights + s.gradients + s.master + s.optimizer, j.model.num_params


def test_zero_paper_formula_known_answers():
    from hpcmem.estimate.states import zero_paper_bytes

    # Rajbhandari et al. 2020, Figure 1: Ψ = 7.5 B, N = 64, K = 12 → 120 GB, 31.4 GB, 16.6 GB, 1.9 GB.
    psi = 7.5e9
    assert round(zero_paper_bytes(0, psi, 64) / 1e9, 1) == 120.0
    assert round(zero_paper_bytes(1, psi, 64) / 1e9, 1) == 31.4
    assert round(zero_paper_bytes(2, psi, 64) / 1e9, 1) == 16.6
    assert round(zero_paper_bytes(3, psi, 64) / 1e9, 1) == 1.9


@pytest.mark.parametrize("n", [1, 8, 64])
def test_estimator_states_follow_the_paper_for_zero2_and_zero3(n):
    from hpcmem.estimate.states import zero_paper_bytes

    got2, p = _deepspeed_state_bytes(2, n)
    got3, _ = _deepspeed_state_bytes(3, n)
    assert got2 == pytest.approx(zero_paper_bytes(2, p, n), rel=1e-6)
    assert got3 == pytest.approx(zero_paper_bytes(3, p, n), rel=1e-6)
    # DeepSpeed 0.19's ZeRO-1 partitions gradients as they are reduced, like ZeRO-2 (measured; test_estimate_sharding)
    got1, _ = _deepspeed_state_bytes(1, n)
    assert got1 == got2


def test_plain_trainer_bytes_per_param_follow_the_load_dtype():
    # TRL loads in the checkpoint's dtype: fp32 load → 4 + 4 + 8 B/param; bf16 load → 2 + 2 + 4 (torch AdamW states in param dtype).
    for dtype, per_param in (("float32", 16), ("bfloat16", 8)):
        j = job(dtype=dtype)
        s = model_states(j, precision(j), lora_layout(j))
        assert s.weights + s.gradients + s.optimizer == per_param * j.model.num_params


def test_lora_adapter_count_by_hand():
    # Llama-3.1-8B, r=16 on q_proj and v_proj (peft's default for llama): per layer 16·(4096+4096) + 16·(4096+1024).
    j = job(use_peft=True)
    lora = lora_layout(j)
    assert lora.num_params == 32 * (16 * (4096 + 4096) + 16 * (4096 + 1024))
    assert lora.adapter_bytes == 4          # fp32 adapters by default (peft autocast_adapter_dtype)


def test_micro_batch_shapes_follow_trl_collators():
    assert micro_batch(job(per_device_train_batch_size=4, max_length=2048)).tokens == 4 * 2048
    packed = micro_batch(job(per_device_train_batch_size=4, max_length=2048, packing=True))
    assert (packed.rows, packed.seq, packed.padding_free) == (1, 8192, True)
    wrapped = micro_batch(job(per_device_train_batch_size=4, max_length=2048, packing=True, packing_strategy="wrapped"))
    assert (wrapped.rows, wrapped.seq, wrapped.padding_free) == (4, 2048, False)
    padded = micro_batch(job(per_device_train_batch_size=3, max_length=1000, pad_to_multiple_of=64))
    assert padded.seq == 1024
    dpo = micro_batch(job(trainer="dpo", per_device_train_batch_size=2, max_length=512))
    assert (dpo.rows, dpo.seq) == (4, 512)


def test_checkpointing_orders_activation_memory():
    # Full fine-tuning (selective checkpointing with PEFT dies in TRL, hpcmem.job.rules), rows long enough that the
    # activations set the peak.
    kw = {"per_device_train_batch_size": 4, "dtype": "bfloat16", "max_length": 4096}
    off = estimate(job(gradient_checkpointing=False, **kw))
    sel = estimate(job(gradient_checkpointing_kwargs={"selective": True}, **kw))
    full = estimate(job(**kw))
    assert off.peak_allocated_bytes > sel.peak_allocated_bytes >= full.peak_allocated_bytes
    # SAC keeps each layer's attention outputs, so it holds more where every layer's saved set is alive (the LM
    # head's backward); at a layer's backward its recompute does not create them again, and the two peaks there are
    # the same (tests/estimate/test_estimate_sac.py)
    head = "backward (LM head)"
    assert tensor_total(sel, head) > tensor_total(full, head)


def tensor_total(e, phase: str) -> int:
    return sum(c.bytes for p in e.phases if p.name == phase for c in p.components)


def test_expandable_segments_shrinks_reserved_only():
    base = job(dtype="bfloat16", per_device_train_batch_size=2)
    plain = estimate(base)
    exp = estimate(JobSpec(model=base.model, train=base.train, expandable_segments=True))
    assert exp.peak_allocated_bytes == plain.peak_allocated_bytes
    assert exp.peak_reserved_bytes < plain.peak_reserved_bytes


def test_zero3_and_offload_reduce_per_gpu_and_move_bytes_to_host():
    single = estimate(job(dtype="bfloat16"))
    z3 = estimate(job(dtype="bfloat16", par=ParallelSpec(num_processes=8, distributed_type="DEEPSPEED", zero_stage=3)))
    off = estimate(job(dtype="bfloat16", par=ParallelSpec(num_processes=8, distributed_type="DEEPSPEED", zero_stage=3,
                                                          offload_optimizer_device="cpu", offload_param_device="cpu")))
    assert single.peak_allocated_bytes > z3.peak_allocated_bytes > off.peak_allocated_bytes
    assert off.host_bytes > 0 and z3.host_bytes == 0


def test_json_contract_keys():
    from hpcmem.gpus.lookup import gpu_spec

    base = job()
    out = estimate(JobSpec(model=base.model, train=base.train, gpu=gpu_spec("H100-80GB"))).to_json()
    assert set(out["model"]) >= {"name", "num_params"}
    assert set(out["per_gpu"]) >= {"peak_allocated_bytes", "peak_reserved_bytes", "device_peak_bytes", "phase",
                                   "components"}
    assert out["gpu"]["name"] == "H100-80GB" and isinstance(out["fits"], bool)
    assert isinstance(out["warnings"], list) and isinstance(out["not_modelled"], list)
    json.dumps(out)


def test_gradient_clipping_adds_one_norm_per_gradient_tensor():
    """max_grad_norm > 0: torch/nn/utils/clip_grad.py clip_grad_norm_ takes one 0-d norm per gradient tensor
    (_foreach_norm), stacks them, takes the total norm, the clip coefficient and its clamp — each a 512-byte block of
    the caching allocator — before optimizer.step(); fused AdamW adds nothing after. By hand: LoRA on peft's default
    q_proj, v_proj of Qwen2.5-0.5B's 24 layers has 24 × 2 × 2 (lora_A, lora_B) = 96 gradient tensors."""
    from hpcmem.estimate.workspaces import tensor_bytes

    qwen = resolve_model("Qwen/Qwen2.5-0.5B")

    def optimizer_phase(**kw):
        est = estimate(job(model=qwen, dtype="bfloat16", use_peft=True, **kw))
        return next(tensor_bytes(p) for p in est.phases if p.name == "optimizer step")

    assert optimizer_phase() - optimizer_phase(max_grad_norm=0.0) == (96 + 4) * 512


def test_accumulating_embedding_backward_holds_a_fresh_vh_gradient_next_to_grad():
    """Reward Gemma-3-1B, 1 × 1024, 8 micro-batches accumulated: the trace peaks in the embedding's backward, where a
    fresh dense [V, H] gradient (bf16) and the incoming fp32 [T, H] gradient are alive next to every .grad."""
    import json
    from pathlib import Path

    from hpcmem.estimate.workspaces import tensor_bytes
    from hpcmem.validate.cases import case_job

    traces = Path(__file__).resolve().parents[2] / "estimator" / "traces" / "reward.jsonl"
    rec = next(r for r in map(json.loads, traces.read_text().splitlines())
               if r["case"]["id"] == "gemma3-1b-full-ga8-1k")
    vocab, hidden, tokens = 262144, 1152, 1024
    assert rec["traced_phase"] == "step 2 / backward / embeddings"
    temporary = rec["traced_components"]["temporary"]
    assert abs(temporary - (vocab * hidden * 2 + tokens * hidden * 4)) < 2 * 1024**2     # by hand, ±2 MiB of others
    est = estimate(case_job(rec["case"]))
    phase = next(p for p in est.phases if p.name == "backward (embeddings)")
    assert abs(tensor_bytes(phase) - rec["traced"]) < 0.002 * rec["traced"]
    assert est.peak_phase.name == "backward (embeddings)"
