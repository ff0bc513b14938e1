"""An image-text processor built offline for tests: a WordLevel tokenizer (one token per word or special token) with
Qwen's image tokens and a chat template, and the real PaddleOCR-VL image processor — the Qwen2-VL family's resize rules
(smart_resize, patch 14, merge 2), buildable without torchvision (Qwen2-VL's own processor needs it for video)."""

from __future__ import annotations

SPECIALS = ["[UNK]", "<pad>", "<|im_start|>", "<|im_end|>", "<|vision_start|>", "<|vision_end|>", "<|image_pad|>"]
# an image part renders as vision_start, the placeholder, vision_end
CHAT = ("{% for m in messages %}<|im_start|> {{ m['role'] }} {% if m['content'] is string %}{{ m['content'] }}"
        "{% else %}{% for c in m['content'] %}{% if c['type'] == 'image' %}<|vision_start|><|image_pad|><|vision_end|>"
        "{% else %} {{ c['text'] }} {% endif %}{% endfor %}{% endif %} <|im_end|> {% endfor %}"
        "{% if add_generation_prompt %}<|im_start|> assistant {% endif %}")


def word_tokenizer():
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    words = " ".join([f"w{i}" for i in range(20)] + ["user", "assistant", "system"])
    tok.train_from_iterator([words], trainers.WordLevelTrainer(special_tokens=SPECIALS))
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", pad_token="<pad>", eos_token="<|im_end|>",
                                   extra_special_tokens={"image_token": "<|image_pad|>"})


def save_grid_processor(folder: str, *, min_pixels: int, max_pixels: int) -> str:
    """Save the processor (resizing into [min_pixels, max_pixels]) to `folder`; returns it."""
    from transformers.models.paddleocr_vl.image_processing_pil_paddleocr_vl import PaddleOCRVLImageProcessorPil
    from transformers.models.paddleocr_vl.processing_paddleocr_vl import PaddleOCRVLProcessor

    images = PaddleOCRVLImageProcessorPil(min_pixels=min_pixels, max_pixels=max_pixels)
    PaddleOCRVLProcessor(image_processor=images, tokenizer=word_tokenizer(), chat_template=CHAT).save_pretrained(folder)
    return folder
