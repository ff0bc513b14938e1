"""The pieces of a vision-language SFT trace: the processor, the image rows of the dataset, the model class.

TRL 1.16's SFTTrainer takes a vision dataset (an "images" column beside conversational "messages"; a "text" column
is dropped by the Trainer's unused-column filter, sft_trainer.py `_set_signature_columns_if_needed`) with a
ProcessorMixin as its processing_class, skips dataset preparation and collates with
`DataCollatorForVisionLanguageModeling`, which puts the images into the first user turn (trl/data_utils.py
`prepare_multimodal_messages`) and calls the processor's `apply_chat_template` on the real images per batch. The trace
hands it exactly that: rows of blank RGB images of the job's size and one user turn of words of the word-level
tokenizer (hpcmem.trace.pieces) that fill each row to its designed length; the chat template (`CHAT_TEMPLATE`) writes
each image as Qwen's vision_start, image_pad, vision_end and the text as it is, and the processor expands image_pad to
the image's tokens. The processor is transformers' own `Qwen2_5_VLProcessor` (Qwen2-VL: `Qwen2VLProcessor`,
`PROCESSORS`) around its PIL image processor `Qwen2VLImageProcessorPil` (the same `smart_resize` and `patchify` as
the torchvision one) and the word tokenizer with Qwen's four vision tokens added; the model config's
token ids are set to the tokenizer's. Gemma 3's processor is hpcmem.trace.vision_gemma3's, Mistral 3's
hpcmem.trace.vision_mistral3's, LightOnOCR's hpcmem.trace.vision_lighton_ocr's, VideoLLaMA3's
hpcmem.trace.vision_video_llama_3's, Gemma 4's hpcmem.trace.vision_gemma4's, GLM-4.1V's hpcmem.trace.vision_glm4v's,
Cohere Compass's hpcmem.trace.vision_cohere_compass's, PaddleOCR-VL's hpcmem.trace.vision_paddleocr_vl's,
LFM2-VL's hpcmem.trace.vision_lfm2_vl's (a PIL stand-in for its torchvision-only image processor), MiniCPM-V 4.6's
hpcmem.trace.vision_minicpmv4_6's, Kimi K2.5's hpcmem.trace.vision_kimi_k25's (a PIL stand-in for its
torchvision-only image processor), Fuyu's hpcmem.trace.vision_fuyu's, Cosmos3 Edge's
hpcmem.trace.vision_cosmos3_edge's, PP-Chart2Table's hpcmem.trace.vision_pp_chart2table's, the Qwen3-Omni
thinker's hpcmem.trace.vision_qwen3_omni's, Qwen2.5-Omni's thinker's hpcmem.trace.vision_qwen2_5_omni's (Omni's
token spellings, a real feature extractor, a stand-in video processor), ERNIE-4.5-VL's
hpcmem.trace.vision_ernie4_5_vl_moe's, Granite 4 Vision's hpcmem.trace.vision_granite4_vision's, Molmo2's
hpcmem.trace.vision_molmo2's (its torchvision-only image processor with torch's resize and normalize), Muse Glimmer's
and Muse Spark's hpcmem.trace.vision_muse_glimmer's (a PIL stand-in for their torchvision-only image processor),
HunYuanVL's hpcmem.trace.vision_hunyuan_vl's, HY-V4-VL's hpcmem.trace.vision_hy_v4_vl's, MiniMax M3 VL's
hpcmem.trace.vision_minimax_m3_vl's (a PIL stand-in for its torchvision-only image processor), DeepSeek-OCR 2's
hpcmem.trace.vision_deepseek_ocr2's, Unlimited-OCR's hpcmem.trace.vision_unlimited_ocr's (a PIL stand-in for its
torchvision-only image processor), Step 3.7 Flash's
hpcmem.trace.vision_step3p7's (its torchvision-only image processor with torch's resize and normalize), dots3 Note's
hpcmem.trace.vision_dots3_note's (Qwen2-VL's PIL image processor at temporal_patch_size 1), Apertus
1.5's hpcmem.trace.vision_apertus1p5's (a PIL stand-in for its torchvision-only image processor, no feature extractor), Inkling 2's
hpcmem.trace.vision_inkling2's (a numpy stand-in for its torchvision-only image processor), Chameleon's
hpcmem.trace.vision_chameleon's (its PIL image processor; the vocabulary map its model reads image ids from), Emu3's
hpcmem.trace.vision_emu3's (a stand-in vocabulary map for the config), Inkling's
hpcmem.trace.vision_inkling's (a numpy stand-in for its torchvision-only image processor).
"""

