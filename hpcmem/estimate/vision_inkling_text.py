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

from hpcmem.estimate.lora import LoraLayout
from hpcmem.estimate.vision_first_layer import rms_first_layer_input
from hpcmem.job.jobspec import JobSpec
from hpcmem.job.shape import Precision

# the Linears of a decoder layer's attention that read input_layernorm's output, by their module names below the layer
NORM_READERS = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.r_proj")


def first_layer_input(job: JobSpec, prec: Precision, lora: LoraLayout, adapted: tuple) -> int:
    """Bytes layer 0 keeps beyond the text profile's layer 0 when an adapted tower feeds it (the module docstring;
    hpcmem.estimate.vision_first_layer); 0 unless LoRA reaches the tower and checkpointing is off."""
    return rms_first_layer_input(job, prec, lora, adapted, NORM_READERS)
