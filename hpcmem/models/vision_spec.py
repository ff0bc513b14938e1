"""The Qwen2-VL-style vision tower spec (`VisionSpec`) and its linears (`VisionLinear`), apart from hpcmem.models.vision's
registry of layouts and dispatch so that a type's own module can extend the spec (hpcmem.models.dots3_note) and still
be dispatched from there. Pure Python, no torch."""

from __future__ import annotations

from dataclasses import dataclass, replace

from hpcmem.errors import Problems
from hpcmem.models.qwen2_5_omni import AudioTower
from hpcmem.models.qwen3_omni_audio import AudioEncoderSpec
from hpcmem.models.siglip import gemma3_projector_params, siglip_tower_params
from hpcmem.models.tower_base import TowerBase, check_activation, check_counts, check_heads

# the activations of a two-linear ("fc") tower MLP whose saved tensors hpcmem.estimate.vision derives
FC_ACTIVATIONS = ("quick_gelu", "gelu", "gelu_pytorch_tanh")


@dataclass(frozen=True, kw_only=True)
class VisionLinear:
    """One linear layer of the tower or the merger: peft's module name suffix, its shape, how many there are."""

    name: str               # module path below the vision model (blocks.N.<name> or merger.<name>; "projector":
    #                         HyperCLOVAX Vision V2's, below the outer model)
    in_features: int
    out_features: int
    count: int              # blocks that hold it (depth), or 1 for the merger's
    part: str               # "tower", "merger" (with a projector after it), "deepstack" (Qwen3-VL's deepstack
    #                         mergers, `count` of them), or "audio" (an Omni thinker's audio encoder, which images never run)

    @property
    def params(self) -> int:
        return (self.in_features * self.out_features + self.out_features) * self.count     # every one has a bias


