"""Unlimited-OCR's vision part in a vision-language job (hpcmem.models.unlimited_ocr), as hpcmem.estimate.vision's
`VisionTerms`, which `with_vision` places in the learned text part's phases.

How the step runs (transformers 5.24 models/unlimited_ocr/modular_unlimited_ocr.py `UnlimitedOcrModel.
get_image_features`): as DeepSeek-OCR 2's (hpcmem.estimate.vision_deepseek_ocr2: the global views' run, then the
tiles', each SAM's layers, neck and convolutions — `sam_run` — with the weights' gradients allocated by the last run's
backward), but after SAM `UnlimitedOcrVisionModel.forward` runs a CLIP encoder over 1 + F rows a view (F = g² SAM
features): `UnlimitedOcrVisionEmbeddings` (`torch.cat` of the class token and the features, plus the position table),
`pre_layrnorm` (a torch LayerNorm: its fp32 input and statistics), then the CLIPEncoderLayers — hpcmem.estimate.
activations' decoder layer at that shape with separate q/k/v, biases everywhere, LayerNorms (hpcmem.estimate.vision
`layer_norm_saved`) and the fc1 → quick_gelu → fc2 MLP (`fc_mlp_saved`); SDPA without a mask (the encoder passes
none), so nothing of [rows, rows] is kept — and `torch.cat` of its rows but the class token with the SAM features
([views, F, 1024 + 1024]), which `multi_modal_projector` keeps when it trains. The image tokens' rows (with a newline
row after each row of features) are copied twice in the forward only (`pooler_output`'s per-image `torch.cat`, and
the `torch.cat` masked_scatter reads).
"""

from __future__ import annotations

from hpcmem.estimate import activations as act
from hpcmem.estimate.lora import LoraLayout, backward_bytes_per_input
from hpcmem.estimate.vision import (FP32, VisionTerms, adapters_saved, fc_mlp_saved, layer_norm_saved,
                                    tower_weights, unused_tower)
from hpcmem.estimate.vision_deepseek_ocr2 import Run, runs_terms, sam_run, with_encoder
from hpcmem.job.image_rules import image_rows
from hpcmem.job.images import image_geometry
from hpcmem.job.jobspec import JobSpec
from hpcmem.job.shape import MicroBatch, Precision
from hpcmem.models.deepseek_ocr2 import GLOBAL_SIZE
from hpcmem.models.spec import ModelSpec
from hpcmem.models.unlimited_ocr import TILE_SIZE, UnlimitedOcrTowerSpec


def clip_spec(v: UnlimitedOcrTowerSpec) -> ModelSpec:
    """A CLIP encoder layer as the decoder layer hpcmem.estimate.activations sizes (CLIPEncoderLayer: q/k/v_proj and
    out_proj with biases, fc1/fc2 with biases)."""
    return ModelSpec(name="unlimited_ocr encoder", model_type="unlimited_ocr_encoder", vocab_size=1,
                     hidden_size=v.hidden_size, intermediate_size=v.intermediate_size, num_hidden_layers=v.depth,
                     num_attention_heads=v.num_heads, num_key_value_heads=v.num_heads, head_dim=v.head_dim,
                     tie_word_embeddings=False, hidden_act=v.hidden_act, qkv_bias=True, o_bias=True, mlp_bias=True,
                     gated_mlp=False)


def _run(job: JobSpec, v: UnlimitedOcrTowerSpec, views: int, size: int, prec: Precision, lora: LoraLayout,
         adapted: list) -> Run:
    """The vision model over `views` squares of `size` px: SAM, then the CLIP encoder over 1 + F rows a view."""
    trained, gc = not lora.enabled, job.train.gradient_checkpointing
    frozen = not trained
    h = v.hidden_size
    sam = sam_run(job, v, views, size, prec, lora, adapted)
    f = v.features(size)
    tokens = views * (1 + f)
    spec = clip_spec(v)
    # one unmasked sequence: every term the layer keeps is per row then, whatever the views' split
    mb = MicroBatch(rows=1, seq=tokens, label_tokens=0, padding_free=False, source="")
    terms = act.layer_saved(spec, mb, prec, attn="sdpa", layer=0, layer_params=v.block_params,
                            lora=LoraLayout(enabled=False) if trained else LoraLayout(enabled=True, r=lora.r))
    terms = {**terms, "autocast_weights": 0, "norms": 2 * layer_norm_saved(h, prec, frozen) * tokens,
             "mlp": fc_mlp_saved(v, prec, frozen) * tokens}
    own = [x for x in adapted if x.part == "encoder"]
    full = sum(terms.values()) + adapters_saved(own, tokens, prec, lora)
    hidden_t, mlp_t, scores_t = act.backward_parts(spec, mb, prec, "sdpa")
    ins = [x.in_features for x in own]
    adapter_t = tokens * max(ins) * backward_bytes_per_input(lora) if ins else 0
    # pre_layrnorm's fp32 input and statistics; the projector's input (the concatenation) when it trains, its
    # adapter's own
    pre = layer_norm_saved(h, prec, frozen=True) * tokens
    projector = (prec.act * v.merged_width * views * f if trained else 0) + \
        adapters_saved([x for x in adapted if x.part == "merger"], views * f, prec, lora)
    return with_encoder(sam, full, prec.residual * h * tokens, hidden_t + max(mlp_t, scores_t) + adapter_t, v.depth,
                        gc, pre + projector)


def unlimited_ocr_terms(job: JobSpec, prec: Precision, lora: LoraLayout) -> VisionTerms:
    v: UnlimitedOcrTowerSpec = job.model.vision
    images, n = image_rows(job)
    adapted, _, weights = tower_weights(job, v, prec, lora)
    if images == 0:
        return unused_tower(weights)
    adapted = list(adapted)
    t = job.train
    tiles = images * v.tiles(t.image_height, t.image_width)
    tokens = images * image_geometry(t, v).tokens
    pixels = FP32 * v.in_channels * (images * GLOBAL_SIZE ** 2 + tiles * TILE_SIZE ** 2)
    runs = [_run(job, v, images, GLOBAL_SIZE, prec, lora, adapted)]
    if tiles:
        runs.append(_run(job, v, tiles, TILE_SIZE, prec, lora, adapted))
    return runs_terms(job, v, prec, lora, adapted, weights, runs, v.block_params, 0, pixels, n, tokens,
                      2 * prec.act * v.out_hidden_size * tokens)
