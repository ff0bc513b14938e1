"""hpcmem.trace.kernels_autocast `vq_tokenizer_fp32`: inside Apertus 1.5's vision tokenizer the trace runs GroupNorm
and softmax as CUDA autocast does (fp32 outputs from 16-bit inputs), where CPU autocast keeps them in bf16; outside
that method, and for every other type, nothing changes."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from hpcmem.trace.kernels_autocast import vq_tokenizer_fp32  # noqa: E402


def _tokenizer():
    from transformers import Apertus1p5VisionTokenizerConfig
    from transformers.models.apertus1p5.modeling_apertus1p5 import Apertus1p5VisionTokenizerModel

    config = Apertus1p5VisionTokenizerConfig(base_channels=32, channel_multiplier=[1, 2], num_res_blocks=1,
                                             attn_resolutions=[128], resolution=256, codebook_size=16, embed_dim=8,
                                             latent_channels=8)
    return Apertus1p5VisionTokenizerModel(config).eval()


def _norm_dtypes(model) -> set:
    seen = set()
    hooks = [m.register_forward_hook(lambda _m, _i, out: seen.add(out.dtype)) for m in model.modules()
             if isinstance(m, torch.nn.GroupNorm)]
    with torch.autocast("cpu", dtype=torch.bfloat16):
        model.encode(torch.zeros(1, 3, 32, 32))
    for h in hooks:
        h.remove()
    return seen


def _job(family: str):
    return SimpleNamespace(model=SimpleNamespace(vision=SimpleNamespace(family=family)))


def test_group_norm_runs_in_fp32_inside_the_tokenizer_only():
    model = _tokenizer()
    assert _norm_dtypes(model) == {torch.bfloat16}          # CPU autocast's own policy
    notes: list[str] = []
    with vq_tokenizer_fp32(notes, _job("apertus1p5")):
        assert _norm_dtypes(model) == {torch.float32}       # CUDA autocast's fp32 policy
        with torch.autocast("cpu", dtype=torch.bfloat16):   # outside encode: untouched
            out = torch.nn.functional.group_norm(torch.zeros(1, 4, 2, 2, dtype=torch.bfloat16), 2)
        assert out.dtype == torch.bfloat16
    assert notes and _norm_dtypes(model) == {torch.bfloat16}


def test_other_types_are_left_alone():
    model, notes = _tokenizer(), []
    with vq_tokenizer_fp32(notes, _job("qwen")):
        assert _norm_dtypes(model) == {torch.bfloat16}
    assert notes == []
