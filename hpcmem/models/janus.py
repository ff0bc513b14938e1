"""JanusTowerSpec: Janus's (model_type "janus") vision tower and aligner, as its config.json's `vision_config` and
outer keys describe them, and the image-generation parts an image-understanding step loads but never runs
(transformers 5.24 models/janus).

- The config (configuration_janus.py `JanusConfig`): an omitted `vision_config` takes `JanusVisionConfig`'s class
  defaults (1024 wide, 24 layers, 384 / 16 px, mlp_ratio 4, projection_dim 2048, aligner depth 2), an omitted
  `vq_config` `JanusVQVAEConfig`'s, an omitted `text_config` a bare `llama` one; `image_token_id` 100581,
  `tie_word_embeddings` True.
- The tower (modeling_janus.py `JanusVisionModel`): SigLIP's layout (a Conv2d patch embedding with bias, a position
  table of (image_size / patch_size)² rows, per layer layer_norm1, q/k/v_proj and `projection_layer`, layer_norm2,
  mlp.fc1 (hidden · mlp_ratio) and mlp.fc2, all with bias, then post_layernorm); no pooling head.
  `JanusModel.get_image_features` reads its `last_hidden_state` (after post_layernorm): every patch is an image token.
- The aligner (`JanusVisionAlignerMLP`): fc1 (vision hidden_size → projection_dim) then `depth` − 1 times the
  activation and a Linear(projection_dim → projection_dim), all with bias; its rows are scattered into the token
  embeddings, so projection_dim must equal the text width.
- Loaded, never run by a text+image forward (`JanusModel.forward` runs vision_model, aligner, language_model):
  `vqmodel` (`JanusVQVAE`: Conv2d/GroupNorm encoder and decoder, the codebook, quant_conv, post_quant_conv),
  `generation_embeddings`, `generation_aligner` (`JanusVQVAEAlignerMLP`) and `generation_head` (`JanusVQVAEHead`).
  Their weights are resident; the generation aligner's and head's Linears get LoRA adapters under "all-linear"
  (peft leaves out only lm_head), which get no gradient.
- The processor (processing_janus.py `JanusProcessor.replace_image_token`): boi, `num_image_tokens` image tokens,
  eoi per image; its image processor (`JanusImageProcessor`) resizes the longest edge to the square `size` and pads.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hpcmem.errors import SpecError
from hpcmem.models.deepseek_vl import DeepseekVLTowerSpec
from hpcmem.models.tower_base import TowerLinear, encoder_layer_linears, text_width

LLAMA_HIDDEN = 4096             # LlamaConfig.hidden_size: the text width of an omitted text_config
# configuration_janus.py JanusVisionConfig's class defaults
JANUS_VISION_DEFAULTS: dict[str, Any] = {
    "hidden_size": 1024, "num_hidden_layers": 24, "num_attention_heads": 16, "num_channels": 3, "image_size": 384,
    "patch_size": 16, "hidden_act": "gelu", "mlp_ratio": 4.0, "attention_bias": True, "projection_dim": 2048,
    "use_qk_norm": False, "depth": 2}
# configuration_janus.py JanusVQVAEConfig's class defaults
JANUS_VQ_DEFAULTS: dict[str, Any] = {
    "embed_dim": 8, "num_embeddings": 16384, "double_latent": False, "latent_channels": 256, "in_channels": 3,
    "base_channels": 128, "channel_multiplier": [1, 1, 2, 2, 4], "num_res_blocks": 2, "out_channels": 3,
    "projection_dim": 2048, "num_hidden_layers": 2, "image_token_embed_dim": 2048}


def _conv(cin: int, cout: int, k: int) -> int:
    return cin * cout * k * k + cout


def _resnet(cin: int, cout: int) -> int:
    """JanusVQVAEResnetBlock: norm1, conv1 (3×3), norm2, conv2 (3×3), nin_shortcut (1×1) when the widths differ."""
    return 2 * cin + _conv(cin, cout, 3) + 2 * cout + _conv(cout, cout, 3) + (_conv(cin, cout, 1) if cin != cout else 0)


def _attn(c: int) -> int:
    """JanusVQVAEAttnBlock: a GroupNorm and four 1×1 Conv2d (q, k, v, proj_out)."""
    return 2 * c + 4 * _conv(c, c, 1)


def vq_params(vq: dict[str, Any]) -> int:
    """JanusVQVAE's parameters (modeling_janus.py JanusVQVAEEncoder, JanusVQVAEDecoder, JanusVQVAEMidBlock,
    JanusVQVAEVectorQuantizer, quant_conv, post_quant_conv)."""
    base, mult, blocks = vq["base_channels"], list(vq["channel_multiplier"]), vq["num_res_blocks"]
    latent, levels = vq["latent_channels"], len(mult)
    ins = [1, *mult]
    enc = _conv(vq["in_channels"], base, 3)
    c = base
    for i in range(levels):
        c, out = base * ins[i], base * mult[i]
        for _ in range(blocks):
            enc += _resnet(c, out) + (_attn(out) if i == levels - 1 else 0)
            c = out
        enc += _conv(c, c, 3) if i != levels - 1 else 0
    mid = 2 * _resnet(c, c) + _attn(c)
    enc += mid + 2 * c + _conv(c, 2 * latent if vq["double_latent"] else latent, 3)
    c = base * mult[-1]
    dec = _conv(latent, c, 3) + mid
    for i in reversed(range(levels)):
        out = base * mult[i]
        for _ in range(blocks + 1):
            dec += _resnet(c, out) + (_attn(out) if i == levels - 1 else 0)
            c = out
        dec += _conv(c, c, 3) if i != 0 else 0
    dec += 2 * c + _conv(c, vq["out_channels"], 3)
    e = vq["embed_dim"]
    return enc + dec + vq["num_embeddings"] * e + _conv(latent, e, 1) + _conv(e, latent, 1)


def generation_linears(vq: dict[str, Any]) -> tuple[TowerLinear, ...]:
    """The Linears of generation_aligner (fc1: embed_dim → projection_dim, then num_hidden_layers − 1 of
    projection_dim → projection_dim) and generation_head (proj_out, vision_head), all with bias: part "generation"."""
    p = vq["projection_dim"]
    return (TowerLinear(name="generation_aligner.fc1", in_features=vq["embed_dim"], out_features=p, count=1,
                        part="generation"),
            *(TowerLinear(name=f"generation_aligner.hidden_layers.{k}", in_features=p, out_features=p, count=1,
                          part="generation") for k in range(vq["num_hidden_layers"] - 1)),
            TowerLinear(name="generation_head.proj_out", in_features=vq["image_token_embed_dim"], out_features=p,
                        count=1, part="generation"),
            TowerLinear(name="generation_head.vision_head", in_features=p, out_features=vq["num_embeddings"], count=1,
                        part="generation"))


@dataclass(frozen=True, kw_only=True)
class JanusTowerSpec(DeepseekVLTowerSpec):
    """DeepSeek-VL's SigLIP-layout tower read whole, Janus's aligner (`aligner_depth` Linears), and the idle
    image-generation parts (`generation`: their Linears; `vq`: the VQ config)."""

    family: str = "janus"
    aligner_depth: int = 2
    generation: tuple[TowerLinear, ...] = ()
    generation_extra: int = 0       # vqmodel and generation_embeddings: parameters in no Linear

    @property
    def aligner_hidden_layers(self) -> int:
        return self.aligner_depth - 1

    def linears(self) -> tuple[TowerLinear, ...]:
        h, i, d, o = self.hidden_size, self.intermediate_size, self.depth, self.out_hidden_size
        return (*encoder_layer_linears(h, i, d, out_proj="projection_layer"),
                TowerLinear(name="fc1", in_features=h, out_features=o, count=1, part="merger"),
                *(TowerLinear(name=f"hidden_layers.{k}", in_features=o, out_features=o, count=1, part="merger")
                  for k in range(self.aligner_hidden_layers)),
                *self.generation)

    @property
    def idle_params(self) -> int:
        """vqmodel, generation_embeddings, generation_aligner and generation_head."""
        return self.generation_extra + sum(x.params for x in self.generation)

    @property
    def num_params(self) -> int:
        return self.tower_params + self.merger_params + self.idle_params


def janus_tower_from_config(cfg: dict[str, Any], name: str) -> JanusTowerSpec:
    """The JanusTowerSpec of a janus config.json dict; keys it omits take JanusVisionConfig's / JanusVQVAEConfig's
    class defaults."""
    raw, rawvq = cfg.get("vision_config"), cfg.get("vq_config")
    for key, val in (("vision_config", raw), ("vq_config", rawvq)):
        if val is not None and not isinstance(val, dict):
            raise SpecError(f"model {name}: {key} must be an object, got {type(val).__name__}")
    vc = {**JANUS_VISION_DEFAULTS, **(raw or {})}
    vq = {**JANUS_VQ_DEFAULTS, **(rawvq or {})}
    for key in ("image_size", "patch_size"):
        if isinstance(vc[key], (list, tuple)):
            raise SpecError(f"model {name}: vision_config.{key} {vc[key]!r}: hpcmem models square images (an integer)")
    if vc["use_qk_norm"] or not vc["attention_bias"]:
        raise SpecError(f"model {name}: janus's vision_config use_qk_norm true or attention_bias false is not "
                        "modelled (JanusVisionAttention's q_norm/k_norm, bias-free q/k/v); hpcmem models the defaults")
    width = text_width(cfg, LLAMA_HIDDEN)
    if vc["projection_dim"] != width:
        raise SpecError(f"model {name}: vision_config.projection_dim {vc['projection_dim']!r} must equal "
                        f"text_config.hidden_size {width!r}: JanusModel.get_placeholder_mask scatters the aligner's "
                        "rows into the token embeddings")
    if int(vc["depth"]) < 1:
        raise SpecError(f"model {name}: vision_config.depth {vc['depth']!r}: the aligner has at least fc1")
    gen_extra = vq_params(vq) + vq["num_embeddings"] * vq["embed_dim"]      # vqmodel, generation_embeddings
    return JanusTowerSpec(model_type="janus", depth=vc["num_hidden_layers"], hidden_size=vc["hidden_size"],
                          intermediate_size=int(vc["hidden_size"] * vc["mlp_ratio"]),
                          num_heads=vc["num_attention_heads"], in_channels=vc["num_channels"],
                          image_size=vc["image_size"], patch_size=vc["patch_size"], out_hidden_size=width,
                          hidden_act=str(vc["hidden_act"]), pooling_head=False, aligner_depth=int(vc["depth"]),
                          generation=generation_linears(vq), generation_extra=gen_extra)
