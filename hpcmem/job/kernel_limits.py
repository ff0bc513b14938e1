"""Jobs whose GPU kernels refuse what the CPU trace would run: RWKV's WKV CUDA kernel and xLSTM's mLSTM kernels
(torch-free; hpcmem.trace.kernels_rwkv and hpcmem.trace.kernels_xlstm map what those kernels allocate)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from hpcmem.job.shape import micro_batch, precision

if TYPE_CHECKING:
    from hpcmem.job.protocol import Job

# transformers 5.24 models/rwkv/modeling_rwkv.py loads the WKV kernel; kernels-community rwkv/build.toml cuda-flags
# -DTmax=1024 (kernel_backward's q[Tmax], r[Tmax])
RWKV_TMAX = 1024
RWKV_MODULES = ("rwkv",)


def rwkv_problems(job: Job) -> list[str]:
    """The RWKV jobs whose GPU step stops (or overruns) in the WKV kernel, from the estimate's own micro-batch and
    precision: a row longer than RWKV_TMAX tokens, and fp32 weights under bf16 autocast (bf16 keys, fp32 time_first)."""
    if job.model.model_type not in RWKV_MODULES:
        return []
    problems, batch, prec = [], micro_batch(job), precision(job)
    context = job.model.max_position_embeddings          # RwkvConfig.context_length (attribute_map)
    if batch.seq > min(RWKV_TMAX, context):
        problems.append(f"{batch.seq} tokens per row ({batch.source}): RWKV's WKV CUDA kernel takes at most "
                        f"{min(RWKV_TMAX, context)} (RwkvLinearAttention.forward raises past context_length {context}; "
                        f"the kernel is built with Tmax {RWKV_TMAX}, kernels-community rwkv build.toml, and its backward "
                        f"keeps per-token arrays of that size); set max_length ≤ {min(RWKV_TMAX, context)} "
                        "(padding-free: batch × max_length)")
    if prec.autocast and job.train.bf16:
        problems.append("fp32 weights under bf16 autocast: RWKV's WKV CUDA kernel reads time_first as bf16 next to "
                        "bf16 keys (torch_binding.cpp forward_bf16) and stops on the fp32 parameter; load bf16 weights "
                        "(dtype bfloat16) or train in fp32/fp16")
    return problems


XLSTM_MODULES = ("xlstm",)
# The config fields whose class default (configuration_xlstm.py xLSTMConfig) runs the torch code the trace measures.
XLSTM_TRACED_KERNELS = {"chunkwise_kernel": "chunkwise--native_autograd", "sequence_kernel": "native_sequence__native"}


def xlstm_problems(model_type: str, config: dict[str, Any] | None) -> list[str]:
    """Why an xLSTM config's GPU memory cannot be held to the trace: each kernel field naming an unmapped kernel."""
    if model_type not in XLSTM_MODULES:
        return []
    problems = []
    for field, traced in XLSTM_TRACED_KERNELS.items():
        got = (config or {}).get(field, traced)
        if got != traced:
            problems.append(
                f"{field} {got!r}: with the xlstm package installed transformers runs mlstm_kernels' {got} kernel, "
                f"whose autograd Function hpcmem has not mapped (the trace measures the torch code of {traced!r}); "
                f"set {field}: {traced!r} to estimate the torch kernels")
    return problems


def xlstm_dtype_problems(job: Job) -> list[str]:
    """An xLSTM on 16-bit weights without autocast (bf16 and fp16 off) whose rows hold a whole chunk: the chunkwise
    kernel (modeling_xlstm.py `mlstm_chunkwise_recurrent_fw_C`) multiplies keys gated by fp32 gate activations with the
    16-bit values (`matK_chunk_gated.transpose(-2, -1) @ matV_chunk`), which torch's matmul refuses ("expected scalar
    type Float but found BFloat16") where autocast would have cast both; a row shorter than `chunk_size` runs only the
    step kernel, which promotes elementwise (traced: 40 tokens run, 130 refused)."""
    if job.model.model_type not in XLSTM_MODULES:
        return []
    batch, prec = micro_batch(job), precision(job)
    learned = job.model.learned
    cfg = (learned.config if learned else None) or {}
    chunk = int(cfg.get("chunk_size", 64))
    # "train_with_padding" pads every row to whole chunks (modeling_xlstm.py `wrap_chunkwise_pad_zeros`)
    if prec.amp or prec.weight != 2 or (batch.seq < chunk and cfg.get("mode") != "train_with_padding"):
        return []
    return [f"bf16 and fp16 off on {job.train.dtype} weights: xLSTM's chunkwise mLSTM kernel multiplies fp32-gated "
            f"keys with {job.train.dtype} values (modeling_xlstm.py mlstm_chunkwise_recurrent_fw_C), which torch "
            f"refuses without autocast once a row holds a whole chunk ({batch.seq} tokens per row, chunk_size "
            f"{chunk}); turn bf16 (or fp16) on, or load fp32 weights"]
