"""GLM-4.1V's tower and merger in a vision-language SFT job with images (hpcmem.models.glm4v): hpcmem.estimate.vision's
Qwen-tower terms (`vision_terms`: its blocks are Qwen2.5-VL's layout over N patch rows, the block MLP at
out_hidden_size, `Glm4vTowerSpec.block_mlp_width`) with what GLM-4.1V keeps outside its blocks (`outside_saved`).

How the step runs (transformers 5.24 models/glm4v/modeling_glm4v.py `Glm4vVisionModel.forward`): pixel_values
[N, 3·2·14²] fp32 → `Glm4vVisionPatchEmbed` (cast to the weight dtype, Conv3d) → `post_conv_layernorm` → the rotary
cos and sin (`Glm4vVisionRotaryEmbedding`: fp32 [N, head_dim] each, read by every block) → `Glm4vVisionEmbeddings`
(the position table cast to fp32 as [1, width, side, side] and resampled by bicubic `grid_sample` at the N patches'
[1, N, 1, 2] fp32 grid, cast back and added) → `depth` `Glm4vVisionBlock`s (RMSNorm → fused qkv, 2-D rotary, SDPA per
image over the cu_seqlens chunks, `torch.cat`, proj → RMSNorm → gate/up/down_proj) → `post_layernorm` → a
[N / merge², width, merge, merge] view (permute) → `downsample` (Conv2d to out_hidden_size) → `Glm4vVisionPatchMerger`
(proj → LayerNorm → nn.GELU → SiLU-gated gate/up/down_proj at intermediate_size) on N / merge² rows → the image
tokens' embeddings (`masked_scatter`).

GLM-OCR's tower (hpcmem.models.glm4v `GlmOcrTowerSpec`, modeling_glm_ocr.py `GlmOcrVisionModel.forward`) runs the
same steps without `post_conv_layernorm` and the position table, with q_norm / k_norm in every block's attention
(counted by the block terms: hpcmem.estimate.vision `block_spec`) and its merger's gated MLP out_hidden_size ·
in_channels wide.

Trained or frozen is what TRL and peft do: full fine-tuning trains everything; LoRA "all-linear" adapts every qkv,
proj, gate/up/down_proj of the blocks and the merger's five linears (the Conv3d and Conv2d are not nn.Linear). The
tower names no input embeddings (`Glm4vTowerSpec.hooked_input`), so a LoRA job none of whose targets reaches it runs it
without a graph, and with adapters its graph starts at the first block's.
"""

from __future__ import annotations

from dataclasses import replace

from hpcmem.estimate import activations as act
from hpcmem.estimate.lora import LoraLayout
from hpcmem.estimate.vision import (FP32, VisionLinear, VisionTerms, adapters_saved, block_spec, layer_norm_saved,
                                    token_leaf, vision_terms)
from hpcmem.estimate.vision_ovis2 import rms_norm_saved
from hpcmem.job.jobspec import JobSpec
from hpcmem.job.shape import MicroBatch, Precision
from hpcmem.models.glm4v import Glm4vTowerSpec, GlmOcrTowerSpec


def glm4v_terms(job: JobSpec, prec: Precision, lora: LoraLayout) -> VisionTerms | None:
    """The Qwen-tower terms with GLM-4.1V's parts outside the blocks."""
    return vision_terms(job, prec, lora, outside=outside_saved)


def outside_saved(job: JobSpec, v: Glm4vTowerSpec, n: int, prec: Precision, adapted: tuple[VisionLinear, ...],
                  lora: LoraLayout) -> tuple[int, int]:
    """(before the blocks, after them) of what the tower keeps outside its blocks on N patch rows and m = N / merge²
    merged rows (the module's docstring for the order):
    - the rotary cos and sin, fp32 [N, head_dim] each (read by every block's `apply_rotary_pos_emb_vision`);
    - trained: the Conv3d's input (pixel_values in the weight dtype), post_conv_layernorm's (an RMSNorm,
      hpcmem.estimate.vision_ovis2 `rms_norm_saved`), and grid_sample's fp32 table copy and grid (its backward reaches
      the position table) — GLM-OCR has neither of the last two; frozen, nothing before the first block requires
      grad, so none of these keeps anything, and under checkpointing the token embeddings' output that `enable_input_require_grads` makes a leaf
      (hpcmem.estimate.vision `token_leaf`);
    - post_layernorm (`rms_norm_saved`: its input requires grad whether the tower trains or its adapters do), and when
      the downsample Conv2d trains its input, the permuted view of post_layernorm's output [N, width];
    - the merger on m rows: proj's input [m, out_hidden_size] when proj trains, post_projection_norm (a LayerNorm:
      `layer_norm_saved`, its output GELU's input, fp32 under autocast, kept by GELU whether or not a linear trains),
      GELU's output cast for gate/up_proj when they train, and the SiLU-gated MLP at the merger's width
      (`Glm4vTowerSpec.merger_width`; the decoder MLP's tensors, hpcmem.estimate.activations `_mlp_saved`), and the
      merger adapters' own."""
    h, o, trained = v.hidden_size, v.out_hidden_size, not lora.enabled
    m = n // v.merge_unit
    rope = 2 * n * (h // v.num_heads) * FP32
    ocr = isinstance(v, GlmOcrTowerSpec)
    table = 0 if ocr else ((v.table_image_size // v.patch_size) ** 2 * h + 2 * n) * FP32
    post_conv = 0 if ocr else rms_norm_saved(h, prec, True)
    leaf = token_leaf(job, prec) if job.train.gradient_checkpointing else 0
    before = rope + (n * (v.patch_dim * prec.weight + post_conv) + table if trained else leaf)
    post = rms_norm_saved(h, prec, trained) * n + (prec.act * h * n if trained else 0)
    gelu_in = (FP32 if prec.amp else prec.act) * o
    norm = layer_norm_saved(o, prec, frozen=True) + gelu_in
    proj = prec.act * o if trained else 0
    gate_up_in = prec.act * o if trained else 0
    mlp = act._mlp_saved(replace(block_spec(v), intermediate_size=v.merger_width),
                         MicroBatch(rows=1, seq=m, label_tokens=0, padding_free=False, source="",
                                    attn_implementation="sdpa"), prec, 0, not trained)
    own = adapters_saved([x for x in adapted if x.part == "merger"], m, prec, lora)
    return before, post + m * (proj + norm + gate_up_in) + mlp + own
