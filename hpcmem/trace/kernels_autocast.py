"""Entry 12 of the CUDA mapping (hpcmem.trace.kernels): layer_norm in fp32 under autocast, for vision-language models.

CUDA autocast runs `layer_norm` in fp32 (torch's autocast op reference, "CUDA Ops that can autocast to float32";
aten/src/ATen/autocast_mode.cpp registers it with the fp32 cast policy): every floating argument that is not fp32 —
the 16-bit input, weight and bias — is cast to fp32, so native_layer_norm keeps an fp32 copy of its input for
backward and returns fp32, which the next linear casts back to 16 bits (and keeps, when its weight trains). CPU
autocast, which the trace runs, has no such entry and keeps the layer norm in 16 bits: half the input bytes, and no
16-bit copy of the output. The trace calls `F.layer_norm` as CUDA autocast does: the arguments cast to fp32, autocast
off inside.

Mapped only for vision-language models (Qwen2-VL's vision tower: torch LayerNorm for norm1, norm2 and the merger's
ln_q, modeling_qwen2_vl.py): the text families' stored traces and the learned profiles fitted on them were traced
without it, and a LayerNorm text family traced with it would no longer match them; Qwen2.5-VL has no LayerNorm, so
its traces are unchanged. A learned profile of a vision-language type's text part (hpcmem.trace.learn
`learning_probe`, provenance LAYER_NORM_FP32) is traced with it too: the image jobs its cells stand for run their
text part's LayerNorms (Persimmon's, under Fuyu) in fp32, which keeps fp32 copies of their inputs where the cells
traced without it kept the 16-bit ones.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

from hpcmem.job.jobspec import JobSpec
from hpcmem.trace.fakeenv import patched

LAYER_NORM_FP32 = "layer_norm_fp32"     # a learned profile's provenance key: its cells traced with the mapping

NOTE = ("layer_norm under autocast runs in fp32 as CUDA autocast runs it (fp32 cast policy; CPU autocast keeps it "
        "in 16 bits) — mapped for vision-language models")


def fp32_policy(fn: Callable[..., Any]) -> Callable[..., Any]:
    """`fn` as CUDA autocast's fp32 cast policy runs it: under CPU autocast, every floating tensor argument that is not
    fp32 cast to fp32 (autocast_mode.h `cached_cast(at::kFloat, …)`: anything else kept) and autocast off inside;
    without autocast, `fn` as it is."""
    import torch

    def up(t: Any) -> Any:
        return t.to(torch.float32) if isinstance(t, torch.Tensor) and t.is_floating_point() and \
            t.dtype not in (torch.float32, torch.float64) else t

    def wrapped(*args: Any, **kwargs: Any) -> Any:
        if not torch.is_autocast_enabled("cpu"):
            return fn(*args, **kwargs)
        with torch.autocast("cpu", enabled=False):
            return fn(*map(up, args), **{k: up(v) for k, v in kwargs.items()})

    return wrapped


@contextlib.contextmanager
def layer_norm_fp32(notes: list[str], job: JobSpec) -> Iterator[None]:
    learned = job.model.learned
    if job.model.vision is None and not (learned is not None and learned.provenance.get(LAYER_NORM_FP32)):
        yield
        return
    import torch.nn.functional as F

    with patched(F, "layer_norm", fp32_policy(F.layer_norm)):
        notes.append(NOTE)
        yield


SOFTMAX_POW_NOTE = ("softmax and pow under autocast run in fp32 as CUDA autocast runs them (fp32 cast policy; CPU "
                    "autocast keeps them in 16 bits) — mapped for Aria's projector, whose ops see 16-bit inputs")


@contextlib.contextmanager
def softmax_pow_fp32(notes: list[str], job: JobSpec) -> Iterator[None]:
    """CUDA autocast's fp32 policy for `softmax` and `pow` (aten/src/ATen/autocast_mode.cpp, "CUDA Ops that can
    autocast to float32"), for Aria only: its projector's nn.MultiheadAttention runs the explicit path
    (torch/nn/functional.py `multi_head_attention_forward` with need_weights True: `softmax` over the bf16 baddbmm
    scores, kept fp32 for backward, cast back to bf16 by bmm) and its AriaProjectorMLP's gelu_new
    (transformers/activations.py `NewGELUActivation`: `torch.pow(input, 3.0)`) both see 16-bit inputs, where CPU
    autocast keeps them in 16 bits. Scoped to Aria so the other types' stored traces stay what they were (in their
    families these ops see fp32 inputs, hpcmem.trace.kernels)."""
    v = job.model.vision
    if v is None or getattr(v, "family", "") != "aria":
        yield
        return
    import torch
    import torch.nn.functional as F

    with patched(F, "softmax", fp32_policy(F.softmax)), patched(torch, "pow", fp32_policy(torch.pow)):
        notes.append(SOFTMAX_POW_NOTE)
        yield


GROUP_NORM_NOTE = ("group_norm and softmax under autocast run in fp32 inside {what} as CUDA autocast runs them (fp32 "
                   "cast policy; CPU autocast keeps them in 16 bits)")
# the vision family → (its modeling module, the class whose `encode` runs the VQ encoder, in words); Chameleon's
# VQ-VAE (modeling_chameleon.py `ChameleonVQVAE.encode`) is the encoder Apertus 1.5's tokenizer reuses
VQ_ENCODERS = {"apertus1p5": ("apertus1p5", "Apertus1p5VisionTokenizerModel", "Apertus 1.5's vision tokenizer"),
               "chameleon": ("chameleon", "ChameleonVQVAE", "Chameleon's VQ-VAE")}


@contextlib.contextmanager
def vq_tokenizer_fp32(notes: list[str], job: JobSpec) -> Iterator[None]:
    """CUDA autocast's fp32 policy for `group_norm` and `softmax` (aten/src/ATen/autocast_mode.cpp, "CUDA Ops that can
    autocast to float32") inside Apertus 1.5's vision tokenizer (modeling_apertus1p5.py
    `Apertus1p5VisionTokenizerModel.encode`: Chameleon's VQGAN encoder, whose GroupNorms see the 16-bit outputs of
    autocast's convolutions and whose attention blocks `F.softmax` the 16-bit bmm scores): each keeps an fp32 copy of
    its input (GroupNorm) or its fp32 output (softmax) for backward and returns fp32, where CPU autocast keeps both in
    16 bits. Scoped to that method, so the text part runs as its learned profile was traced and the other types'
    stored traces stay what they were. Chameleon's VQ-VAE (`ChameleonVQVAE.encode`, the same encoder) likewise
    (`VQ_ENCODERS`)."""
    v = job.model.vision
    if v is None or getattr(v, "family", "") not in VQ_ENCODERS:
        yield
        return
    import importlib

    import torch.nn.functional as F

    module, name, what = VQ_ENCODERS[v.family]
    model = getattr(importlib.import_module(f"transformers.models.{module}.modeling_{module}"), name)
    encode = model.encode

    fp32_group_norm, fp32_softmax = fp32_policy(F.group_norm), fp32_policy(F.softmax)

    def fp32_encode(self: Any, *args: Any, **kwargs: Any) -> Any:
        with patched(F, "group_norm", fp32_group_norm), patched(F, "softmax", fp32_softmax):
            return encode(self, *args, **kwargs)

    with patched(model, "encode", fp32_encode):
        notes.append(GROUP_NORM_NOTE.format(what=what))
        yield


GROUP_NORM_POW_NOTE = ("group_norm and ** under autocast run in fp32 as CUDA autocast runs them (fp32 cast policy; "
                       "CPU autocast keeps them in 16 bits) — mapped for Emu3's VQ-VAE")


@contextlib.contextmanager
def group_norm_pow_fp32(notes: list[str], job: JobSpec) -> Iterator[None]:
    """CUDA autocast's fp32 policy for `group_norm` and `pow` (aten/src/ATen/autocast_mode.cpp, "CUDA Ops that can
    autocast to float32"), for Emu3 only: its VQ-VAE (transformers 5.24 models/emu3/modeling_emu3.py) normalises every
    res block's 16-bit input with nn.GroupNorm / `Emu3VQVAEGroupNorm` (F.group_norm: an fp32 copy of the input kept
    for backward, an fp32 output the swish then runs on), and its quantizer squares the 16-bit latents and the
    codebook with `**` (`Emu3VQVAEVectorQuantizer.forward`: fp32 sums, so the distances are fp32), where CPU autocast
    keeps both in 16 bits. Scoped to Emu3 so the other types' stored traces stay what they were."""
    v = job.model.vision
    if v is None or getattr(v, "family", "") != "emu3":
        yield
        return
    import torch
    import torch.nn.functional as F

    with patched(F, "group_norm", fp32_policy(F.group_norm)), \
            patched(torch.Tensor, "__pow__", fp32_policy(torch.Tensor.__pow__)):
        notes.append(GROUP_NORM_POW_NOTE)
        yield
