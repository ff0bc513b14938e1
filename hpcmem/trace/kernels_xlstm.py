"""xLSTM's mLSTM kernels: which configs the trace stands for on a GPU, and the refusal of the others (torch-free).

transformers 5.24 models/xlstm/modeling_xlstm.py: with the `xlstm` package installed (`is_xlstm_available`), the
blocks are xlstm.xlstm_large.model's `mLSTMBlock` (github.com/NX-AI/xlstm @032a6fb), whose `mLSTMLayer` runs
mlstm_kernels' `mLSTMBackend` (github.com/NX-AI/mlstm_kernels @39d3c61, torch/backend_module.py): the chunkwise kernel
named by the config's `chunkwise_kernel` (`get_mlstm_kernel`), in mode "train" directly, in mode "inference" (the
class default) through `wrap_chunkwise__arbitrary_sequence_length` (torch/kernel_wrappers.py: fp32 zero initial
states, chunk sizes 64, 32, 16, then `sequence_kernel` for a remainder under 16 tokens). Without the package,
transformers' own copies run (`xLSTMBackend`: always `mlstm_chunkwise_native_autograd` and
`mlstm_recurrent_sequence_native`, whatever the config names).

The class default `chunkwise--native_autograd` is mlstm_kernels' torch/chunkwise/native/fwbw.py
`mlstm_chunkwise__native_autograd` → native/fw.py `mlstm_chunkwise_fw` (plain torch ops, autograd saves what they
save), and transformers' fallback is that code op for op (einops `rearrange` of contiguous tensors where transformers
takes `view`; the same fp32 initial states in the inference wrapper); xlstm_large's mLSTMLayer, FeedForward, RMSNorm and
MultiHeadLayerNorm (xlstm_large/model.py, components.py) match transformers' xLSTMLayer, xLSTMFeedForward,
xLSTMRMSNorm and xLSTMMultiHeadLayerNorm the same way. So for a config naming the torch kernels the trace of the
fallback is the GPU's own computation, with or without the package, and no stand-in is needed — but for the tokens
past a row's last whole chunk of 64: the fallback runs them all step by step, the package's wrapper chunks of 32 and
16 first (the estimate counts the fallback's steps: hpcmem/estimate/recurrent_tail.py).

A config naming another chunkwise kernel (the Triton `chunkwise--triton_limit_chunk`, `--triton_xl_chunk`,
`--triton_xl_chunk_siging`; the custom-backward `chunkwise--native_custbw`; the quadratic `parallel--*`) or the Triton
sequence kernel runs, with the package installed, an autograd Function that saves other tensors than the fallback the
trace would measure: refused, not estimated.
"""

from __future__ import annotations


