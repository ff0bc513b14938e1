"""A published loop whose peft predates the fp32 adapters (peft <= 0.10) is estimated with bf16 adapters: the
adapters, their gradients and AdamW's states at 2 B, sized by hand; and the schema takes the field only with a loss."""

from __future__ import annotations

import pytest

# Llama-2-7B, LoRA r 64 on q, k, v, gate, up, down (Answer.AI's 'all' targets), by hand:
LAYER = 3 * 64 * (4096 + 4096) + 3 * 64 * (4096 + 11008)      # q, k, v + gate, up, down: 4,472,832
ADAPTER_PARAMS = 32 * LAYER                                      # 143,130,624
PER_RANK = ADAPTER_PARAMS // 2     # FSDP FULL_SHARD over 2 ranks: every matrix's rows (64, 4096, 11008) split evenly


def _row_job(row_id: str):
    from hpcmem.gpus.lookup import gpu_spec
    from hpcmem.job.trl_config import build_job
    from hpcmem.validate.published import load
    from hpcmem.validate.published_score import job_settings

    row = next(r for r in load().rows if r.id == row_id)
    job, _ = build_job(row.trainer, job_settings(row), gpu=gpu_spec(row.gpu))
    return row, job


def _component(est, phase: str, name: str) -> int:
    p = next(p for p in est.phases if p.name == phase)
    return sum(c.bytes for c in p.components if c.name == name)


def test_answerai_lora_adapters_gradients_and_adam_states_are_bf16_shards() -> None:
    from hpcmem.validate.published_adapters import base_dtype_lora_estimate

    row, job = _row_job("aai-3090-7b-lora-b1-c512")
    assert row.adapters == "base-dtype"
    est = base_dtype_lora_estimate(job)
    assert _component(est, "optimizer step", "lora adapters") == PER_RANK * 2            # 143,130,624 B
    assert _component(est, "optimizer step", "optimizer states") == PER_RANK * 2 * 2     # exp_avg, exp_avg_sq
    assert _component(est, "optimizer step", "gradients") == PER_RANK * 2


def test_trl_estimate_of_the_same_row_keeps_peft_fp32_adapters() -> None:
    from hpcmem.estimate import estimate

    _, job = _row_job("aai-3090-7b-lora-b1-c512")
    est = estimate(job)
    assert _component(est, "optimizer step", "lora adapters") == PER_RANK * 4
    assert _component(est, "optimizer step", "optimizer states") == PER_RANK * 4 * 2


def test_a_quantized_base_is_unchanged() -> None:
    from hpcmem.estimate import estimate
    from hpcmem.validate.published_adapters import base_dtype_lora_estimate

    _, job = _row_job("aai-3090-7b-qlora-b4")       # TRL already casts a 4-bit base's adapters to bf16
    assert base_dtype_lora_estimate(job).peak_allocated_bytes == estimate(job).peak_allocated_bytes


def test_the_source_field_needs_a_loss_and_a_known_dtype(tmp_path) -> None:
    from hpcmem.validate.published import PublishedError, read_file

    text = """
source: {id: s, citation: {url: "https://example.org/post"}, loop: other, loop_name: a script, peak: reserved,
         unit: GiB, loss: model-loss, adapters: base-dtype}
defaults: {trainer: sft, settings: {model_name_or_path: Qwen/Qwen2.5-0.5B}, gpu: H100-80GB}
rows:
  - {id: r1, measured: 5.0, outcome: ran}
"""
    path = tmp_path / "s.yaml"
    path.write_text(text)
    assert read_file(path)[0].adapters == "base-dtype"
    for edit, says in ((("loss: model-loss, ", ""), "source: adapters 'base-dtype': only with `loss:`"),
                       (("adapters: base-dtype", "adapters: fp8"), "source: adapters")):
        path.write_text(text.replace(*edit))
        with pytest.raises(PublishedError) as info:
            read_file(path)
        assert says in str(info.value) and "\n" not in str(info.value)


def test_peft_without_the_upcast_keeps_the_base_dtype() -> None:
    """What peft <= 0.10 did by default, peft 0.21 does with autocast_adapter_dtype=False: bf16 adapters on a bf16
    base, fp32 ones with the default upcast."""
    torch = pytest.importorskip("torch")
    peft = pytest.importorskip("peft")

    def adapter_dtypes(upcast: bool) -> set:
        base = torch.nn.Sequential(torch.nn.Linear(8, 8)).to(torch.bfloat16)
        cfg = peft.LoraConfig(r=2, target_modules=["0"])
        model = peft.get_peft_model(base, cfg, autocast_adapter_dtype=upcast)
        return {p.dtype for n, p in model.named_parameters() if "lora_" in n}

    assert adapter_dtypes(False) == {torch.bfloat16}
    assert adapter_dtypes(True) == {torch.float32}
