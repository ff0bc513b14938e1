"""dots3 Note's tower and merger in a vision-language job with images (hpcmem.models.dots3_note), beside its idle
audio encoder: hpcmem.estimate.vision's Qwen-tower terms (`vision_terms`: fused qkv, q/k RMSNorms over the head, 2-D
rotary, SDPA per image over the cu_seqlens chunks, proj, gated MLP, over N patch rows) with what dots3 Note keeps
outside its blocks (`outside_saved`), and the audio encoder's weights, buffer and idle adapters
(hpcmem.estimate.vision_idle_audio).

How the step runs (transformers 5.24 models/dots3_note/modeling_dots3_note.py `Dots3NoteVisionModel.forward`):
pixel_values [N, 3·14²] fp32 → `Dots3NoteVisionPatchEmbed` (reshaped to [N, 3, 14, 14], cast to the weight dtype,
Conv2d, reshaped to [N, width], `norm` an RMSNorm) → the axial rotary cos and sin (`Dots3NoteVisionRotaryEmbedding`:
fp32 [N, head_dim] each, read by every block) → `num_hidden_layers` `Dots3NoteVisionBlock`s (norm1 → qkv → q_norm,
k_norm → `apply_rotary_pos_emb_vision` in fp32 → SDPA per image chunk, `torch.cat` → proj; norm2 →
gate/up/down_proj) → `norm` (RMSNorm) → `Dots3NoteVisionMerger` (ln_q LayerNorm over the width, a [N / merge²,
4·width] view, mlp.0 → GELU → mlp.2) → `Dots3NoteModel.get_image_features` splits the merger's output per image
(`pooler_output`) and `forward` scatters their `torch.cat` into the image tokens (`masked_scatter`).

`Dots3NoteModel.forward` runs the audio tower only on input_features, which an image-text batch never has.
"""

from __future__ import annotations

from dataclasses import replace

from hpcmem.estimate.lora import LoraLayout
from hpcmem.estimate.vision import VisionLinear, VisionTerms
from hpcmem.estimate.vision import outside_saved as qwen_outside_saved
from hpcmem.estimate.vision_idle_audio import idle_audio_terms
from hpcmem.estimate.vision_ovis2 import rms_norm_saved
from hpcmem.job.jobspec import JobSpec
from hpcmem.job.shape import Precision
from hpcmem.models.dots3_note import Dots3NoteTowerSpec


def dots3_note_terms(job: JobSpec, prec: Precision, lora: LoraLayout) -> VisionTerms | None:
    """The Qwen-tower terms with dots3 Note's parts outside the blocks, and the idle audio encoder."""
    return idle_audio_terms(job, prec, lora, outside=outside_saved)


def outside_saved(job: JobSpec, v: Dots3NoteTowerSpec, n: int, prec: Precision, adapted: tuple[VisionLinear, ...],
                  lora: LoraLayout) -> tuple[int, int]:
    """(before the blocks, after them) on N patch rows: hpcmem.estimate.vision `outside_saved`'s terms for Qwen2-VL's
    merger (the Conv2d's input in the weight dtype when it trains, the hooked leaves under LoRA with checkpointing,
    the rotary cos and sin, ln_q a torch LayerNorm: `layer_norm_saved`, GELU's input, mlp.2's input when it trains,
    the merger adapters' own), plus dots3 Note's two RMSNorms outside the blocks (`Dots3NoteRMSNorm.forward`: the fp32
    upcast, and when its weight trains the normalised tensor cast back and the cast's input,
    hpcmem.estimate.vision_ovis2 `rms_norm_saved`):
    - the patch embedding's `norm` on the Conv2d's output: only when the tower trains (frozen, nothing before it
      requires grad; `enable_input_require_grads` hooks patch_embed's output, after the norm);
    - the tower's final `norm` on the last block's output, which requires grad whether the tower trains or its
      adapters do."""
    trained = not lora.enabled
    before, after = qwen_outside_saved(job, replace(v, norm="layer"), n, prec, adapted, lora)
    patch_norm = rms_norm_saved(v.hidden_size, prec, True) * n if trained else 0
    final_norm = rms_norm_saved(v.hidden_size, prec, trained) * n
    return before + patch_norm, after + final_norm
