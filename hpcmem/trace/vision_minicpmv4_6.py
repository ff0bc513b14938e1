"""The MiniCPM-V 4.6 pieces of a vision-language trace (hpcmem.trace.vision for the rest): the processor, its image
token and the tokens around each image.

transformers 5.24 models/minicpmv4_6/processing_minicpmv4_6.py `MiniCPMV4_6Processor` reads its tokenizer's
`image_token` (also the placeholder the chat template writes for each image), `video_token`, their ids,
`image_start_token`, `image_end_token`, `slice_start_token`, `slice_end_token`, `image_id_start_token` and
`image_id_end_token`, and its video processor's `slice_mode` and `downsample_mode` in `__init__`. Per image
(`replace_image_token`, `_prepend_local_ids` with the image processor's use_image_id true) it writes
<image_id>k</image_id>, <image> and the source's image tokens </image>, then per slice <slice> and its tokens
</slice> ("\\n" between rows: whitespace the word tokenizer drops; the local id k one unknown word): 5 + 2 · slices
tokens besides the image tokens (`markers`). The word tokenizer gets those spellings added as special tokens.

The image processor is transformers' own PIL one (image_processing_pil_minicpmv4_6.py
`MiniCPMV4_6ImageProcessorPil`) with the vision config's patch size (its class default 14 is the published
checkpoint's; the tower's Conv2d runs at vision_config.patch_size) and the spec's scale_resolution, max_slice_nums and
slice_mode. Its video processor needs torchvision, which an image-only dataset never calls: a stand-in carrying the
two attributes `__init__` reads, which the processor's class check skips.

MiniCPM-V 4.7 (model type minicpmv4_7) runs transformers' MiniCPMV4_7Processor (modular_minicpmv4_7.py: 4.6's with
mm_token_type_ids returned and one placeholder per image checked; the same image text, so the same `markers`) around
the same PIL image processor (image_processing_auto.py maps minicpmv4_7 to MiniCPMV4_6ImageProcessorPil), and its
config gets the marker ids canvas M-RoPE reads (`MiniCPMV4_7Config` image_start_id … newline_id, required for
images) from the tokenizer (`token_ids`); "\n" is whitespace the word tokenizer drops, so no slice row ends at a
newline token.

MiniCPM-OCR (model type minicpm_ocr) runs transformers' MiniCPMOcrProcessor (processing_minicpm_ocr.py: 4.6's text
per image, slices' counts read one by one) around the same PIL image processor at the spec's downsample_mode ("4x":
sides rounded to patch · 2, patches / 4 image tokens). Its own image processor, `MiniCPMOcrImageProcessor`, needs
torchvision; at its default small_image_upsize "always" (the only one hpcmem models, hpcmem.models.minicpm_ocr) its
`_preprocess` resizes the source and the slices as the PIL class's does.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from hpcmem.job.jobspec import JobSpec
from hpcmem.trace.pieces import chat_template, tokenizer

# MiniCPM-V's spellings (the published tokenizer's special tokens)
TOKENS = {"image_token": "<unk_image>", "video_token": "<unk_video>", "image_start_token": "<image>",
          "image_end_token": "</image>", "slice_start_token": "<slice>", "slice_end_token": "</slice>",
          "image_id_start_token": "<image_id>", "image_id_end_token": "</image_id>"}


def markers(job: JobSpec) -> int:
    """Tokens around one image's image tokens: its id (start, the number, end), <image> and </image>, and <slice>
    and </slice> around each slice of the grid."""
    return 5 + 2 * (len(job.model.vision.slices(job.train.image_height, job.train.image_width)) - 1)


def processor(job: JobSpec) -> Any:
    from transformers.models.minicpm_ocr.processing_minicpm_ocr import MiniCPMOcrProcessor
    from transformers.models.minicpmv4_6.image_processing_pil_minicpmv4_6 import MiniCPMV4_6ImageProcessorPil
    from transformers.models.minicpmv4_6.processing_minicpmv4_6 import MiniCPMV4_6Processor
    from transformers.models.minicpmv4_7.processing_minicpmv4_7 import MiniCPMV4_7Processor

    base = {"minicpmv4_7": MiniCPMV4_7Processor, "minicpm_ocr": MiniCPMOcrProcessor}.get(
        job.model.vision.model_type, MiniCPMV4_6Processor)

    class ImageOnlyProcessor(base):
        def check_argument_for_proper_class(self, argument_name: str, argument: Any) -> Any:
            if argument_name == "video_processor" and isinstance(argument, SimpleNamespace):
                return None
            return super().check_argument_for_proper_class(argument_name, argument)

    v = job.model.vision
    tok = tokenizer()
    tok.add_special_tokens({"additional_special_tokens": list(TOKENS.values())})
    for key, token in TOKENS.items():
        setattr(tok, key, token)
    tok.image_token_id = tok.convert_tokens_to_ids(TOKENS["image_token"])
    tok.video_token_id = tok.convert_tokens_to_ids(TOKENS["video_token"])
    images = MiniCPMV4_6ImageProcessorPil(patch_size=v.patch_size, scale_resolution=v.scale_resolution,
                                          max_slice_nums=v.max_slice_nums, slice_mode=v.slice_mode,
                                          downsample_mode=v.downsample_mode)
    return ImageOnlyProcessor(image_processor=images,
                              video_processor=SimpleNamespace(slice_mode=True, downsample_mode=v.downsample_mode),
                              tokenizer=tok, chat_template=chat_template(TOKENS["image_token"]))


def is_processor(proc: Any) -> bool:
    return isinstance(getattr(proc, "image_token", None), str) and proc.image_token == TOKENS["image_token"]


def token_ids(proc: Any) -> dict[str, int]:
    """MiniCPMV4_6Config's image and video token ids in the processor's tokenizer; for MiniCPMV4_7Processor also
    MiniCPMV4_7Config's marker ids (modular_minicpmv4_7.py `MiniCPMV4_7Model._group_visual_frames` reads them);
    newline_id one past the tokenizer's ids: the word tokenizer writes no "\n" token (the unknown word's id would
    also match the image's local id and the template's words)."""
    ids = {"image_token_id": proc.image_token_id, "video_token_id": proc.video_token_id}
    if getattr(proc, "return_mm_token_type_ids", False):
        tok = proc.tokenizer
        ids.update({key: tok.convert_tokens_to_ids(TOKENS[token]) for key, token in (
            ("image_start_id", "image_start_token"), ("image_end_id", "image_end_token"),
            ("slice_start_id", "slice_start_token"), ("slice_end_id", "slice_end_token"))})
        ids["newline_id"] = len(tok)
    return ids
