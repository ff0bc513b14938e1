"""Vision-language SFT (Qwen2.5-VL and Qwen2-VL, full width cut to 1 decoder layer and 4 vision blocks; Qwen3-VL, cut
to 3 decoder layers and 4 vision blocks with 3 deepstack mergers) against the
trace of TRL's SFTTrainer with its vision collator and transformers' processor on real images
(estimator/traces/vlm.jsonl, written by `hpcmem validate trace --cases estimator/cases/vlm.yaml`, vlm-accumulation.yaml,
vlm-qwen2-vl.yaml and vlm-qwen3-vl.yaml): full fine-tuning and LoRA (all-linear, q_proj/v_proj), checkpointing on and off, 448 and 896
px, one case of 2 rows × 2 images, two with 2 micro-batches per step."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hpcmem.estimate import estimate
from hpcmem.estimate.vision import ACTIVATIONS, GRADIENTS, OPTIMIZER, WEIGHTS
from hpcmem.estimate.workspaces import tensor_bytes
from hpcmem.validate.cases import case_job

ROOT = Path(__file__).resolve().parents[2]
TRACES = [ROOT / "estimator" / "traces" / f"{name}.jsonl" for name in ("vlm", "vlm-accumulation", "vlm-qwen2-vl",
                                                                              "vlm-qwen3-vl")]
RECORDS = {r["case"]["id"]: r for f in TRACES for r in map(json.loads, f.read_text().splitlines())}
MAX_PCT = 3.0


def _job(case_id: str):
    return case_job({**RECORDS[case_id]["case"],
                     "model_name_or_path": str(ROOT / RECORDS[case_id]["case"]["model_name_or_path"])})


@pytest.mark.parametrize("case_id", sorted(RECORDS))
def test_estimate_within_3_percent_of_the_trace(case_id):
    traced = RECORDS[case_id]["traced"]
    estimated = max(tensor_bytes(p) for p in estimate(_job(case_id)).phases)
    assert abs(estimated - traced) <= MAX_PCT / 100 * traced, (estimated, traced)


@pytest.mark.parametrize(("case_id", "patches"), [("qvl-full-gc-896", 64 * 64), ("q2vl-full-gc-896", 64 * 64),
                                                  ("q3vl-full-gc-896", 56 * 56)])
def test_the_tower_is_its_own_components(case_id, patches):
    """Full fine-tuning: the tower's weights, Adam states, saved activations and gradients are printed apart, and the
    weights are its parameters × 2 bytes (bf16), the Adam states twice that (by hand: hpcmem.models.vision); 896 px
    is 64 × 64 patches of 14 px, 56 × 56 of Qwen3-VL's 16 px."""
    job = _job(case_id)
    est = estimate(job)
    names = {c.name for p in est.phases for c in p.components}
    assert {WEIGHTS, OPTIMIZER, ACTIVATIONS, GRADIENTS} <= names
    weights = next(c.bytes for c in est.phases[0].components if c.name == WEIGHTS)
    assert weights == 2 * job.model.vision.num_params
    assert next(c.bytes for c in est.phases[0].components if c.name == OPTIMIZER) == 2 * weights
    assert est.to_json()["vision"]["patches_per_micro_batch"] == patches


@pytest.mark.parametrize("prefix", ["qvl", "q2vl", "q3vl"])
def test_more_pixels_more_memory_in_the_trace_and_the_estimate(prefix):
    for technique in ("full-gc", "full-nogc", "lora-all-gc", "lora-all-nogc"):
        small, large = f"{prefix}-{technique}-448", f"{prefix}-{technique}-896"
        traced = RECORDS[large]["traced"] - RECORDS[small]["traced"]
        est = (max(tensor_bytes(p) for p in estimate(_job(large)).phases)
               - max(tensor_bytes(p) for p in estimate(_job(small)).phases))
        assert traced > 0 and est > 0, technique


@pytest.mark.torch
@pytest.mark.slow
def test_the_recorded_trace_is_the_trace_of_today():
    """One case traced again (TRL's SFTTrainer, the vision collator, transformers' processor; about a minute on two
    shared cores): the stored record is what the installed libraries trace, to the byte."""
    pytest.importorskip("trl")
    from hpcmem.trace.run import run_trace

    case_id = "qvl-full-gc-448"
    assert run_trace(_job(case_id)).peak_allocated_bytes == RECORDS[case_id]["traced"]


def test_qwen2_vl_tower_saves_what_its_modeling_code_keeps():
    """Qwen2-VL's block with nothing recomputed (full fine-tuning, bf16, CUDA autocast), by hand from
    modeling_qwen2_vl.py, per patch at h = 1280, I = 5120, 16 heads: two LayerNorms (fp32 input copy 4h, mean and rstd
    8 B, the 16-bit output the next linear keeps 2h), attention (q and k after the rotary 2h each, the fused qkv
    output 6h that v is a view of, SDPA's output 2h, fp32 logsumexp per head), `proj`'s input 2h, the MLP (fc1's
    output and quick_gelu's sigmoid, then fc2's input: 3 × 2I)."""
    from hpcmem.estimate.vision import vision_terms
    from hpcmem.estimate.lora import LoraLayout
    from hpcmem.job.shape import precision

    job = _job("q2vl-full-nogc-896")
    h, i, n = 1280, 5120, 64 * 64
    norms = 2 * (4 * h + 8 + 2 * h)
    attention = 2 * 2 * h + 6 * h + 2 * h + 4 * 16
    per_patch = norms + attention + 2 * h + 3 * 2 * i
    terms = vision_terms(job, precision(job), LoraLayout(enabled=False))
    assert terms.block_full == per_patch * n


def test_qwen3_vl_deepstack_mergers_save_what_their_modeling_code_keeps():
    """One Qwen3-VL deepstack merger (full fine-tuning, bf16, CUDA autocast), by hand from modeling_qwen3_vl.py
    `Qwen3VLVisionPatchMerger` with `use_postshuffle_norm=True`, per merged row (4 patches) at h = 1152, merged width
    m = 4h: its LayerNorm over m (fp32 input copy 4m, mean and rstd 8 B, the 16-bit output linear_fc1 keeps 2m),
    linear_fc1's output (GELU's input, 2m) and GELU's output (linear_fc2's input, 2m); the tower keeps three (blocks 0,
    1, 2 of the cut fixture), each under the blocks' backward until block index + 1's is done."""
    from hpcmem.estimate.lora import LoraLayout
    from hpcmem.estimate.vision import vision_terms
    from hpcmem.job.shape import precision

    job = _job("q3vl-full-nogc-896")
    m, rows = 4 * 1152, 56 * 56 // 4
    per_row = 4 * m + 8 + 2 * m + 2 * m + 2 * m
    terms = vision_terms(job, precision(job), LoraLayout(enabled=False))
    assert [(i, saved) for i, saved, _ in terms.deepstack] == [(0, per_row * rows), (1, per_row * rows),
                                                              (2, per_row * rows)]
    # each merger's gradients: its LayerNorm (weight, bias) and two linears with biases, bf16
    grads = 2 * (2 * m + (m * m + m) + (m * 4096 + 4096))
    assert {g for _, _, g in terms.deepstack} == {grads}