from __future__ import annotations

import importlib
from typing import Any

from hpcmem.errors import SpecError
from hpcmem.job.images import image_geometry, pixel_bounds
from hpcmem.job.jobspec import JobSpec
from hpcmem.trace import (vision_apertus1p5, vision_aria, vision_aya_vision, vision_chameleon, vision_cohere2_vision,
                          vision_cohere_compass, vision_cosmos3_edge, vision_deepseek_ocr2, vision_deepseek_vl,
                          vision_deepseek_vl_hybrid, vision_dots3_note, vision_emu3, vision_ernie4_5_vl_moe,
                          vision_fuyu, vision_gemma3, vision_gemma4, vision_glm4v, vision_granite4_vision,
                          vision_granite_docling, vision_hunyuan_vl, vision_hy_v4_vl, vision_idefics2, vision_idefics3,
                          vision_inkling, vision_inkling2, vision_internvl, vision_janus, vision_kimi_k25,
                          vision_lfm2_vl, vision_lighton_ocr, vision_llava, vision_minicpmv4_6, vision_minimax_m3_vl,
                          vision_mistral3, vision_mllama, vision_molmo2, vision_muse_glimmer, vision_ovis2,
                          vision_paddleocr_vl, vision_paligemma, vision_pp_chart2table, vision_qwen2_5_omni,
                          vision_qwen3_omni, vision_step3p7, vision_unlimited_ocr, vision_video_llama_3)
from hpcmem.trace.pieces import WORD, chat_template, tokenizer

VISION_START, VISION_END, IMAGE_PAD, VIDEO_PAD = "<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>"
# what one image takes in the text before the processor expands IMAGE_PAD (Qwen2.5-VL's chat template)
PLACEHOLDER = VISION_START + IMAGE_PAD + VISION_END
MARKERS_PER_IMAGE = 2      # vision_start and vision_end around each image's tokens
CHAT_TEMPLATE = chat_template(PLACEHOLDER)
# model_type → (module, class) of the processor transformers pairs with it (models/auto/processing_auto.py
# PROCESSOR_MAPPING_NAMES)
PROCESSORS = {"qwen2_5_vl": ("transformers.models.qwen2_5_vl.processing_qwen2_5_vl", "Qwen2_5_VLProcessor"),
              "qwen2_vl": ("transformers.models.qwen2_vl.processing_qwen2_vl", "Qwen2VLProcessor"),
              "qwen3_vl": ("transformers.models.qwen3_vl.processing_qwen3_vl", "Qwen3VLProcessor"),
              "qwen3_vl_moe": ("transformers.models.qwen3_vl.processing_qwen3_vl", "Qwen3VLProcessor"),
              # no mapping row (the checkpoint's processor_config names the class); its image processor and tokenizer
              # rows are Qwen3-VL's (image_processing_auto.py: Qwen2VLImageProcessor; tokenization_auto.py: Qwen2)
              "cosmos3_omni": ("transformers.models.qwen3_vl.processing_qwen3_vl", "Qwen3VLProcessor"),
              "qwen3_5": ("transformers.models.qwen3_vl.processing_qwen3_vl", "Qwen3VLProcessor"),
              # Exaone4_5_Processor(Qwen2VLProcessor): Qwen2-VL's image processor and vision tokens
              "exaone4_5": ("transformers.models.exaone4_5.processing_exaone4_5", "Exaone4_5_Processor"),
              # HyperCLOVAXVisionV2Processor (modular_hyperclovax_vision_v2.py: Exaone4_5_Processor's subclass, its
              # overrides touching videos only): Qwen2-VL's image processor and vision tokens
              "hyperclovax_vision_v2": ("transformers.models.hyperclovax_vision_v2.processing_hyperclovax_vision_v2",
                                        "HyperCLOVAXVisionV2Processor"),
              "qwen3_5_moe": ("transformers.models.qwen3_vl.processing_qwen3_vl", "Qwen3VLProcessor"),
              # processing_auto.py's qwen4_exp row: Qwen3VLProcessor (image_processing_auto.py: Qwen2VLImageProcessor)
              "qwen4_exp": ("transformers.models.qwen3_vl.processing_qwen3_vl", "Qwen3VLProcessor"),
              # Lfm3VlProcessor (modular_lfm3_vl.py: Qwen3VLProcessor's, without mm_token_type_ids): Qwen2-VL's image
              # processor (image_processing_auto.py) and Qwen's vision tokens
              "lfm3_vl": ("transformers.models.lfm3_vl.processing_lfm3_vl", "Lfm3VlProcessor")}
