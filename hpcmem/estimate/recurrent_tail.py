"""xLSTM's recurrent tail: the tokens of a row past its last whole chunk run one step at a time, and every step keeps
its state for the backward.

transformers 5.24 models/xlstm/modeling_xlstm.py, the code that runs without the `xlstm` package: in mode "inference"
(xLSTMConfig's default) `wrap_chunkwise_arbitrary_sequence_length` runs the row's ⌊L / chunk_size⌋ whole chunks
through `mlstm_chunkwise_native_autograd` and the L mod chunk_size tokens left through
`mlstm_recurrent_sequence_native`, one `mlstm_recurrent_step_native` per token. Each step's autograd keeps, per layer,
three tensors of [rows, num_heads, qk_head_dim, v_head_dim]:
- the clone of the previous state C (`matC_old.clone()`, saved by its product with the forget gate), in
  `inference_state_dtype` (float32 by default);
- the outer product k vᵀ (saved by its product with the input gate), in the projections' dtype;
- the new state in the projections' dtype (saved by the output's matmul `q @ C`; the state itself when both dtypes
  agree, a copy otherwise).
The learned terms of an xLSTM are traced at row lengths that are multiples of chunk_size (hpcmem/trace/learn.py), where
no step runs, so a row of another length adds these bytes to every layer: saved across the forward without
checkpointing, held by the one layer being recomputed with it. Added to the layer's backward peak they are an upper
bound: the steps ran last, so their backward runs first and frees them before the chunks' backward, where a layer's
peak may fall.

With the `xlstm` package installed, mlstm_kernels' wrapper runs chunks of 64, 32 and 16 before the steps
(hpcmem/trace/kernels_xlstm.py), leaving fewer than 16 steps: the term is then an upper bound.
"""

from __future__ import annotations

from typing import Any

from hpcmem.job.jobspec import JobSpec
from hpcmem.job.shape import MicroBatch, Precision

STATE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


def _config(job: JobSpec) -> dict[str, Any] | None:
    m = job.model
    if m.model_type != "xlstm" or m.learned is None:
        return None
    cfg = m.learned.config
    return cfg if "inference" in str(cfg.get("mode", "inference")) else None


def chunk_size(job: JobSpec) -> int | None:
    """The chunk size whose remainder runs step by step, None where no step runs (not an xLSTM in inference mode)."""
    cfg = _config(job)
    return int(cfg.get("chunk_size", 64)) if cfg is not None else None


def step_bytes(job: JobSpec, mb: MicroBatch, prec: Precision) -> int:
    """What one recurrent step keeps in one layer (the three tensors above), 0 for other models."""
    cfg = _config(job)
    if cfg is None:
        return 0
    heads = int(cfg.get("num_heads", 8))
    hidden = int(cfg.get("hidden_size") or cfg.get("embedding_dim"))
    # xLSTMLayer: qk_dim = int(hidden_size · qk_dim_factor), v_dim likewise, split over num_heads
    qk = int(hidden * float(cfg.get("qk_dim_factor", 0.5))) // heads
    v = int(hidden * float(cfg.get("v_dim_factor", 1.0))) // heads
    state = STATE_BYTES.get(str(cfg.get("inference_state_dtype", "float32")), 4)
    return mb.rows * heads * qk * v * (state + 2 * prec.act)


def tail_bytes(job: JobSpec, mb: MicroBatch, prec: Precision) -> int:
    """What the steps of a row of mb.seq tokens keep in one layer."""
    chunk = chunk_size(job)
    return (mb.seq % chunk) * step_bytes(job, mb, prec) if chunk else 0


def worst_tail_note(job: JobSpec, mb: MicroBatch, prec: Precision) -> str | None:
    """TRL pads each batch to its longest row, so a batch shorter than max_length can run more steps than a full one:
    the warning with the most its steps can add, unless pad_to_multiple_of keeps every batch on whole chunks."""
    chunk = chunk_size(job)
    if not chunk or mb.seq < chunk or (job.train.pad_to_multiple_of or 1) % chunk == 0:
        return None
    per_step = step_bytes(job, mb, prec)
    layers = 1 if job.train.gradient_checkpointing else job.model.num_hidden_layers
    extra = (chunk - 1 - mb.seq % chunk) * per_step * layers
    if extra <= 0:
        return None
    return (f"xLSTM in mode 'inference' runs the last L mod {chunk} tokens of a batch whose longest row is L one step "
            f"at a time, each keeping {per_step / 2**20:,.0f} MiB per layer for the backward; the estimate takes "
            f"max_length's {mb.seq % chunk} steps, and a shorter batch with {chunk - 1} steps holds up to "
            f"{extra / 2**30:.2f} GiB more: set pad_to_multiple_of {chunk} (and max_length a multiple of it) so "
            "that every batch runs whole chunks")
