"""GraniteDoclingTowerSpec: Granite-Docling's vision tower and connector (model_type "granite_docling"), as its
config.json's `vision_config` describes it, their linear layers, parameter count and the image processor's tiling
(transformers 5.24 models/granite_docling/modular_granite_docling.py).

- The tower (`GraniteDoclingVisionModel(Idefics3VisionTransformer)`): Idefics3's SigLIP-style encoder layers
  (hpcmem.models.idefics3) over each 512 × 512 tile at `GraniteDoclingVisionConfig`'s defaults (width 768, 12 heads,
  16 px patches: 1,024 patches a tile; Idefics3VisionConfig's MLP 3072 and 12 layers) and post_layernorm;
  `GraniteDoclingVisionModel.encode` also taps the output of each layer in `deepstack_visual_indexes`.
- The connector (`GraniteDoclingConnector`, inside the vision model): `ln_in` LayerNorm over the tower's output, then
  the coarse path (`GraniteDoclingConnectorPath` at scale_factor 4): Idefics3's pixel_shuffle to [tiles, 64, 768 · 16],
  `projection` Linear(12,288 → out_hidden_size, no bias), a fixed 2-D sine-cosine table added (a buffer), and one
  `GraniteDoclingDeepStackMerger` (InternVLMultiModalProjector's: LayerNorm(12,288) → linear_1 → GELU → linear_2,
  biases) per tapped layer, each over that layer's pixel-shuffled output; then `ln_mid` → GELU → `mlp_fc2`
  Linear(out → out, no bias) → `ln_out`. The fine path (`use_fine_route`, the class default True: the same path at
  scale_factor 2) is built but runs only when the processor is called with `fine_route=True` (`tile_fine_mask`),
  which TRL's collators never pass: its parameters are loaded and idle (part "idle": no gradient, no optimizer state;
  peft's all-linear still wraps its linears).
- The model (`GraniteDoclingModel.get_image_features`, `.forward`): the real tiles gathered
  (`pixel_values[pixel_attention_mask]`), image_seq_len = (512 / 16)² / 4² = 64 image tokens a tile, their rows
  scattered into the token embeddings; the deepstack features are added to the image tokens' hidden states after
  text layers 0, 1, … (`GraniteDoclingTextModel._deepstack_process`). No density router at the class default
  (`density_router_hidden_size` None).
- The image processor (`GraniteDoclingImageProcessorPil(GotOcr2ImageProcessorPil)`): crop_to_patches True,
  min_patches 1, max_patches 32, 512 px tiles: the columns × rows canvas of GotOcr2's `get_optimal_tiled_canvas` over
  grids of at most 16 tiles a side (`granite_canvas`) and a thumbnail when more than one tile
  (`get_number_of_image_patches`).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from hpcmem.errors import Problems, SpecError
from hpcmem.models.idefics3 import Idefics3TowerSpec
from hpcmem.models.tower_base import TowerLinear, check_counts, text_width

# GraniteDoclingVisionConfig's class defaults over Idefics3VisionConfig's (configuration_granite_docling.py)
GRANITE_DOCLING_VISION_DEFAULTS: dict[str, Any] = {
    "hidden_size": 768, "intermediate_size": 3072, "num_hidden_layers": 12, "num_attention_heads": 12,
    "num_channels": 3, "image_size": 512, "patch_size": 16, "hidden_act": "gelu_pytorch_tanh", "out_hidden_size": 1024,
    "scale_factor": 4, "deepstack_visual_indexes": [3, 7, 10], "use_fine_route": True}
# GraniteDoclingTextConfig's field defaults where they differ from GraniteConfig's (configuration_granite_docling.py):
# the text part is the granite layout (GraniteDoclingTextModel(GraniteModel)'s layers are Granite's) with these
GRANITE_DOCLING_TEXT_DEFAULTS: dict[str, Any] = {
    "model_type": "granite", "vocab_size": 133800, "hidden_size": 1024, "intermediate_size": 2048,
    "num_hidden_layers": 28, "num_attention_heads": 16, "num_key_value_heads": 4, "max_position_embeddings": 32768,
    "rms_norm_eps": 1e-5, "pad_token_id": 100256, "bos_token_id": 100257, "eos_token_id": 100257,
    "embedding_multiplier": 12.0, "logits_scaling": 4.0, "residual_multiplier": 0.263,
    "attention_multiplier": 0.015625}
# GraniteDoclingImageProcessor's class defaults (crop_to_patches, min_patches, max_patches)
PROCESSOR_DEFAULTS: dict[str, Any] = {"crop_to_patches": True, "min_patches": 1, "max_patches": 32}
MAX_SIDE = 16     # modular_granite_docling.py `get_all_supported_aspect_ratios`: at most 16 tiles a side


@dataclass(frozen=True, kw_only=True)
class GraniteDoclingTowerSpec(Idefics3TowerSpec):
    """Idefics3's tower with Granite-Docling's connector: `deepstack_layers` the tapped layers (one merger each on
    every path; hpcmem.estimate.vision_granite_docling sizes them, so the shared code's Qwen-style
    `deepstack_visual_indexes` stays empty), `fine` whether the idle fine path is built, the processor's tile
    budget."""

    deepstack_layers: tuple[int, ...]
    fine: bool
    min_patches: int
    max_patches: int
    family: str = "granite_docling"

    def __post_init__(self) -> None:
        super().__post_init__()
        p = Problems()
        check_counts(p, self, ("min_patches", "max_patches"), prefix="")
        p.check(all(0 <= i < self.depth for i in self.deepstack_layers),
                f"vision_config.deepstack_visual_indexes {list(self.deepstack_layers)}: hpcmem models taps of the "
                f"tower's {self.depth} layers only")
        p.raise_if_any()

    @property
    def fold_problem(self) -> str | None:
        side = self.tile // self.patch_size
        if side % self.scale_factor == 0 and (not self.fine or side % (self.scale_factor // 2) == 0):
            return None
        return (f"granite_docling: image_size {self.tile} / patch_size {self.patch_size} is not a multiple of "
                f"scale_factor {self.scale_factor}; GraniteDoclingConnectorPath.pixel_shuffle fails on images")

    def _path(self, name: str, scale: int, part: str) -> tuple[TowerLinear, ...]:
        """One GraniteDoclingConnectorPath's linears: `projection` and each deepstack merger's two."""
        h, o, k = self.hidden_size * scale ** 2, self.out_hidden_size, len(self.deepstack_layers)
        merged = (TowerLinear(name=f"connector.{name}.deepstack_mergers.linear_1", in_features=h, out_features=o,
                              count=k, part=part),
                  TowerLinear(name=f"connector.{name}.deepstack_mergers.linear_2", in_features=o, out_features=o,
                              count=k, part=part)) if k else ()
        return (TowerLinear(name=f"connector.{name}.projection", in_features=h, out_features=o, count=1, part=part,
                            bias=False), *merged)

    def linears(self) -> tuple[TowerLinear, ...]:
        tower = tuple(x for x in super().linears() if x.part == "tower")
        fine = self._path("fine", self.scale_factor // 2, "idle") if self.fine else ()
        o = self.out_hidden_size
        return (*tower, *self._path("coarse", self.scale_factor, "merger"),
                TowerLinear(name="connector.mlp_fc2", in_features=o, out_features=o, count=1, part="merger",
                            bias=False), *fine)

    def _merger_norms(self, scale: int) -> int:
        """Each deepstack merger's LayerNorm(hidden · scale²) (weight and bias)."""
        return len(self.deepstack_layers) * 2 * self.hidden_size * scale ** 2

    @property
    def merger_params(self) -> int:
        """The connector's trained part: ln_in, the coarse path's linears and merger norms, ln_mid, mlp_fc2, ln_out."""
        linear = sum(x.params for x in self.linears() if x.part == "merger")
        return linear + 2 * self.hidden_size + 4 * self.out_hidden_size + self._merger_norms(self.scale_factor)

    @property
    def idle_params(self) -> int:
        """The fine path's parameters (loaded, never run by a training step)."""
        if not self.fine:
            return 0
        return sum(x.params for x in self.linears() if x.part == "idle") + self._merger_norms(self.scale_factor // 2)

    @property
    def num_params(self) -> int:
        return self.tower_params + self.merger_params + self.idle_params

    @property
    def tokens_per_tile(self) -> int:
        """GraniteDoclingModel.image_seq_len: (image_size / patch_size)² / scale_factor² (the coarse path)."""
        return self.patches // self.scale_factor ** 2

    def tiles(self, height: int, width: int) -> tuple[int, int, int]:
        """(tiles, columns, rows) of one image (`GraniteDoclingImageProcessorPil.get_tile_grid`,
        `get_number_of_image_patches`): the canvas's columns × rows and a thumbnail when more than one, else 1."""
        if not PROCESSOR_DEFAULTS["crop_to_patches"] or self.max_patches <= 1:
            return 1, 1, 1
        cols, rows = granite_canvas(height, width, self.tile, self.min_patches, self.max_patches)
        return cols * rows + (1 if cols * rows > 1 else 0), cols, rows


@lru_cache(maxsize=256)
def granite_canvas(height: int, width: int, tile: int, min_patches: int, max_patches: int) -> tuple[int, int]:
    """image_processing_pil_granite_docling.py `get_optimal_tiled_canvas`, line for line (GotOcr2's, hpcmem.models
    .internvl `optimal_canvas`, over `get_all_supported_aspect_ratios`' grids of at most 16 tiles a side, which both
    the prompt's grid and `crop_image_to_patches` use): (columns, rows) of the min..max-tile arrangement, sorted by
    tile count, whose columns / rows is closest to width / height; on a tie the later one when the image's area
    exceeds half the canvas's."""
    side = min(max_patches, MAX_SIDE)
    grids = sorted(((c, r) for c in range(1, side + 1) for r in range(1, side + 1)
                    if min_patches <= c * r <= max_patches), key=lambda g: g[0] * g[1])
    aspect, area = width / height, width * height
    best_diff, best = float("inf"), (1, 1)
    for c, r in grids:
        diff = abs(aspect - c / r)
        if diff < best_diff:
            best_diff, best = diff, (c, r)
        elif diff == best_diff and area > 0.5 * tile * tile * c * r:
            best = (c, r)
    return best


def granite_docling_tower_from_config(cfg: dict[str, Any], name: str) -> GraniteDoclingTowerSpec:
    """The GraniteDoclingTowerSpec of a granite_docling config.json dict; keys it omits take the config classes'
    defaults, the processor's the GraniteDoclingImageProcessor class defaults."""
    raw = cfg.get("vision_config") or {}
    if not isinstance(raw, dict):
        raise SpecError(f"model {name}: vision_config must be an object, got {type(raw).__name__}")
    vc = {**GRANITE_DOCLING_VISION_DEFAULTS, **raw}
    for key in ("image_size", "patch_size"):
        if isinstance(vc[key], (list, tuple)):
            raise SpecError(f"model {name}: vision_config.{key} {vc[key]!r}: hpcmem models square tiles (an integer)")
    if cfg.get("density_router_hidden_size") is not None:
        raise SpecError(f"model {name}: density_router_hidden_size {cfg['density_router_hidden_size']!r}: the "
                        "density router (GraniteDoclingDensityRouter) is not modelled; hpcmem models "
                        "granite_docling without it (the class default)")
    width = text_width(cfg, GRANITE_DOCLING_TEXT_DEFAULTS["hidden_size"])
    if vc["out_hidden_size"] != width:
        # GraniteDoclingConfig.validate_architecture raises likewise
        raise SpecError(f"model {name}: vision_config.out_hidden_size {vc['out_hidden_size']} must equal "
                        f"text_config.hidden_size {width}")
    image = vc["image_size"]
    return GraniteDoclingTowerSpec(
        model_type=str(cfg["model_type"]), depth=vc["num_hidden_layers"], hidden_size=vc["hidden_size"],
        intermediate_size=vc["intermediate_size"], num_heads=vc["num_attention_heads"], in_channels=vc["num_channels"],
        image_size=image, patch_size=vc["patch_size"], out_hidden_size=width, hidden_act=str(vc["hidden_act"]),
        scale_factor=vc["scale_factor"], tile=image, longest_edge=image,
        deepstack_layers=tuple(vc["deepstack_visual_indexes"] or ()), fine=bool(vc["use_fine_route"]),
        min_patches=PROCESSOR_DEFAULTS["min_patches"], max_patches=PROCESSOR_DEFAULTS["max_patches"])
