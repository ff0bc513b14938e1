"""What a learned text part's first decoder layer keeps only because the image features make its input require grad,
under LoRA without checkpointing when an adapter reaches the tower (an image-path term, `VisionTerms.text_saved`).

The learned text profile was traced on text rows, where layer 0's input — the frozen token embeddings' output, with no
`enable_input_require_grads` hook without checkpointing — requires no grad. With images the adapted tower's features
are scattered into it (`masked_scatter`), so it does, and a pre-norm decoder layer then keeps for the input gradient:
- its frozen RMSNorm's fp32 copy of the input (`hidden_states.to(torch.float32)`, kept by `pow` and the `* rsqrt`
  product; none where the input is fp32 already) and the fp32 rsqrt [tokens, 1];
- peft's dropout before each adapted Linear that reads the norm's output: its bool mask, one byte an input element.
Checkpointing hooks the token embeddings in both (the profile has it); full fine-tuning trains them (likewise). Which
Linears read the norm is the type's (hpcmem.estimate.vision_inkling_text, vision_inkling2_text).
"""

from __future__ import annotations

from hpcmem.estimate.lora import LORA_DROPOUT_MASK_BYTES, LoraLayout
from hpcmem.estimate.vision import FP32
from hpcmem.job.jobspec import JobSpec
from hpcmem.job.shape import Precision, micro_batch
from hpcmem.models.peft_targets import ALL_LINEAR


def adapted(name: str, targets: tuple[str, ...]) -> bool:
    """peft's rule (tuners_utils.py `check_target_module_exists`): all-linear, or a target equal to the name or to its
    tail after a dot."""
    return ALL_LINEAR in targets or any(name == t or name.endswith("." + t) for t in targets)


def rms_first_layer_input(job: JobSpec, prec: Precision, lora: LoraLayout, tower_adapted: tuple,
                          norm_readers: tuple[str, ...]) -> int:
    """Bytes layer 0 keeps beyond the text profile's layer 0 (the module docstring), `norm_readers` the module names
    below the layer of the Linears that read its input RMSNorm's output; 0 unless LoRA reaches the tower and
    checkpointing is off."""
    if not lora.enabled or not tower_adapted or job.train.gradient_checkpointing:
        return 0
    tokens, width = micro_batch(job).tokens, job.model.hidden_size
    copy = FP32 * width if prec.residual != FP32 else 0
    norm = (copy + FP32) * tokens
    readers = sum(adapted(name, tuple(job.train.lora_target_modules)) for name in norm_readers)
    masks = LORA_DROPOUT_MASK_BYTES * width * tokens * readers if lora.dropout else 0
    return norm + masks
