"""What Inkling's first decoder layer keeps only because the image features make its input require grad, under LoRA
without checkpointing: an image-path term of the learned inkling_text part (hpcmem.estimate.vision_inkling adds it as
`VisionTerms.text_saved`), as hpcmem.estimate.vision_inkling2_text `first_layer_input` does for Inkling 2.

The learned text profile was traced on text rows, where layer 0's input — the frozen `InklingNormedEmbedding`'s
output, with no `enable_input_require_grads` hook without checkpointing — requires no grad. With images, the adapted
tower's features are scattered into it (modeling_inkling.py `InklingModel.forward`:
`inputs_embeds.masked_scatter(special_image_mask, image_embeds)`), so it does, and `InklingDecoderLayer.forward` (either
layer type: both run `InklingAttention`) keeps for the input gradient:
- `input_layernorm` (`InklingRMSNorm.forward`, frozen): its input's fp32 copy (`hidden_states.to(torch.float32)`, kept
  by `pow` and the `* rsqrt` product; no copy where the input is fp32 already) and the fp32 rsqrt [tokens, 1];
- peft's dropout before each adapted Linear that reads the norm's output (`InklingAttention.forward`: q_proj, k_proj,
  v_proj, r_proj): its bool mask, one byte an input element.
Checkpointing hooks the token embeddings in both (the profile has it); full fine-tuning trains them (likewise).
"""

from __future__ import annotations

from hpcmem.estimate.lora import LORA_DROPOUT_MASK_BYTES, LoraLayout
from hpcmem.estimate.vision import FP32
from hpcmem.job.jobspec import JobSpec
from hpcmem.job.shape import Precision, micro_batch
from hpcmem.models.peft_targets import ALL_LINEAR

# the Linears of a decoder layer's attention that read input_layernorm's output, by their module names below the layer
NORM_READERS = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.r_proj")


def _adapted(name: str, targets: tuple[str, ...]) -> bool:
    """peft's rule (tuners_utils.py `check_target_module_exists`): all-linear, or a target equal to the name or to its
    tail after a dot."""
    return ALL_LINEAR in targets or any(name == t or name.endswith("." + t) for t in targets)


def first_layer_input(job: JobSpec, prec: Precision, lora: LoraLayout, adapted: tuple) -> int:
    """Bytes layer 0 keeps beyond the text profile's layer 0 when an adapted tower feeds it (the module docstring);
    0 unless LoRA reaches the tower and checkpointing is off."""
    if not lora.enabled or not adapted or job.train.gradient_checkpointing:
        return 0
    tokens, width = micro_batch(job).tokens, job.model.hidden_size
    copy = FP32 * width if prec.residual != FP32 else 0
    norm = (copy + FP32) * tokens
    readers = sum(_adapted(name, tuple(job.train.lora_target_modules)) for name in NORM_READERS)
    masks = LORA_DROPOUT_MASK_BYTES * width * tokens * readers if lora.dropout else 0
    return norm + masks
