"""What a GRPO/RLOO job with images must satisfy (TRL 1.16 grpo_trainer.py / rloo_trainer.py with a ProcessorMixin as
processing_class). Typed by the `Job` protocol, as hpcmem.job.image_rules."""

from __future__ import annotations

from typing import TYPE_CHECKING

from hpcmem.job.images import image_geometry
from hpcmem.job.trainers import entry

if TYPE_CHECKING:
    from hpcmem.job.protocol import Job

# what one image takes in the prompt besides its image tokens: Qwen's vision_start and vision_end markers (the chat
# template's `<|vision_start|><|image_pad|><|vision_end|>`, image_pad expanded by the processor); Gemma 3's boi and
# eoi (processing_gemma3.py Gemma3Processor `full_image_sequence`, whose two "\n\n" are two more tokens in Gemma's
# own tokenizer: this bound is then two tokens short per image)
MARKERS_PER_IMAGE = 2


def rl_image_problems(job: Job) -> list[str]:
    """max_prompt_length is hpcmem's longest prompt in tokens, its images' tokens included (TRL has no such field:
    the processor expands each image to its tokens in the prompt); the images alone must leave room for text."""
    t = job.train
    if not entry(t.trainer).generates or not t.images_per_example or job.model.vision is None:
        return []
    out = []
    g = image_geometry(t, job.model.vision)
    lower = "" if job.model.vision.image_size else " or lower max_pixels"     # llava, Gemma 3: one resolution
    tokens = t.images_per_example * (g.tokens + MARKERS_PER_IMAGE)
    if tokens >= t.max_prompt_length:
        out.append(f"max_prompt_length {t.max_prompt_length} with images_per_example {t.images_per_example} × "
                   f"({g.tokens} image tokens + {MARKERS_PER_IMAGE} markers) = {tokens} tokens ({g.resized[0]}×"
                   f"{g.resized[1]} px after the processor's resize): max_prompt_length counts a prompt's image "
                   f"tokens too; raise it above the images' tokens{lower}")
    return out
