"""InklingTowerSpec: Inkling's (model_type "inkling_mm_model", InklingForConditionalGeneration) vision tower, a
hierarchical MLP over each 40 × 40 × 2 patch, and the audio tower beside it that no image runs (transformers 5.24
models/inkling/).

- The config (configuration_inkling.py): `InklingConfig.sub_configs_defaults` builds an omitted `vision_config` as
  `InklingVisionConfig` (patch_size 40, temporal_patch_size 2, num_channels 3, num_hidden_layers 24, RMSNorm eps 1e-6;
  its hidden_size and num_attention_heads are read by no module), an omitted `audio_config` as `InklingAudioConfig`
  (n_mel_bins 80, mel_vocab_size 256) and an omitted `text_config` as `InklingTextConfig` (model_type "inkling_text",
  learned: hpcmem.models.vlm_learned); `__post_init__` sets both towers' text_hidden_size to the text width.
- The tower (modeling_inkling.py `InklingVisionModel`): `plan_out_scales(temporal_patch_size, patch_size,
  num_hidden_layers, num_channels)` picks num_hidden_layers + 1 (t, h, w, channels) scales from a ladder — the pixel
  (1, 1, 1, channels), one rung per prime factor of patch_size taken largest first (h = w = their running product,
  channels ⌈h² · channels / 64⌉ · 64), one per prime factor of temporal_patch_size (t their running product at the full
  patch, channels ⌈patch² · channels · t⌉ · 64) — each layer's the rung whose t·h·w is nearest in log to an even
  log-spacing from 1 to the patch's values (`torch.argmin`), the first the pixel and the last the top rung; with fewer
  layers than rungs transformers assigns them with scipy's `linear_sum_assignment`, which this project does not
  model. Layer i (`InklingVisionEncoderLayer`) folds its input's (t, h, w) blocks into channels
  (`fold_timespace_to_depth`: reshape, permute, reshape — a copy), projects them (nn.Linear without bias: its
  start rung's channels × the fold's size → its end rung's channels, the last layer's → the text width), then, in all
  but the last, `InklingRMSNorm` and GELU. `final_norm` (an RMSNorm of the text width) and one row per patch: one image
  token per patch, nothing merged after.
- The audio tower (`InklingAudioModel`): an nn.Embedding of n_mel_bins · mel_vocab_size rows of the text width, an
  RMSNorm, a non-persistent int64 offsets buffer [n_mel_bins]; no Linear (peft's all-linear adds nothing), run only on
  audio_input_ids, which an image-text batch never has.
- The processor (image_processing_inkling.py `InklingImageProcessor`, size 40 × 40; processing_inkling.py
  `InklingProcessor`): `divide_to_patches` cuts each image into ⌈height / 40⌉ rows of width // 40 + 1 columns (an
  image whose width is a multiple of 40 gets an all-padding last column), each patch padded to 40 × 40 with −1, stacked
  twice in time (`[..., None].repeat(1, 1, 1, 1, 2)`), pixel_values [patches, 2, 40, 40, 3]; `replace_image_token`
  writes num_patches image tokens, no markers.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar

from hpcmem.errors import Problems, SpecError
from hpcmem.models.tower_base import TowerBase, TowerLinear, check_counts, vision_values, text_width

# configuration_inkling.py `InklingVisionConfig`'s and `InklingAudioConfig`'s field defaults
INKLING_VISION_DEFAULTS: dict[str, Any] = {
    "patch_size": 40, "temporal_patch_size": 2, "num_channels": 3, "hidden_size": 1024, "num_hidden_layers": 24,
    "num_attention_heads": 16}
INKLING_AUDIO_DEFAULTS: dict[str, Any] = {"n_mel_bins": 80, "mel_vocab_size": 256}
INKLING_TEXT_HIDDEN = 6144      # InklingTextConfig.hidden_size: the text width of an omitted text_config
INKLING_PATCH = 40              # `InklingImageProcessor.size` {"height": 40, "width": 40}: one image token's patch
INKLING_FRAMES = 2              # `InklingImageProcessor._preprocess`: each patch repeated twice in time
CHANNEL_ROUND = 64              # plan_out_scales: rung channels rounded up to multiples of 64


def prime_factors(number: int) -> list[int]:
    """modeling_inkling.py `prime_factors`: ascending, with repeats."""
    factors = []
    while number % 2 == 0:
        factors.append(2)
        number //= 2
    for p in range(3, math.isqrt(number) + 1, 2):
        while number % p == 0:
            factors.append(p)
            number //= p
    if number > 1:
        factors.append(number)
    return factors


def _running(factors: list[int]) -> list[int]:
    out, run = [], 1
    for f in factors:
        run *= f
        out.append(run)
    return out


def scale_ladder(temporal: int, patch: int, channels: int) -> list[tuple[int, int, int, int]]:
    """plan_out_scales' `scales`: the pixel rung, the spatial rungs, the temporal rungs (t, h, w, channels)."""
    h = _running(prime_factors(patch)[::-1])
    t = _running(prime_factors(temporal)[::-1])
    spatial = [(1, x, x, math.ceil(x * x * channels / CHANNEL_ROUND) * CHANNEL_ROUND) for x in h]
    # `torch.ceil(h[-1] ** 2 * n_channels * t).int() * 64`: no division by 64 here (the temporal rungs' width)
    temporal_rungs = [(x, h[-1], h[-1], h[-1] ** 2 * channels * x * CHANNEL_ROUND) for x in t]
    return [(1, 1, 1, channels), *spatial, *temporal_rungs]


