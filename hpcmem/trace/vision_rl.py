"""The prompts of a GRPO/RLOO trace with images, and what its trace does not run.

TRL 1.16's GRPOTrainer/RLOOTrainer with a ProcessorMixin as processing_class (grpo_trainer.py / rloo_trainer.py
`_generate_and_score_completions`) reads an "images" column beside conversational prompts, puts each example's images
into its first user turn (trl/data_utils.py `prepare_multimodal_messages`) and runs the processor twice: once on the
chat-templated prompts for generation (`_tokenize_prompts`: the prompt ids and generate's pixel_values), and once,
after generation, on the prompts' text and the images (`self.processing_class(images=..., text=prompts_text,
padding=True)`) for the scoring forwards: its pixel_values and image_grid_thw go with every forward of the batch — the
reference pass (beta > 0), the old-policy pass, the policy's own (`_get_per_token_logps_and_entropies`, chunked by
per_device_train_batch_size, each chunk's pixel_values the rows of its images) — and are split per micro-batch into
the buffered inputs (`split_pixel_values_by_grid`, `unsplit_pixel_values_by_grid`). The sampler repeats each prompt
num_generations times, and every repeat carries its images: the tower sees each image once per completion.

The trace hands TRL exactly such rows: conversational prompts of `images_per_example` blank RGB images of the job's
size and words of the word-level tokenizer that fill the prompt to max_prompt_length tokens (image tokens and the
vision_start/vision_end markers included — Gemma 3: boi and eoi); the processor and chat template are the SFT trace's
(hpcmem.trace.vision; Gemma 3's: hpcmem.trace.vision_gemma3).
"""

from __future__ import annotations

from typing import Any

from hpcmem.errors import SpecError
from hpcmem.job.images import image_geometry
from hpcmem.job.jobspec import JobSpec
from hpcmem.trace.pieces import WORD
from hpcmem.trace.vision import MARKERS_PER_IMAGE



def prompt_words(job: JobSpec) -> int:
    """Words of each prompt beside its images (each image: its tokens and two markers)."""
    t = job.train
    images = t.images_per_example * (image_geometry(t, job.model.vision).tokens + MARKERS_PER_IMAGE)
    words = t.max_prompt_length - images
    if words < 1:
        raise SpecError(f"max_prompt_length {t.max_prompt_length}: {t.images_per_example} image(s) take {images} "
                        "tokens, leaving no room for text; raise max_prompt_length")
    return words


def make_image_prompt_dataset(job: JobSpec, rows: int) -> Any:
    """`rows` examples: "images" (images_per_example blank images) and a conversational "prompt"."""
    from datasets import Dataset
    from PIL import Image

    t = job.train
    image = Image.new("RGB", (t.image_width, t.image_height))
    words = " ".join([WORD] * prompt_words(job))
    return Dataset.from_dict({"images": [[image] * t.images_per_example for _ in range(rows)],
                              "prompt": [[{"role": "user", "content": words}] for _ in range(rows)]})


def generate_fields(fields: dict[str, Any], width: int) -> dict[str, Any]:
    """The processor's multimodal fields as TRL hands them to generate (grpo_trainer.py / rloo_trainer.py
    `_generate_single_turn`, transformers path): tensors as they are (pixel_values, image_grid_thw), per-token lists
    left-padded with 0 to the prompts' width, anything else as a tensor."""
    import numpy as np
    import torch

    out = {}
    for key, value in fields.items():
        if isinstance(value, torch.Tensor):
            out[key] = value
        elif isinstance(value, list) and value and isinstance(value[0], list):
            out[key] = torch.tensor([[0] * (width - len(x)) + list(x) for x in value])
        else:
            out[key] = torch.tensor(np.array(value))
    return out
