"""llava's CLIP tower and projector in a vision-language SFT job (hpcmem.models.clip_tower; llava_next's the same over
its anyres tiles, hpcmem.models.llava_next): their states, what their
forward keeps for the backward, and the tower's backward, as hpcmem.estimate.vision's `VisionTerms`, which
`with_vision` places in the step's phases as it does for the Qwen towers.

How the step runs (transformers 5.24 models/llava/modeling_llava.py `LlavaModel.get_image_features`,
models/clip/modeling_clip.py `CLIPVisionModel.forward`; traced, estimator/LOG.md): pixel_values [images, 3, 336, 336]
fp32 → the Conv2d patch embedding (its input cast to the weight dtype) → the class token and the position table added
→ `pre_layrnorm` → `depth` CLIPEncoderLayers over [images, 577, width] (full attention per image, no mask) →
`post_layernorm` on the class token; the projector reads layer `vision_feature_layer`'s output without the class
token and replaces the image tokens' embeddings (`masked_scatter`). The layers after the feature layer (-2: the last
one) and post_layernorm run but feed only `last_hidden_state` / `pooler_output`, which the loss never reads: the
trainer drops the model's outputs before the backward, so their saved tensors go with them, they get no gradient,
and AdamW makes no state for them (torch/optim/adamw.py skips parameters whose grad is None). The same holds for the
LoRA adapters of those layers.

Trained or frozen is what TRL and peft do: full fine-tuning trains the tower and the projector; LoRA "all-linear"
adapts every q/k/v/out_proj, fc1, fc2 of the tower and the projector's linear_1 and linear_2 (peft
tuners_utils.py `_maybe_include_all_linear_layers` leaves out only the output embedding). The tower names its patch
embedding as its input embeddings (`CLIPVisionModel._input_embed_layer = "patch_embedding"`), which
`enable_input_require_grads` hooks under checkpointing with PEFT (hpcmem.estimate.vision `outside_saved`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from dataclasses import replace

from hpcmem.estimate import activations as act
from hpcmem.estimate.lora import LoraLayout, backward_bytes_per_input
from hpcmem.estimate.states import optimizer_bytes_per_param
from hpcmem.estimate.vision import (FP32, VisionTerms, adapters_saved, block_saved, block_spec, graphless_tower,
                                    layer_norm_saved, padding_mask_difference, token_leaf, tower_weights,
                                    unused_tower, vision_terms)
from hpcmem.estimate.vision_idefics2 import idefics2_terms
from hpcmem.estimate.vision_granite_docling import granite_docling_terms
from hpcmem.estimate.vision_aria import aria_terms
from hpcmem.estimate.vision_idefics3 import idefics3_terms
from hpcmem.estimate.vision_mistral3 import pixtral_terms
from hpcmem.estimate.vision_aya import aya_terms
from hpcmem.estimate.vision_internvl import internvl_terms
from hpcmem.estimate.vision_vipllava import vipllava_terms
from hpcmem.estimate.vision_paddleocr_vl import paddleocr_terms
from hpcmem.estimate.vision_video_llama_3 import video_llama_3_terms
from hpcmem.estimate.vision_mllama import mllama_terms
from hpcmem.estimate.vision_ovis2 import ovis2_terms
from hpcmem.estimate.vision_chameleon import chameleon_terms
from hpcmem.estimate.vision_emu3 import emu3_terms
from hpcmem.estimate.vision_fuyu import fuyu_terms
from hpcmem.estimate.vision_gemma4 import gemma4_terms, gemma4_unified_terms
from hpcmem.estimate.vision_glm4v import glm4v_terms
from hpcmem.estimate.vision_lfm2_vl import lfm2_vl_terms
from hpcmem.estimate.vision_minicpmv4_6 import minicpmv4_6_terms
from hpcmem.estimate.vision_lfm3_vl import lfm3_vl_terms
from hpcmem.estimate.vision_got_ocr2 import got_ocr2_terms
from hpcmem.estimate.vision_deepseek_ocr2 import deepseek_ocr2_terms
from hpcmem.estimate.vision_unlimited_ocr import unlimited_ocr_terms
from hpcmem.estimate.vision_kimi_k25 import kimi_k25_terms
from hpcmem.estimate.vision_deepseek_vl_hybrid import deepseek_vl_hybrid_terms
from hpcmem.estimate.vision_cosmos3_edge import cosmos3_edge_terms
from hpcmem.estimate.vision_muse_glimmer import muse_glimmer_terms
from hpcmem.estimate.vision_ernie4_5_vl_moe import ernie45vl_terms
from hpcmem.estimate.vision_minimax_m3_vl import minimax_m3_terms
from hpcmem.estimate.vision_granite4_vision import granite4_vision_terms
from hpcmem.estimate.vision_idle_audio import idle_audio_terms
from hpcmem.estimate.vision_dots3_note import dots3_note_terms
from hpcmem.estimate.vision_molmo2 import molmo2_terms
from hpcmem.estimate.vision_hunyuan_vl import hunyuan_vl_terms
from hpcmem.estimate.vision_step3p7 import step3p7_terms
from hpcmem.estimate.vision_apertus1p5 import apertus1p5_terms
from hpcmem.estimate.vision_inkling import inkling_terms
from hpcmem.estimate.vision_inkling2 import inkling2_terms
from hpcmem.job.image_rules import image_rows
from hpcmem.job.images import image_geometry
from hpcmem.job.jobspec import JobSpec
from hpcmem.job.shape import MicroBatch, Precision
from hpcmem.models.aya_vision import AyaVisionTowerSpec
from hpcmem.models.clip_tower import ClipTowerSpec
from hpcmem.models.chameleon import ChameleonTowerSpec
from hpcmem.models.dots3_note import Dots3NoteTowerSpec
from hpcmem.models.emu3 import Emu3TowerSpec
from hpcmem.models.fuyu import FuyuTowerSpec
from hpcmem.models.apertus1p5 import Apertus1p5TowerSpec
from hpcmem.models.gemma4 import Gemma4TowerSpec, Gemma4UnifiedTowerSpec
from hpcmem.models.glm4v import Glm4vTowerSpec
from hpcmem.models.granite_docling import GraniteDoclingTowerSpec
from hpcmem.models.aria import AriaTowerSpec
from hpcmem.models.idefics2 import Idefics2TowerSpec
from hpcmem.models.idefics3 import Idefics3TowerSpec
from hpcmem.models.internvl import InternVLTowerSpec
from hpcmem.models.lfm2_vl import Lfm2VlTowerSpec
from hpcmem.models.minicpmv4_6 import MiniCpmV46TowerSpec
from hpcmem.models.lfm3_vl import Lfm3VlTowerSpec
from hpcmem.models.got_ocr2_tower import GotOcr2TowerSpec
from hpcmem.models.deepseek_ocr2 import DeepseekOcr2TowerSpec
from hpcmem.models.unlimited_ocr import UnlimitedOcrTowerSpec
from hpcmem.models.kimi_k25 import KimiK25TowerSpec
from hpcmem.models.deepseek_vl_hybrid import DeepseekVLHybridTowerSpec
from hpcmem.models.cosmos3_edge import Cosmos3EdgeTowerSpec
from hpcmem.models.muse_glimmer import MuseGlimmerTowerSpec
from hpcmem.models.ernie4_5_vl_moe import Ernie45VlTowerSpec
from hpcmem.models.minimax_m3_vl import MiniMaxM3VlTowerSpec
from hpcmem.models.granite4_vision import Granite4VisionTowerSpec
from hpcmem.models.molmo2 import Molmo2TowerSpec
from hpcmem.models.hunyuan_vl import HunYuanVLTowerSpec
from hpcmem.models.step3p7 import Step3p7TowerSpec
from hpcmem.models.inkling import InklingTowerSpec
from hpcmem.models.inkling2 import Inkling2TowerSpec
from hpcmem.models.mllama import MllamaTowerSpec
from hpcmem.models.ovis2 import Ovis2TowerSpec
from hpcmem.models.paligemma import PaliGemmaTowerSpec
from hpcmem.models.pixtral import PixtralTowerSpec
from hpcmem.models.paddleocr_vl import PaddleOcrTowerSpec
from hpcmem.models.video_llama_3 import VideoLlama3TowerSpec
from hpcmem.models.vipllava import VipLlavaTowerSpec
from hpcmem.models.vision_spec import VisionSpec


def llava_terms(job: JobSpec, prec: Precision, lora: LoraLayout) -> VisionTerms:
    v: ClipTowerSpec = job.model.vision
    images, patches = image_rows(job)
    adapted, adapter_params, weights = tower_weights(job, v, prec, lora)
    r, w, trained = job.train.lora_r, prec.weight, not lora.enabled
    if images == 0:
        return unused_tower(weights)
    layers, h = v.trained_layers, v.hidden_size
    # llava: one image_size tile per image; llava_next: each image's anyres tiles and its base image, which the tower
    # and the projector run as a batch of tiles (modeling_llava_next.py `get_image_features`)
    tiles = patches // v.patches
    n, m = tiles * v.positions, tiles * v.tokens_per_image        # tower rows, projector rows
    # the image tokens in the text: llava_next's unpadded grid, newlines and base (`pack_image_features`)
    text_tokens = images * image_geometry(job.train, v).tokens
    if lora.enabled and not adapted and not job.train.gradient_checkpointing:
        # no adapter in the tower or the projector and no `enable_input_require_grads` hook (TRL installs it for PEFT
        # under checkpointing only): nothing there requires grad, so it builds no graph and runs no backward
        return graphless_tower(weights=weights, pixels=tiles * v.tile_values * FP32, patches=patches,
                               image_tokens=text_tokens)
    gbytes = w if trained else lora.adapter_bytes
    tower_adapters = [x for x in adapted if x.part == "tower"]
    merger_adapters = [x for x in adapted if x.part == "merger"]
    per_block = (v.block_params if trained else sum(r * (x.in_features + x.out_features) for x in tower_adapters))
    merger = v.merger_params if trained else sum(r * (x.in_features + x.out_features) for x in merger_adapters)
    # on the loss's path: the embeddings and pre_layrnorm (trained only), the layers up to the feature layer, the
    # projector, post_layernorm where last_hidden_state is read (Cohere2Vision's)
    # and llava_next's image_newline (num_params beyond the tower, the projector and any idle module such as
    # Video-LLaVA's video tower; llava has none)
    post = v.post_norm_params if v.reads_last_hidden_state else 0
    outside = (v.embed_params + v.pre_norm_params + post + v.num_params - v.tower_params - v.merger_params
               - v.idle_params) if trained else 0
    trainable = outside + per_block * layers + merger
    grads = trainable * gbytes
    opt = int(trainable * optimizer_bytes_per_param(job.train.optim, gbytes))
    # CLIPAttention's q, k, v are three Linears (no fused storage kept alive by a slice)
    spec = replace(block_spec(v), fused_qkv=False)
    mb = MicroBatch(rows=tiles, seq=v.positions, label_tokens=0, padding_free=False, source="",
                    attn_implementation="sdpa")
    # out_proj reads SDPA's output itself (sdpa_attention_forward's `transpose(1, 2).contiguous()` of the kernel's
    # [B, S, H, D] output copies nothing), not a concatenation as the Qwen towers' `proj` does; and no attention mask
    # however many tiles are rows (modeling_clip.py CLIPVisionTransformer.forward, modeling_siglip.py
    # SiglipVisionTransformer.forward, modeling_internvl.py InternVLVisionModel.forward: `self.encoder(...)` without
    # one), so no additive bias where the rows are several (`padding_mask_difference`)
    block = (block_saved(job, v, spec, mb, prec, v.block_params, adapted, lora) - (prec.act * h * n if trained else 0)
             + padding_mask_difference(prec, mb, padded=False))
    if job.train.gradient_checkpointing:      # CLIPEncoderLayer is a GradientCheckpointingLayer: its input alone
        blocks = (prec.residual * h * n,) * layers
    else:
        blocks = (block,) * layers
    # before the layers: the Conv2d's input (pixel_values in the weight dtype) for its weight gradient, pre_layrnorm;
    # frozen under checkpointing, the hooked patch embedding's output and the token embeddings' output are leaves
    conv = tiles * v.tile_values * w if trained else 0
    hooked = not trained and job.train.gradient_checkpointing
    leaves = patches * h * w + token_leaf(job, prec) if hooked else 0
    # pre_layrnorm's output feeds the residual stream, not a linear (a SigLIP tower, LLaVA-OneVision's, has none)
    pre = layer_norm_saved(h, prec, frozen=True) * n if v.pre_norm_params else 0
    # the projector: linear_1's input is a slice of the feature layer's output (the whole [images, 577, width] kept)
    # when it trains; GELU keeps its input; linear_2 keeps GELU's output when it trains; the adapters' own
    o = v.out_hidden_size
    merger_saved = ((prec.act * h * n if trained else 0) + prec.act * o * m * (2 if trained else 1)
                    + adapters_saved(merger_adapters, m, prec, lora))
    saved = sum(blocks) + conv + leaves + pre + merger_saved
    hidden_t, mlp_t, scores_t = act.backward_parts(spec, mb, prec, "sdpa")
    # without checkpointing the MLP's adapters run their backward before its base path's, one after the other (as
    # SigLIP's, hpcmem.estimate.vision `vision_terms`; traced: llava and llava_next LoRA no-GC, estimator/LOG.md); under
    # checkpointing the recomputed block's tensors are alive beside them
    adapter_t = n * max(x.in_features for x in tower_adapters) * backward_bytes_per_input(lora) \
        if tower_adapters else 0
    # alive until the trainer drops the model's outputs (the forward only): the layers past the feature layer (their
    # saved tensors, or under checkpointing their outputs) and the layers' outputs `capture_outputs` records for
    # hidden_states, which under autocast nothing else keeps (LayerNorm saves its fp32 cast), [n, width] each; none
    # recorded where last_hidden_state is read (Cohere2VisionModel.get_image_features asks for no hidden states)
    unused = v.depth - layers
    recorded = (v.depth + 1) * prec.residual * h * n if prec.amp and not job.train.gradient_checkpointing \
        and not v.reads_last_hidden_state else 0
    tail = unused * (prec.residual * h * n if job.train.gradient_checkpointing else block)
    # DPO's reference forward runs the same model forward under no_grad (hpcmem.estimate.vision `with_vision`): no
    # layer saves anything, so what the model's forward keeps through its language model is alive and no more: the
    # tower's output (modeling_llava.py `LlavaModel.get_image_features`: `image_outputs`, held in `mm_encoder_outputs`
    # through `language_model` by `LlavaModel.forward`) with its last_hidden_state and, where hidden_states are read,
    # the selected layers' outputs alone (`select_hidden_states("vision_feature_layer")` has `capture_outputs` keep
    # only those, transformers/utils/output_capturing.py; the last layer's is last_hidden_state itself), beside the
    # projector's output (`pooler_output`, split into views) and its `torch.cat` copy, cast to the token embeddings'
    # dtype where autocast left it in another (the cat's rows: the text's image tokens, llava_next's packed grid)
    selected = 0 if v.reads_last_hidden_state else len(getattr(v, "feature_layers", (layers,)))
    kept = selected + (0 if layers == v.depth and selected else 1)
    outputs = kept * prec.residual * h * n
    features = prec.act * o * m + (prec.act + (prec.weight if prec.weight != prec.act else 0)) * o * text_tokens
    idle = " and the idle video tower's, which images never run" if v.idle_params else ""
    off_path = "layers after vision_feature_layer" if v.reads_last_hidden_state else \
        "layers after vision_feature_layer and post_layernorm"
    what = (f"tower and projector trained (full fine-tuning); {off_path} "
            f"get no gradient{idle and '; the video tower is loaded and idle'}" if trained else
            f"frozen; LoRA on {len(tower_adapters) + len(merger_adapters)} of its linear kinds{idle}")
    return VisionTerms(weights=weights, gradients=grads, optimizer=opt, pixels=tiles * v.tile_values * FP32,
                       saved=saved, merger_saved=merger_saved, blocks_saved=blocks, block_full=block,
                       block_backward=hidden_t + max(mlp_t + adapter_t if job.train.gradient_checkpointing else
                                                     max(mlp_t, adapter_t), scores_t),
                       block_grads=per_block * gbytes, merger_grads=merger * gbytes, patches=patches,
                       image_tokens=text_tokens, trained=what, forward_only=tail + recorded,
                       reference_forward=outputs + features)


# Each tower spec's terms, first match wins (a subclass before its base); the flag: the function refines llava's terms
# (llava_terms' result is its last argument). Where each type's terms come from: the module of its function.
TOWER_TERMS: tuple[tuple[Any, Callable[..., VisionTerms | None], bool], ...] = (
    (FuyuTowerSpec, fuyu_terms, False),
    (ChameleonTowerSpec, chameleon_terms, False),
    (Apertus1p5TowerSpec, apertus1p5_terms, False),
    (Emu3TowerSpec, emu3_terms, False),
    (InternVLTowerSpec, internvl_terms, True),
    (AyaVisionTowerSpec, aya_terms, True),
    (Lfm2VlTowerSpec, lfm2_vl_terms, True),
    (MiniCpmV46TowerSpec, minicpmv4_6_terms, False),
    (DeepseekVLHybridTowerSpec, deepseek_vl_hybrid_terms, False),  # a PaliGemmaTowerSpec: before idefics3's
    (Lfm3VlTowerSpec, lfm3_vl_terms, False),
    (KimiK25TowerSpec, kimi_k25_terms, False),
    (Cosmos3EdgeTowerSpec, cosmos3_edge_terms, False),
    (Inkling2TowerSpec, inkling2_terms, False),
    (InklingTowerSpec, inkling_terms, False),
    (MuseGlimmerTowerSpec, muse_glimmer_terms, False),
    (Ernie45VlTowerSpec, ernie45vl_terms, False),
    (Molmo2TowerSpec, molmo2_terms, False),
    (HunYuanVLTowerSpec, hunyuan_vl_terms, False),
    (MiniMaxM3VlTowerSpec, minimax_m3_terms, False),  # before VideoLLaMA3's, its base class
    (Step3p7TowerSpec, step3p7_terms, False),  # a ClipTowerSpec: before llava's
    (GotOcr2TowerSpec, got_ocr2_terms, False),
    (UnlimitedOcrTowerSpec, unlimited_ocr_terms, False),  # a DeepseekOcr2TowerSpec: first
    (DeepseekOcr2TowerSpec, deepseek_ocr2_terms, False),
    (Granite4VisionTowerSpec, granite4_vision_terms, False),  # a ClipTowerSpec: before llava's
    (VipLlavaTowerSpec, vipllava_terms, True),
    (ClipTowerSpec, llava_terms, False),
    (Idefics2TowerSpec, idefics2_terms, False),
    (AriaTowerSpec, aria_terms, False),  # an Idefics3TowerSpec: first
    (GraniteDoclingTowerSpec, granite_docling_terms, False),  # an Idefics3TowerSpec: first
    ((Idefics3TowerSpec, PaliGemmaTowerSpec), idefics3_terms, False),
    (MllamaTowerSpec, mllama_terms, False),
    (PixtralTowerSpec, pixtral_terms, False),
    (PaddleOcrTowerSpec, paddleocr_terms, False),  # a VideoLlama3TowerSpec: first
    (VideoLlama3TowerSpec, video_llama_3_terms, False),
    (Ovis2TowerSpec, ovis2_terms, False),
    (Gemma4TowerSpec, gemma4_terms, False),
    (Gemma4UnifiedTowerSpec, gemma4_unified_terms, False),
    (Glm4vTowerSpec, glm4v_terms, False),
)


def tower_terms(job: JobSpec, prec: Precision, lora: LoraLayout) -> VisionTerms | None:
    """The tower's terms: an Omni thinker's image path beside its idle audio encoder
    (hpcmem.estimate.vision_idle_audio), else the function TOWER_TERMS names for the spec's class, else the Qwen
    towers' (hpcmem.estimate.vision `vision_terms`)."""
    v = job.model.vision
    if isinstance(v, Dots3NoteTowerSpec):       # its own parts outside the blocks beside an idle audio encoder
        return dots3_note_terms(job, prec, lora)
    if isinstance(v, VisionSpec) and v.audio is not None:       # before the Qwen towers'
        return idle_audio_terms(job, prec, lora)
    for spec, terms, refines_llava in TOWER_TERMS:
        if isinstance(v, spec):
            return terms(job, prec, lora, llava_terms(job, prec, lora)) if refines_llava else terms(job, prec, lora)
    return vision_terms(job, prec, lora)
