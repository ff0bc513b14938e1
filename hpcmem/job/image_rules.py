"""What TRL 1.16 and transformers 5.24 refuse around a vision-language job's images, and a micro-batch's images and
pixel_values rows (the geometry is hpcmem.job.images). Typed by the `Job` protocol: the rules that run while a
JobSpec is built need not import it."""

from __future__ import annotations

from typing import TYPE_CHECKING

from hpcmem.job.images import IMAGE_TRAINERS, image_geometry
from hpcmem.models.vision import VISION_LANGUAGE

if TYPE_CHECKING:
    from hpcmem.job.protocol import Job


def image_job_problems(job: Job) -> list[str]:
    """What TRL 1.16 / transformers 5.24 refuse, or hpcmem does not model, for a job with images."""
    t, m = job.train, job.model
    if t.images_per_example == 0:
        return []
    if m.vision is None:
        return [f"images_per_example {t.images_per_example}: model {m.name} ({m.model_type}) has no vision tower "
                f"hpcmem models (vision-language types: {', '.join(VISION_LANGUAGE)}); set images_per_example 0"]
    out = []
    if t.trainer not in IMAGE_TRAINERS:
        out.append(f"images_per_example with trainer {t.trainer}: hpcmem models images for {', '.join(IMAGE_TRAINERS)} "
                   "only (DPO/GRPO/RLOO with images are not modelled yet)")
    # sft_trainer.py SFTTrainer.__init__: "Packing is not supported for vision datasets", "Padding-free training is
    # yet not supported for vision datasets"
    if t.packing:
        out.append("packing with images: TRL 1.16's SFTTrainer raises 'Packing is not supported for vision datasets'")
    if t.padding_free:
        out.append("padding_free with images: TRL 1.16's SFTTrainer raises 'Padding-free training is yet not "
                   "supported for vision datasets'")
    g = image_geometry(t, m.vision)
    tokens = g.tokens * t.images_per_example
    if t.max_length is not None and tokens > t.max_length:
        # processing_utils.py ProcessorMixin._check_special_mm_tokens: truncation that cuts image tokens raises
        out.append(f"images_per_example {t.images_per_example} × {g.tokens} image tokens ({g.resized[0]}×"
                   f"{g.resized[1]} px after smart_resize) = {tokens} > max_length {t.max_length}: the processor "
                   "raises when truncation cuts image tokens; raise max_length or lower max_pixels")
    if t.activation_offloading:
        out.append("activation_offloading with images: the vision tower's saved tensors under TRL's offloading are not "
                   "modelled yet")
    if t.selective_checkpointing:
        out.append("selective checkpointing with images: what TRL's policy keeps in the vision tower's blocks is not "
                   "modelled yet; use full checkpointing")
    par = job.parallel
    if par.world_size > 1 or par.deepspeed or par.fsdp:
        out.append(f"images with {par.world_size} process(es) under {par.distributed_type}: the vision tower's "
                   "sharding, offloading and DDP buckets are not modelled yet; estimate the single-GPU job")
    if job.tokens_per_micro_batch is not None:
        out.append("--lengths with images: a length profile counts text tokens, not the image tokens the processor "
                   "adds; not modelled yet")
    return out


def image_rows(job: Job) -> tuple[int, int]:
    """(images, pixel_values rows) of one micro-batch: per_device_train_batch_size × images_per_example images."""
    t = job.train
    if t.images_per_example == 0 or job.model.vision is None:
        return 0, 0
    images = t.per_device_train_batch_size * t.images_per_example
    return images, images * image_geometry(t, job.model.vision).patches