def plan_scales(temporal: int, patch: int, layers: int, channels: int) -> list[tuple[int, int, int, int]]:
    """plan_out_scales for layers ≥ rungs (`torch.argmin` per layer over |log ideal − log t·h·w|, the first the
    pixel rung, the last the top rung); fewer layers take scipy's assignment, refused by the caller."""
    ladder = scale_ladder(temporal, patch, channels)
    top = math.log(patch * patch * temporal * channels)
    logs = [math.log(a * b * c) for a, b, c, _ in ladder]
    idxs = []
    for i in range(layers + 1):
        ideal = top * i / layers
        cost = [abs(ideal - x) for x in logs]
        idxs.append(cost.index(min(cost)))
    idxs[0], idxs[-1] = 0, len(ladder) - 1
    return [ladder[i] for i in idxs]


@dataclass(frozen=True)
class HmlpLayer:
    """One `InklingVisionEncoderLayer`: its fold (t_fold, hw_fold), projection in → out, whether a norm and GELU
    follow, and the positions per patch after its fold (t · h · w left of the patch's own)."""

    t_fold: int
    hw_fold: int
    in_features: int
    out_features: int
    norm: bool
    positions: int

    @property
    def folds(self) -> bool:
        return self.hw_fold > 1 or self.t_fold > 1


