"""Step3p7TowerSpec: Step 3.7 Flash's (model_type "step3p7") vision tower, its convolutional downsampler and its
projector (transformers 5.24 models/step3p7/).

- The config (configuration_step3p7.py): `Step3p7Config.sub_configs_defaults` builds an omitted `vision_config` as
  `Step3p7VisionConfig` (width 1536, 47 layers, 16 heads, 728 px images at 14 px patches, quick_gelu, LayerNorm eps
  1e-5, intermediate_size = int(width · mlp_ratio) = 8960 whatever the file says, layer scale 0.1) and an omitted
  `text_config` as `Step3p7TextConfig` (model_type "step3p5", learned: hpcmem.models.vlm_learned); projector_bias
  False.
- The tower (modular_step3p7.py `Step3p7VisionModel`): `Step3p7VisionEmbeddings` (SigLIP's embeddings with a Conv2d
  patch embedding without bias and a position table of (image_size / patch)² rows, bilinearly resampled for another
  grid), `pre_layernorm`, `num_hidden_layers` `Step3p7VisionEncoderLayer`s (layernorm_before → CLIP's attention:
  q/k/v/out_proj with biases, the axial 2-D rope on q and k (`apply_rotary_pos_emb_vision`) → × lambda_1 → residual;
  layernorm_after → fc1 → quick_gelu → fc2 → × lambda_2 → residual), then `downsampler1` (Conv2d width → 2 · width,
  3 × 3, stride 2, padding 1, with bias) and `downsampler2` (2 · width → 4 · width, the same): each image's grid
  halved twice, no post-norm.
- The projector (`Step3p7Model.multi_modal_projector`): one nn.Linear(4 · width → the text width, bias
  projector_bias); `get_image_features` runs the tower on the global views (`pixel_values`) and again on the local
  crops (`pixel_values_local`) and puts each image's crops' rows before its global view's.
- The processor (image_processing_step3p7.py `Step3p7ImageProcessor`, size 728, patch_size 504, max_image_size 3024;
  processing_step3p7.py `Step3p7Processor`): every image a 728² global view, plus — by `_plan_patches` — a grid of
  504² local crops when it is larger than the global view or elongated; each view's image tokens (size / 56)²
  (`num_image_feature_size`, `num_patch_feature_size`: 169 and 81), each crop between <patch_start> and <patch_end>
  with a <patch_newline> after each crop row but the last, the global view's between <im_start> and <im_end>.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from hpcmem.errors import SpecError
from hpcmem.models.clip_tower import ClipTowerSpec
from hpcmem.models.tower_base import TowerLinear, encoder_layer_linears, text_width, vision_values

# configuration_step3p7.py `Step3p7VisionConfig`'s field defaults (intermediate_size derived from mlp_ratio)
STEP3P7_VISION_DEFAULTS: dict[str, Any] = {
    "hidden_size": 1536, "num_hidden_layers": 47, "num_attention_heads": 16, "num_channels": 3, "image_size": 728,
    "patch_size": 14, "hidden_act": "quick_gelu", "mlp_ratio": 8960 / 1536}
# `Step3p7ImageProcessor`'s class defaults: size (the global view), patch_size (a local crop), max_image_size,
# downsampler_stride (the two stride-2 convolutions)
STEP3P7_PROCESSOR_DEFAULTS: dict[str, Any] = {"size": 728, "crop": 504, "max_image_size": 3024}
STRIDE = 4
STEP3P5_HIDDEN = 4096       # Step3p7TextConfig.hidden_size: the text width of an omitted text_config
STEP3P7_ACTIVATIONS = ("quick_gelu",)


def plan_crops(height: int, width: int, size: int, crop: int, max_image_size: int) -> tuple[int, int]:
    """(crops across, crops down) of one image: image_processing_step3p7.py `Step3p7ImageProcessor._plan_patches`
    (an image larger than max_image_size scaled down first; a window of `crop` px, or the short side for an image
    within the global view but more than 1.5 times as long as wide, or for one over 4 times; each side snapped to a
    multiple of the window, up when the rest is over a fifth of it). (0, 0): no local crops."""
    if max(height, width) > max_image_size:
        scale = max_image_size / max(height, width)
        width, height = int(width * scale), int(height * scale)
    short, long = min(height, width), max(height, width)
    if long <= size:
        window = short if long / short > 1.5 else 0
    elif long / short > 4:
        window = min(short, crop)
    else:
        window = crop
    if window == 0:
        return 0, 0
    w, h = (window * (d // window + (d % window > 0.2 * window)) if d >= window else d for d in (width, height))
    return max(1, w // window), max(1, h // window)


def _halved_twice(side: int) -> int:
    """A grid side after the two Conv2d(kernel 3, stride 2, padding 1): ⌊(s + 2 − 3) / 2⌋ + 1, twice."""
    for _ in range(2):
        side = (side - 1) // 2 + 1
    return side


@dataclass(frozen=True, kw_only=True)
class Step3p7TowerSpec(ClipTowerSpec):
    """The tower and projector. `image_size` is the global view's side (the position table's grid), `crop` a local
    crop's side."""

    crop: int
    max_image_size: int
    fixed_resolution: bool = False
    family: str = "step3p7"
    activations: ClassVar[tuple[str, ...]] = STEP3P7_ACTIVATIONS
    reads_last_hidden_state: ClassVar[bool] = True

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.crop % (self.patch_size * STRIDE) or self.image_size % (self.patch_size * STRIDE):
            raise SpecError(f"vision image size {self.image_size} and crop {self.crop} must be multiples of "
                            f"{self.patch_size * STRIDE} (patch × the downsamplers' stride): hpcmem models whole "
                            "downsampled grids, as Step3p7Processor counts them")

    @property
    def patches(self) -> int:
        """Patches of the global view: (image_size / patch)²."""
        return (self.image_size // self.patch_size) ** 2

    @property
    def crop_patches(self) -> int:
        return (self.crop // self.patch_size) ** 2

    @property
    def positions(self) -> int:
        """Rows of the position table (Step3p7VisionEmbeddings' num_positions: the global view's patches)."""
        return self.patches

    @property
    def global_tokens(self) -> int:
        """Image tokens of a global view: its grid halved twice, squared (Step3p7Processor: (728 / 56)² = 169)."""
        return _halved_twice(self.image_size // self.patch_size) ** 2

    @property
    def crop_tokens(self) -> int:
        return _halved_twice(self.crop // self.patch_size) ** 2

    def crops(self, height: int, width: int) -> tuple[int, int]:
        return plan_crops(height, width, self.image_size, self.crop, self.max_image_size)

    def image_patches(self, height: int, width: int) -> int:
        """Rows the tower runs for one image: its global view's patches and its crops'."""
        x, y = self.crops(height, width)
        return self.patches + x * y * self.crop_patches

    def image_tokens(self, height: int, width: int) -> int:
        x, y = self.crops(height, width)
        return self.global_tokens + x * y * self.crop_tokens

    def markers(self, height: int, width: int) -> int:
        """Tokens of one image besides its <im_patch> ones (Step3p7Processor.replace_image_token): <patch_start> and
        <patch_end> per crop, a <patch_newline> after each crop row but the last, <im_start> and <im_end>."""
        x, y = self.crops(height, width)
        return 2 * x * y + (y - 1 if x * y else 0) + 2

    def linears(self) -> tuple[TowerLinear, ...]:
        """Every nn.Linear (peft's "all-linear" wraps each): the encoder layers' (`vision_model.layers.N.self_attn.
        q_proj` … `out_proj`, `mlp.fc1`, `mlp.fc2`, all with bias) and the projector (`multi_modal_projector`). The
        downsamplers are Conv2d: no adapter."""
        return (*encoder_layer_linears(self.hidden_size, self.intermediate_size, self.depth),
                TowerLinear(name="multi_modal_projector", in_features=STRIDE * self.hidden_size,
                            out_features=self.out_hidden_size, count=1, part="merger", bias=self.projector_bias))

    @property
    def block_params(self) -> int:
        """One encoder layer: its six linears, two LayerNorms (weight and bias) and lambda_1, lambda_2."""
        linear = sum(x.params for x in self.linears() if x.part == "tower")
        return linear // self.depth + 6 * self.hidden_size

    @property
    def embed_params(self) -> int:
        """The patch embedding (no bias) and the position table."""
        return self.patch_dim * self.hidden_size + self.positions * self.hidden_size

    @property
    def downsampler_params(self) -> int:
        """downsampler1 (width → 2 · width) and downsampler2 (2 · width → 4 · width), 3 × 3 kernels with biases."""
        h = self.hidden_size
        return 9 * h * 2 * h + 2 * h + 9 * 2 * h * 4 * h + 4 * h

    @property
    def tower_params(self) -> int:
        """Embeddings, pre_layernorm, the encoder layers and the downsamplers."""
        return self.embed_params + 2 * self.hidden_size + self.block_params * self.depth + self.downsampler_params

    @property
    def post_norm_params(self) -> int:
        return 0

    @property
    def merger_params(self) -> int:
        return sum(x.params for x in self.linears() if x.part == "merger")


def step3p7_tower_from_config(cfg: dict[str, Any], name: str) -> Step3p7TowerSpec:
    """The Step3p7TowerSpec of a step3p7 config.json dict; keys it omits take the config classes' defaults, the
    processor's settings Step3p7ImageProcessor's class defaults."""
    vc = vision_values(cfg, name, STEP3P7_VISION_DEFAULTS)
    for old in ("width", "layers", "heads"):
        if old in vc:
            raise SpecError(f"model {name}: vision_config.{old} is the released checkpoint's legacy spelling, which "
                            "Step3p7VisionConfig.__post_init__ renames; hpcmem reads hidden_size, num_hidden_layers "
                            "and num_attention_heads")
    if isinstance(vc["patch_size"], (list, tuple)) or isinstance(vc["image_size"], (list, tuple)):
        raise SpecError(f"model {name}: hpcmem models square patches and images (vision_config.patch_size, "
                        "image_size)")
    proc = STEP3P7_PROCESSOR_DEFAULTS
    if vc["image_size"] != proc["size"]:
        # the processor's global view (Step3p7ImageProcessor.size) is what the tower runs, whatever image_size says
        raise SpecError(f"model {name}: vision_config.image_size {vc['image_size']!r} is not Step3p7ImageProcessor's "
                        f"size {proc['size']} (the global view the tower runs); hpcmem models them equal")
    return Step3p7TowerSpec(
        model_type="step3p7", depth=vc["num_hidden_layers"], hidden_size=vc["hidden_size"],
        intermediate_size=int(vc["hidden_size"] * vc["mlp_ratio"]), num_heads=vc["num_attention_heads"],
        in_channels=vc["num_channels"], image_size=vc["image_size"], patch_size=vc["patch_size"],
        out_hidden_size=text_width(cfg, STEP3P5_HIDDEN), hidden_act=str(vc["hidden_act"]), projector_act="gelu",
        projector_bias=bool(cfg.get("projector_bias", False)), feature_layer=-1, drop_class_token=False,
        crop=proc["crop"], max_image_size=proc["max_image_size"])
