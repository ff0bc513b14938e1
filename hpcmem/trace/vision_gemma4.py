"""The Gemma 4 pieces of a vision-language SFT trace (hpcmem.trace.vision for the rest): the processor, its image
token and the tokens around each image.

transformers 5.24 models/gemma4/processing_gemma4.py `Gemma4Processor` around the PIL `Gemma4ImageProcessorPil`
(patch_size, pooling_kernel_size and max_soft_tokens of the spec: hpcmem.models.gemma4), its audio feature extractor
(`Gemma4AudioFeatureExtractor`, numpy only; an image-only dataset never calls it) and no video processor (it needs
torchvision: hpcmem.trace.vision_llava `without_video`). It reads the tokenizer's `image_token`, `boi_token`,
`eoi_token`, `image_token_id` and, in `validate_inputs`, `boa_token` and `eoa_token`: the word tokenizer gets them
added as special tokens and set. `replace_image_token` writes boi, the image's `num_soft_tokens_per_image` image
tokens and eoi (`MARKERS_PER_IMAGE`), and the processor returns `mm_token_type_ids`, `image_position_ids` and
`num_soft_tokens_per_image` beside pixel_values; TRL's vision collator hands them all to the model, whose forward
reads image_position_ids and takes the rest into its kwargs. The chat template writes each image as the image token.
"""

from __future__ import annotations

from typing import Any

from hpcmem.job.jobspec import JobSpec
from hpcmem.trace.pieces import chat_template, tokenizer
from hpcmem.trace.vision_llava import without_video

# Gemma 4's tokenizer's spellings (its chat template's image placeholder is <|image|>)
IMAGE, BOI, EOI, BOA, EOA, AUDIO = "<|image|>", "<|image>", "<image|>", "<|audio>", "<audio|>", "<|audio|>"
MARKERS_PER_IMAGE = 2       # boi and eoi around each image's soft tokens


def processor(job: JobSpec) -> Any:
    from transformers.models.gemma4.feature_extraction_gemma4 import Gemma4AudioFeatureExtractor
    from transformers.models.gemma4.image_processing_pil_gemma4 import Gemma4ImageProcessorPil
    from transformers.models.gemma4.processing_gemma4 import Gemma4Processor

    v = job.model.vision
    tok = tokenizer()
    tok.add_special_tokens({"additional_special_tokens": [IMAGE, BOI, EOI, BOA, EOA, AUDIO]})
    for key, token in (("image_token", IMAGE), ("boi_token", BOI), ("eoi_token", EOI), ("boa_token", BOA),
                       ("eoa_token", EOA), ("audio_token", AUDIO)):
        setattr(tok, key, token)
    tok.image_token_id = tok.convert_tokens_to_ids(IMAGE)
    tok.audio_token_id = tok.convert_tokens_to_ids(AUDIO)
    images = Gemma4ImageProcessorPil(patch_size=v.patch_size, pooling_kernel_size=v.pooling_kernel_size,
                                     max_soft_tokens=v.max_soft_tokens)
    return without_video(Gemma4Processor)(feature_extractor=Gemma4AudioFeatureExtractor(), image_processor=images,
                                          tokenizer=tok, video_processor=None, chat_template=chat_template(IMAGE),
                                          image_seq_length=v.max_soft_tokens)


def is_processor(proc: Any) -> bool:
    """Whether `proc` is a Gemma4Processor (`processor` builds a subclass of it)."""
    return any(c.__name__ == "Gemma4Processor" for c in type(proc).__mro__)


def token_ids(proc: Any) -> dict[str, int]:
    """Gemma4Config's token-id keys and the processor tokenizer's ids (the video token's too, so that no text token
    is taken for it)."""
    tok = proc.tokenizer
    return {"image_token_id": proc.image_token_id, "boi_token_id": tok.convert_tokens_to_ids(BOI),
            "eoi_token_id": tok.convert_tokens_to_ids(EOI), "video_token_id": proc.video_token_id,
            "audio_token_id": proc.audio_token_id, "boa_token_id": tok.convert_tokens_to_ids(BOA)}
