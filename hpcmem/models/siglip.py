"""Gemma 3's vision side, torch-free: the SigLIP vision tower and the Gemma 3 multi-modal projector, their config keys,
geometry and parameter count (transformers 5.24).

- Gemma3Config (models/gemma3/configuration_gemma3.py) nests a `siglip_vision_model` config under `vision_config` and
  names `mm_tokens_per_image` (default 256) at the top level.
- The tower (models/siglip/modeling_siglip.py `SiglipVisionModel`, `vision_use_head` false in Gemma 3's configs): a
  Conv2d patch embedding with bias (`SiglipVisionEmbeddings.patch_embedding`, kernel = stride = patch_size), a
  learned position table of (image_size / patch_size)² rows (`position_embedding`), `num_hidden_layers` encoder layers
  (`SiglipEncoderLayer`: LayerNorm → q/k/v/out_proj with biases, full bidirectional attention over the image's patches
  → LayerNorm → fc1 → gelu_pytorch_tanh → fc2 with biases), and `post_layernorm`.
- The projector (models/gemma3/modeling_gemma3.py `Gemma3MultiModalProjector`): an AvgPool2d of kernel
  (image_size / patch_size) / sqrt(mm_tokens_per_image) over the patch grid (64 / 16 = 4 at 896 px: 4,096 patches →
  256 tokens), a Gemma3RMSNorm over the tower width (weight only) and `mm_input_projection_weight`, an nn.Parameter
  [tower width, text hidden size] applied by torch.matmul (no bias, not an nn.Linear: peft never adapts it).
- The image processor (models/gemma3/image_processing_gemma3.py `Gemma3ImageProcessor`) resizes every image to
  image_size × image_size whatever its size (pan-and-scan crops off by default).
"""

from __future__ import annotations

from typing import Any

from hpcmem.models.tower_base import text_width

# SiglipVisionConfig's class defaults (configuration_siglip.py) that a Gemma 3 config.json omits, as transformers fills
# them (also Gemma3Config's own when `vision_config` is absent: AutoConfig.for_model("gemma3")). Gemma 3's published
# vision_config names hidden_size 1152, image_size 896, intermediate_size 4304, num_attention_heads 16,
# num_hidden_layers 27, patch_size 14, vision_use_head false; the rest are the class's
SIGLIP_DEFAULTS: dict[str, Any] = {
    "hidden_size": 768, "intermediate_size": 3072, "num_hidden_layers": 12, "num_attention_heads": 12,
    "num_channels": 3, "image_size": 224, "patch_size": 16, "hidden_act": "gelu_pytorch_tanh", "vision_use_head": True}
GEMMA3_MM_TOKENS = 256          # Gemma3Config.mm_tokens_per_image
# the SigLIP MLP activations whose saved tensors hpcmem.estimate.vision derives (fc1 → act → fc2)
SIGLIP_ACTIVATIONS = ("gelu_pytorch_tanh", "gelu")


