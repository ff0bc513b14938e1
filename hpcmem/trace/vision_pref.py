"""The dataset of a vision-language DPO trace: conversational preference rows with images.

TRL 1.16's DPOTrainer with an "images" column skips dataset preparation (dpo_trainer.py `skip_prepare_dataset`) and
collates with `DataCollatorForVisionPreference`: each example's images go into the prompt's first user turn
(trl/data_utils.py `prepare_multimodal_messages`), the chat template renders prompt, chosen and rejected
(`apply_chat_template`: the completions are what follows the shared prompt), the processor runs on the 2·B prompts
with the images repeated for chosen and rejected, and prompt + completion are flushed left and cut to max_length
(keep_start). No eos is appended on this path; the prompt's positions are labelled -100 (`_compute_loss`), so the
fused LM head scores the completions only. The trace hands it the worst case for the head: prompts of the images and
one word, chosen completions that run past max_length (cut), rejected ones as long but for the last pair's (one
token short: padding, so an attention mask); the images are blank RGB of the job's size, the processor and chat
template the SFT trace's (hpcmem.trace.vision).
"""

from __future__ import annotations

from typing import Any

from hpcmem.errors import SpecError
from hpcmem.job.images import image_geometry
from hpcmem.job.jobspec import JobSpec
from hpcmem.trace.data import BatchDesign
from hpcmem.trace import (vision_aria, vision_deepseek_vl, vision_emu3, vision_fuyu, vision_granite_docling,
                          vision_idefics2, vision_idefics3, vision_internvl, vision_janus, vision_llava, vision_mistral3, vision_molmo2, vision_ovis2,
                          vision_video_llama_3)
from hpcmem.trace.pieces import WORD
from hpcmem.trace.vision import MARKERS_PER_IMAGE

OVER = 8            # chosen completions run this many tokens past max_length: keep_start truncation cuts them
PROMPT_WORDS = 1    # beside the images: the shortest prompt, the longest completions


def prompt_tokens(job: JobSpec) -> int:
    """Tokens of each prompt: its images (image tokens and any markers around them: Qwen's vision_start/vision_end,
    InternVL's <img>/</img>, none for the llava types, Mistral 3, DeepSeek-VL, DeepSeek-OCR 2, Unlimited-OCR and
    VideoLLaMA3) and one word."""
    t = job.train
    v = job.model.vision
    markers = vision_idefics3.markers(job) if v.family == "idefics3" else \
        vision_granite_docling.markers(job) if v.family == "granite_docling" else \
        vision_aria.MARKERS_PER_IMAGE if v.family == "aria" else \
        vision_idefics2.MARKERS_PER_IMAGE if v.family == "idefics2" else \
        vision_internvl.MARKERS_PER_IMAGE if v.family == "internvl" else \
        vision_llava.MARKERS_PER_IMAGE if v.model_type in vision_llava.LLAVA_TYPES else \
        vision_mistral3.MARKERS_PER_IMAGE if v.family == "pixtral" else \
        vision_deepseek_vl.MARKERS_PER_IMAGE if v.family in ("deepseek_vl", "deepseek_vl_hybrid",
                                                             "deepseek_ocr2", "unlimited_ocr") else \
        vision_janus.MARKERS_PER_IMAGE if v.family == "janus" else \
        vision_ovis2.MARKERS_PER_IMAGE if v.family == "ovis2" else \
        vision_video_llama_3.MARKERS_PER_IMAGE if v.family == "video_llama_3" else \
        vision_fuyu.markers(job) if v.family == "fuyu" else \
        vision_emu3.MARKERS_PER_IMAGE if v.family == "emu3" else \
        vision_molmo2.markers(job) if v.family == "molmo2" else MARKERS_PER_IMAGE
    # Molmo2's and Emu3's processors put a bos before the prompt and before the completion, each tokenized alone: both
    # counted here, so that the rejected completion's words leave its row one token short as designed
    row = vision_idefics2.ROW_TOKENS if v.family == "idefics2" else \
        vision_molmo2.PREFERENCE_ROW_TOKENS if v.family == "molmo2" else \
        vision_emu3.PREFERENCE_ROW_TOKENS if v.family == "emu3" else 0
    tokens = t.images_per_example * (image_geometry(t, job.model.vision).tokens + markers) + PROMPT_WORDS + row
    if tokens + 2 > (t.max_length or 0):
        raise SpecError(f"the DPO trace fills rows of max_length {t.max_length} tokens: a prompt of "
                        f"{t.images_per_example} image(s) and a word takes {tokens} tokens, leaving no room for a "
                        "completion; raise max_length")
    return tokens


def make_vision_preference_dataset(job: JobSpec, design: BatchDesign, num_micro_batches: int) -> Any:
    """`num_micro_batches` × B examples: "images", conversational "prompt", "chosen", "rejected"."""
    from datasets import Dataset
    from PIL import Image

    t = job.train
    b, length, last = t.per_device_train_batch_size, design.documents[0], design.documents[-1]
    image = Image.new("RGB", (t.image_width, t.image_height))
    prompt = prompt_tokens(job)
    text = lambda n: " ".join([WORD] * n)      # noqa: E731
    rows: dict[str, list] = {"images": [], "prompt": [], "chosen": [], "rejected": []}
    for _ in range(num_micro_batches):
        for i in range(b):
            rows["images"].append([image] * t.images_per_example)
            rows["prompt"].append([{"role": "user", "content": text(PROMPT_WORDS)}])
            rows["chosen"].append([{"role": "assistant", "content": " " + text(length - prompt + OVER)}])
            n = (last if i == b - 1 else length + OVER) - prompt
            rows["rejected"].append([{"role": "assistant", "content": " " + text(n)}])
    return Dataset.from_dict(rows)
