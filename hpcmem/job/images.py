"""The images of a vision-language SFT job: their fields' checks, what the processor turns one image into (patch
grid, patches, image tokens); TRL's and transformers' refusals around a job with images are
hpcmem.job.image_rules.

The geometry mirrors the Qwen2-VL image processor of transformers 5.24 (models/qwen2_vl/image_processing_qwen2_vl.py,
also Qwen2.5-VL's): `Qwen2VLImageProcessor.resize` calls `smart_resize(height, width, factor=patch_size · merge_size,
min_pixels=size.shortest_edge, max_pixels=size.longest_edge)`; `patchify` cuts the resized image into
(height/patch_size) × (width/patch_size) patches of in_channels · temporal_patch_size · patch_size² values (a still image
is repeated temporal_patch_size times: grid_t = 1); the processor (processing_qwen2_5_vl.py `replace_image_token`)
puts grid_t · grid_h · grid_w / merge_size² image tokens into the text. Qwen3-VL's processor is the same class
(models/auto/image_processing_auto.py maps qwen3_vl to `Qwen2VLImageProcessor`) with its vision config's 16 px
patches: sides rounded to multiples of 32. Gemma 3's (models/gemma3/image_processing_gemma3.py `Gemma3ImageProcessor`,
`do_pan_and_scan` off by default) resizes every image to the vision config's image_size square, and its processor
(processing_gemma3.py) writes mm_tokens_per_image image tokens per image (`VisionSpec.image_size`, `tokens_per_image`).
SmolVLM's and Idefics3's (image_processing_pil_smolvlm.py `SmolVLMImageProcessorPil._preprocess`) cut each image into
tiles (hpcmem.models.idefics3 `idefics3_tiles`), each (tile / patch_size)² patches and tokens_per_tile image tokens.
Llama-3.2-Vision's (image_processing_pil_mllama.py `MllamaImageProcessorPil`) fits each image to rows × cols tiles
of image_size px (hpcmem.models.mllama `mllama_tiles`) but pads every image to max_num_tiles tiles (`pack_images`):
the tower runs max_num_tiles · ((image_size / patch_size)² + 1) rows per image whatever its size, and the text holds
one <|image|> token per image (the model reads the image through its cross-attention layers).
LLaVA-NeXT's (image_processing_pil_llava_next.py) picks a best-fit resolution and cuts it into tiles plus a base image
(hpcmem.models.llava_next `anyres_tiles`, `anyres_tokens`); LLaVA-OneVision's (image_processing_pil_llava_onevision.py)
the same for an image alone in its row, its grid downscaled past anyres_max's tiles, and one square tile for each
image of a row of several (hpcmem.models.llava_onevision). Mistral 3's (image_processing_pil_pixtral.py) fits each
image to longest_edge at its own aspect ratio (hpcmem.models.pixtral).
Idefics2's (image_processing_pil_idefics2.py `Idefics2ImageProcessorPil`, no splitting) resizes each image between its
shortest and longest edge (hpcmem.models.idefics2 `idefics2_resize`); the tower runs its whole patch grid and the
perceiver resampler makes n_latents image tokens of it.
InternVL's (image_processing_pil_got_ocr2.py `GotOcr2ImageProcessorPil`) cuts each image into the tiles of the
canvas whose aspect ratio fits it best and a thumbnail, or resizes it to one tile (hpcmem.models.internvl
`internvl_tiles`); each tile (image_size / patch_size)² patches and tokens_per_image image tokens. Granite-Docling's
(modular_granite_docling.py `GraniteDoclingImageProcessorPil`, GotOcr2's subclass) the same with 512 px tiles and
up to 32 of them (hpcmem.models.granite_docling).
GLM-4.1V's (image_processing_glm4v.py `Glm4vImageProcessor`) is Qwen2-VL's with its own `smart_resize` (a still image
taken as temporal_patch_size frames) and size bounds (hpcmem.models.glm4v `glm4v_resize`).
Apertus 1.5's (image_processing_apertus1p5.py `Apertus1p5ImageProcessor`) is its own smart_resize at 16 px within
128² … 1400² pixels, one code (image token) per 16 × 16 cell (hpcmem.models.apertus1p5).
HunYuanVL's (image_processing_pil_hunyuan_vl.py `HunYuanVLImageProcessorPil`) is Qwen2-VL's smart_resize within its
own size bounds at one frame; its processor writes a newline token per merged row and two more per image
(hpcmem.models.hunyuan_vl).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from hpcmem.models.idefics3 import idefics3_tiles
from hpcmem.models.mllama import mllama_tiles
from hpcmem.models.tower_base import fit_pixels

if TYPE_CHECKING:
    from hpcmem.models.vision_spec import VisionSpec

# Qwen2VLImageProcessor.size's class defaults (image_processing_qwen2_vl.py): shortest_edge 56·56, longest_edge
# 28·28·1280 pixels — what min_pixels / max_pixels None stand for
DEFAULT_MIN_PIXELS = 56 * 56
DEFAULT_MAX_PIXELS = 28 * 28 * 1280
MAX_ASPECT = 200            # smart_resize raises above this aspect ratio
# (min_pixels, max_pixels) a checkpoint's preprocessor_config.json sets where they differ from the class defaults and
# change what small or large images become: Qwen3-VL's `size` {"shortest_edge": 65536, "longest_edge": 16777216}
# (Qwen/Qwen3-VL-8B-Instruct); keyed by the model config's model_type
PUBLISHED_PIXELS = {"qwen3_vl": (65536, 16777216)}
# What a type's own checkpoint files make TRL do other than what the estimate holds (keyed by model_type).
# ShieldGemma 2: the estimate (and the trace) is Gemma3ForConditionalGeneration, what AutoModelForImageTextToText
# builds from a ShieldGemma2Config, fed by a Gemma3Processor; trl/trainer/utils.py `create_model_from_path` loads the
# class config.json's `architectures` names, and modeling_shieldgemma2.py `ShieldGemma2ForImageClassification.forward`
# returns the last position's yes/no logits only; processing_shieldgemma2.py `ShieldGemma2Processor.__call__`
# replaces the text it is given by one policy prompt per image and policy and raises on text without images
LOADING_NOTES = {"shieldgemma2": (
    "shieldgemma2 is estimated as Gemma3ForConditionalGeneration (AutoModelForImageTextToText) with a Gemma3Processor "
    "as processing_class; ShieldGemma2ForImageClassification returns no loss and no per-token logits, and "
    "ShieldGemma2Processor drops the dataset's text for one policy prompt per image and policy (3 rows per image "
    "by default): load the model with AutoModelForImageTextToText and pass a Gemma3Processor")}
# The flags' help: which names are hpcmem's own and which transformers'
FIELD_HELP = {
    "images_per_example": "hpcmem's own: images in each row's \"images\" list (0: text only) (default 0)",
    "image_height": "hpcmem's own: pixel height of every image before the processor resizes it",
    "image_width": "hpcmem's own: pixel width of every image before the processor resizes it",
    "min_pixels": f"the Qwen2-VL image processor's min_pixels (transformers' name) (default {DEFAULT_MIN_PIXELS}, "
                  "the processor class's; a checkpoint's preprocessor_config.json may set another: Qwen3-VL's 65536)",
    "max_pixels": f"the Qwen2-VL image processor's max_pixels (transformers' name) (default {DEFAULT_MAX_PIXELS}, "
                  "the processor class's; Qwen2.5-VL's preprocessor_config.json sets 12845056, Qwen3-VL's 16777216)",
    "profile_images": "hpcmem's own, set by --lengths with an image-text profile: the worst micro-batch's images",
    "profile_patches": "hpcmem's own, set by --lengths with an image-text profile: the worst micro-batch's vision "
                       "patches",
    "profile_image_tokens": "hpcmem's own, set by --lengths with an image-text profile: the worst micro-batch's "
                            "image tokens",
}


def image_problems(t: Any) -> list[str]:
    """The image fields' own ranges (a TrainSpec)."""
    out = []
    if t.images_per_example < 0:
        out.append(f"images_per_example must be ≥ 0 (0: text only); got {t.images_per_example}")
    missing = [n for n in ("image_height", "image_width") if t.images_per_example > 0 and getattr(t, n) == 0]
    if len(missing) == 2:       # neither given: one line that says so, not two that read the default 0 as a value
        out.append(f"images_per_example {t.images_per_example} needs image_height and image_width (each image's "
                   "size in pixels before the processor resizes it), or a length profile of the data (--lengths)")
    for name in ("image_height", "image_width"):
        value = getattr(t, name)
        if (value < 0 or (t.images_per_example > 0 and value < 1)) and len(missing) < 2:
            out.append(f"{name} must be ≥ 1 pixel when images_per_example > 0; got {value}")
    for name in ("profile_images", "profile_patches", "profile_image_tokens"):
        if getattr(t, name) < 0:
            out.append(f"{name} must be ≥ 0 (0: no length profile's images); got {getattr(t, name)}")
    if t.profile_images > 0 and t.images_per_example > 0:
        out.append(f"images_per_example {t.images_per_example} and a length profile's images ({t.profile_images} per "
                   "micro-batch) both describe the images; give one of them")
    if t.profile_images > 0 and min(t.profile_patches, t.profile_image_tokens) < 1:
        out.append(f"profile_images {t.profile_images} needs profile_patches and profile_image_tokens ≥ 1; got "
                   f"{t.profile_patches} and {t.profile_image_tokens}")
    for name in ("min_pixels", "max_pixels"):
        value = getattr(t, name)
        if value is not None and value < 1:
            out.append(f"{name} must be ≥ 1 or None (the processor's default); got {value}")
    # both given: their order is the user's; with one left to the processor's default, the model's tower says which
    # default (hpcmem.job.image_rules `pixel_bounds_problems`)
    if t.min_pixels is not None and t.max_pixels is not None and t.min_pixels > t.max_pixels:
        out.append(f"min_pixels {t.min_pixels} must be ≤ max_pixels {t.max_pixels}")
    if t.images_per_example > 0 and min(t.image_height, t.image_width) >= 1:
        ratio = max(t.image_height, t.image_width) / min(t.image_height, t.image_width)
        if ratio > MAX_ASPECT:
            out.append(f"image_height × image_width {t.image_height}×{t.image_width}: aspect ratio {ratio:.0f} > "
                       f"{MAX_ASPECT}, which the Qwen2-VL image processor's smart_resize refuses")
    return out


