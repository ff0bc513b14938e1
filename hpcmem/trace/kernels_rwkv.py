"""`--kernels cuda` for RWKV (RWKV-4) time mixing: what the WKV CUDA kernel's autograd Function allocates and saves, in
place of transformers' per-token CPU loop (which keeps every token's state update for backward).

transformers 5.24 models/rwkv/modeling_rwkv.py: `RwkvSelfAttention.__init__` loads the Hub kernel
`kernels-community/rwkv` (version 1) through `load_wkv_cuda_kernel(config.context_length)` when ninja, CUDA and the
`kernels` package are available; `rwkv_linear_attention` then calls `RwkvLinearAttention.apply` for every CUDA input of
more than one token (else `rwkv_linear_attention_cpu`, a Python loop over the tokens). In training TRL passes
use_cache=False, so no state goes in or out. Read from that Function and from the kernel's source,
github.com/huggingface/kernels-community @8a730d9 rwkv/ (torch-ext/torch_binding.cpp, rwkv/wkv_cuda.cu,
rwkv/wkv_cuda_bf16.cu: the launchers only write into the tensors they are given, nothing is allocated in C++):

- forward: time_decay → −exp(time_decay.float()) fp32 [C]; under fp16, time_first, key and value are cast to fp32;
  output = empty_like(key); `forward_bf16` for bf16 keys (w fp32, u/k/v/y bf16: `data_ptr<bf16>()`, so a bf16 key with
  an fp32 time_first — fp32 weights under bf16 autocast — stops in the dtype check of `data_ptr<T>`,
  pytorch aten/src/ATen/templates/TensorMethods.cpp `check_type`), `forward` (all fp32) otherwise. Saves time_decay,
  time_first, key, value, output; returns output cast to the input dtype (the same tensor unless fp16).
- backward: g_time_decay [C] (bf16 for bf16 inputs, else fp32), g_time_first, g_key, g_value like their saved inputs,
  g_output made contiguous (fp32 first under fp16); each gradient cast back to the input dtype.

Limits: transformers' own checks run first, as they run on a GPU — `RwkvLinearAttention.forward` raises past
`context_length` tokens per row (the length the kernel was loaded for) and where B·C is no multiple of min(C, 32) (the
launch grid); the stand-in calls that forward with a kernel handle of the config's `context_length` and goes on once
it has passed them (`real_checks`), so such a refusal is transformers' own line. Beyond them, refused here rather than
estimated: build.toml compiles the kernel with -DTmax=1024 and `kernel_backward` keeps two float[Tmax] per-thread
arrays indexed by token, so with a `context_length` over 1,024 a longer row runs past them. Under `--kernels cuda` the
per-token CPU loop never runs in place of the kernel: it is replaced by a refusal.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

from hpcmem.job.kernel_limits import RWKV_MODULES as MODULES
from hpcmem.job.kernel_limits import RWKV_TMAX as TMAX
from hpcmem.trace.kernels_linear import hybrid_modules, stand_ins


def _check(key: Any, time_first: Any) -> None:
    import torch

    tokens = key.shape[1]
    if tokens > TMAX:
        raise NotImplementedError(f"RWKV's WKV CUDA kernel is built for at most {TMAX} tokens per row (Tmax); a row "
                                  f"of {tokens} overruns its backward's per-token arrays")
    want = torch.bfloat16 if key.dtype == torch.bfloat16 else torch.float32
    if time_first.dtype != want:
        raise RuntimeError(f"RWKV's WKV CUDA kernel reads time_first as {want} for {key.dtype} keys "
                           f"(torch_binding.cpp data_ptr); it is {time_first.dtype}: fp32 weights under bf16 "
                           "autocast stop in the real kernel")


def _wkv_function() -> Any:
    import torch

    class RwkvLinearAttentionStandIn(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, time_decay: Any, time_first: Any, key: Any, value: Any) -> Any:
            ctx.input_dtype = key.dtype
            time_decay = -torch.exp(time_decay.float().contiguous())
            if key.dtype == torch.float16:
                time_first, key, value = time_first.float(), key.float(), value.float()
            time_first, key, value = time_first.contiguous(), key.contiguous(), value.contiguous()
            _check(key, time_first)
            output = torch.empty_like(key, memory_format=torch.contiguous_format)     # the kernel writes y
            ctx.save_for_backward(time_decay, time_first, key, value, output)
            return output.to(ctx.input_dtype)

        @staticmethod
        def backward(ctx: Any, g_output: Any) -> Any:
            dtype = ctx.input_dtype
            time_decay, time_first, key, value, _output = ctx.saved_tensors
            g_time_decay = torch.empty_like(time_decay, memory_format=torch.contiguous_format,
                                            dtype=torch.bfloat16 if dtype == torch.bfloat16 else torch.float32)
            g_time_first = torch.empty_like(time_first, memory_format=torch.contiguous_format)
            g_key = torch.empty_like(key, memory_format=torch.contiguous_format)
            g_value = torch.empty_like(value, memory_format=torch.contiguous_format)
            if dtype == torch.float16:
                g_output = g_output.float()
            g_output = g_output.contiguous()                                    # read by the kernel, alive till here
            return (g_time_decay.to(dtype), g_time_first.to(dtype), g_key.to(dtype), g_value.to(dtype))

    return RwkvLinearAttentionStandIn


class _ChecksPassed(Exception):
    """Raised by the kernel handle `real_checks` lends transformers: its forward reached the kernel call."""


def _kernel_reached(*args: Any, **kwargs: Any) -> None:
    raise _ChecksPassed


# transformers' RwkvLinearAttention.forward raises this after its own checks when a tensor is not on a CUDA device
# (the trace's tensors are not): the checks before it have passed
_DEVICE_CHECK = "Calling the CUDA kernel"


def real_checks(module: Any, context_length: int, time_decay: Any, time_first: Any, key: Any, value: Any) -> None:
    """Run transformers' own checks in `module.RwkvLinearAttention.forward` (the row against the length the kernel was
    loaded for, `load_wkv_cuda_kernel(config.context_length)`; batch × hidden against the launch grid) with a kernel
    handle of that length in place of the Hub kernel; their ValueError propagates from transformers' line. Returns once
    the forward is past them (its device check, or its call of the kernel)."""
    handle = SimpleNamespace(max_seq_length=context_length, forward=_kernel_reached, forward_bf16=_kernel_reached,
                             forward_with_state=_kernel_reached, forward_with_state_bf16=_kernel_reached)
    loaded, module.rwkv_cuda_kernel = module.rwkv_cuda_kernel, handle
    try:
        module.RwkvLinearAttention.forward(SimpleNamespace(), time_decay, time_first, key, value)
    except _ChecksPassed:
        pass
    except ValueError as exc:
        if not str(exc).startswith(_DEVICE_CHECK):
            raise
    finally:
        module.rwkv_cuda_kernel = loaded


def replacements(module: Any, context_length: int) -> dict[str, Any]:
    """What `--kernels cuda` puts in modeling_rwkv (`module`): the kernel's Function where transformers dispatches to
    it, after transformers' own checks of it (`real_checks`, at the config's `context_length`), and a refusal in place
    of the per-token loop (the original still serves one-token inputs, as on a GPU)."""
    cpu_loop = module.rwkv_linear_attention_cpu

    def rwkv_linear_attention(time_decay: Any, time_first: Any, key: Any, value: Any, state: Any = None,
                              return_state: bool = False) -> Any:
        if key.size(1) == 1:
            return cpu_loop(time_decay, time_first, key, value, state=state, return_state=return_state)
        if state is not None or return_state:
            raise NotImplementedError("the RWKV kernel stand-in maps training (no state in or out)")
        real_checks(module, context_length, time_decay, time_first, key, value)
        return _wkv_function().apply(time_decay, time_first, key, value), None

    def refusal(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("hpcmem trace --kernels cuda: transformers' per-token loop rwkv_linear_attention_cpu ran in "
                           "RWKV time mixing; on a GPU with the WKV kernel loaded the training step runs the kernel")

    return {"rwkv_linear_attention": rwkv_linear_attention, "rwkv_linear_attention_cpu": refusal}


@contextlib.contextmanager
def rwkv_kernels(notes: list[str], job: Any) -> Iterator[None]:
    """Put the WKV kernel's stand-in in modeling_rwkv while the block runs, if the job's model is built from it."""
    names = hybrid_modules(job, MODULES)
    table: dict[str, dict[str, Any]] = {}
    if names:
        import transformers.models.rwkv.modeling_rwkv as rwkv

        table = {"rwkv": replacements(rwkv, job.model.max_position_embeddings)}    # RwkvConfig.context_length
    with stand_ins(table) as calls:
        yield
    if calls[0]:
        notes.append(f"RWKV time mixing: the WKV CUDA kernel's Function stands in for transformers' per-token loop in "
                     f"{calls[0]} calls (hpcmem/trace/kernels_rwkv.py)")
