"""TowerBase: the fields every vision tower spec names (hpcmem.models.vision_spec VisionSpec, hpcmem.models.clip_tower
ClipTowerSpec, hpcmem.models.idefics3 Idefics3TowerSpec, hpcmem.models.paligemma PaliGemmaTowerSpec,
hpcmem.models.mllama MllamaTowerSpec), the values per patch they derive from them, and the checks they share: whole
counts, a known activation, a width the attention heads divide, a square image cut into whole patches. LinearTower adds
what the towers built of CLIP/SigLIP-style encoder layers (ClipTowerSpec, Idefics3TowerSpec, PaliGemmaTowerSpec,
MllamaTowerSpec) count alike from their linears: a layer's parameters, the projector's, the total.

The names follow transformers' vision configs read through VisionSpec's spelling: `depth` is num_hidden_layers,
`num_heads` num_attention_heads, `in_channels` num_channels, `hidden_size` the tower width and `out_hidden_size` the
width the projector (merger, connector) hands to the language model.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from hpcmem.errors import Problems, SpecError


@dataclass(frozen=True, kw_only=True)
class TowerBase:
    """The shape every covered vision tower has; each spec adds its own geometry and projector."""

    model_type: str
    depth: int
    hidden_size: int
    intermediate_size: int
    num_heads: int
    in_channels: int
    patch_size: int
    out_hidden_size: int
    hidden_act: str

    @property
    def patch_dim(self) -> int:
        """Values per patch of pixel_values: in_channels × patch_size² (the patch embedding's Conv2d input; a tower
        with a temporal patch, Qwen's Conv3d, overrides it)."""
        return self.in_channels * self.patch_size ** 2

    @property
    def kv_heads(self) -> int:
        """Key/value heads of a block's attention: every head unless the tower groups them (EXAONE 4.5, Gemma 4)."""
        return self.num_heads

    @property
    def feature_width(self) -> int:
        """The width of the rows the image tokens take: out_hidden_size (HyperCLOVAX Vision V2's projector after the
        merger differs, hpcmem.models.vision `VisionSpec`)."""
        return self.out_hidden_size

    @property
    def block_mlp_width(self) -> int:
        """An encoder block MLP's width: intermediate_size (GLM-4.1V's tower differs, hpcmem.models.glm4v)."""
        return self.intermediate_size


@dataclass(frozen=True, kw_only=True)
class TowerLinear:
    """One linear of a CLIP/SigLIP-style tower or its projector: its module name below the encoder layer
    (`vision_tower.encoder.layers.N.`, `vision_model.encoder.layers.N.`) or the projector (`multi_modal_projector.`,
    `connector.`), its shape, how many there are, and whether it has a bias."""

    name: str
    in_features: int
    out_features: int
    count: int
    part: str               # "tower", "merger" (the projector) or "video" (Video-LLaVA's idle video tower)
    bias: bool = True

    @property
    def params(self) -> int:
        return (self.in_features * self.out_features + (self.out_features if self.bias else 0)) * self.count


def encoder_layer_linears(hidden: int, intermediate: int, count: int, *, out_proj: str = "out_proj",
                          attention_bias: bool = True, attention: str = "self_attn",
                          out_bias: bool | None = None) -> tuple[TowerLinear, ...]:
    """The six linears of `count` CLIP/SigLIP-style encoder layers (CLIPEncoderLayer, SiglipEncoderLayer,
    MllamaVisionEncoderLayer, InternVLVisionLayer): the attention module's (`self_attn`, InternVL's `attention`) q/k/v
    and output projection (named `out_proj`, Mllama's `o_proj`, InternVL's `projection_layer`; biases unless
    `attention_bias` is false, as in Mllama; the output projection's bias `out_bias` when it differs, as InternVL's
    always has one), mlp.fc1 and mlp.fc2 with biases."""
    ob = attention_bias if out_bias is None else out_bias
    return (*(TowerLinear(name=f"{attention}.{n}", in_features=hidden, out_features=hidden, count=count, part="tower",
                          bias=attention_bias if n != out_proj else ob)
              for n in ("q_proj", "k_proj", "v_proj", out_proj)),
            TowerLinear(name="mlp.fc1", in_features=hidden, out_features=intermediate, count=count, part="tower"),
            TowerLinear(name="mlp.fc2", in_features=intermediate, out_features=hidden, count=count, part="tower"))


def vision_values(cfg: dict, name: str, defaults: dict) -> dict:
    """The config.json's vision_config over the vision config class's `defaults` (keys it omits take them); a
    vision_config that is not an object is refused."""
    raw = cfg.get("vision_config")
    if raw is not None and not isinstance(raw, dict):
        raise SpecError(f"model {name}: vision_config must be an object, got {type(raw).__name__}")
    return {**defaults, **(raw or {})}


def text_width(cfg: dict, default: int) -> int:
    """The language model's width, which the projector hands its rows to: text_config.hidden_size, else `default`
    (the hidden_size of the text config class the outer config builds when the file names none)."""
    text = cfg.get("text_config")
    return text.get("hidden_size", default) if isinstance(text, dict) else default


def fit_pixels(height: int, width: int, h_bar: int, w_bar: int, factor: int, min_pixels: int,
               max_pixels: int) -> tuple[int, int]:
    """The scaling step of the smart_resize functions (models/qwen2_vl/image_processing_qwen2_vl.py `smart_resize`,
    models/lfm2_vl/image_processing_lfm2_vl.py `Lfm2VlImageProcessor.smart_resize`): the sides already rounded to
    multiples of `factor` (`h_bar`, `w_bar`, each function its own way) are scaled, aspect kept, down (floor, at
    least `factor`) into max_pixels or up (ceil) to min_pixels."""
    if h_bar * w_bar > max_pixels:
        beta = math.sqrt((height * width) / max_pixels)
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h_bar = math.ceil(height * beta / factor) * factor
        w_bar = math.ceil(width * beta / factor) * factor
    return h_bar, w_bar


def grid_patches(image_size: int, patch_size: int) -> int:
    """Patches of a square image (or tile) of `image_size` pixels: (image_size / patch_size)², the Conv2d patch
    embedding's output rows at stride patch_size."""
    return (image_size // patch_size) ** 2


@dataclass(frozen=True, kw_only=True)
class LinearTower(TowerBase):
    """A tower whose spec lists its linears (`linears()`, TowerLinear rows of part "tower" or "merger"): one encoder
    layer's parameters are its linears' and two LayerNorms' (weight and bias); the projector's are its linears'."""

    def linears(self) -> tuple[TowerLinear, ...]:
        raise NotImplementedError

    @property
    def encoder_layers(self) -> int:
        """Encoder layers the tower linears' counts span (Mllama's local and global layers together)."""
        return self.depth

    @property
    def tower_params(self) -> int:
        raise NotImplementedError

    @property
    def block_params(self) -> int:
        """One encoder layer: its six linears and two LayerNorms (weight and bias)."""
        linear = sum(x.params for x in self.linears() if x.part == "tower")
        return linear // self.encoder_layers + 4 * self.hidden_size

    @property
    def merger_params(self) -> int:
        return sum(x.params for x in self.linears() if x.part == "merger")

    @property
    def num_params(self) -> int:
        return self.tower_params + self.merger_params


def check_counts(p: Problems, spec: object, fields: tuple[str, ...], *, prefix: str = "vision_config.",
                 zero_ok: tuple[str, ...] = ()) -> None:
    """Each named field an integer (not a bool) ≥ 1, or ≥ 0 for those in `zero_ok`."""
    for f in fields:
        value = getattr(spec, f)
        least = 0 if f in zero_ok else 1
        p.check(isinstance(value, int) and not isinstance(value, bool) and value >= least,
                f"{prefix}{f} must be an integer ≥ {least}, got {value!r}")


def check_activation(p: Problems, act: str, known: tuple[str, ...]) -> None:
    """The tower MLP's activation one whose saved tensors hpcmem.estimate derives."""
    p.check(act in known, f"vision_config.hidden_act {act!r}: what it keeps for backward is derived only for "
                          f"{', '.join(known)}")


def check_heads(p: Problems, hidden: int, heads: int, heads_key: str) -> None:
    """The tower width a multiple of the head count (each head hidden / heads wide); `heads_key` the config's name."""
    p.check(hidden % heads == 0, f"vision_config.hidden_size {hidden} is not a multiple of {heads_key} {heads}")


def check_whole_grid(p: Problems, image_size: int, patch_size: int) -> None:
    """A square image of `image_size` pixels cut into whole patches (the Conv2d patch embedding, stride patch_size)."""
    p.check(image_size % patch_size == 0,
            f"vision_config.image_size {image_size} is not a multiple of patch_size {patch_size}")