@dataclass(frozen=True, kw_only=True)
class VisionSpec(TowerBase):
    """A Qwen2-VL / Qwen2.5-VL style vision tower and patch merger (names follow Qwen2.5-VL's `vision_config`:
    hidden_size is the tower width, out_hidden_size the merger's output; window_size 0 and no
    fullatt_block_indexes: full attention in every block)."""

    spatial_merge_size: int
    temporal_patch_size: int
    window_size: int
    fullatt_block_indexes: tuple[int, ...]
    hidden_act: str = "silu"
    norm: str = "rms"           # TowerLayout.norm
    mlp: str = "gated"          # TowerLayout.mlp
    fc_names: tuple[str, str] = ("mlp.fc1", "mlp.fc2")         # TowerLayout.fc_names
    merger_names: tuple[str, str] = ("mlp.0", "mlp.2")         # TowerLayout.merger_names
    patch_bias: bool = False                                   # TowerLayout.patch_bias
    hooked_input: bool = True                                  # TowerLayout.hooked_input
    num_position_embeddings: int = 0      # Qwen3-VL's learned position table (rows of the tower width); 0: none
    deepstack_visual_indexes: tuple[int, ...] = ()     # blocks whose output a deepstack merger reads (Qwen3-VL)
    family: str = "qwen"        # TowerLayout.family
    image_size: int = 0         # the processor's fixed square resize (Gemma 3: 896); 0: smart_resize (Qwen)
    tokens_per_image: int = 0   # Gemma 3's mm_tokens_per_image; 0: patches / spatial_merge_size² (Qwen)
    pooling_head: bool = False  # SigLIP's attention-pooling head loaded (vision_use_head), never run by Gemma 3
    # grouped-query attention in the tower (EXAONE 4.5: qkv projects to num_heads + 2 · num_key_value_heads heads);
    # 0: as many key/value heads as query heads (Qwen2.5-VL's fused qkv of 3 · width)
    num_key_value_heads: int = 0
    # HyperCLOVAX Vision V2's `projector`, Linear(out_hidden_size → projector_width) after the merger (TowerLayout.
    # projector_text_width); 0: none
    projector_width: int = 0
    # an audio encoder beside the tower that no image runs (the Omni thinkers: hpcmem.models.qwen3_omni_audio
    # `AudioEncoderSpec`, hpcmem.models.qwen2_5_omni `AudioTower`): its weights load, its linears take adapters
    # (part "audio"), nothing of it gets a gradient; None: none
    audio: AudioEncoderSpec | AudioTower | None = None

    def __post_init__(self) -> None:
        p = Problems()
        # window_size 0: no window attention (Qwen2-VL)
        check_counts(p, self, ("depth", "hidden_size", "intermediate_size", "num_heads", "in_channels", "patch_size",
                               "spatial_merge_size", "temporal_patch_size", "window_size", "out_hidden_size"),
                     zero_ok=("window_size",))
        p.check(self.norm in ("rms", "layer"), f"vision tower norm must be rms or layer, got {self.norm!r}")
        p.check(self.mlp in ("gated", "fc"), f"vision tower mlp must be gated or fc, got {self.mlp!r}")
        if self.mlp == "fc":
            check_activation(p, self.hidden_act, FC_ACTIVATIONS)
        p.raise_if_any()
        check_heads(p, self.hidden_size, self.num_heads, "num_heads")
        p.check(isinstance(self.num_key_value_heads, int) and self.num_key_value_heads >= 0
                and (self.num_key_value_heads == 0 or self.num_heads % self.num_key_value_heads == 0),
                f"vision_config.num_key_value_heads must divide num_heads ({self.num_heads}), got "
                f"{self.num_key_value_heads!r}")
        p.check(all(0 <= i < self.depth for i in self.fullatt_block_indexes),
                f"vision_config.fullatt_block_indexes {list(self.fullatt_block_indexes)} must lie in 0..{self.depth - 1}")
        p.check(all(0 <= i < self.depth for i in self.deepstack_visual_indexes),
                f"vision_config.deepstack_visual_indexes {list(self.deepstack_visual_indexes)} must lie in "
                f"0..{self.depth - 1}")
        p.check(len(set(self.deepstack_visual_indexes)) == len(self.deepstack_visual_indexes),
                f"vision_config.deepstack_visual_indexes {list(self.deepstack_visual_indexes)}: each block once "
                "(Qwen3VLVisionModel.forward finds a block's merger by `.index`)")
        p.check(isinstance(self.projector_width, int) and self.projector_width >= 0,
                f"text_config.hidden_size (the projector's output) must be an integer ≥ 0, got "
                f"{self.projector_width!r}")
        p.check(isinstance(self.num_position_embeddings, int) and self.num_position_embeddings >= 0,
                f"vision_config.num_position_embeddings must be an integer ≥ 0, got {self.num_position_embeddings!r}")
        p.raise_if_any()

    @property
    def kv_heads(self) -> int:
        return self.num_key_value_heads or self.num_heads

    @property
    def merge_unit(self) -> int:
        """Patches merged into one language-model token (spatial_merge_size²)."""
        return self.spatial_merge_size ** 2

    @property
    def patch_dim(self) -> int:
        """Values per patch row of pixel_values: in_channels × temporal_patch_size × patch_size²."""
        return self.in_channels * self.temporal_patch_size * self.patch_size ** 2

    @property
    def merged_width(self) -> int:
        """The merger's input width: the tower width × spatial_merge_size² (Qwen2_5_VLPatchMerger.hidden_size)."""
        return self.hidden_size * self.merge_unit

    @property
    def feature_width(self) -> int:
        """The width of the rows the image tokens take: the projector's output (HyperCLOVAX Vision V2), else the
        merger's."""
        return self.projector_width or self.out_hidden_size

    def linears(self) -> tuple[VisionLinear, ...]:
        h, i, m, d = self.hidden_size, self.intermediate_size, self.merged_width, self.depth
        if self.family == "siglip":     # modeling_siglip.py SiglipAttention, SiglipMLP; the projector has none
            return (*(VisionLinear(name=f"self_attn.{x}", in_features=h, out_features=h, count=d, part="tower")
                      for x in ("q_proj", "k_proj", "v_proj", "out_proj")),
                    VisionLinear(name="mlp.fc1", in_features=h, out_features=i, count=d, part="tower"),
                    VisionLinear(name="mlp.fc2", in_features=i, out_features=h, count=d, part="tower"))
        if self.mlp == "gated":     # Qwen2_5_VLMLP
            mlp = (VisionLinear(name="mlp.gate_proj", in_features=h, out_features=i, count=d, part="tower"),
                   VisionLinear(name="mlp.up_proj", in_features=h, out_features=i, count=d, part="tower"),
                   VisionLinear(name="mlp.down_proj", in_features=i, out_features=h, count=d, part="tower"))
        else:                       # modeling_qwen2_vl.py VisionMlp, modeling_qwen3_vl.py Qwen3VLVisionMLP
            fc1, fc2 = self.fc_names
            mlp = (VisionLinear(name=fc1, in_features=h, out_features=i, count=d, part="tower"),
                   VisionLinear(name=fc2, in_features=i, out_features=h, count=d, part="tower"))
        first, second = self.merger_names
        ds = len(self.deepstack_visual_indexes)
        deepstack = (VisionLinear(name=first, in_features=m, out_features=m, count=ds, part="deepstack"),
                     VisionLinear(name=second, in_features=m, out_features=self.out_hidden_size, count=ds,
                                  part="deepstack")) if ds else ()
        qkv = h + 2 * self.kv_heads * (h // self.num_heads)       # EXAONE 4.5: q_dim + 2 · kv_dim
        # Qwen2.5-Omni's `Qwen2_5OmniVisionAttention`: q, k, v three Linears (width → width, bias) for the fused qkv
        attention = tuple(VisionLinear(name=f"attn.{x}", in_features=h, out_features=h, count=d, part="tower")
                          for x in ("q", "k", "v")) if self.family == "qwen2_5_omni" else \
            (VisionLinear(name="attn.qkv", in_features=h, out_features=qkv, count=d, part="tower"),)
        # its audio tower's linears (part "audio": peft wraps them, nothing runs them; their parameters are counted
        # by `idle_params`, k_proj having no bias)
        audio = tuple(VisionLinear(name=x.name, in_features=x.in_features, out_features=x.out_features,
                                   count=x.count, part="audio") for x in self.audio.linears()) if self.audio else ()
        # HyperCLOVAX Vision V2's projector (modular_hyperclovax_vision_v2.py `HyperCLOVAXVisionV2Model.__init__`:
        # `model.projector`, beside `model.vision_model`), counted with the merger whose output it reads
        projector = (VisionLinear(name="projector", in_features=self.out_hidden_size,
                                  out_features=self.projector_width, count=1, part="merger"),) \
            if self.projector_width else ()
        return (*attention,
                VisionLinear(name="attn.proj", in_features=h, out_features=h, count=d, part="tower"),
                *mlp,
                VisionLinear(name=first, in_features=m, out_features=m, count=1, part="merger"),
                VisionLinear(name=second, in_features=m, out_features=self.out_hidden_size, count=1, part="merger"),
                *projector, *deepstack, *audio)

    @property
    def norm_params(self) -> int:
        """One norm's parameters over the tower width: RMSNorm a weight, LayerNorm a weight and a bias."""
        return self.hidden_size * (1 if self.norm == "rms" else 2)

    @property
    def embed_params(self) -> int:
        """The patch embedding (Conv3d; Qwen3-VL's with a bias) and Qwen3-VL's learned position table."""
        h = self.hidden_size
        return self.patch_dim * h + (h if self.patch_bias else 0) + self.num_position_embeddings * h

    @property
    def tower_params(self) -> int:
        """Patch and position embeddings, the blocks' linears and their two norms (SigLIP: its post_layernorm and an
        unused pooling head too, hpcmem.models.siglip)."""
        if self.family == "siglip":
            return siglip_tower_params(depth=self.depth, hidden=self.hidden_size, intermediate=self.intermediate_size,
                                       channels=self.in_channels, patch=self.patch_size,
                                       positions=self.num_position_embeddings, head=self.pooling_head)
        norms = 2 * self.norm_params * self.depth
        return self.embed_params + norms + sum(x.params for x in self.linears() if x.part == "tower")

    @property
    def merger_params(self) -> int:
        """The merger's norm (ln_q, the tower width) and its two linears (HyperCLOVAX Vision V2: and the projector
        after it); Gemma 3's projector (hpcmem.models.siglip)."""
        if self.family == "siglip":
            return gemma3_projector_params(self.hidden_size, self.out_hidden_size)
        return self.norm_params + sum(x.params for x in self.linears() if x.part == "merger")

    @property
    def deepstack_params(self) -> int:
        """Qwen3-VL's deepstack mergers: each a LayerNorm over 4·width (`use_postshuffle_norm=True`) and two linears."""
        norms = 2 * self.merged_width * len(self.deepstack_visual_indexes)
        return norms + sum(x.params for x in self.linears() if x.part == "deepstack")

    @property
    def idle_params(self) -> int:
        """The audio encoder's parameters (loaded, never run on images); 0 without one."""
        return self.audio.params if self.audio else 0

    @property
    def image_path(self) -> VisionSpec:
        """The tower, merger and deepstack mergers alone, what an image runs through."""
        return replace(self, audio=None)

    @property
    def num_params(self) -> int:
        return self.tower_params + self.merger_params + self.deepstack_params + self.idle_params
