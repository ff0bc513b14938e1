"""Gemma4TowerSpec: Gemma 4's (model_type "gemma4") vision encoder and its embedder into the text width, as its
config.json's `vision_config` describes them, their linears and parameter count (transformers 5.24
models/gemma4/).

- The config (configuration_gemma4.py `Gemma4VisionConfig`): width 768, MLP 3072, 16 layers, 12 heads of 64
  (num_key_value_heads 12), 16 px patches, pooling_kernel_size 3, a 2 × 10,240-row position table, gelu_pytorch_tanh,
  use_clipped_linears false, standardize false. `Gemma4Config.vision_config` is optional: without one
  `Gemma4Model.__init__` builds no vision tower and no `embed_vision`.
- The patch embedding (modeling_gemma4.py `Gemma4VisionPatchEmbedder`): `input_proj`, an nn.Linear(3 · patch², width,
  bias=False) over each patch's pixels, plus the sum of two rows of `position_embedding_table` [2,
  position_embedding_size, width] (x and y).
- A layer (`Gemma4VisionEncoderLayer`, a GradientCheckpointingLayer): four Gemma4RMSNorms with a weight
  (input_layernorm, post_attention_layernorm, pre_feedforward_layernorm, post_feedforward_layernorm);
  `Gemma4VisionAttention`: q/k/v/o_proj, each a `Gemma4ClippableLinear` holding an nn.Linear without bias (`.linear`),
  q_norm and k_norm (Gemma4RMSNorm over head_dim, with a weight), v_norm (over head_dim, no weight), the 2-D rotary
  (`apply_multidimensional_rope`), SDPA with scaling 1.0 and the padding mask; `Gemma4VisionMLP`: gate/up/down_proj
  (ClippableLinears), act(gate) · up.
- The pooler (`Gemma4VisionPooler`): no parameters; averages each k × k block of patches (k = pooling_kernel_size) into
  one soft token (`_avg_pool_by_positions`), scaled by √width in fp32, padding stripped (`hidden_states[pooler_mask]`).
- The embedder (`Gemma4MultimodalEmbedder`, `Gemma4Model.embed_vision`): a weightless Gemma4RMSNorm
  (`embedding_pre_projection_norm`) and `embedding_projection`, an nn.Linear(width, text width, bias=False).
- The processor (image_processing_pil_gemma4.py `Gemma4ImageProcessorPil`: patch_size 16, max_soft_tokens 280,
  pooling_kernel_size 3): each image is resized at its aspect ratio to the largest sides, multiples of
  pooling_kernel_size · patch_size, that hold at most max_soft_tokens · k² patches (`gemma4_resized`), patchified and
  padded to max_soft_tokens · k² rows (`pad_along_first_dim`): the tower runs that many rows per image whatever its
  size; processing_gemma4.py `Gemma4Processor.replace_image_token` writes boi, (patches / k²) image tokens, eoi.

Its decoder is Gemma 4's text model (Gemma4TextConfig, `gemma4_text`), learned (hpcmem.models.vlm_learned).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from hpcmem.errors import Problems, SpecError
from hpcmem.models.tower_base import TowerBase, TowerLinear, check_counts, text_width

# configuration_gemma4.py `Gemma4VisionConfig`'s field defaults the tower reads
GEMMA4_VISION_DEFAULTS: dict[str, Any] = {
    "hidden_size": 768, "intermediate_size": 3072, "num_hidden_layers": 16, "num_attention_heads": 12,
    "num_key_value_heads": 12, "head_dim": 64, "hidden_activation": "gelu_pytorch_tanh", "pooling_kernel_size": 3,
    "patch_size": 16, "position_embedding_size": 10 * 1024, "use_clipped_linears": False, "standardize": False}
# image_processing_pil_gemma4.py `Gemma4ImageProcessorPil`'s class defaults; `_SUPPORTED_SOFT_TOKENS`
GEMMA4_MAX_SOFT_TOKENS = 280
GEMMA4_SOFT_TOKENS = (70, 140, 280, 560, 1120)
GEMMA4_TEXT_HIDDEN = 2304       # Gemma4TextConfig.hidden_size: the text width of an omitted text_config
GEMMA4_ACTIVATIONS = ("gelu_pytorch_tanh",)


@dataclass(frozen=True, kw_only=True)
class Gemma4TowerSpec(TowerBase):
    """Gemma 4's vision encoder, pooler and embedder (the module docstring)."""

    num_key_value_heads: int
    head_dim: int
    pooling_kernel_size: int
    position_embedding_size: int
    max_soft_tokens: int = GEMMA4_MAX_SOFT_TOKENS
    # the text config's use_bidirectional_attention (Gemma4TextConfig: None, "vision" or "all"): with "vision"
    # Gemma4Model.forward builds create_masks_for_vision_model's blockwise masks over the image tokens
    text_bidirectional: str | None = None
    image_size: int = 0         # no fixed square resize (hpcmem.job.image_rules reads it of every tower)
    norm: str = "rms"           # Gemma4RMSNorm (hpcmem.estimate.vision `block_saved` reads these two)
    mlp: str = "gated"          # Gemma4VisionMLP: act(gate_proj) · up_proj → down_proj
    fixed_resolution: bool = False
    deepstack_visual_indexes: tuple[int, ...] = ()
    family: str = "gemma4"
    # Gemma4VisionModel has no get_input_embeddings (PreTrainedModel's raises NotImplementedError, which
    # modeling_utils.py `enable_input_require_grads` skips): nothing hooks the tower
    hooked_input: bool = False

    def __post_init__(self) -> None:
        p = Problems()
        check_counts(p, self, ("depth", "hidden_size", "intermediate_size", "num_heads", "num_key_value_heads",
                               "head_dim", "patch_size", "pooling_kernel_size", "position_embedding_size",
                               "out_hidden_size"))
        p.check(self.hidden_act in GEMMA4_ACTIVATIONS, f"vision_config.hidden_activation {self.hidden_act!r}: what "
                f"it keeps for backward is derived only for {', '.join(GEMMA4_ACTIVATIONS)}")
        p.check(self.max_soft_tokens in GEMMA4_SOFT_TOKENS, f"max_soft_tokens {self.max_soft_tokens!r} must be one "
                f"of {GEMMA4_SOFT_TOKENS} (image_processing_pil_gemma4.py _SUPPORTED_SOFT_TOKENS)")
        p.raise_if_any()
        p.check(self.num_heads % self.num_key_value_heads == 0, f"vision_config.num_attention_heads {self.num_heads} "
                f"is not a multiple of num_key_value_heads {self.num_key_value_heads}")
        p.raise_if_any()

    @property
    def max_patches(self) -> int:
        """Rows of pixel_values per image: max_soft_tokens · k², every image padded to it (`pad_along_first_dim`)."""
        return self.max_soft_tokens * self.pooling_kernel_size ** 2

    @property
    def merge_unit(self) -> int:
        """Patches the pooler averages into one soft token: pooling_kernel_size²."""
        return self.pooling_kernel_size ** 2

    def resized(self, height: int, width: int) -> tuple[int, int]:
        """The processor's resize of one image (`gemma4_resized`)."""
        return gemma4_resized(height, width, self.patch_size, self.max_patches, self.pooling_kernel_size)

    def image_tokens(self, height: int, width: int) -> int:
        """Soft tokens of one image: its resized patches / k² (Gemma4ImageProcessorPil._preprocess
        `num_soft_tokens_per_image`)."""
        h, w = self.resized(height, width)
        return (h // self.patch_size) * (w // self.patch_size) // self.merge_unit

    def linears(self) -> tuple[TowerLinear, ...]:
        """Every nn.Linear of the tower and the embedder (peft's "all-linear" wraps each): the layers' (inside their
        ClippableLinears: `.linear`), the patch embedder's input_proj ("embed") and embed_vision's projection
        ("merger"); none has a bias."""
        h, i, d = self.hidden_size, self.intermediate_size, self.depth
        q, kv = self.num_heads * self.head_dim, self.num_key_value_heads * self.head_dim

        def lin(name: str, n_in: int, n_out: int, count: int = d, part: str = "tower") -> TowerLinear:
            return TowerLinear(name=name, in_features=n_in, out_features=n_out, count=count, part=part, bias=False)

        return (lin("self_attn.q_proj.linear", h, q), lin("self_attn.k_proj.linear", h, kv),
                lin("self_attn.v_proj.linear", h, kv), lin("self_attn.o_proj.linear", q, h),
                lin("mlp.gate_proj.linear", h, i), lin("mlp.up_proj.linear", h, i),
                lin("mlp.down_proj.linear", i, h),
                lin("patch_embedder.input_proj", self.patch_dim, h, 1, "embed"),
                lin("embedding_projection", h, self.out_hidden_size, 1, "merger"))

    @property
    def embed_params(self) -> int:
        """The patch embedder: input_proj and the [2, position_embedding_size, width] position table."""
        return self.patch_dim * self.hidden_size + 2 * self.position_embedding_size * self.hidden_size

    @property
    def block_params(self) -> int:
        """One encoder layer: its seven linears, four RMSNorm weights over the width, q_norm and k_norm over
        head_dim (v_norm has none)."""
        linear = sum(x.params for x in self.linears() if x.part == "tower") // self.depth
        return linear + 4 * self.hidden_size + 2 * self.head_dim

    @property
    def tower_params(self) -> int:
        return self.embed_params + self.depth * self.block_params

    @property
    def merger_params(self) -> int:
        """embed_vision: its projection (the pre-projection RMSNorm has no weight)."""
        return self.hidden_size * self.out_hidden_size

    @property
    def num_params(self) -> int:
        return self.tower_params + self.merger_params


def gemma4_resized(height: int, width: int, patch: int, max_patches: int, kernel: int) -> tuple[int, int]:
    """image_processing_pil_gemma4.py `get_aspect_ratio_preserving_size`: the image scaled by √(max_patches · patch² /
    (height · width)), each side rounded down to a multiple of kernel · patch; a side that rounds to 0 is one such
    step and the other floor(ratio) steps, at most (max_patches / kernel²) steps."""
    factor = math.sqrt(max_patches * patch ** 2 / (height * width))
    step = kernel * patch
    h, w = int(math.floor(factor * height / step)) * step, int(math.floor(factor * width / step)) * step
    if h == 0 and w == 0:
        raise SpecError(f"a {height}×{width} image resizes to 0 × 0 (Gemma4ImageProcessor)")
    longest = (max_patches // kernel ** 2) * step
    if h == 0:
        h, w = step, min(int(math.floor(width / height)) * step, longest)
    elif w == 0:
        h, w = min(int(math.floor(height / width)) * step, longest), step
    return h, w


def gemma4_tower_from_config(cfg: dict[str, Any], name: str) -> Gemma4TowerSpec | None:
    """The Gemma4TowerSpec of a gemma4 config.json dict (None without a vision_config: Gemma4Model builds no tower);
    keys it omits take Gemma4VisionConfig's defaults; `max_soft_tokens` as the config dict names it, else the image
    processor's class default (280)."""
    raw = cfg.get("vision_config")
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise SpecError(f"model {name}: vision_config must be an object, got {type(raw).__name__}")
    if raw.get("model_type", "gemma4_vision") != "gemma4_vision":
        raise SpecError(f"model {name}: gemma4's vision_config.model_type {raw.get('model_type')!r} is not "
                        "gemma4_vision")
    vc = {**GEMMA4_VISION_DEFAULTS, **raw}
    for key in ("use_clipped_linears", "standardize"):
        if vc[key]:
            raise SpecError(f"model {name}: vision_config.{key} true: its clamps (Gemma4ClippableLinear) or "
                            "standardization buffers are not modelled; hpcmem models gemma4 with both off")
    return Gemma4TowerSpec(
        model_type="gemma4", depth=vc["num_hidden_layers"], hidden_size=vc["hidden_size"],
        intermediate_size=vc["intermediate_size"], num_heads=vc["num_attention_heads"],
        num_key_value_heads=vc["num_key_value_heads"], head_dim=vc["head_dim"], in_channels=3,
        patch_size=vc["patch_size"], out_hidden_size=text_width(cfg, GEMMA4_TEXT_HIDDEN),
        hidden_act=str(vc["hidden_activation"]), pooling_kernel_size=vc["pooling_kernel_size"],
        position_embedding_size=vc["position_embedding_size"],
        max_soft_tokens=cfg.get("max_soft_tokens", GEMMA4_MAX_SOFT_TOKENS),
        text_bidirectional=text.get("use_bidirectional_attention") if isinstance(text := cfg.get("text_config"),
                                                                                 dict) else None)


# configuration_gemma4_unified.py `Gemma4UnifiedVisionConfig`'s field defaults
GEMMA4_UNIFIED_VISION_DEFAULTS: dict[str, Any] = {
    "patch_size": 16, "pooling_kernel_size": 3, "mm_embed_dim": 3840, "mm_posemb_size": 1120, "output_proj_dims": 3840}


@dataclass(frozen=True, kw_only=True)
class Gemma4UnifiedTowerSpec(TowerBase):
    """Gemma 4 unified's (model_type "gemma4_unified") encoder-free vision embedder (transformers 5.24
    models/gemma4_unified/modular_gemma4_unified.py `Gemma4UnifiedVisionEmbedder`): no encoder layers (`depth` 0).
    Each merged k × k patch of (patch_size · k)² · 3 pixels is one row: `patch_ln1` (LayerNorm over those pixels) →
    `patch_dense` (nn.Linear to mm_embed_dim, with bias) → `patch_ln2` → plus the x and y rows of `pos_embedding`
    [mm_posemb_size, 2, mm_embed_dim] (zero on padding) → `pos_norm` → `multimodal_embedder`
    (`Gemma4UnifiedMultimodalEmbedder`: a weightless Gemma4RMSNorm over output_proj_dims and `embedding_projection`,
    nn.Linear(output_proj_dims, text width, bias=False)) on every padded row; `Gemma4UnifiedModel.get_image_features`
    then drops the padding rows by a boolean index. The processor (`Gemma4UnifiedImageProcessor._preprocess`) resizes
    as Gemma 4's (`gemma4_resized` with max_soft_tokens · k² patches), patchifies at patch_size, merges each k × k
    block into one row (`patches_merge`) and pads to max_soft_tokens rows: one row per image token."""

    pooling_kernel_size: int
    mm_posemb_size: int
    output_proj_dims: int
    max_soft_tokens: int = GEMMA4_MAX_SOFT_TOKENS
    text_bidirectional: str | None = None     # as Gemma4TowerSpec's (Gemma4UnifiedModel.forward reads it alike)
    image_size: int = 0
    norm: str = "layer"
    mlp: str = "fc"
    fixed_resolution: bool = False
    deepstack_visual_indexes: tuple[int, ...] = ()
    family: str = "gemma4_unified"
    hooked_input: bool = False    # the embedder is no input embedding: enable_input_require_grads hooks none of it

    def __post_init__(self) -> None:
        p = Problems()
        check_counts(p, self, ("hidden_size", "patch_size", "pooling_kernel_size", "mm_posemb_size",
                               "output_proj_dims", "out_hidden_size"))
        p.check(self.max_soft_tokens in GEMMA4_SOFT_TOKENS, f"max_soft_tokens {self.max_soft_tokens!r} must be one "
                f"of {GEMMA4_SOFT_TOKENS} (image_processing_gemma4_unified.py _SUPPORTED_SOFT_TOKENS)")
        p.check(self.output_proj_dims == self.hidden_size, f"vision_config.output_proj_dims {self.output_proj_dims} "
                f"≠ mm_embed_dim {self.hidden_size}: the embedder's projection would not take pos_norm's output")
        p.raise_if_any()

    @property
    def patch_dim(self) -> int:
        """Values per row of pixel_values: a merged patch, (patch_size · k)² · 3 (`model_patch_size`)."""
        return self.in_channels * (self.patch_size * self.pooling_kernel_size) ** 2

    @property
    def max_patches(self) -> int:
        """Rows of pixel_values per image: max_soft_tokens, every image padded to it (`pad_along_first_dim`)."""
        return self.max_soft_tokens

    @property
    def merge_unit(self) -> int:
        """Patch-size patches one row (one soft token) merges: pooling_kernel_size²."""
        return self.pooling_kernel_size ** 2

    def resized(self, height: int, width: int) -> tuple[int, int]:
        """The processor's resize of one image: Gemma 4's (`gemma4_resized`) at max_soft_tokens · k² patches."""
        return gemma4_resized(height, width, self.patch_size, self.max_soft_tokens * self.merge_unit,
                              self.pooling_kernel_size)

    def image_tokens(self, height: int, width: int) -> int:
        """Soft tokens of one image: its merged rows (`num_soft_tokens_per_image`)."""
        h, w = self.resized(height, width)
        return (h // self.patch_size) * (w // self.patch_size) // self.merge_unit

    def linears(self) -> tuple[TowerLinear, ...]:
        """The embedder's two nn.Linears (peft's "all-linear" wraps both): patch_dense ("embed", with bias) and
        embedding_projection ("merger", none)."""
        return (TowerLinear(name="patch_dense", in_features=self.patch_dim, out_features=self.hidden_size, count=1,
                            part="embed"),
                TowerLinear(name="embedding_projection", in_features=self.output_proj_dims,
                            out_features=self.out_hidden_size, count=1, part="merger", bias=False))

    @property
    def embed_params(self) -> int:
        """patch_ln1, patch_dense, patch_ln2, pos_embedding and pos_norm."""
        pd, d = self.patch_dim, self.hidden_size
        return 2 * pd + pd * d + d + 2 * d + 2 * self.mm_posemb_size * d + 2 * d

    @property
    def block_params(self) -> int:
        return 0

    @property
    def tower_params(self) -> int:
        return self.embed_params

    @property
    def merger_params(self) -> int:
        """embedding_projection (the pre-projection RMSNorm has no weight)."""
        return self.output_proj_dims * self.out_hidden_size

    @property
    def num_params(self) -> int:
        return self.tower_params + self.merger_params


def gemma4_unified_tower_from_config(cfg: dict[str, Any], name: str) -> Gemma4UnifiedTowerSpec | None:
    """The Gemma4UnifiedTowerSpec of a gemma4_unified config.json dict (None without a vision_config:
    Gemma4UnifiedModel builds no embed_vision); keys it omits take Gemma4UnifiedVisionConfig's defaults."""
    raw = cfg.get("vision_config")
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise SpecError(f"model {name}: vision_config must be an object, got {type(raw).__name__}")
    if raw.get("model_type", "gemma4_unified_vision") != "gemma4_unified_vision":
        raise SpecError(f"model {name}: gemma4_unified's vision_config.model_type {raw.get('model_type')!r} is not "
                        "gemma4_unified_vision")
    vc = {**GEMMA4_UNIFIED_VISION_DEFAULTS, **raw}
    text = cfg.get("text_config")
    # Gemma4UnifiedTextConfig's class default is "vision"
    bidirectional = text.get("use_bidirectional_attention", "vision") if isinstance(text, dict) else "vision"
    return Gemma4UnifiedTowerSpec(
        model_type="gemma4_unified", depth=0, hidden_size=vc["mm_embed_dim"], intermediate_size=0, num_heads=0,
        in_channels=3, patch_size=vc["patch_size"], out_hidden_size=text_width(cfg, GEMMA4_TEXT_HIDDEN),
        hidden_act="", pooling_kernel_size=vc["pooling_kernel_size"], mm_posemb_size=vc["mm_posemb_size"],
        output_proj_dims=vc["output_proj_dims"], max_soft_tokens=cfg.get("max_soft_tokens", GEMMA4_MAX_SOFT_TOKENS),
        text_bidirectional=bidirectional)