# What the trace does that a real run does not (its notes).
NOTES = ("vision-language: a Qwen processor's video_processor is left out (it needs torchvision; an image-only dataset "
         "never calls it; Gemma 3's processor has none); PixtralProcessor's import of the torchvision image "
         "processor's get_resize_output_image_size is served by the PIL one's, the same function; the images are "
         "blank RGB images of the job's size",)


def vision_tokenizer() -> Any:
    """The word tokenizer with Qwen's vision tokens added as special tokens (ids after the words)."""
    tok = tokenizer()
    tok.add_special_tokens({"additional_special_tokens": [VISION_START, VISION_END, IMAGE_PAD, VIDEO_PAD]})
    return tok


def processor(job: JobSpec) -> Any:
    """transformers' processor of the model type (`PROCESSORS`) with the job's min_pixels / max_pixels and the vision
    config's patch geometry. ProcessorMixin checks each sub-processor's class against the auto mappings; without
    torchvision the video mapping is a placeholder that fails that check even for None, so the check skips the absent
    video processor alone (hpcmem.trace.vision_llava `without_video`)."""
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    v = job.model.vision
    if getattr(v, "family", "") == "siglip":
        return vision_gemma3.processor(job)
    if v.model_type in vision_llava.LLAVA_TYPES:
        return vision_llava.processor(job)
    if v.family == "granite4_vision":
        return vision_granite4_vision.processor(job)
    if v.family == "idefics3":
        return vision_idefics3.processor(job)
    if v.family == "granite_docling":
        return vision_granite_docling.processor(job)
    if v.family == "aria":
        return vision_aria.processor(job)
    if v.family == "paligemma":
        return vision_paligemma.processor(job)
    if v.family == "deepseek_vl":
        return vision_deepseek_vl.processor(job)
    if v.family == "deepseek_vl_hybrid":
        return vision_deepseek_vl_hybrid.processor(job)
    if v.family == "deepseek_ocr2":
        return vision_deepseek_ocr2.processor(job)
    if v.family == "unlimited_ocr":
        return vision_unlimited_ocr.processor(job)
    if v.family == "aya_vision":
        return vision_aya_vision.processor(job)
    if v.family == "cohere2_vision":
        return vision_cohere2_vision.processor(job)
    if v.family == "gemma4":
        return vision_gemma4.processor(job)
    if v.family == "gemma4_unified":
        return vision_gemma4.unified_processor(job)
    if v.family == "glm4v":
        return vision_glm4v.processor(job)
    if v.family == "lfm2_vl":
        return vision_lfm2_vl.processor(job)
    if v.family == "minicpmv4_6":
        return vision_minicpmv4_6.processor(job)
    if v.family == "kimi_k25":
        return vision_kimi_k25.processor(job)
    if v.family == "muse_glimmer":
        return vision_muse_glimmer.processor(job)
    if v.family == "fuyu":
        return vision_fuyu.processor(job)
    if v.family == "emu3":
        return vision_emu3.processor(job)
    if v.family == "janus":
        return vision_janus.processor(job)
    if v.family == "chameleon":
        return vision_chameleon.processor(job)
    if v.family == "ovis2":
        return vision_ovis2.processor(job)
    if v.family == "got_ocr2":
        return vision_pp_chart2table.processor(job)
    if v.family == "idefics2":
        return vision_idefics2.processor(job)
    if v.family == "mllama":
        return vision_mllama.processor(job)
    if v.model_type == "lighton_ocr":
        return vision_lighton_ocr.processor(job)
    if v.family == "pixtral":
        return vision_mistral3.processor(job)
    if v.family == "internvl":
        return vision_internvl.processor(job)
    if v.family == "video_llama_3":
        return vision_video_llama_3.processor(job, vision_tokenizer())
    if v.model_type == "cohere_compass":
        return vision_cohere_compass.processor(job)
    if v.family == "paddleocr_vl":
        return vision_paddleocr_vl.processor(job, vision_tokenizer(), CHAT_TEMPLATE, IMAGE_PAD)
    if v.family == "cosmos3_edge":
        return vision_cosmos3_edge.processor(job, vision_tokenizer(), CHAT_TEMPLATE)
    if v.model_type == "qwen3_omni_moe_thinker":
        return vision_qwen3_omni.processor(job)
    if v.family == "qwen2_5_omni":
        return vision_qwen2_5_omni.processor(job)
    if v.family == "ernie4_5_vl_moe":
        return vision_ernie4_5_vl_moe.processor(job)
    if v.family == "molmo2":
        return vision_molmo2.processor(job)
    if v.family == "hunyuan_vl":
        return vision_hunyuan_vl.processor(job)
    if v.family == "hy_v4_vl":
        return vision_hy_v4_vl.processor(job, vision_tokenizer(), CHAT_TEMPLATE)
    if v.family == "minimax_m3_vl":
        return vision_minimax_m3_vl.processor(job)
    if v.family == "step3p7":
        return vision_step3p7.processor(job)
    if v.family == "dots3_note":
        return vision_dots3_note.processor(job)
    if v.family == "apertus1p5":
        return vision_apertus1p5.processor(job)
    if v.family == "inkling2":
        return vision_inkling2.processor(job)
    if v.family == "inkling":
        return vision_inkling.processor(job)
    lo, hi = pixel_bounds(job.train)
    module, name = PROCESSORS[v.model_type]
    base = getattr(importlib.import_module(module), name)
    images = Qwen2VLImageProcessorPil(min_pixels=lo, max_pixels=hi, patch_size=v.patch_size,
                                      temporal_patch_size=v.temporal_patch_size, merge_size=v.spatial_merge_size)
    return vision_llava.without_video(base)(image_processor=images, tokenizer=vision_tokenizer(),
                                            chat_template=CHAT_TEMPLATE)


