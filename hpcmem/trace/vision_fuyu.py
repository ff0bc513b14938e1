"""The Fuyu pieces of a vision-language trace (hpcmem.trace.vision for the rest): the processor, its image token and
the tokens around each image.

transformers 5.24 models/fuyu/processing_fuyu.py `FuyuProcessor`: `__init__` reads the tokenizer's vocabulary for
"|SPEAKER|" (image_token) and "|NEWLINE|" and sets its pad_token_id to 0 (the word tokenizer's pad already); it drops
a chat_template keyword (`super().__init__` gets the two sub-processors only), so the trace sets the attribute after.
`prepare_inputs_layout` writes one |SPEAKER| before each sample that has an image and appends <0x04> (beginning of
answer), so the chat template writes nothing for an image part (`CHAT_TEMPLATE`). `replace_image_token` expands it to
columns |SPEAKER| and one |NEWLINE| per patch row, then <s>; `__call__` tokenizes the part up to <s> and the rest
separately (add_special_tokens off) and drops the first token of the former ("strip off the underscore which is always
prepended before special image tokens": the SentencePiece "▁" the real tokenizer writes first). The word tokenizer
writes no such piece, so the trace's tokenizer writes one unknown word "▁" before a text that starts with |SPEAKER|
(`_with_leading_piece`), which that step then drops. Per image: rows |NEWLINE|, <s> and the sample's <0x04> besides the
image tokens (`markers`).

The image processor is transformers' own PIL one (image_processing_pil_fuyu.py `FuyuImageProcessorPil`, class
defaults) with the config's patch size, its `patchify_image` handed a numpy copy of the tensor FuyuProcessor gives it
(`_process_images` asks for "pt" images, and the PIL class's numpy transposes fail on a torch tensor; the torchvision
class, image_processing_fuyu.py `FuyuImageProcessor.patchify_image`, cuts the same [patches, 3 · patch²] rows with
unfold but needs torchvision): `TensorPatchify`.
"""

from __future__ import annotations

from typing import Any

from hpcmem.job.jobspec import JobSpec
from hpcmem.trace.pieces import chat_template, tokenizer

IMAGE_TOKEN, NEWLINE_TOKEN, BOS, BOA = "|SPEAKER|", "|NEWLINE|", "<s>", "<0x04>"
LEADING_PIECE = "\u2581"        # SentencePiece's word-start piece, an unknown word to the word tokenizer
CHAT_TEMPLATE = chat_template("")       # the processor writes each sample's image placeholder itself


def markers(job: JobSpec) -> int:
    """Tokens beside one image's |SPEAKER| tokens: a |NEWLINE| per patch row, <s>, and the <0x04> after the sample's
    text (one image per row, hpcmem.models.fuyu `fuyu_problems`)."""
    rows, _ = job.model.vision.grid(job.train.image_height, job.train.image_width)
    return rows + 2


def _with_leading_piece(tok: Any) -> Any:
    """The word tokenizer, writing "▁" before a text that starts with |SPEAKER| as Fuyu's SentencePiece tokenizer does
    (the token FuyuProcessor.__call__ strips)."""
    base = type(tok)

    class LeadingPieceTokenizer(base):      # type: ignore[misc, valid-type]
        def __call__(self, text: Any = None, *args: Any, **kwargs: Any) -> Any:
            if isinstance(text, str) and text.startswith(IMAGE_TOKEN):
                text = f"{LEADING_PIECE} {text}"
            return super().__call__(text, *args, **kwargs)

    tok.__class__ = LeadingPieceTokenizer
    return tok


def processor(job: JobSpec) -> Any:
    import torch
    from transformers.models.fuyu.image_processing_pil_fuyu import FuyuImageProcessorPil
    from transformers.models.fuyu.processing_fuyu import FuyuProcessor

    class TensorPatchify(FuyuImageProcessorPil):
        def patchify_image(self, image: Any, patch_size: Any = None) -> Any:
            if isinstance(image, torch.Tensor):
                return torch.from_numpy(super().patchify_image(image.numpy(), patch_size=patch_size))
            return super().patchify_image(image, patch_size=patch_size)

    v = job.model.vision
    tok = tokenizer()
    tok.add_special_tokens({"additional_special_tokens": [IMAGE_TOKEN, NEWLINE_TOKEN, BOS, BOA]})
    images = TensorPatchify(patch_size={"height": v.patch_size, "width": v.patch_size},
                                   size={"height": v.target_height, "width": v.target_width})
    proc = FuyuProcessor(image_processor=images, tokenizer=_with_leading_piece(tok))
    proc.chat_template = CHAT_TEMPLATE
    return proc


def is_processor(proc: Any) -> bool:
    return proc.__class__.__name__ == "FuyuProcessor"


def token_ids(proc: Any) -> dict[str, int]:
    """FuyuConfig's image_token_id: |SPEAKER|'s id in the processor's tokenizer."""
    return {"image_token_id": proc.image_token_id}
