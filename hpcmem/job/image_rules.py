"""What TRL 1.16 and transformers 5.24 refuse around a vision-language job's images, and a micro-batch's images and
pixel_values rows (the geometry is hpcmem.job.images). Typed by the `Job` protocol: the rules that run while a
JobSpec is built need not import it."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from hpcmem.job.image_rl_rules import rl_image_problems
from hpcmem.job.images import image_geometry, pixel_bounds
from hpcmem.job.trainers import entry
from hpcmem.models.ernie4_5_vl_moe import ernie45vl_text_only_problems
from hpcmem.models.emu3 import emu3_problems
from hpcmem.models.fuyu import fuyu_problems
from hpcmem.models.vision import IMAGE_TRAINERS_ALLOWED, VISION_LANGUAGE

if TYPE_CHECKING:
    from hpcmem.job.protocol import Job


# why TRL 1.16 itself fails a (type, trainer) pair that IMAGE_TRAINERS_ALLOWED leaves out, where a run showed it:
# dpo_trainer.py DataCollatorForVisionPreference runs the processor on the chosen and rejected texts without images,
# and processing_paligemma.py PaliGemmaProcessor.validate_inputs raises on a call without images
PALIGEMMA_NEEDS_IMAGES = "`images` are expected as arguments to a `PaliGemmaProcessor` instance."
TRAINER_FAILS = {("paligemma", "dpo"): "TRL 1.16's DataCollatorForVisionPreference tokenizes the chosen and rejected "
                                       f"completions without images and PaliGemmaProcessor raises '{PALIGEMMA_NEEDS_IMAGES}'"}
# Traced and refused: the allocated peak holds within 3 %, the reserved one does not (estimator/LOG.md, "ShieldGemma 2
# and Cosmos3-Omni with images"); the parent type's traces of the same jobs are the same bytes
_SG2_RESERVED = ("traced on its cut, allocated within 3 % but the reserved peak 3.6–6.6 % low beyond the estimate's "
                 "spread on its LoRA cases (GRPO full fine-tuning at 2 images 5.3 % under expandable segments): the "
                 "caching allocator holds up to 0.47 GiB over the allocated peak where the estimate's slack "
                 "(hpcmem/estimate/allocator.py) counts 0.13; and ShieldGemma2Processor raises on the text-only "
                 "completions these collators tokenize")
TRAINER_FAILS.update({("shieldgemma2", trainer): _SG2_RESERVED for trainer in ("dpo", "grpo", "rloo")})
# processing_pp_chart2table.py PPChart2TableProcessor.__call__ raises unless both text and images are given, and
# dpo_trainer.py DataCollatorForVisionPreference tokenizes the chosen and rejected completions without images
# (traced: the four DPO cases of estimator/cases/vlm-pp-chart2table.yaml fail in the collator)
TRAINER_FAILS[("pp_chart2table", "dpo")] = (
    "TRL 1.16's DataCollatorForVisionPreference tokenizes the chosen and rejected completions without images and "
    "PPChart2TableProcessor raises 'Both `images` and `text` must be provided'")
# dpo_trainer.py DataCollatorForVisionPreference returns the prompts' processor output with input_ids, attention_mask
# and mm_token_type_ids extended over the completions, but not the moe_mm_token_type_ids Ernie4_5_VLMoeProcessor
# adds; modeling_ernie4_5_vl_moe.py Ernie4_5_VLMoeMoeBlock.forward then indexes the [rows, prompt + completion,
# hidden] states with the [rows, prompt, hidden] mask (a real CPU forward of TRL's collated batch:
# tests/estimate/test_estimate_vlm_ernie4_5_vl_moe.py)
TRAINER_FAILS[("ernie4_5_vl_moe", "dpo")] = (
    "TRL 1.16's DataCollatorForVisionPreference leaves the prompts' moe_mm_token_type_ids unextended over the "
    "completions and Ernie4_5_VLMoeMoeBlock.forward raises 'IndexError: The shape of the mask ... does not match the "
    "shape of the indexed tensor'")
TRAINER_FAILS[("video_llama_3", "dpo")] = (
    "traced on its cut (TRL's preference collator runs VideoLlama3Processor), LoRA all-linear with checkpointing "
    "+3.02 % over the allocated peak at the Qwen2 layer's backward: the decoder's LoRA backward under checkpointing "
    "is +2.71 % on the same job without images")
TRAINER_FAILS[("idefics3", "dpo")] = (
    "traced on its cut (TRL's preference collator runs Idefics3Processor), LoRA all-linear with checkpointing +3.27 % "
    "over the allocated peak (full fine-tuning without checkpointing +0.94 %): the tower's LoRA backward bound under "
    "checkpointing is loose, as on SmolVLM")
TRAINER_FAILS[("mllama", "dpo")] = (
    "not traced: the trace of TRL's DPO step on its cut stops in the cross-attention, a [2, 1, 3, 6404] "
    "cross-attention mask against [2, 32, 1024, …] scores (whether TRL's own run fails there was not tried)")
TRAINER_FAILS[("cosmos3_omni", "grpo")] = (
    "traced on its cut, allocated within 3 % but full fine-tuning without checkpointing 3.7 % low on the reserved "
    "peak beyond the estimate's spread: the caching allocator holds 1.18 GiB over the allocated peak where the "
    "estimate's slack (hpcmem/estimate/allocator.py) counts 0.35")


def aux_loss_problems(job: Job) -> list[str]:
    """A job on a GLM-4.5 MoE decoder (glm4v_moe, or glm46v / glmga over a glm4v_moe_text sub-config) whose
    router_aux_loss_coef — the job's, else its text config's, which the tower spec carries (hpcmem.models.glm4v
    `Glm4vTowerSpec.text_aux_loss_coef`), else the class default 0.0001 — is not 0: the real trainer raises before its
    first step. TRL 1.16's SFTTrainer and DPOTrainer enable the load-balancing loss when the coefficient is not 0
    (sft_trainer.py / dpo_trainer.py `aux_loss_enabled`), and the fused LM head's forward then reads
    `text_config.num_experts` (trl/trainer/utils.py `add_fused_lm_head._fused_forward`), which Glm4vMoeTextConfig
    does not have (it names n_routed_experts; traced: AttributeError)."""
    t, m = job.train, job.model
    config_coef = getattr(m.vision, "text_aux_loss_coef", None)
    if config_coef is None:
        return []
    kind = m.vision.model_type
    coef = t.router_aux_loss_coef if t.router_aux_loss_coef is not None else config_coef
    if not coef:
        return []
    return [f"router_aux_loss_coef {coef}: on {kind} TRL 1.16 turns the MoE load-balancing loss on and its fused LM "
            "head then reads text_config.num_experts, which its text config does not have (AttributeError in "
            "trl/trainer/utils.py); set router_aux_loss_coef: 0"]


def image_job_problems(job: Job) -> list[str]:
    """What TRL 1.16 / transformers 5.24 refuse, or hpcmem does not model, for a job with images (and a job on a
    GLM-4.5 MoE decoder with or without them: `aux_loss_problems`)."""
    t, m = job.train, job.model
    aux = aux_loss_problems(job)
    if aux:
        return aux
    if getattr(m.vision, "family", "") == "mllama" and not t.has_images:
        # modeling_mllama.py MllamaTextModel.forward: `continue` past every cross-attention layer when there are no
        # cross_attention_states, so a text-only step runs fewer layers than the decoder hpcmem counts
        return [f"images_per_example 0 on {m.vision.model_type}: without images MllamaTextModel skips its "
                f"{len(m.vision.cross_layers)} cross-attention layers, which hpcmem's count of its decoder runs; "
                "text-only jobs on this type are not derived (give images_per_example ≥ 1)"]
    if getattr(m.vision, "family", "") == "ernie4_5_vl_moe" and not t.has_images:
        return ernie45vl_text_only_problems(t.use_peft)
    if getattr(m.vision, "family", "") == "molmo2" and not t.has_images:
        # modeling_molmo2.py Molmo2Model.forward raises "`mm_token_type_ids` is required as a model input when
        # training"; only Molmo2Processor makes them, which TRL's text collators never call (the real SFTTrainer
        # raised so on text rows: estimator/vlm-trainable.jsonl)
        return [f"images_per_example 0 on {m.vision.model_type}: Molmo2Model.forward requires mm_token_type_ids when "
                "training, which only Molmo2Processor makes and TRL 1.16's text collators do not (the real "
                "SFTTrainer raises on text rows); give images_per_example ≥ 1"]
    if not t.has_images:
        return []
    said = (f"images_per_example {t.images_per_example}" if t.images_per_example else
            f"a length profile with images ({t.profile_images} per micro-batch)")
    if m.vision is None:
        return [f"{said}: model {m.name} ({m.model_type}) has no vision tower "
                f"hpcmem models (vision-language types: {', '.join(VISION_LANGUAGE)}); set images_per_example 0"]
    out = []
    allowed = IMAGE_TRAINERS_ALLOWED.get(m.vision.model_type, ())
    if t.trainer not in allowed:
        fails = TRAINER_FAILS.get((m.vision.model_type, t.trainer))
        out.append(f"{said} with trainer {t.trainer} on {m.vision.model_type}: hpcmem models {m.vision.model_type}'s "
                   f"images for {', '.join(allowed) or 'no trainer'} only" + (f" ({fails})" if fails else ""))
    elif (getattr(m.vision, "family", "") in ("idefics3", "mllama", "pixtral", "internvl", "idefics2",
                                                "video_llama_3", "granite_docling", "aria")
          or getattr(m.vision, "grid_pinpoints", None)) \
            and t.profile_images:
        out.append(f"{said} on {m.vision.model_type}: its images are read from images_per_example, image_height and "
                   "image_width only (a length profile of its tiles is not built; no video)")
    elif t.profile_images and t.trainer != "sft":
        out.append(f"{said} with trainer {t.trainer}: a length profile's images are read for SFT only; give "
                   "images_per_example, image_height and image_width")
    # sft_trainer.py SFTTrainer.__init__: "Packing is not supported for vision datasets", "Padding-free training is
    # yet not supported for vision datasets" (DPOTrainer warns about padding_free and pads: hpcmem.job.rules)
    if t.packing:
        out.append("packing with images: TRL 1.16's SFTTrainer raises 'Packing is not supported for vision datasets'")
    if t.padding_free and t.trainer == "sft":
        out.append("padding_free with images: TRL 1.16's SFTTrainer raises 'Padding-free training is yet not "
                   "supported for vision datasets'")
    out += _preference_problems(job) + _fixed_size_problems(job) + _gemma4_problems(job) + rl_image_problems(job)
    out += _inkling2_problems(job) + _inkling_problems(job)
    if getattr(m.vision, "family", "") == "fuyu":
        out += fuyu_problems(t.images_per_example, t.min_pixels, t.max_pixels)
    if getattr(m.vision, "family", "") == "emu3":
        out += emu3_problems(t.min_pixels, t.max_pixels)
    bounds = pixel_bounds_problems(t, m.vision)
    if bounds:              # no geometry to check the row against
        return out + bounds
    g = image_geometry(t, m.vision) if t.images_per_example else None
    tokens = g.tokens * t.images_per_example if g else 0     # a profile's cuts are checked where it is read
    # GRPO/RLOO have no max_length (GRPOConfig/RLOOConfig: their prompt bound is max_prompt_length, checked with the
    # images' tokens by image_rl_rules); TrainSpec's default 1,024 there is no truncation of theirs
    if g and t.max_length is not None and tokens > t.max_length and not entry(t.trainer).generates:
        # processing_utils.py ProcessorMixin._check_special_mm_tokens: truncation that cuts image tokens raises
        lower = "" if m.vision.image_size else " or lower max_pixels"     # llava, Gemma 3: one resolution
        out.append(f"images_per_example {t.images_per_example} × {g.tokens} image tokens ({g.resized[0]}×"
                   f"{g.resized[1]} px after the processor's resize) = {tokens} > max_length {t.max_length}: the "
                   f"processor raises when truncation cuts image tokens; raise max_length{lower}")
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
    if job.tokens_per_micro_batch is not None and t.images_per_example:
        out.append("--lengths with images_per_example: a text length profile counts no image tokens; profile the "
                   "image-text data with `hpcmem lengths DATA --processor DIR` (its images replace images_per_example)")
    return out


def _fixed_size_problems(job: Job) -> list[str]:
    """Gemma 3 (a fixed-size processor, hpcmem.job.images): no min/max pixels; a patch grid its projector pools into
    exactly mm_tokens_per_image tokens (modeling_gemma3.py Gemma3MultiModalProjector, AvgPool2d)."""
    t, v, out = job.train, job.model.vision, []
    if not v.image_size:
        return out
    if t.min_pixels is not None or t.max_pixels is not None:
        processor = {"siglip": "Gemma3ImageProcessor", "idefics3": "SmolVLMImageProcessor",
                     "paligemma": "SiglipImageProcessor", "mllama": "MllamaImageProcessor",
                     "pixtral": "PixtralImageProcessor", "internvl": "GotOcr2ImageProcessor",
                     "deepseek_vl": "DeepseekVLImageProcessor",
                     "deepseek_vl_hybrid": "DeepseekVLHybridImageProcessor", "idefics2": "Idefics2ImageProcessor",
                     "janus": "JanusImageProcessor", "ovis2": "Ovis2ImageProcessor",
                     "lfm2_vl": "Lfm2VlImageProcessor", "minicpmv4_6": "MiniCPMV4_6ImageProcessor",
                     "kimi_k25": "Kimi_K25ImageProcessor", "muse_glimmer": "MuseGlimmerImageProcessor",
                     "got_ocr2": "PPChart2TableImageProcessor",
                     "granite_docling": "GraniteDoclingImageProcessor", "aria": "AriaImageProcessor",
                     "molmo2": "Molmo2ImageProcessor", "deepseek_ocr2": "DeepseekOcr2ImageProcessor",
                     "unlimited_ocr": "UnlimitedOcrImageProcessor",
                     "step3p7": "Step3p7ImageProcessor", "chameleon": "ChameleonImageProcessor"}.get(
            v.family, "CLIPImageProcessor")
        if v.model_type == "video_llava":       # VideoLlavaProcessor's (processing_video_llava.py)
            processor = "VideoLlavaImageProcessor"
        if v.model_type == "minicpm_ocr":       # MiniCPMOcrProcessor's (modular_minicpm_ocr.py)
            processor = "MiniCPMOcrImageProcessor"
        if getattr(v, "grid_pinpoints", None):
            # LlavaNextVideoProcessor's image processor is LlavaNextImageProcessor
            processor = {"llava_onevision": "LlavaOnevisionImageProcessor"}.get(v.model_type,
                                                                                "LlavaNextImageProcessor")
        does = (f"it cuts every image into {v.tile}-px tiles after resizing its longest edge to {v.longest_edge}"
                if v.family == "idefics3" else
                f"it resizes every image to at most {v.longest_edge} px on its longest side and at least "
                f"{v.shortest_edge} px on each" if v.family == "idefics2" else
                f"it fits every image to at most {v.max_num_tiles} tiles of {v.image_size} px and pads it to "
                f"{v.max_num_tiles}" if v.family == "mllama" else
                f"it fits every image to {v.image_size} px on its longest edge, its sides rounded up to {v.step}-px "
                "steps" if v.family == "pixtral" else
                f"it resizes every image's longest edge to {v.image_size} px and pads it to a square"
                if v.family in ("deepseek_vl", "janus") else
                f"it resizes every image's longest edge to {v.tile} px and pads it to a square"
                if v.family == "aria" else
                f"it cuts every image into {v.image_size}-px overlapping crops of a canvas of at most {v.max_crops} "
                "crops, plus a global crop" if v.family == "molmo2" else
                f"it resizes every image to a {v.image_size}-px global view and cuts a larger or elongated one into "
                f"{v.crop}-px local crops" if v.family == "step3p7" else
                f"it resizes every image's longest edge to {v.image_size} px and to {v.sam_image_size} px (the SAM "
                "tower's) and pads each to a square" if v.family == "deepseek_vl_hybrid" else
                f"it resizes every image's longest edge to {v.image_size} px and pads it to a square, and cuts one "
                "larger than 768 px into 2..6 tiles of 768 px" if v.family == "deepseek_ocr2" else
                f"it resizes every image's longest edge to {v.image_size} px and pads it to a square, and cuts one "
                "larger than 640 px into 2..32 tiles of 640 px" if v.family == "unlimited_ocr" else
                f"it fits every image to {v.min_image_tokens}..{v.max_image_tokens} image tokens and cuts a large one "
                f"into {v.image_size}-px tiles ({v.min_tiles}..{v.max_tiles}) and a thumbnail"
                if v.family == "lfm2_vl" else
                f"it resizes every image to about {v.scale_resolution}² pixels and cuts a larger one into up to "
                f"{v.max_slice_nums} slices of about that size" if v.family == "minicpmv4_6" else
                f"it scales every image down into {v.max_patches} patches of {v.patch_size} px and pads its sides to "
                f"multiples of {2 * v.patch_size} px" if v.family == "kimi_k25" else
                f"it resizes every image to the grid of {v.patch_size * v.merge_size}-px blocks nearest its aspect "
                f"ratio within {v.max_image_tokens} blocks" if v.family == "muse_glimmer" else
                f"it cuts every image into {v.image_size}-px tiles of the canvas of {v.min_patches}..{v.max_patches} "
                "tiles that fits its aspect ratio best, plus a thumbnail" if v.family in ("internvl",
                                                                          "granite_docling") else
                f"it cuts every image into {v.image_size}-px tiles of the image_grid_pinpoints resolution that fits it "
                "best, plus one downscaled tile" if getattr(v, "grid_pinpoints", None) else
                f"it resizes every image's shortest edge to {v.image_size} px and crops the centre "
                f"{v.image_size}×{v.image_size}" if v.family == "chameleon" else
                f"it resizes every image to {v.image_size}×{v.image_size}")
        out.append(f"min_pixels/max_pixels with {v.model_type}: {processor} has no such setting; {does}; leave them "
                   "unset")
    if getattr(v, "family", "") == "step3p7" and t.has_images and min(t.image_height, t.image_width) < 32 and \
            max(t.image_height, t.image_width) > 4 * min(t.image_height, t.image_width):
        # image_processing_step3p7.py `_is_extreme_aspect`: such an image is zero-padded to a square first (`pad`)
        out.append(f"image {t.image_height}x{t.image_width} with step3p7: Step3p7ImageProcessor pads an image under "
                   "32 px a side and over 4:1 to a square before planning its crops, which hpcmem does not model; "
                   "give at least 32 px a side or an aspect ratio within 4:1")
    if getattr(v, "family", "") in ("idefics3", "granite_docling", "aria") and v.fold_problem:
        out.append(v.fold_problem)
    if getattr(v, "family", "") == "internvl":
        out += _internvl_problems(v)
    if getattr(v, "family", "") == "ovis2" and v.tokenize_function != "softmax":
        # modeling_ovis2.py Ovis2VisionModel.forward: "st_argmax" (hard_softmax) and "gumbel_argmax" add a one-hot
        # scatter and a straight-through sum over the visual vocabulary beside softmax's output
        out.append(f"vision_config.tokenize_function {v.tokenize_function!r} with ovis2 images: hpcmem models the "
                   "visual tokenizer's softmax only (Ovis2VisionConfig's default); the hard one-hot variants keep "
                   "more [image tokens, visual vocabulary] tensors")
    if getattr(v, "family", "") in ("deepseek_vl", "deepseek_vl_hybrid") and v.pooling_head:
        # modeling_siglip.py SiglipVisionTransformer.forward runs the head whenever vision_use_head
        # (SiglipVisionConfig's default); DeepseekVLModel.get_image_features overwrites its pooler_output
        out.append(f"vision_config.vision_use_head true with {v.model_type} images: SiglipVisionModel runs its "
                   "attention-pooling head on every image and get_image_features discards its output, so in full "
                   "fine-tuning its parameters get no gradient; hpcmem does not model that head's forward or its "
                   "ungraded parameters; set it false")
    if getattr(v, "family", "") == "paligemma" and v.pooling_head:
        # modeling_siglip.py SiglipVisionTransformer.forward runs the head on every image when vision_use_head
        out.append("vision_config.vision_use_head true with paligemma images: SiglipVisionModel runs its attention-"
                   "pooling head on every image, which hpcmem does not model for paligemma (its published configs "
                   "set it false); set it false")
    side = v.image_size // v.patch_size
    if getattr(v, "family", "") == "siglip" and v.tokens_per_image * v.merge_unit != side * side:
        out.append(f"vision_config image_size {v.image_size} / patch_size {v.patch_size} gives a {side}×{side} patch "
                   f"grid that Gemma3MultiModalProjector cannot pool into mm_tokens_per_image {v.tokens_per_image} "
                   "tokens; the model fails on images")
    return out


def _internvl_problems(v: Any) -> list[str]:
    """InternVL's images: a patch grid pixel_shuffle can fold (hpcmem.models.internvl `shuffle_problem`), and the
    tower hpcmem derives what its layers keep for — InternViT-300M's, the InternVL3 1B–38B towers': LayerNorms, no
    qk-norm, `layernorm` an nn.Identity (use_mean_pooling)."""
    out = [v.shuffle_problem] if v.shuffle_problem else []
    if v.norm_type != "layer_norm":
        out.append(f"vision_config.norm_type {v.norm_type!r} with internvl images: what InternVLVisionRMSNorm keeps "
                   "for backward is not derived (hpcmem derives InternViT's LayerNorm layers)")
    if v.use_qk_norm:
        out.append("vision_config.use_qk_norm true with internvl images: what the q/k RMSNorms keep for backward is "
                   "not derived")
    if not v.use_mean_pooling and v.feature_layer in (-1, v.depth):
        out.append("vision_config.use_mean_pooling false with internvl images: the LayerNorm it puts after the last "
                   "layer, on the loss's path, is not placed in the estimate")
    return out


def _gemma4_problems(job: Job) -> list[str]:
    """Gemma 4 (hpcmem.models.gemma4): its image processor sizes images by max_soft_tokens, not min/max pixels; a text
    config with use_bidirectional_attention builds blockwise masks over the image tokens (modeling_gemma4.py
    `create_masks_for_vision_model`), which its learned text profile, traced on text alone, does not hold."""
    t, v, out = job.train, job.model.vision, []
    family = getattr(v, "family", "")
    if family not in ("gemma4", "gemma4_unified"):
        return out
    if t.min_pixels is not None or t.max_pixels is not None:
        out.append(f"min_pixels/max_pixels on {family}: Gemma4ImageProcessor fits each image to max_soft_tokens · "
                   f"{v.merge_unit} patches ({v.max_soft_tokens} soft tokens; a `max_soft_tokens` key in the model "
                   "config sets it), not to pixel bounds")
    if v.text_bidirectional is not None:
        out.append(f"text_config.use_bidirectional_attention {v.text_bidirectional!r} on {family} with images: the "
                   "blockwise masks Gemma4Model builds over each image's tokens are not modelled (its learned text "
                   "profile is traced on causal text)")
    return out


def _inkling2_problems(job: Job) -> list[str]:
    """Inkling 2 (hpcmem.models.inkling2): Inkling2ImageProcessor never resizes; it pads each image up to whole
    40 px cells (image_processing_inkling2.py `_preprocess`), so it has no pixel bounds; a full-attention first text
    layer under LoRA without checkpointing is not modelled (hpcmem.estimate.vision_inkling2_text)."""
    t, v, out = job.train, job.model.vision, []
    if getattr(v, "family", "") != "inkling2":
        return out
    if t.min_pixels is not None or t.max_pixels is not None:
        out.append(f"min_pixels/max_pixels on inkling2: Inkling2ImageProcessor has no such setting; it pads every "
                   f"image up to whole {v.cell}-px cells, one image token each, without resizing; leave them unset")
    if t.use_peft and not t.gradient_checkpointing and v.text_first_layer != "hybrid_sliding":
        # hpcmem.estimate.vision_inkling2_text: what layer 0 keeps once the image features make its input require grad
        out.append(f"text_config.layer_types[0] {v.text_first_layer!r} on inkling2 with images under LoRA without "
                   "gradient checkpointing: what a full-attention first layer keeps for an input that requires grad "
                   "is not modelled (a 'hybrid_sliding' first layer is); turn checkpointing on")
    return out


def _inkling_problems(job: Job) -> list[str]:
    """Inkling (hpcmem.models.inkling): InklingImageProcessor resizes only by rescale_image_frac (class default None:
    never) and cuts each image into 40 px patches (image_processing_inkling.py `_preprocess`), so it has no pixel
    bounds."""
    t, v = job.train, job.model.vision
    if getattr(v, "family", "") != "inkling" or (t.min_pixels is None and t.max_pixels is None):
        return []
    return [f"min_pixels/max_pixels on inkling_mm_model: InklingImageProcessor has no such setting; it cuts every "
            f"image into {v.cell}-px patches, one image token each, without resizing; leave them unset"]


def _preference_problems(job: Job) -> list[str]:
    """What DPOTrainer 1.16 refuses with a vision dataset (dpo_trainer.py `__init__`,
    DataCollatorForVisionPreference)."""
    t, out = job.train, []
    if t.trainer != "dpo":
        return out
    if t.precompute_ref_log_probs:
        out.append("precompute_ref_log_probs with images: TRL 1.16's DPOTrainer raises "
                   "'`precompute_ref_log_probs=True` is not supported for vision datasets'")
    if t.pad_to_multiple_of is not None:
        out.append(f"pad_to_multiple_of {t.pad_to_multiple_of} with images: TRL 1.16's "
                   "DataCollatorForVisionPreference raises NotImplementedError ('Padding to a multiple of a value is "
                   "not yet implemented'); set it to None")
    return out


def image_rows(job: Job) -> tuple[int, int]:
    """(images, pixel_values rows) of one micro-batch: per_device_train_batch_size × images_per_example images per
    row kind, or a length profile's worst micro-batch (profile_images, profile_patches: the profile counts DPO's
    copies itself). DPO's DataCollatorForVisionPreference repeats each example's images for its chosen and its
    rejected row (`images = [...] * 2`, the processor runs on the 2·B prompts), so the tower sees them twice per
    forward."""
    t = job.train
    if job.model.vision is None:
        return 0, 0
    if t.profile_images:
        return t.profile_images, t.profile_patches
    if t.images_per_example == 0:
        return 0, 0
    images = entry(t.trainer).rows_per_example * t.per_device_train_batch_size * t.images_per_example
    return images, images * image_geometry(t, job.model.vision).patches


def image_mask(job: Job) -> bool:
    """Whether the language model's attention gets a 4-D mask because of the images: Gemma3Processor returns
    token_type_ids (1 on image tokens), TRL's vision collators pass them on, and Gemma3Model.forward then builds
    full- and sliding-attention masks that let each image's tokens see each other (modeling_gemma3.py
    `create_masks_for_vision_model`, `blockwise_overlay`), so even one unpadded row's SDPA runs with a materialised
    mask (traced: 8,192-token rows, estimator/LOG.md). Molmo2's likewise: Molmo2Processor returns mm_token_type_ids (1
    on its image tokens), and Molmo2Model.forward hands them to `create_causal_mask` as `block_sequence_ids`, one
    block that all image tokens attend within (modeling_molmo2.py). Qwen's models build no such mask."""
    v = job.model.vision
    return v is not None and v.family in ("siglip", "molmo2") and job.train.has_images


def prompt_image_tokens(job: Job) -> int:
    """Image tokens in each row's prompt: DPO's DataCollatorForVisionPreference puts every image in the prompt and
    `_compute_loss` labels only the completion (`labels = input_ids.masked_fill(completion_mask == 0, -100)`), so
    these positions are never scored by the fused LM head."""
    t = job.train
    if t.images_per_example == 0 or job.model.vision is None:
        return 0
    return t.images_per_example * image_geometry(t, job.model.vision).tokens


def pixel_bounds_problems(t: Any, vision: Any) -> list[str]:
    """min_pixels above max_pixels where one of them is the processor class's default: Qwen2-VL's, or the tower's own
    (`default_pixels`: GLM-4.1V's, PaddleOCR-VL's), which the job's TrainSpec alone cannot know."""
    if t.min_pixels is not None and t.max_pixels is not None:
        return []           # both the user's: hpcmem.job.images `image_problems` compares them
    lo, hi = pixel_bounds(t, vision)
    if lo <= hi:
        return []
    default = "max_pixels" if t.min_pixels is not None else "min_pixels"
    return [f"min_pixels {lo} must be ≤ max_pixels {hi} ({default} is {vision.model_type}'s processor default; "
            "set both)"]
