"""What Inkling 2's first decoder layer keeps only because the image features make its input require grad, under LoRA
without checkpointing: an image-path term of the learned inkling2_text part (hpcmem.estimate.vision_inkling2 adds it
as `VisionTerms.text_saved`), as hpcmem.estimate.vision_fuyu `first_layer_input` does for Fuyu.

The learned text profile was traced on text rows, where layer 0's input — the frozen token embeddings' output, with no
`enable_input_require_grads` hook without checkpointing — requires no grad. With images, the adapted tower's features
are scattered into it (`Inkling2Model.forward`: `inputs_embeds.masked_scatter(special_image_mask, image_embeds)`), so
it does, and modeling_inkling2.py `Inkling2SlidingDecoderLayer.forward` (layer 0: no `attention_input`) keeps for the
input gradient:
- `input_layernorm` (`Inkling2RMSNorm.forward`, frozen): its input's fp32 copy (`hidden_states.to(torch.float32)`,
  kept by `pow` and the `* rsqrt` product; no copy where the input is fp32 already) and the fp32 rsqrt [tokens, 1];
- peft's dropout before each adapted Linear that reads the norm's output (`Inkling2SlidingAttention.forward`:
  `q_proj.linear`, `k_proj.linear`, `v_proj.linear`, `relative_position_bias.linear`, `sink_proj`,
  `o_proj.gate_proj`): its bool mask, one byte an input element.
Checkpointing hooks the token embeddings in both (the profile has it); full fine-tuning trains them (likewise). A
full-attention first layer (layer_types[0] "hybrid": three input norms, dynamic convolutions) is refused instead
(hpcmem.job.image_rules).
"""

from __future__ import annotations

from hpcmem.estimate.lora import LoraLayout
from hpcmem.estimate.vision_first_layer import rms_first_layer_input
from hpcmem.job.jobspec import JobSpec
from hpcmem.job.shape import Precision

# the Linears of a sliding layer's attention that read input_layernorm's output, by their module names below the layer
NORM_READERS = ("self_attn.q_proj.linear", "self_attn.k_proj.linear", "self_attn.v_proj.linear",
                "self_attn.relative_position_bias.linear", "self_attn.sink_proj", "self_attn.o_proj.gate_proj")


def first_layer_input(job: JobSpec, prec: Precision, lora: LoraLayout, adapted: tuple) -> int:
    """Bytes layer 0 keeps beyond the text profile's layer 0 when an adapted tower feeds it (the module docstring;
    hpcmem.estimate.vision_first_layer); 0 unless LoRA reaches the tower and checkpointing is off."""
    return rms_first_layer_input(job, prec, lora, adapted, NORM_READERS)
