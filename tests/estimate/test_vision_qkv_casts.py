"""A tower block with q, k and v as three Linears after a torch LayerNorm, trained under autocast, keeps three 16-bit
casts of the norm's fp32 output (hpcmem.estimate.vision `qkv_casts`), and CLIP/SigLIP/InternVL towers keep no
attention mask however many tiles are rows (hpcmem.estimate.vision_llava `llava_terms`). Known answers: the real
layer's saved tensors (transformers' CLIPEncoderLayer under the trace's autocast mapping), a hand calculation, and
the stored traces' growth between two image sizes (the text part's tokens are the same at both, so the peak grows by
what the tower keeps for the added patches). The growth pairs were read to find both terms: in-sample."""

from __future__ import annotations

from pathlib import Path

import pytest

from hpcmem.estimate.vision import block_spec, qkv_casts
from hpcmem.job.shape import MicroBatch, Precision
from tests.helpers.stored_cases import estimated_tensor_peak, stored_case_job, trace_records

ROOT = Path(__file__).resolve().parents[2]
AMP = Precision(weight=2, act=2, residual=2, autocast=False, amp=True)

# (records file, smaller case, larger case): full fine-tuning (every tower Linear keeps its input) and, for Cosmos3
# Edge, LoRA (its patch_embedding adapter keeps no dropout mask)
GROWTH = [
    ("vlm-llava", "llava-full-nogc-1img", "llava-full-nogc-2img"),
    ("vlm-llava-next", "lnext-full-nogc-3t", "lnext-full-nogc-5t"),
    ("vlm-llava-onevision", "lov-full-nogc-3t", "lov-full-nogc-13t"),
    ("vlm-video-llava", "vl-full-nogc-1img", "vl-full-nogc-2img"),
    ("vlm-vipllava", "vip-full-nogc-1img", "vip-full-nogc-2img"),
    ("vlm-internvl", "internvl-full-nogc-3t", "internvl-full-nogc-7t"),
    ("vlm-qianfan-ocr", "qianfan-full-nogc-3t", "qianfan-full-nogc-7t"),
    ("vlm-aya-vision", "aya1t-full-nogc", "aya3t-full-nogc"),
    ("vlm-cohere2-vision", "c2v1t-full-nogc", "c2v3t-full-nogc"),
    ("vlm-lfm2-vl", "lvl1t-full-nogc", "lvl5t-full-nogc"),
    ("vlm-gemma3", "g3-full-nogc-1img", "g3-full-nogc-2img"),
    ("vlm-gemma3", "g3-full-gc-1img", "g3-full-gc-2img"),
    ("vlm-cosmos3-edge", "c3edge-full-nogc-448", "c3edge-full-nogc-896"),
    ("vlm-cosmos3-edge", "c3edge-lora-all-nogc-448", "c3edge-lora-all-nogc-896"),
    ("vlm-cosmos3-edge", "c3edge-lora-all-gc-448", "c3edge-lora-all-gc-896"),
]


@pytest.mark.parametrize(("name", "small", "large"), GROWTH, ids=[f"{s}->{b}" for _, s, b in GROWTH])
def test_the_tower_s_growth_is_the_trace_s(name, small, large):
    """Before these terms the estimate grew less than the traces in every full no-checkpointing pair (llava +3.1 MB,
    InternVL +16.8 MB, Gemma 3 +47.2 MB, Cosmos3 Edge +14.4 MB, LFM2-VL +25.2 MB, ...) and 1.2 MB more in Cosmos3
    Edge's LoRA pairs; held now within 1 MiB."""
    records = trace_records(ROOT, name)
    lo, hi = records[small], records[large]
    traced = hi["traced"] - lo["traced"]
    estimated = estimated_tensor_peak(hi, ROOT) - estimated_tensor_peak(lo, ROOT)
    assert abs(estimated - traced) < 2 ** 20


def _llava_tower():
    record = trace_records(ROOT, "vlm-llava")["llava-full-nogc-1img"]
    return stored_case_job(record, ROOT)


def test_three_casts_by_hand():
    """CLIP ViT-L/14-336 (1,024 wide) on one image's 577 positions: q_proj, k_proj and v_proj each keep a bf16
    [577, 1024] copy of layer_norm1's fp32 output; layer_norm_saved counts one, so two more: 2 · 2 · 1024 · 577
    bytes. None where the weights are frozen, without autocast, or for a fused qkv Linear or an RMSNorm tower."""
    from dataclasses import replace

    v = _llava_tower().model.vision
    spec = replace(block_spec(v), fused_qkv=False)
    mb = MicroBatch(rows=1, seq=577, label_tokens=0, padding_free=False, source="", attn_implementation="sdpa")
    assert v.hidden_size == 1024 and v.norm == "layer"
    assert qkv_casts(v, spec, mb, AMP, frozen=False) == 2 * 2 * 1024 * 577 == 2_363_392
    assert qkv_casts(v, spec, mb, AMP, frozen=True) == 0
    assert qkv_casts(v, spec, mb, replace(AMP, act=4, residual=4, weight=4, amp=False), frozen=False) == 0
    assert qkv_casts(v, replace(spec, fused_qkv=True), mb, AMP, frozen=False) == 0
    assert qkv_casts(replace(v, norm="rms"), spec, mb, AMP, frozen=False) == 0


def test_the_real_clip_layer_keeps_three_casts():
    """transformers' CLIPEncoderLayer in bf16 under autocast with the trace's layer_norm mapping (fp32, as CUDA
    autocast runs it: hpcmem.trace.kernels_autocast): q_proj, k_proj and v_proj each save a distinct bf16 [T, H]
    tensor for their weight gradients (autocast caches casts of leaf tensors only, not of an activation)."""
    import torch
    from transformers.models.clip.configuration_clip import CLIPVisionConfig
    from transformers.models.clip.modeling_clip import CLIPEncoderLayer

    from hpcmem.trace.kernels_autocast import layer_norm_fp32

    config = CLIPVisionConfig(hidden_size=64, num_attention_heads=4, intermediate_size=256)
    config._attn_implementation = "sdpa"
    layer = CLIPEncoderLayer(config).to(torch.bfloat16).train()
    weights = {p.untyped_storage().data_ptr() for p in layer.parameters()}
    current: list[str] = []
    saved: dict[str, set[int]] = {}
    def leave(module, args, output):
        current.pop()

    for name in ("q_proj", "k_proj", "v_proj"):
        module = getattr(layer.self_attn, name)
        module.register_forward_pre_hook(lambda m, a, n=name: current.append(n))
        module.register_forward_hook(leave)

    def pack(t):
        if current and t.untyped_storage().data_ptr() not in weights:
            assert t.dtype == torch.bfloat16 and t.shape[-1] == 64
            saved.setdefault(current[-1], set()).add(t.untyped_storage().data_ptr())
        return t

    x = torch.randn(1, 10, 64, dtype=torch.bfloat16, requires_grad=True)
    notes: list[str] = []
    with layer_norm_fp32(notes, _llava_tower()), torch.autocast("cpu", dtype=torch.bfloat16), \
            torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        layer(x, None)
    assert notes, "the trace's layer_norm mapping is on for a vision-language job"
    inputs = [saved[n] for n in ("q_proj", "k_proj", "v_proj")]
    assert all(len(s) == 1 for s in inputs)
    assert len(set.union(*inputs)) == 3