def pixel_bounds(t: Any, vision: Any = None) -> tuple[int, int]:
    """(min_pixels, max_pixels) the processor uses: the job's, else the class defaults (Qwen2-VL's, or the tower's
    `default_pixels` where its processor's differ: GLM-4.1V's, hpcmem.models.glm4v)."""
    dlo, dhi = getattr(vision, "default_pixels", (DEFAULT_MIN_PIXELS, DEFAULT_MAX_PIXELS))
    lo = dlo if t.min_pixels is None else t.min_pixels
    hi = dhi if t.max_pixels is None else t.max_pixels
    return lo, hi


def processor_kwargs(t: Any, vision: VisionSpec | None) -> dict[str, Any]:
    """The keywords `AutoProcessor.from_pretrained` needs so that a real run resizes images as this job assumes
    (a TrainSpec): the Qwen2-VL family's `size` bounds (transformers 5's names for min_pixels / max_pixels,
    image_processing_qwen2_vl.py); nothing for a job without images or for a processor with a fixed resize
    (Gemma 3's: its checkpoint's own size is what the estimate takes)."""
    if vision is None or vision.image_size or (t.images_per_example == 0 and t.profile_images == 0):
        return {}
    lo, hi = pixel_bounds(t, vision)
    if getattr(vision, "family", "") == "apertus1p5":     # Apertus1p5ImageProcessor.resize reads these keys
        return {"size": {"min_pixels": lo, "max_pixels": hi}}
    return {"size": {"shortest_edge": lo, "longest_edge": hi}}