def gemma3_vision_values(cfg: dict[str, Any], name: str) -> dict[str, Any] | str:
    """The VisionSpec keyword values of a Gemma 3 config.json dict, or a one-line problem: the SigLIP keys (class
    defaults for those it omits), the fixed resize, the projector's pool (`spatial_merge_size`: its kernel) and its
    output width (the text config's hidden_size, Gemma3TextConfig's default 2304 when absent)."""
    raw = cfg.get("vision_config") or {}
    if not isinstance(raw, dict):
        return f"model {name}: vision_config must be an object, got {type(raw).__name__}"
    vc = {**SIGLIP_DEFAULTS, **raw}
    for key in ("image_size", "patch_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                "num_attention_heads", "num_channels"):
        value = vc[key]
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            return f"model {name}: vision_config.{key} must be a positive integer, got {value!r}"
    side = vc["image_size"] // vc["patch_size"]
    if side < 1:
        return (f"model {name}: vision_config.image_size {vc['image_size']} is smaller than patch_size "
                f"{vc['patch_size']}: SiglipVisionEmbeddings would cut no patch")
    tokens = cfg.get("mm_tokens_per_image", GEMMA3_MM_TOKENS)
    if not isinstance(tokens, int) or isinstance(tokens, bool) or tokens < 1:
        return f"model {name}: mm_tokens_per_image must be a positive integer, got {tokens!r}"
    per_side = int(round(tokens ** 0.5))
    # the projector's AvgPool2d kernel (Gemma3MultiModalProjector.kernel_size); a grid it does not pool into exactly
    # mm_tokens_per_image tokens (AutoConfig.for_model("gemma3")'s 224 px, 16 px patches) is refused for images by
    # hpcmem.job.image_rules, and a text-only job never runs it
    kernel = side // per_side if per_side * per_side == tokens and side % per_side == 0 else 1
    out = text_width(cfg, 2304)
    return {
        "depth": vc["num_hidden_layers"], "hidden_size": vc["hidden_size"],
        "intermediate_size": vc["intermediate_size"],
        "num_heads": vc["num_attention_heads"], "in_channels": vc["num_channels"], "patch_size": vc["patch_size"],
        "spatial_merge_size": kernel, "temporal_patch_size": 1, "window_size": 0, "out_hidden_size": out,
        "hidden_act": str(vc["hidden_act"]), "num_position_embeddings": side * side, "image_size": vc["image_size"],
        "tokens_per_image": tokens, "pooling_head": bool(vc.get("vision_use_head"))}


def siglip_tower_params(*, depth: int, hidden: int, intermediate: int, channels: int, patch: int,
                        positions: int, head: bool = False) -> int:
    """SiglipVisionModel's parameters without its head: the Conv2d patch embedding (weight and bias), the position
    table, per layer two LayerNorms (weight, bias), q/k/v/out_proj and fc1/fc2 (weights and biases), post_layernorm;
    and with `vision_use_head` SiglipMultiheadAttentionPoolingHead, which loads but Gemma 3 never runs."""
    embed = channels * patch * patch * hidden + hidden + positions * hidden
    mlp = 2 * hidden * intermediate + intermediate + hidden
    layer = 2 * 2 * hidden + 4 * (hidden * hidden + hidden) + mlp
    return embed + depth * layer + 2 * hidden + (pooling_head_params(hidden, intermediate) if head else 0)


class SiglipTowerCounts:
    """The counts of a SigLIP tower (SiglipVisionModel, without its head unless `pooling_head`) for a tower spec that
    lists this class before its base: a Conv2d patch embedding with bias, a position table of `table_positions` rows,
    no class token and no pre-norm, so the tower runs its patches. The spec supplies TowerBase's sizes, `patch_dim`
    and `patches`."""

    pooling_head = False    # a spec that loads SiglipMultiheadAttentionPoolingHead has it as a field (PaliGemma)

    @property
    def table_positions(self) -> int:
        """Rows of the position table: the patches of one image (a tiling spec whose tile is not its image_size says
        otherwise)."""
        return self.patches

    @property
    def positions(self) -> int:
        """Rows the tower runs per tile: its patches (SiglipVisionEmbeddings has no class token)."""
        return self.patches

    @property
    def embed_params(self) -> int:
        """The patch embedding (weight and bias) and the position table."""
        h = self.hidden_size
        return self.patch_dim * h + h + self.table_positions * h

    @property
    def pre_norm_params(self) -> int:
        return 0

    @property
    def tower_params(self) -> int:
        """SiglipVisionModel: embeddings, the encoder layers, post_layernorm (and the pooling head it loads)."""
        return siglip_tower_params(depth=self.depth, hidden=self.hidden_size, intermediate=self.intermediate_size,
                                   channels=self.in_channels, patch=self.patch_size, positions=self.table_positions,
                                   head=self.pooling_head)


def pooling_head_params(hidden: int, intermediate: int) -> int:
    """SiglipMultiheadAttentionPoolingHead: the probe [1, 1, hidden], nn.MultiheadAttention (in_proj weight and bias
    for q, k, v; out_proj with bias), a LayerNorm and a SiglipMLP."""
    return hidden + 3 * hidden * hidden + 3 * hidden + hidden * hidden + hidden + 2 * hidden + (
        2 * hidden * intermediate + intermediate + hidden)


def gemma3_projector_params(hidden: int, text_hidden: int) -> int:
    """Gemma3MultiModalProjector: mm_input_projection_weight [hidden, text_hidden] and mm_soft_emb_norm's weight."""
    return hidden * text_hidden + hidden