def token_ids(proc: Any) -> dict[str, int]:
    """The config keys of the vision tokens and their ids in the processor's tokenizer."""
    # an Idefics3Processor subclass whose image_token is llava's "<image>": first
    if vision_granite_docling.is_processor(proc):
        return vision_granite_docling.token_ids(proc)
    if vision_aria.is_processor(proc):
        return vision_aria.token_ids(proc)
    if proc.__class__.__name__ == "Gemma3Processor":
        return vision_gemma3.token_ids(proc)
    if vision_video_llama_3.is_processor(proc):
        return vision_video_llama_3.token_ids(proc)
    if proc.__class__.__name__ == "Ovis2Processor":      # its image_token is llava's "<image>" too
        return vision_ovis2.token_ids(proc)
    if proc.__class__.__name__ == "AyaVisionProcessor":     # its image_token is llava's "<image>": first
        return vision_aya_vision.token_ids(proc)
    if proc.__class__.__name__ == "Cohere2VisionProcessor":
        return vision_cohere2_vision.token_ids(proc)
    if vision_gemma4.is_processor(proc):
        return vision_gemma4.token_ids(proc)
    if vision_glm4v.is_processor(proc):
        return vision_glm4v.token_ids(proc)
    if vision_cohere_compass.is_processor(proc):
        return vision_cohere_compass.token_ids(proc)
    if vision_minicpmv4_6.is_processor(proc):
        return vision_minicpmv4_6.token_ids(proc)
    if vision_kimi_k25.is_processor(proc):
        return vision_kimi_k25.token_ids(proc)
    if vision_muse_glimmer.is_processor(proc):
        return vision_muse_glimmer.token_ids(proc)
    if vision_fuyu.is_processor(proc):
        return vision_fuyu.token_ids(proc)
    if vision_emu3.is_processor(proc):      # its image_token is llava's "<image>": before llava's
        return vision_emu3.token_ids(proc)
    if vision_ernie4_5_vl_moe.is_processor(proc):
        return vision_ernie4_5_vl_moe.token_ids(proc)
    if vision_minimax_m3_vl.is_processor(proc):
        return vision_minimax_m3_vl.token_ids(proc)
    if vision_pp_chart2table.is_processor(proc):
        return vision_pp_chart2table.token_ids(proc)
    if vision_qwen3_omni.is_processor(proc):
        return vision_qwen3_omni.token_ids(proc)
    if vision_qwen2_5_omni.is_processor(proc):
        return vision_qwen2_5_omni.token_ids(proc)
    if vision_chameleon.is_processor(proc):     # its image_token is llava's "<image>": before llava's
        return vision_chameleon.token_ids(proc)
    if vision_deepseek_ocr2.is_processor(proc):     # its image_token is llava's "<image>": before llava's
        return vision_deepseek_ocr2.token_ids(proc)
    if vision_unlimited_ocr.is_processor(proc):     # its image_token is llava's "<image>": before llava's
        return vision_unlimited_ocr.token_ids(proc)
    if vision_molmo2.is_processor(proc):
        return vision_molmo2.token_ids(proc)
    if vision_hunyuan_vl.is_processor(proc):
        return vision_hunyuan_vl.token_ids(proc)
    if vision_step3p7.is_processor(proc):
        return vision_step3p7.token_ids(proc)
    if vision_dots3_note.is_processor(proc):
        return vision_dots3_note.token_ids(proc)
    if vision_apertus1p5.is_processor(proc):
        return vision_apertus1p5.token_ids(proc)
    if vision_inkling2.is_processor(proc):
        return vision_inkling2.token_ids(proc)
    if vision_inkling.is_processor(proc):
        return vision_inkling.token_ids(proc)
    if vision_lfm2_vl.is_processor(proc):      # its image_token is llava's "<image>": before llava's
        return vision_lfm2_vl.token_ids(proc)
    if getattr(proc, "image_token", None) == vision_llava.IMAGE_TOKEN:
        return vision_llava.token_ids(proc)
    if proc.__class__.__name__ == "Idefics3Processor":
        return vision_idefics3.token_ids(proc)
    if proc.__class__.__name__ == "PaliGemmaProcessor":
        return vision_paligemma.token_ids(proc)
    if proc.__class__.__name__ == "DeepseekVLProcessor":
        return vision_deepseek_vl.token_ids(proc)
    if proc.__class__.__name__ == "DeepseekVLHybridProcessor":
        return vision_deepseek_vl_hybrid.token_ids(proc)
    if proc.__class__.__name__ == "JanusProcessor":
        return vision_janus.token_ids(proc)
    if proc.__class__.__name__ == "Idefics2Processor":
        return vision_idefics2.token_ids(proc)
    if proc.__class__.__name__ == "MllamaProcessor":
        return vision_mllama.token_ids(proc)
    if proc.__class__.__name__ == "PixtralProcessor":
        return vision_mistral3.token_ids(proc)
    if proc.__class__.__name__ == "LightOnOcrProcessor":
        return vision_lighton_ocr.token_ids(proc)
    if isinstance(getattr(proc, "image_token", None), str) and proc.image_token == vision_internvl.CONTEXT:
        return vision_internvl.token_ids(proc)
    ids = proc.tokenizer.convert_tokens_to_ids([VISION_START, VISION_END, IMAGE_PAD, VIDEO_PAD])
    return dict(zip(("vision_start_token_id", "vision_end_token_id", "image_token_id", "video_token_id"), ids,
                    strict=True))


