"""TowerBase: the fields every vision tower spec names (hpcmem.models.vision VisionSpec, hpcmem.models.clip_tower
ClipTowerSpec, hpcmem.models.idefics3 Idefics3TowerSpec, hpcmem.models.paligemma PaliGemmaTowerSpec,
hpcmem.models.mllama MllamaTowerSpec), the values per patch they derive from them, and the checks they share: whole
counts, a known activation, a width the attention heads divide, a square image cut into whole patches.

The names follow transformers' vision configs read through VisionSpec's spelling: `depth` is num_hidden_layers,
`num_heads` num_attention_heads, `in_channels` num_channels, `hidden_size` the tower width and `out_hidden_size` the
width the projector (merger, connector) hands to the language model.
"""

from __future__ import annotations

from dataclasses import dataclass

from hpcmem.errors import Problems


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