@dataclass(frozen=True, kw_only=True)
class InklingTowerSpec(TowerBase):
    """The hierarchical MLP: `depth` its layers (num_hidden_layers), `patch_size` the spatial patch side, `hidden_size`
    and `num_heads` the config's values no module reads; `audio_params` the idle audio tower's parameters."""

    temporal_patch_size: int
    audio_params: int
    audio_buffer_bytes: int
    cell: int = INKLING_PATCH
    family: str = "inkling"
    norm: str = "rms"
    mlp: str = "fc"
    image_size: int = 0         # no resize (hpcmem.job.images): the processor cuts each image into 40 px patches
    fixed_resolution: bool = False
    hooked_input: bool = False  # InklingVisionModel names no input embeddings
    deepstack_visual_indexes: tuple[int, ...] = ()
    spatial_merge_size: int = 1
    reads_last_hidden_state: ClassVar[bool] = True

    def __post_init__(self) -> None:
        p = Problems()
        check_counts(p, self, ("depth", "in_channels", "patch_size", "temporal_patch_size", "out_hidden_size"))
        p.raise_if_any()
        p.check(self.patch_size == self.cell,
                f"vision_config.patch_size {self.patch_size} must be {self.cell}: InklingImageProcessor's patch "
                "(size 40 × 40), which InklingVisionModel folds down to one row")
        p.check(self.temporal_patch_size == INKLING_FRAMES,
                f"vision_config.temporal_patch_size {self.temporal_patch_size} must be {INKLING_FRAMES}: "
                "InklingImageProcessor repeats each patch twice in time")
        p.raise_if_any()
        rungs = len(scale_ladder(self.temporal_patch_size, self.patch_size, self.in_channels))
        p.check(self.depth >= rungs,
                f"vision_config.num_hidden_layers {self.depth} < {rungs} scales: plan_out_scales then assigns the "
                "layers with scipy's linear_sum_assignment, which hpcmem does not model")
        p.raise_if_any()

    @property
    def scales(self) -> list[tuple[int, int, int, int]]:
        return plan_scales(self.temporal_patch_size, self.patch_size, self.depth, self.in_channels)

    @property
    def patch_dim(self) -> int:
        """Values per patch of pixel_values [2, 40, 40, 3]."""
        return self.temporal_patch_size * self.patch_size ** 2 * self.in_channels

    def layers(self) -> tuple[HmlpLayer, ...]:
        """`InklingVisionModel.__init__`'s layers over consecutive scales."""
        s, out = self.scales, []
        for i, (a, b) in enumerate(zip(s[:-1], s[1:])):
            t_fold, hw_fold = b[0] // a[0], b[1] // a[1]
            last = i == self.depth - 1
            positions = (self.temporal_patch_size // b[0]) * (self.patch_size // b[1]) ** 2
            out.append(HmlpLayer(t_fold=t_fold, hw_fold=hw_fold, in_features=a[3] * t_fold * hw_fold * hw_fold,
                                 out_features=self.out_hidden_size if last else b[3], norm=not last,
                                 positions=positions))
        return tuple(out)

    def linears(self) -> tuple[TowerLinear, ...]:
        """Every nn.Linear (peft's "all-linear" wraps each): `vision_tower.encoder_layers.N.projection`, no bias. The
        audio tower has none."""
        return tuple(TowerLinear(name=f"encoder_layers.{i}.projection", in_features=x.in_features,
                                 out_features=x.out_features, count=1, part="tower", bias=False)
                     for i, x in enumerate(self.layers()))

    @property
    def tower_params(self) -> int:
        """InklingVisionModel: the projections, the layers' RMSNorm weights, final_norm."""
        return sum(x.in_features * x.out_features + (x.out_features if x.norm else 0) for x in self.layers()) + \
            self.out_hidden_size

    @property
    def merger_params(self) -> int:
        return 0

    @property
    def block_params(self) -> int:
        return 0

    @property
    def idle_params(self) -> int:
        return self.audio_params

    @property
    def num_params(self) -> int:
        """The vision tower and the idle audio tower."""
        return self.tower_params + self.audio_params

    def grid(self, height: int, width: int) -> tuple[int, int]:
        """(rows, columns) of patches: image_processing_inkling.py `divide_to_patches` (`(height + 39) // 40`,
        `width // 40 + 1`)."""
        return (height + self.cell - 1) // self.cell, width // self.cell + 1

    def image_tokens(self, height: int, width: int) -> int:
        """One image token per patch (`InklingProcessor.replace_image_token`: num_patches)."""
        rows, cols = self.grid(height, width)
        return rows * cols

    def image_patches(self, height: int, width: int) -> int:
        return self.image_tokens(height, width)


def inkling_tower_from_config(cfg: dict[str, Any], name: str) -> InklingTowerSpec:
    """The InklingTowerSpec of an inkling_mm_model config.json dict; keys it omits take the config classes'
    defaults (InklingVisionConfig's attribute_map reads `n_layers` as num_hidden_layers)."""
    raw = cfg.get("vision_config")
    if isinstance(raw, dict) and "n_layers" in raw:
        raw = {**{k: v for k, v in raw.items() if k != "n_layers"}, "num_hidden_layers": raw["n_layers"]}
        cfg = {**cfg, "vision_config": raw}
    vc = vision_values(cfg, name, INKLING_VISION_DEFAULTS)
    audio = cfg.get("audio_config")
    if audio is not None and not isinstance(audio, dict):
        raise SpecError(f"model {name}: audio_config must be an object, got {type(audio).__name__}")
    ac = {**INKLING_AUDIO_DEFAULTS, **(audio or {})}
    for key in ("n_mel_bins", "mel_vocab_size"):
        if not isinstance(ac[key], int) or isinstance(ac[key], bool) or ac[key] < 1:
            raise SpecError(f"model {name}: audio_config.{key} must be an integer ≥ 1, got {ac[key]!r}")
    text = text_width(cfg, INKLING_TEXT_HIDDEN)
    # InklingAudioModel: embed_audio_tokens (n_mel_bins · mel_vocab_size rows of the text width) and its norm's weight
    audio_params = ac["n_mel_bins"] * ac["mel_vocab_size"] * text + text
    return InklingTowerSpec(
        model_type="inkling_mm_model", depth=vc["num_hidden_layers"], hidden_size=vc["hidden_size"],
        intermediate_size=0, num_heads=vc["num_attention_heads"], in_channels=vc["num_channels"],
        patch_size=vc["patch_size"], out_hidden_size=text, hidden_act="gelu",
        temporal_patch_size=vc["temporal_patch_size"], audio_params=audio_params,
        audio_buffer_bytes=8 * ac["n_mel_bins"])