def image_row_words(job: JobSpec, row: int) -> int:
    """Words of a row of `row` tokens beside its images (each image: its tokens and two markers; PaliGemma's,
    Llama-3.2-Vision's, Molmo2's and Emu3's row one bos besides)."""
    t, family = job.train, job.model.vision.family
    markers = vision_llava.MARKERS_PER_IMAGE if job.model.vision.model_type in vision_llava.LLAVA_TYPES else \
        vision_idefics3.markers(job) if family == "idefics3" else \
        vision_granite_docling.markers(job) if family == "granite_docling" else \
        vision_granite4_vision.MARKERS_PER_IMAGE if family == "granite4_vision" else \
        vision_aria.MARKERS_PER_IMAGE if family == "aria" else \
        vision_paligemma.MARKERS_PER_IMAGE if family == "paligemma" else \
        vision_deepseek_vl.MARKERS_PER_IMAGE if family == "deepseek_vl" else \
        vision_deepseek_vl_hybrid.MARKERS_PER_IMAGE if family == "deepseek_vl_hybrid" else \
        vision_deepseek_ocr2.MARKERS_PER_IMAGE if family == "deepseek_ocr2" else \
        vision_unlimited_ocr.MARKERS_PER_IMAGE if family == "unlimited_ocr" else \
        vision_aya_vision.markers(job) if family == "aya_vision" else \
        vision_cohere2_vision.markers(job) if family == "cohere2_vision" else \
        vision_gemma4.MARKERS_PER_IMAGE if family in ("gemma4", "gemma4_unified") else \
        vision_glm4v.MARKERS_PER_IMAGE if family == "glm4v" else \
        vision_lfm2_vl.markers(job) if family == "lfm2_vl" else \
        vision_minicpmv4_6.markers(job) if family == "minicpmv4_6" else \
        vision_kimi_k25.MARKERS_PER_IMAGE if family == "kimi_k25" else \
        vision_muse_glimmer.MARKERS_PER_IMAGE if family == "muse_glimmer" else \
        vision_ernie4_5_vl_moe.MARKERS_PER_IMAGE if family == "ernie4_5_vl_moe" else \
        vision_minimax_m3_vl.MARKERS_PER_IMAGE if family == "minimax_m3_vl" else \
        vision_fuyu.markers(job) if family == "fuyu" else \
        vision_emu3.MARKERS_PER_IMAGE if family == "emu3" else \
        vision_janus.MARKERS_PER_IMAGE if family == "janus" else \
        vision_chameleon.MARKERS_PER_IMAGE if family == "chameleon" else \
        vision_ovis2.MARKERS_PER_IMAGE if family == "ovis2" else \
        vision_pp_chart2table.MARKERS_PER_IMAGE if family == "got_ocr2" else \
        vision_hunyuan_vl.MARKERS_PER_IMAGE if family == "hunyuan_vl" else \
        vision_idefics2.MARKERS_PER_IMAGE if family == "idefics2" else \
        vision_mllama.MARKERS_PER_IMAGE if family == "mllama" else \
        vision_mistral3.MARKERS_PER_IMAGE if family == "pixtral" else \
        vision_internvl.MARKERS_PER_IMAGE if family == "internvl" else \
        vision_video_llama_3.MARKERS_PER_IMAGE if family == "video_llama_3" else \
        vision_qwen2_5_omni.MARKERS_PER_IMAGE if family == "qwen2_5_omni" else \
        vision_molmo2.markers(job) if family == "molmo2" else \
        vision_step3p7.markers(job) if family == "step3p7" else \
        vision_dots3_note.MARKERS_PER_IMAGE if family == "dots3_note" else \
        vision_apertus1p5.markers(job) if family == "apertus1p5" else \
        vision_inkling2.MARKERS_PER_IMAGE if family == "inkling2" else \
        vision_inkling.MARKERS_PER_IMAGE if family == "inkling" else MARKERS_PER_IMAGE
    per_image = image_geometry(t, job.model.vision).tokens + markers
    row_tokens = vision_paligemma.ROW_TOKENS if family == "paligemma" else \
        vision_mllama.BOS_PER_ROW if family == "mllama" else \
        vision_idefics2.ROW_TOKENS if family == "idefics2" else \
        vision_molmo2.ROW_TOKENS if family == "molmo2" else \
        vision_chameleon.ROW_TOKENS if family == "chameleon" else \
        vision_emu3.ROW_TOKENS if family == "emu3" else 0
    words = row - t.images_per_example * per_image - row_tokens
    if words < 1:
        raise SpecError(f"the trace fills rows of {row} tokens: {t.images_per_example} image(s) × {per_image} tokens "
                        "(image tokens and any markers around them) leave no room for text; raise max_length")
    return words


def make_image_dataset(job: JobSpec, documents: tuple[int, ...], num_micro_batches: int) -> Any:
    """Rows of `images_per_example` blank images and text filling each designed row length."""
    from datasets import Dataset
    from PIL import Image

    t = job.train
    image = Image.new("RGB", (t.image_width, t.image_height))
    messages, images = [], []
    for _ in range(num_micro_batches):
        for row in documents:
            words = " ".join([WORD] * image_row_words(job, row))
            messages.append([{"role": "user", "content": words}])
            images.append([image] * t.images_per_example)
    return Dataset.from_dict({"images": images, "messages": messages})


def build_vlm(config: Any, dtype: Any, attn: Any) -> Any:
    """`AutoModelForImageTextToText.from_config`: the class TRL's create_model_from_path loads a vision-language
    checkpoint with."""
    from transformers import AutoModelForImageTextToText

    return AutoModelForImageTextToText.from_config(config, dtype=dtype, attn_implementation=attn)