def smart_resize(height: int, width: int, factor: int, min_pixels: int, max_pixels: int) -> tuple[int, int]:
    """transformers 5.24 models/qwen2_vl/image_processing_qwen2_vl.py `smart_resize`, line for line: both sides
    rounded to multiples of `factor`, then scaled (aspect kept) into [min_pixels, max_pixels]."""
    return fit_pixels(height, width, round(height / factor) * factor, round(width / factor) * factor, factor,
                      min_pixels, max_pixels)


@dataclass(frozen=True)
class ImageGeometry:
    """One image as the processor hands it to the model."""

    resized: tuple[int, int]     # (height, width) after smart_resize
    grid_thw: tuple[int, int, int]   # image_grid_thw's row: (1, height/patch, width/patch)
    patches: int                 # rows of pixel_values for this image
    tokens: int                  # image tokens in the text (patches / spatial_merge_size²)


def image_geometry(t: Any, vision: VisionSpec) -> ImageGeometry:
    if getattr(vision, "family", "") == "idefics3":
        # SmolVLM / Idefics3: rows × cols tiles and a global one (or one tile); grid_thw is (tiles, side, side)
        cut, rows, cols = idefics3_tiles(t.image_height, t.image_width, vision.longest_edge, vision.tile)
        tiles, side = rows * cols + 1 if rows else 1, vision.tile // vision.patch_size
        return ImageGeometry(resized=cut, grid_thw=(tiles, side, side), patches=tiles * vision.patches,
                             tokens=tiles * vision.tokens_per_tile)
    if getattr(vision, "family", "") == "aria":
        # Aria (hpcmem.models.aria): one max_image_size² square per image (the resized image padded), all its
        # patches through the tower, patch_to_query's tokens; `resized` the real pixels before the padding
        side = vision.tile // vision.patch_size
        return ImageGeometry(resized=vision.resized(t.image_height, t.image_width), grid_thw=(1, side, side),
                             patches=vision.patches, tokens=vision.tokens_per_tile)
    if getattr(vision, "family", "") == "granite_docling":
        # Granite-Docling (hpcmem.models.granite_docling): GotOcr2's columns × rows tiles and a thumbnail, or one
        # tile; grid_thw is (tiles, side, side); each tile's patches and tokens_per_tile image tokens
        tiles, cols, rows = vision.tiles(t.image_height, t.image_width)
        side = vision.tile // vision.patch_size
        return ImageGeometry(resized=(rows * vision.tile, cols * vision.tile), grid_thw=(tiles, side, side),
                             patches=tiles * vision.patches, tokens=tiles * vision.tokens_per_tile)
    if getattr(vision, "family", "") == "idefics2":
        resized, rows, cols = vision.grid(t.image_height, t.image_width)
        return ImageGeometry(resized=resized, grid_thw=(1, rows, cols), patches=rows * cols,
                             tokens=vision.tokens_per_image)
    if getattr(vision, "family", "") == "mllama":
        # grid_thw is (max_num_tiles, side, side): the padded tiles the tower runs; `resized` the tiled canvas
        rows, cols = mllama_tiles(t.image_height, t.image_width, vision.image_size, vision.max_num_tiles)
        side = vision.image_size // vision.patch_size
        return ImageGeometry(resized=(rows * vision.image_size, cols * vision.image_size),
                             grid_thw=(vision.max_num_tiles, side, side),
                             patches=vision.max_num_tiles * vision.patches, tokens=1)
    if getattr(vision, "family", "") == "pixtral":
        # Mistral 3 (hpcmem.models.pixtral): each image fit to longest_edge in patch · merge steps, one grid of
        # patches at its own resolution; its [IMG] tokens, a break per merged row
        rows, cols = vision.grid(t.image_height, t.image_width)
        return ImageGeometry(resized=(rows * vision.patch_size, cols * vision.patch_size), grid_thw=(1, rows, cols),
                             patches=rows * cols, tokens=vision.image_tokens(t.image_height, t.image_width))
    if getattr(vision, "family", "") in ("internvl", "aya_vision", "cohere2_vision"):
        # InternVL (hpcmem.models.internvl): columns × rows tiles and a thumbnail, or one tile; grid_thw is
        # (tiles, side, side); each tile's patches (the class token is the tower's own row) and tokens_per_image tokens
        tiles, cols, rows = vision.tiles(t.image_height, t.image_width)
        side = vision.image_size // vision.patch_size
        return ImageGeometry(resized=(rows * vision.tile, cols * vision.tile), grid_thw=(tiles, side, side),
                             patches=tiles * vision.patches, tokens=tiles * vision.tokens_per_image)
    if getattr(vision, "family", "") in ("gemma4", "gemma4_unified"):
        # Gemma 4 (hpcmem.models.gemma4): the aspect-ratio resize's grid; the tower runs every image padded to
        # max_soft_tokens · k² rows (Gemma 4 unified's embedder: max_soft_tokens merged rows), the text holds the
        # resized grid's soft tokens
        h, w = vision.resized(t.image_height, t.image_width)
        return ImageGeometry(resized=(h, w), grid_thw=(1, h // vision.patch_size, w // vision.patch_size),
                             patches=vision.max_patches, tokens=vision.image_tokens(t.image_height, t.image_width))
    if getattr(vision, "family", "") in ("glm4v", "cosmos3_edge"):
        # GLM-4.1V (hpcmem.models.glm4v): its own smart_resize (a still image as temporal_patch_size frames);
        # Cosmos3 Edge's processor is GLM-4.1V's at one frame (hpcmem.models.cosmos3_edge)
        h, w = vision.resized(t.image_height, t.image_width, *pixel_bounds(t, vision))
        gh, gw = h // vision.patch_size, w // vision.patch_size
        return ImageGeometry(resized=(h, w), grid_thw=(1, gh, gw), patches=gh * gw,
                             tokens=gh * gw // vision.merge_unit)
    if getattr(vision, "family", "") == "molmo2":
        # Molmo2 (hpcmem.models.molmo2): the global crop and the canvas's overlapping crops, each side² patches;
        # grid_thw is (crops, side, side); one image token per pooling window of each view
        _, _, ch, cw = vision.layout(t.image_height, t.image_width)
        crops = vision.crops(t.image_height, t.image_width)
        return ImageGeometry(resized=(ch, cw), grid_thw=(crops, vision.side, vision.side),
                             patches=crops * vision.patches, tokens=vision.image_tokens(t.image_height, t.image_width))
    if getattr(vision, "family", "") == "step3p7":
        # Step 3.7 Flash (hpcmem.models.step3p7): the global view and its local crops; grid_thw is (views, the global
        # view's side, side); the rows are the views' patches
        x, y = vision.crops(t.image_height, t.image_width)
        side = vision.image_size // vision.patch_size
        return ImageGeometry(resized=(vision.image_size, vision.image_size), grid_thw=(1 + x * y, side, side),
                             patches=vision.image_patches(t.image_height, t.image_width),
                             tokens=vision.image_tokens(t.image_height, t.image_width))
    if getattr(vision, "family", "") == "inkling2":
        # Inkling 2 (hpcmem.models.inkling2): no resize, the image padded up to whole 40 px cells; grid_thw counts
        # cells (image_grid_thw), the tower's rows are merge² patches a cell (its class tokens besides)
        rows, cols = vision.grid(t.image_height, t.image_width)
        return ImageGeometry(resized=(rows * vision.cell, cols * vision.cell), grid_thw=(1, rows, cols),
                             patches=vision.image_patches(t.image_height, t.image_width),
                             tokens=vision.image_tokens(t.image_height, t.image_width))
    if getattr(vision, "family", "") == "inkling":
        # Inkling (hpcmem.models.inkling): no resize, each image cut into 40 px patches (`divide_to_patches`: a last
        # column beyond the width), one image token each
        rows, cols = vision.grid(t.image_height, t.image_width)
        return ImageGeometry(resized=(rows * vision.cell, cols * vision.cell), grid_thw=(1, rows, cols),
                             patches=vision.image_patches(t.image_height, t.image_width),
                             tokens=vision.image_tokens(t.image_height, t.image_width))
    if getattr(vision, "family", "") == "kimi_k25":
        # Kimi K2.5 (hpcmem.models.kimi_k25): navit_resize's size padded to multiples of 28 px, one patch grid
        gh, gw = vision.grid(t.image_height, t.image_width)
        return ImageGeometry(resized=(gh * vision.patch_size, gw * vision.patch_size), grid_thw=(1, gh, gw),
                             patches=gh * gw, tokens=vision.image_tokens(t.image_height, t.image_width))
    if getattr(vision, "family", "") == "muse_glimmer":
        # Muse Glimmer (hpcmem.models.muse_glimmer): smart_resize's grid of 28 px blocks under max_image_tokens, one
        # patch grid
        gh, gw = vision.grid(t.image_height, t.image_width)
        return ImageGeometry(resized=(gh * vision.patch_size, gw * vision.patch_size), grid_thw=(1, gh, gw),
                             patches=gh * gw, tokens=vision.image_tokens(t.image_height, t.image_width))
    if getattr(vision, "family", "") in ("deepseek_ocr2", "unlimited_ocr"):
        # DeepSeek-OCR 2 (hpcmem.models.deepseek_ocr2): the 1024 px global view and any 768 px tiles (Unlimited-OCR's
        # 640 px, hpcmem.models.unlimited_ocr); grid_thw is (views, the global view's patch grid); the SAM patches of
        # every view
        g = vision.image_size // vision.patch_size
        tiles = vision.tiles(t.image_height, t.image_width)
        return ImageGeometry(resized=(vision.image_size,) * 2, grid_thw=(1 + tiles, g, g),
                             patches=vision.image_patches(t.image_height, t.image_width),
                             tokens=vision.image_tokens(t.image_height, t.image_width))
    if getattr(vision, "family", "") == "apertus1p5":
        # Apertus 1.5 (hpcmem.models.apertus1p5): its own smart_resize at 16 px within the size bounds, one code per
        # 16 × 16 cell, one image token per code
        lo, hi = pixel_bounds(t, vision)
        h, w = vision.resized(t.image_height, t.image_width, lo, hi)
        gh, gw = h // vision.patch_size, w // vision.patch_size
        return ImageGeometry(resized=(h, w), grid_thw=(1, gh, gw), patches=gh * gw, tokens=gh * gw)
    if getattr(vision, "family", "") == "emu3":
        # Emu3 (hpcmem.models.emu3): smart_resize to multiples of 8 within 512² .. 1024² pixels; the VQ-VAE's code
        # grid is the resized sides / 8, one <image> token per code and one row end per code row
        rows, cols = vision.grid(t.image_height, t.image_width)
        return ImageGeometry(resized=vision.resized(t.image_height, t.image_width), grid_thw=(1, rows, cols),
                             patches=rows * cols, tokens=rows * (cols + 1))
    if getattr(vision, "family", "") == "fuyu":
        # Fuyu (hpcmem.models.fuyu): the image fitted into the 1080 × 1920 canvas when larger, cropped to whole 30 px
        # patches; one |SPEAKER| token per patch (the |NEWLINE| per patch row is text)
        rows, cols = vision.grid(t.image_height, t.image_width)
        return ImageGeometry(resized=(rows * vision.patch_size, cols * vision.patch_size), grid_thw=(1, rows, cols),
                             patches=rows * cols, tokens=rows * cols)
    if getattr(vision, "family", "") == "minicpmv4_6":
        # MiniCPM-V 4.6 (hpcmem.models.minicpmv4_6): the resized source and any grid of slices, each its own patch
        # grid; grid_thw is (slices, the source's patch grid)
        slices = vision.slices(t.image_height, t.image_width)
        (gh, gw) = slices[0]
        return ImageGeometry(resized=(gh * vision.patch_size, gw * vision.patch_size), grid_thw=(len(slices), gh, gw),
                             patches=vision.image_patches(t.image_height, t.image_width),
                             tokens=vision.image_tokens(t.image_height, t.image_width))
    if getattr(vision, "family", "") == "lfm2_vl":
        # LFM2-VL (hpcmem.models.lfm2_vl): columns × rows tiles and a thumbnail, or one smart_resize'd image; the
        # tower runs each padded to max_num_patches rows; grid_thw is (tiles, the resized image's patch grid)
        _, _, (h, w) = vision.layout(t.image_height, t.image_width)
        tiles = vision.tiles(t.image_height, t.image_width)
        return ImageGeometry(resized=(h, w), grid_thw=(tiles, h // vision.patch_size, w // vision.patch_size),
                             patches=tiles * vision.patches, tokens=vision.image_tokens(t.image_height, t.image_width))
    if getattr(vision, "family", "") in ("hunyuan_vl", "hy_v4_vl"):
        # HunYuanVL (hpcmem.models.hunyuan_vl): Qwen2-VL's smart_resize within its own size bounds, one frame; its
        # tokens the merged grid's rows with a newline column each, begin and end (HY-V4-VL's: none,
        # hpcmem.models.hy_v4_vl)
        lo, hi = pixel_bounds(t, vision)
        h, w = smart_resize(t.image_height, t.image_width, vision.patch_size * vision.spatial_merge_size, lo, hi)
        gh, gw = h // vision.patch_size, w // vision.patch_size
        return ImageGeometry(resized=(h, w), grid_thw=(1, gh, gw), patches=gh * gw,
                             tokens=vision.image_tokens(gh, gw))
    if getattr(vision, "max_num_patches", 0) and t.images_per_example > 1:
        # LLaVA-OneVision (hpcmem.models.llava_onevision): each image of a multi-image row one square tile
        g = vision.image_size // vision.patch_size
        return ImageGeometry(resized=(vision.image_size,) * 2, grid_thw=(1, g, g), patches=g * g,
                             tokens=vision.single_tile_tokens)
    if getattr(vision, "grid_pinpoints", None):
        # LLaVA-NeXT (hpcmem.models.llava_next): the best-fit pinpoint's tiles and the base image, each image_size
        # square; grid_thw is (tiles, side, side); LLaVA-OneVision's image alone in its row likewise
        tiles, g = vision.anyres_tiles(t.image_height, t.image_width), vision.image_size // vision.patch_size
        return ImageGeometry(resized=vision.best_resolution(t.image_height, t.image_width), grid_thw=(tiles, g, g),
                             patches=tiles * g * g, tokens=vision.anyres_tokens(t.image_height, t.image_width))
    if getattr(vision, "fixed_resolution", False):
        # llava (hpcmem.models.clip_tower): CLIPImageProcessor resizes the shortest edge to image_size and crops the
        # centre square, whatever the image's size: one resolution, one token count
        s, g = vision.image_size, vision.image_size // vision.patch_size
        return ImageGeometry(resized=(s, s), grid_thw=(1, g, g), patches=g * g, tokens=vision.tokens_per_image)
    if vision.image_size:       # Gemma3ImageProcessor: a fixed square resize, mm_tokens_per_image tokens
        side = vision.image_size // vision.patch_size
        return ImageGeometry(resized=(vision.image_size,) * 2, grid_thw=(1, side, side), patches=side * side,
                             tokens=vision.tokens_per_image)
    lo, hi = pixel_bounds(t, vision)
    h, w = smart_resize(t.image_height, t.image_width, vision.patch_size * vision.spatial_merge_size, lo, hi)
    gh, gw = h // vision.patch_size, w // vision.patch_size
    return ImageGeometry(resized=(h, w), grid_thw=(1, gh, gw), patches=gh * gw, tokens=gh * gw // vision.merge_unit)


def published_pixels_note(t: Any, vision: VisionSpec) -> str | None:
    """A warning when min_pixels / max_pixels are left to the class defaults and the checkpoint's published processor
    bounds (`PUBLISHED_PIXELS`) would resize this job's images otherwise; None when they agree or do not apply."""
    published = PUBLISHED_PIXELS.get(vision.model_type)
    if published is None or t.images_per_example == 0 or (t.min_pixels is not None and t.max_pixels is not None):
        return None
    factor = vision.patch_size * vision.spatial_merge_size
    lo, hi = pixel_bounds(t)
    ours = smart_resize(t.image_height, t.image_width, factor, lo, hi)
    lo2 = published[0] if t.min_pixels is None else t.min_pixels
    hi2 = published[1] if t.max_pixels is None else t.max_pixels
    theirs = smart_resize(t.image_height, t.image_width, factor, lo2, hi2) if lo2 <= hi2 else ours
    if theirs == ours:
        return None
    return (f"min_pixels/max_pixels not given: the processor class's defaults ({lo}, {hi}) resize "
            f"{t.image_height}×{t.image_width} px to {ours[0]}×{ours[1]}; {vision.model_type}'s published "
            f"preprocessor_config.json ({published[0]}, {published[1]}) makes it {theirs[0]}×{theirs[1]}: pass "
            f"--min_pixels {lo2} --max_pixels {hi2} when you use that processor")
