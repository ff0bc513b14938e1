"""Idefics2's tower and connector in a vision-language SFT job (hpcmem.models.idefics2): Idefics3's tower terms
(hpcmem.estimate.vision_idefics3, the same SigLIP-style layers and post_layernorm) with Idefics2's batch and connector
in place of the pixel-shuffle Linear.

How the step runs (transformers 5.24 models/idefics2/modeling_idefics2.py `Idefics2Model.get_image_features`,
`Idefics2Connector.forward`, `Idefics2PerceiverResampler.forward`): pixel_values [batch, images, 3, H, W] fp32 and
pixel_attention_mask int64 [batch, images, H, W] (image_processing_pil_idefics2.py `_make_pixel_mask`), both alive
the whole step → cast to the weight dtype, the real images gathered (`.contiguous()`: the Conv2d's input) → the tower
over (H // patch) · (W // patch) patches per image → post_layernorm → `modality_projection` (Idefics2MLP:
down_proj(act(gate_proj(x)) · up_proj(x)) on every patch row, text intermediate wide) → the perceiver's layers on
[images, n_latents] latents reading the projected patches as context → its final RMSNorm → the image tokens'
embeddings. No module of the connector is a GradientCheckpointingLayer: it keeps its saved tensors under
checkpointing too. Every image is the same size here, so every patch mask is all ones and `create_bidirectional_mask`
returns None for the tower and the perceiver alike (no 4-D mask; GQA inside SDPA without repeating k and v:
integrations/sdpa_attention.py `use_gqa_in_sdpa`).

What the connector keeps (N patch rows, L = images · n_latents latent rows, T the text width, I the text
intermediate size; 16-bit `act` under autocast):
- post_layernorm (counted by the tower terms): under autocast its fp32 output is cast by gate_proj and by up_proj,
  each keeping its own copy when they train (autocast caches only parameters' casts): one more [N, width] copy;
- modality_projection: gate_proj's output (act_fn's input), act_fn's and up_proj's outputs (the product's inputs) and,
  when down_proj trains, the product: 4 (frozen 3) [N, I] tensors (activations.py `_mlp_saved`);
- per perceiver layer: input_context_norm (Idefics2RMSNorm: its fp32 upcast of the [N, T] context; trained, the
  normalised tensor its weight multiplies) and input_latents_norm, post_attention_layernorm on L rows
  (activations.py `_norm_saved`); `torch.concat([context, latents])`, the input of k_proj and v_proj: one
  [N + L, T] tensor kept when they train; SDPA's q [L, heads · head_dim], k and v [N + L, kv_heads · head_dim], its
  output [L, heads · head_dim] and fp32 logsumexp; the gated MLP 4 (frozen 3) [L, 4T] tensors;
- the final norm on L rows (its output feeds no linear);
- the adapters' own (hpcmem.estimate.vision `adapters_saved`) at each linear's rows.
Its forward's worst instant comes before the language model's layers (`connector` names the two candidates); its
backward runs before the tower's: at modality_projection's backward the tower's saved tensors, post_layernorm's
and the projection's own are alive beside two [N, I] gradients (activations.py `backward_parts`' MLP term); before
that, each perceiver layer's input_context_norm runs its backward in fp32 on the N context rows (`connector`).
"""

from __future__ import annotations

from hpcmem.estimate import activations as act
from hpcmem.estimate.lora import LoraLayout
from hpcmem.estimate.vision import FP32, VisionTerms, adapters_saved, layer_norm_saved, vision_adapters
from hpcmem.estimate.vision_idefics3 import INT64, Connector, idefics3_terms
from hpcmem.job.image_rules import image_rows
from hpcmem.job.images import image_geometry
from hpcmem.job.jobspec import JobSpec
from hpcmem.job.shape import Precision
from hpcmem.models.idefics2 import Idefics2TowerSpec


def _norm(width: int, prec: Precision, frozen: bool, feeds_linear: bool) -> int:
    """Bytes per row of one Idefics2RMSNorm (LlamaRMSNorm's code): activations.py `_norm_saved` at the connector's
    16-bit rows."""
    return act._norm_saved(width, prec, feeds_linear=feeds_linear, frozen=frozen, normed=prec.act)


