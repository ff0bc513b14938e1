"""`--kernels cuda`: where a CUDA GPU allocates differently from the fake-CPU trace, and how the trace maps it.

Each entry names the CPU behaviour, the CUDA behaviour, and the source read. Mapped:

1. SDPA, flash-eligible (no mask, fp16/bf16 inputs after autocast, head_dim ≤ 256 and a multiple of 8): CUDA runs
   `aten._scaled_dot_product_flash_attention`. Its saved set equals the CPU flash kernel's on torch 2.13 (q, k, v —
   GQA stays unexpanded on both —, out in [B, S, H, D] layout, fp32 logsumexp [B, H, S]; checked on fake and real
   CPU tensors), plus the philox seed/offset tensors. The trace calls the CUDA op itself (its meta kernel runs on
   fake tensors), so those small tensors and the op identity TRL's selective-checkpointing policy matches are the
   GPU's. With a mask (padding, packed documents) CUDA takes memory-efficient attention, whose saved set (q, k, v,
   the bias, out, logsumexp) equals the CPU flash kernel's with a mask: not remapped — unless the call also drops out
   (GPT-2's attn_pdrop in SFT): the CPU flash kernel refuses dropout (sdp_utils_cpp.cpp `check_for_dropout`) and the
   math path keeps fp32 [B, H, S, S] scores and probabilities, where CUDA's cuDNN or memory-efficient attention take
   mask and dropout and keep the CPU flash kernel's set plus the philox seed/offset; the trace calls that op as for
   MLA below (`mla_backend`: equal head sizes are its ≤ 128 case or memory-efficient).
   SDPA whose value heads differ in size from the query/key heads (Multi-head Latent Attention: DeepSeek-V2/V3,
   Kimi-Linear, Bailing-hybrid, …): flash refuses them (cuda/sdp_utils.cpp `check_head_dim_size_flash`) and the CPU
   takes the math path (sdp_utils_cpp.cpp `check_head_dim_size_cpp`), which keeps fp32 [B, H, S, S] scores and
   probabilities. On sm90 torch 2.13 tries cuDNN attention first (`check_prefer_cudnn_attention`: cuDNN > 9.15.0,
   which the CUDA 13 wheels ship), and `check_cudnn_tensor_shapes` takes head dims ≤ 128 or exactly d_qk 192 /
   d_v 128 (every MLA type of transformers 5.24 with unequal dims: 192/128, 96/64), masked or not; other unequal
   dims go to memory-efficient attention. The trace calls that CUDA op itself (`mla_backend`, `_cuda_sdpa`):
   `_scaled_dot_product_cudnn_attention` saves q, k, v, out [B, H, S, D_v], fp32 logsumexp [B, H, S, 1] and the
   philox seed/offset; `_scaled_dot_product_efficient_attention` the same with logsumexp [B, H, S↑32]; a boolean mask
   becomes an additive one in the query's dtype first (attention.cpp `convert_boolean_attn_mask_cudnn`), which
   backward saves. Source read at pytorch commit 001f694a (sdp_utils.cpp, attention.cpp); meta kernels from torch
   2.13's torch/_meta_registrations.py. Not checked on a GPU.
2. FlashAttention-2 backward workspace (pytorch aten/src/ATen/native/transformers/cuda/flash_attn/flash_api.cpp
   `mha_bwd`): softmax_d fp32 [B, H, S↑128], dq_accum fp32 [B, S↑128, H, D↑32], and under GQA dk/dv_expanded
   [B, S, H, D] in the input dtype, alive together with dq/dk/dv while the kernel runs. Added as a transient
   reservation when the backward op runs.
3. TRL's fused LM head (trl/kernels/chunked_logprob.py, trl/trainer/utils.py `add_fused_lm_head`): on CUDA
   `_use_triton` is true, so (a) only positions with a label ≠ -100 are gathered (`hidden_states[mask]`) and
   scattered back, (b) the fold of each [4096, 32768] tile into the running logsumexp runs in Triton and allocates
   nothing, where the CPU fallback (`_forward_tile`/`_backward_tile`) materialises several fp32 tile-sized
   temporaries, (c) `_addmm_fp32` accumulates with `addmm(out_dtype=float32, out=acc)` instead of fp32 copies of
   both operands. The trace patches `_use_triton` to true and the two kernels to no-allocation stand-ins.
4. torch optimizers left at foreach=None (HF's "adamw_torch", SGD): torch picks the foreach implementation for CUDA
   tensors and the for-loop one for CPU tensors (torch/optim/optimizer.py `_default_to_fused_or_foreach`); foreach
   holds a parameter-sized list of temporaries. The trace makes the same choice as on CUDA.
5. Every block is rounded up to 512 bytes (CUDACachingAllocator `kMinBlockSize`): the tracker's `round_to`.
6. Dropout in training (peft's lora_dropout, TRL 0.05 by default): on CPU `at::dropout` takes `_dropout_impl`, a
   mask in the INPUT dtype from `bernoulli_` that `mul` saves (4 B/elt for peft's fp32 adapter inputs); on CUDA
   `is_fused_kernel_acceptable` sends it to `aten::native_dropout`, which saves a bool mask (1 B/elt)
   (aten/src/ATen/native/Dropout.cpp). The trace calls `native_dropout` as CUDA does.
7. TRL's chunked divergence (trl/kernels/chunked_divergence.py, DistillationTrainer's loss): on CUDA (a) only the
   completion positions are projected (`h[valid]` in distillation_trainer.py `_chunked_divergence_loss`), (b) the
   three folds of each pair of [4096, 32768] tiles run in Triton and allocate nothing, where the CPU fallback
   (`_stats_tile`, `_jsd_tile`, `_backward_tile`) materialises several fp32 tile-sized temporaries, (c) `_project`
   writes the fp32 tile straight from 16-bit operands (`torch.mm(out_dtype=float32, out=tile)`) instead of fp32
   copies of the hidden chunk and the weight chunk, and `_addmm_fp32` as in 3. The trace patches the same names.
8. Linear-attention hybrids (Gated DeltaNet, short convolutions): flash-linear-attention's and causal-conv1d's
   kernels in place of transformers' torch fallbacks, each allocation from the kernels' own wrappers
   (hpcmem/trace/kernels_linear.py).
9. Mamba mixers: mamba-ssm's fused mamba_split_conv1d_scan_combined for Mamba-2 and its hybrids (conv, chunked
   scan, gated RMSNorm and out_proj in one autograd Function; hpcmem/trace/kernels_mamba.py), its mamba_inner_fn
   for Mamba-1 and selective_scan_fn (+ causal-conv1d) for Jamba's and Zamba's Mamba layers
   (hpcmem/trace/kernels_mamba1.py), in place of transformers' torch fallbacks, each allocation from the kernels'
   own wrappers; the fallbacks refuse to run.
10. Kimi Delta Attention (Kimi-Linear, Bailing-hybrid): flash-linear-attention's chunk_kda (it saves the normed q, k,
   the chunk-local attention matrices Aqk / Akk and the gate's cumsum, and recomputes the WY representation and the
   chunk states in backward) and causal-conv1d's kernel in place of transformers' torch fallbacks, each allocation
   from the kernels' own wrappers (hpcmem/trace/kernels_kda.py); the recurrent fallbacks refuse to run.
11. RWKV time mixing: the Hub WKV kernel (kernels-community/rwkv) behind transformers' RwkvLinearAttention in place
   of the per-token loop, from the Function and the kernel's source (hpcmem/trace/kernels_rwkv.py); rows over its
   compiled 1,024-token Tmax refused.
12. layer_norm under autocast: CUDA autocast runs it in fp32, CPU autocast in 16 bits; mapped for vision-language
   models only (hpcmem/trace/kernels_autocast.py says why); softmax and pow likewise for Aria's projector, whose
   ops see 16-bit inputs (kernels_autocast.py `softmax_pow_fp32`), and group_norm and softmax inside Apertus 1.5's
   vision tokenizer and Chameleon's VQ-VAE, the same encoder (`vq_tokenizer_fp32`), and group_norm and `**` for Emu3's VQ-VAE
   (`group_norm_pow_fp32`).

Not mapped (documented in the result's not_modelled): cuBLAS/cuBLASLt workspaces (constant per handle, seen by
probes), memory-efficient attention's backward workspace (the masked SDPA path), cuDNN attention's backward
workspace (MLA calls, entry 1: cuDNN sizes it per graph, aten/src/ATen/native/cudnn/MHA.cpp), MLA calls that go
to memory-efficient attention with fewer key/value heads than query heads (they stay on the CPU math path; no type
of transformers 5.24 makes one: its unequal head dims are all cuDNN's), the rest of CUDA autocast's fp32 op list (CPU
autocast keeps exp/log/pow/softmax in bf16; in the supported families these ops already see fp32 inputs, but for
Aria's projector: entry 12), and its
layer_norm outside vision-language models (entry 12), the 8-byte RNG
state tensors of CUDA flash, `_foreach_norm` in gradient clipping (same outputs as the CPU norms).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from hpcmem.job.jobspec import JobSpec
from hpcmem.trace.fakeenv import patched
from hpcmem.trace.kernels_autocast import group_norm_pow_fp32, layer_norm_fp32, softmax_pow_fp32, vq_tokenizer_fp32
from hpcmem.trace.kernels_kda import kda_kernels
from hpcmem.trace.kernels_linear import linear_attention_kernels
from hpcmem.trace.kernels_mamba import mamba_kernels
from hpcmem.trace.kernels_rwkv import rwkv_kernels

FLASH_MAX_HEAD_DIM = 256


@contextlib.contextmanager
def cuda_mapping(tracker: Any, job: JobSpec) -> Iterator[list[str]]:
    """Apply the CUDA mapping while the block runs; yields the notes that go into the result."""
    notes: list[str] = []
    with contextlib.ExitStack() as stack:
        stack.enter_context(_flash_sdpa(tracker, notes))
        stack.enter_context(_fused_head_triton(notes))
        stack.enter_context(_foreach_default(notes))
        stack.enter_context(_native_dropout(notes))
        stack.enter_context(_divergence_triton(notes))

        stack.enter_context(linear_attention_kernels(notes, job))    # 8: linear-attention hybrids' kernels

        stack.enter_context(mamba_kernels(notes, job))               # 9: Mamba mixers' kernels

        stack.enter_context(kda_kernels(notes, job))                 # 10: Kimi Delta Attention's kernels

        stack.enter_context(rwkv_kernels(notes, job))                # 11: RWKV's WKV kernel

        stack.enter_context(layer_norm_fp32(notes, job))             # 12: layer_norm in fp32 (vision-language)
        stack.enter_context(softmax_pow_fp32(notes, job))            # 12: softmax and pow in fp32 (Aria)
        stack.enter_context(vq_tokenizer_fp32(notes, job))           # 12: group_norm, softmax (VQ encoders)
        stack.enter_context(group_norm_pow_fp32(notes, job))         # 12: group_norm and ** in fp32 (Emu3)
        notes.append("every block rounded up to 512 bytes (CUDA caching allocator)")
        yield notes


def _round(n: int, m: int) -> int:
    return -(-n // m) * m


# -- 1 + 2: SDPA → CUDA flash attention ---------------------------------------------------------------------------
@contextlib.contextmanager
def _flash_sdpa(tracker: Any, notes: list[str]) -> Iterator[None]:
    import torch
    import torch.nn.functional as F

    original = F.scaled_dot_product_attention
    aten = torch.ops.aten
    used = [0]
    mla = {"cudnn": 0, "efficient": 0}
    masked_dropout = {"cudnn": 0, "efficient": 0}

    def sdpa(query: Any, key: Any, value: Any, attn_mask: Any = None, dropout_p: float = 0.0,
             is_causal: bool = False, scale: float | None = None, enable_gqa: bool = False) -> Any:
        dtype = torch.get_autocast_dtype("cpu") if torch.is_autocast_enabled("cpu") else query.dtype
        head_dim = query.shape[-1]
        heads_ok = key.shape[-3] == query.shape[-3] or (enable_gqa and query.shape[-3] % key.shape[-3] == 0)
        # flash needs q, k and v of one head size (cuda/sdp_utils.cpp check_head_dim_size_flash): MLA's value heads
        # (v_head_dim ≠ qk_head_dim) do not take it
        same_dim = key.shape[-1] == head_dim and value.shape[-1] == head_dim
        half = dtype in (torch.float16, torch.bfloat16)
        if half and not same_dim and key.shape[-1] == head_dim and heads_ok:
            backend = mla_backend(head_dim, value.shape[-1])
            # cuDNN takes fewer key/value heads (sdp_utils.cpp can_use_cudnn_attention: supports_gqa); the
            # memory-efficient path is mapped for equal head counts only
            if backend == "cudnn" or (backend is not None and key.shape[-3] == query.shape[-3]):
                mla[backend] += 1
                q, k, v = (t.to(dtype) for t in (query, key, value))
                return _cuda_sdpa(backend, q, k, v, attn_mask, dropout_p, is_causal, scale)
        if attn_mask is not None and dropout_p > 0 and half and same_dim and heads_ok:
            # a mask and dropout: the CPU's flash kernel refuses dropout (sdp_utils_cpp.cpp `check_for_dropout`) and
            # the math path keeps fp32 [B, H, S, S] scores and probabilities; CUDA's flash refuses the mask, and
            # cuDNN or memory-efficient attention take both (sdp_utils.cpp), keeping no scores
            backend = mla_backend(head_dim, head_dim)
            if backend == "cudnn" or (backend is not None and key.shape[-3] == query.shape[-3]):
                masked_dropout[backend] += 1
                q, k, v = (t.to(dtype) for t in (query, key, value))
                return _cuda_sdpa(backend, q, k, v, attn_mask, dropout_p, is_causal, scale)
        if (attn_mask is not None or not half or head_dim > FLASH_MAX_HEAD_DIM
                or head_dim % 8 or not heads_ok or not same_dim):
            return original(query, key, value, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal,
                            scale=scale, enable_gqa=enable_gqa)
        used[0] += 1
        q, k, v = (t.to(dtype) for t in (query, key, value))    # what CUDA autocast's cast does
        return aten._scaled_dot_product_flash_attention(q, k, v, dropout_p, is_causal, False, scale=scale)[0]

    def flash_backward_workspace(args: Any, kwargs: Any, out: Any) -> int:
        q, k = args[1], args[2]     # (grad_out, query, key, value, out, logsumexp, ...)
        b, h, s, d = q.shape
        s128, d32 = _round(s, 128), _round(d, 32)
        workspace = _nbytes(b * h * s128, 4) + _nbytes(b * s128 * h * d32, 4)        # softmax_d, dq_accum
        if k.shape[1] != h:
            workspace += 2 * _nbytes(b * k.shape[2] * h * d, q.element_size())      # dk/dv_expanded
        return workspace

    tracker.workspace[aten._scaled_dot_product_flash_attention_backward.default] = flash_backward_workspace
    try:
        with patched(F, "scaled_dot_product_attention", sdpa):
            yield
    finally:
        tracker.workspace.pop(aten._scaled_dot_product_flash_attention_backward.default, None)
    if used[0]:
        notes.append(f"SDPA → CUDA flash attention op with the FA2 backward workspace, in {used[0]} calls")
    for backend, calls in mla.items():
        if calls:
            notes.append(f"SDPA with value heads of another size (MLA) → CUDA {backend} attention op, "
                         f"in {calls} calls")
    for backend, calls in masked_dropout.items():
        if calls:
            notes.append(f"SDPA with a mask and dropout → CUDA {backend} attention op, in {calls} calls")


def mla_backend(d_qk: int, d_v: int) -> str | None:
    """The CUDA backend torch 2.13 picks on sm90 for a 16-bit SDPA call flash does not take: value heads of another
    size (MLA), or a mask with dropout (flash takes no mask; equal sizes d_qk = d_v).

    aten/src/ATen/native/transformers/cuda/sdp_utils.cpp: `check_prefer_cudnn_attention` puts cuDNN first on sm90
    with cuDNN > 9.15.0 (torch 2.13.0+cu132 requires 9.20 / 9.21; the H200 probes ran 9.19);
    `check_cudnn_tensor_shapes` then takes head dims ≤ 128, or exactly d_qk 192 / d_v 128 on sm90 with cuDNN ≥ 9.11
    (256 only from cuDNN 9.22), multiples of 8; flash refuses unequal dims (`check_head_dim_size_flash`);
    memory-efficient attention takes them when both are multiples of 8 (`check_head_dim_size_mem_efficient`,
    `minimum_gemm_alignment` 8 for 16-bit on sm80+). None: math, as on the CPU.
    """
    if d_qk % 8 or d_v % 8:
        return None
    if (d_qk <= 128 and d_v <= 128) or (d_qk, d_v) == (192, 128):
        return "cudnn"
    return "efficient"


def _cuda_sdpa(backend: str, q: Any, k: Any, v: Any, attn_mask: Any, dropout_p: float, is_causal: bool,
              scale: float | None) -> Any:
    """Call the CUDA op itself (its meta kernel runs on fake tensors), as aten/src/ATen/native/transformers/
    attention.cpp `scaled_dot_product_attention` does: a boolean mask becomes an additive one in the query's dtype
    first (cuDNN: `convert_boolean_attn_mask_cudnn`, -65504 where masked; memory-efficient:
    `convert_boolean_attn_mask`, -inf, then `preprocess_mask` pads the last dim to a multiple of 16 and slices it
    back), and that tensor is what backward saves."""
    import torch

    aten = torch.ops.aten
    lse = torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v))    # should_compute_logsumexp
    bias = attn_mask
    if bias is not None and bias.dtype == torch.bool:
        fill = -65504.0 if backend == "cudnn" else float("-inf")
        bias = torch.where(bias.logical_not(), fill, torch.scalar_tensor(0.0, dtype=q.dtype))
    if backend == "cudnn":
        return aten._scaled_dot_product_cudnn_attention(q, k, v, bias, lse, dropout_p, is_causal, False,
                                                        scale=scale)[0]
    if bias is not None:
        last = bias.shape[-1]
        if last % 16:
            bias = torch.nn.functional.pad(bias, (0, 16 - last % 16))[..., :last]
        bias = bias.expand(q.shape[0], q.shape[1], q.shape[2], k.shape[2])
    return aten._scaled_dot_product_efficient_attention(q, k, v, bias, lse, dropout_p, is_causal, scale=scale)[0]


def _nbytes(numel: int, itemsize: int) -> int:
    return _round(numel * itemsize, 512)


# -- 3: TRL's fused LM head on a Triton device ----------------------------------------------------------------------
class _NoAllocKernel:
    """Stands in for a Triton kernel that folds a tile in place: `kernel[grid](...)` allocates nothing."""

    def __getitem__(self, grid: Any) -> Any:
        return lambda *args, **kwargs: None


@contextlib.contextmanager
def _fused_head_triton(notes: list[str]) -> Iterator[None]:
    import types

    import torch

    # Modules that `from chunked_logprob import _use_triton, _addmm_fp32` must bind the originals: imported for the
    # first time inside the patches below, they would keep the stand-ins for the rest of the process (a real CPU run
    # of DistillationTrainer after a trace then took the Triton path and failed).
    import trl.kernels.chunked_divergence  # noqa: F401
    import trl.kernels.chunked_logprob as chunked
    import trl.trainer.distillation_trainer  # noqa: F401
    import trl.trainer.utils as trl_utils

    def addmm_fp32(acc: Any, a: Any, b: Any) -> None:
        # chunked_logprob._addmm_fp32 on CUDA with 16-bit operands: no fp32 copies of a and b.
        torch.addmm(acc, a, b, out_dtype=torch.float32, out=acc)

    had_triton = hasattr(chunked, "triton")
    triton_stub = chunked.triton if had_triton else types.SimpleNamespace(cdiv=lambda a, b: -(-a // b))
    if not had_triton:
        chunked.triton = triton_stub
    try:
        with contextlib.ExitStack() as stack:
            for module in (chunked, trl_utils):
                stack.enter_context(patched(module, "_use_triton", lambda device: True))
            stack.enter_context(patched(chunked, "_forward_kernel", _NoAllocKernel()))
            stack.enter_context(patched(chunked, "_backward_kernel", _NoAllocKernel()))
            stack.enter_context(patched(chunked, "_addmm_fp32", addmm_fp32))
            yield
    finally:
        if not had_triton:
            del chunked.triton
    notes.append("TRL fused LM head on its Triton path: valid positions only, no fp32 tile temporaries")


# -- 7: TRL's chunked divergence (distillation) on a Triton device --------------------------------------------------
@contextlib.contextmanager
def _divergence_triton(notes: list[str]) -> Iterator[None]:
    import types

    import torch
    import trl.kernels.chunked_divergence as divergence
    import trl.trainer.distillation_trainer as distill

    used = [0]

    def addmm_fp32(acc: Any, a: Any, b: Any) -> None:
        torch.addmm(acc, a, b, out_dtype=torch.float32, out=acc)

    def project(tile: Any, hidden_chunk: Any, weight: Any, bias: Any, start: int, end: int, dtype: Any) -> None:
        # chunked_divergence._project with `tile.device.type == "cuda"`: 16-bit operands, fp32 output, no copies
        used[0] += 1
        w = weight[start:end].to(dtype).t()
        if dtype in (torch.float16, torch.bfloat16):
            torch.mm(hidden_chunk, w, out_dtype=torch.float32, out=tile)
        else:
            torch.mm(hidden_chunk.float(), w.float(), out=tile)
        if bias is not None:
            tile.add_(bias[start:end].float())

    had_triton = hasattr(divergence, "triton")
    if not had_triton:
        divergence.triton = types.SimpleNamespace(cdiv=lambda a, b: -(-a // b))
    try:
        with contextlib.ExitStack() as stack:
            for module in (divergence, distill):
                stack.enter_context(patched(module, "_use_triton", lambda device: True))
            for kernel in ("_stats_kernel", "_jsd_kernel", "_backward_kernel"):
                stack.enter_context(patched(divergence, kernel, _NoAllocKernel()))
            stack.enter_context(patched(divergence, "_addmm_fp32", addmm_fp32))
            stack.enter_context(patched(divergence, "_project", project))
            yield
    finally:
        if not had_triton:
            del divergence.triton
    if used[0]:
        notes.append("TRL chunked divergence on its Triton path: completion positions only, no fp32 tile temporaries")


# -- 4: foreach optimizers, as torch picks them for CUDA tensors ---------------------------------------------------
@contextlib.contextmanager
def _foreach_default(notes: list[str]) -> Iterator[None]:
    import torch.optim.adam as adam
    import torch.optim.sgd as sgd

    def on_cuda(params: Any, differentiable: bool, use_fused: bool = False) -> tuple[bool, bool]:
        if differentiable:
            return False, False
        return use_fused, not use_fused

    with contextlib.ExitStack() as stack:
        for module in (adam, sgd):
            if hasattr(module, "_default_to_fused_or_foreach"):
                stack.enter_context(patched(module, "_default_to_fused_or_foreach", on_cuda))
        yield
    notes.append("optimizers with foreach=None run foreach, as torch picks for CUDA tensors")


# -- 6: dropout → the fused CUDA kernel with a bool mask -----------------------------------------------------------
@contextlib.contextmanager
def _native_dropout(notes: list[str]) -> Iterator[None]:
    import torch
    import torch.nn.functional as F

    original = F.dropout
    used = [0]

    def dropout(input: Any, p: float = 0.5, training: bool = True, inplace: bool = False) -> Any:
        if not training or p == 0.0 or inplace or not input.is_floating_point():
            return original(input, p, training, inplace)
        used[0] += 1
        return torch.ops.aten.native_dropout(input, p, True)[0]

    with patched(F, "dropout", dropout):
        yield
    if used[0]:
        notes.append(f"dropout → CUDA native_dropout with a bool mask, in {used[0]} calls")
