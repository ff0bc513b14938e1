"""The Cosmos3 Edge processor of a vision-language trace with images (hpcmem.trace.vision for the rest).

transformers 5.24 models/cosmos3_edge/processing_cosmos3_edge.py `Cosmos3EdgeProcessor` (modular_cosmos3_edge.py:
Qwen3VLProcessor's, its `replace_image_token` writing patches / merge_size² image tokens) around the PIL
`Cosmos3EdgeImageProcessorPil` (image_processing_auto.py's "pil" row for cosmos3_edge: Glm4vImageProcessorPil's
`smart_resize` at temporal_patch_size 1, patch 16, merge 2; its own block-major `patchify`) with the job's size bounds
(the class's own where the job gives none: hpcmem.models.cosmos3_edge) and the word tokenizer with Qwen's vision
tokens (hpcmem.trace.vision `vision_tokenizer`: the processor reads "<|image_pad|>", "<|vision_start|>" … by their
spellings); no video processor (hpcmem.trace.vision_llava `without_video`: Cosmos3EdgeVideoProcessor needs
torchvision; an image-only dataset never calls it), returning mm_token_type_ids (see `processor`). The chat
template and the two markers per image are Qwen's.
"""

from __future__ import annotations

from typing import Any

from hpcmem.job.images import pixel_bounds
from hpcmem.job.jobspec import JobSpec
from hpcmem.trace.vision_llava import without_video


def processor(job: JobSpec, tokenizer: Any, chat_template: str) -> Any:
    from transformers.models.cosmos3_edge.image_processing_pil_cosmos3_edge import Cosmos3EdgeImageProcessorPil
    from transformers.models.cosmos3_edge.processing_cosmos3_edge import Cosmos3EdgeProcessor

    v = job.model.vision
    lo, hi = pixel_bounds(job.train, v)
    images = Cosmos3EdgeImageProcessorPil(size={"shortest_edge": lo, "longest_edge": hi}, patch_size=v.patch_size,
                                          temporal_patch_size=1, merge_size=v.spatial_merge_size)
    proc = without_video(Cosmos3EdgeProcessor)(image_processor=images, tokenizer=tokenizer,
                                               chat_template=chat_template)
    # Cosmos3EdgeProcessor drops Qwen3VLProcessor's `return_mm_token_type_ids = True` (modular_cosmos3_edge.py:
    # `return_mm_token_type_ids = AttributeError()`, so ProcessorMixin's False), yet Cosmos3EdgeModel.forward
    # (Qwen2VLModel's `compute_3d_position_ids`) raises on image_grid_thw without mm_token_type_ids, in training as in
    # generate: a job with images needs a processor that returns them (a checkpoint's processor config setting
    # return_mm_token_type_ids true). The trace's does; TRL's collators pass them on (sft_trainer.py).
    proc.return_mm_token_type_ids = True
    return proc