def connector(job: JobSpec, prec: Precision, lora: LoraLayout) -> Connector:
    v: Idefics2TowerSpec = job.model.vision
    images, n = image_rows(job)
    height, width = image_geometry(job.train, v).resized
    frozen, a = lora.enabled, prec.act
    t, i, depth = v.out_hidden_size, v.text_intermediate, v.resampler_depth
    latents = images * v.n_latents
    context = n + latents
    pixels = images * height * width * (v.in_channels * FP32 + INT64)
    conv = 0 if frozen else images * v.in_channels * height * width * prec.weight
    casts = a * v.hidden_size * n if not frozen and prec.amp else 0
    projection = (3 if frozen else 4) * i * a * n
    q, kv = v.resampler_width, v.resampler_kv_width
    attention = a * (2 * q * latents + 2 * kv * context) + act.LSE_BYTES * v.resampler_heads * latents
    layer = (_norm(t, prec, frozen, feeds_linear=False) * n + _norm(t, prec, frozen, feeds_linear=True) * latents
             + (0 if frozen else a * t * context) + attention
             + _norm(t, prec, frozen, feeds_linear=True) * latents + (3 if frozen else 4) * 4 * t * a * latents)
    final = _norm(t, prec, frozen, feeds_linear=False) * latents
    adapted = [x for x in vision_adapters(job, v) if x.part == "merger"] if frozen else []
    rows = {"q_proj": latents, "k_proj": context, "v_proj": context, "o_proj": latents}
    own_projection = adapters_saved([x for x in adapted if x.name.startswith("modality_projection.")], n, prec, lora)
    own_layer = sum(adapters_saved([x], rows.get(x.name.rsplit(".", 1)[1], latents), prec, lora)
                    for x in adapted if not x.name.startswith("modality_projection."))
    own = own_projection + depth * own_layer
    trainable = v.merger_params if not frozen else sum(
        job.train.lora_r * (x.in_features + x.out_features) * x.count for x in adapted)
    saved = casts + projection + depth * layer + final + own
    post = layer_norm_saved(v.hidden_size, prec, frozen) * n
    # The perceiver's backward, before modality_projection's: in each layer (the last first) input_context_norm's
    # backward on the N context rows runs in fp32 (Idefics2RMSNorm upcasts; autograd: the gradient cast to fp32, the
    # multiply's input gradient held for the sum and its rsqrt-side product, the mean's expanded gradient, pow's product
    # with the input) — five fp32 [N, T] tensors at once beside the norm's saved upcast, the bf16 gradient that
    # arrived there freed. In the last layer every earlier layer's saved tensors are alive and no layer's gradients
    # are made; in the first, the others' saved tensors are freed, their gradients made, and the context's gradient
    # from them waits. The phase counts every connector gradient as made (`VisionTerms.merger_grads`), so the
    # gradients not made yet (the other layers' in the last layer's instant, modality_projection's in both) come off.
    per_layer = [x for x in v.linears() if x.name.startswith("perceiver_resampler.layers.")]
    on_projection = [x for x in v.linears() if x.name.startswith("modality_projection.")]
    if frozen:
        r = job.train.lora_r
        layer_grads = sum(r * (x.in_features + x.out_features) for x in adapted if x in per_layer) * \
            lora.adapter_bytes
        projection_grads = sum(r * (x.in_features + x.out_features) for x in adapted if x in on_projection) * \
            lora.adapter_bytes
    else:
        layer_grads = (sum(x.params // x.count for x in per_layer) + 3 * t) * prec.weight
        projection_grads = sum(x.params for x in on_projection) * prec.weight
    norm_backward = _norm(t, prec, frozen, feeds_linear=False) * n + 5 * FP32 * t * n - a * t * n
    base = post + casts + projection + own_projection + norm_backward - projection_grads
    context_norm = max(base + (depth - 1) * (layer + own_layer - layer_grads), base + a * t * n)
    backward = max(post + casts + projection + 2 * a * i * n + own, context_norm)
    # the forward's worst instant, before the language model's layers, with post_layernorm's output, which the tower's
    # output (`image_outputs.last_hidden_state`, get_image_features) holds until the connector returns (fp32 under
    # autocast; else the weight dtype, kept by gate_proj and up_proj anyway when they train): in modality_projection,
    # gate_proj's and act_fn's outputs beside up_proj's (with an adapter: its base output, lora_B's scaled output and their sum), or a
    # frozen down_proj's input (the product, alive though not saved) and its [N, T] output; or in the last perceiver
    # layer's v_proj, with the context (the projection's output, held by the resampler's `context` argument through
    # every layer), the earlier layers' saved tensors, this layer's context norm, its output and the concatenation
    # (alive as locals), k_proj's adapter's and, for v_proj's adapter, peft's cast of its input to the adapter dtype
    # and the dropout's output of that (peft/tuners/lora/layer.py Linear.forward `_cast_input_dtype`, `dropout`) beside
    # the tensors the adapter keeps (the dropout mask, lora_A's input cast)
    names = {x.name.rsplit(".", 1)[1] for x in adapted}
    up = "modality_projection.up_proj" in {x.name for x in adapted}
    held = (FP32 if prec.amp else prec.residual if frozen else 0) * v.hidden_size * n
    before = post + held + casts + projection + own_projection
    at_projection = before + max(a * i * n * (2 if up else 0),
                                 (a * i * n if frozen else 0) + 2 * a * t * n)
    cast = lora.adapter_bytes if lora.adapter_bytes != a or not prec.amp else 0
    copies = (cast + (lora.adapter_bytes if lora.dropout else 0)) * t * context if "v_proj" in names else 0
    kv_own = sum(adapters_saved([x], context, prec, lora) for x in adapted
                 if x.name.endswith(("self_attn.k_proj", "self_attn.v_proj")))
    at_v = before + a * t * n + (depth - 1) * (layer + own_layer) + _norm(t, prec, frozen, False) * n + a * t * n + (
        a * t * context) + kv_own + copies
    # a no-grad pass (DPO's reference forward): nothing saved; post_layernorm's output held, then act_fn's and
    # up_proj's outputs and their product alive together (the operands freed once the product exists), or in a
    # perceiver layer the context beside its norm's fp32 upcast and normalised tensor
    no_grad = (FP32 if prec.amp else prec.residual) * v.hidden_size * n + max(3 * a * i * n, (a + 2 * FP32) * t * n)
    return Connector(pixels=pixels, conv=conv, saved=saved, trainable=trainable, backward=backward,
                     forward=max(at_projection, at_v), reference=no_grad)


def idefics2_terms(job: JobSpec, prec: Precision, lora: LoraLayout) -> VisionTerms:
    """Idefics3's tower terms with Idefics2's batch and connector (`connector`); a job without images only its
    weights."""
    if image_rows(job)[0] == 0:
        return idefics3_terms(job, prec, lora)
    return idefics3_terms(job, prec, lora, connector(job, prec, lora))
