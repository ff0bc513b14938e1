"""A model's layout from transformers' own code on the meta device: parameters by place, the decoder layers' weights
and kinds, and the reduced-depth config whose layers stand for all of them (for hpcmem.trace.learn).

Layers are the model's outermost `GradientCheckpointingLayer`s, in module order (what gradient checkpointing wraps
and what hpcmem.trace.phases names "layer k"). Two layers are of one kind when their class, parameter names and
shapes, and attention pattern (config `layer_types[i]`; the `attention_type` / `is_sliding` / `sliding_window` /
`use_rope` a layer or its attention module carries), KV sharing and activation sparsity (the `is_kv_shared_layer` /
`store_full_length_kv` of an attention module and the `activation_sparsity` of an MLP: Gemma-3n's
modeling_gemma3n.py Gemma3nTextAttention.__init__, Gemma3nTextMLP.forward — a sparse MLP saves its top-k cut-off
tensors, a dense one does not) agree.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

from hpcmem.errors import SpecError
from hpcmem.models.profile import LayerKind, Linear, ParamLayout
from hpcmem.trace import text_heads

MAX_DEPTH = 12            # the deepest reduced model the learner traces
LAYER_ATTRS = ("attention_type", "layer_type", "is_sliding", "sliding_window", "use_rope", "is_causal",
               "is_kv_shared_layer", "store_full_length_kv", "activation_sparsity")
# Config keys that count layers from the end of the stack (the last N layers are of another kind): a cut that keeps
# some of those layers sets the key to how many it keeps. Gemma-3n's `num_kv_shared_layers` (configuration_gemma3n.py
# Gemma3nTextConfig.kv_sharing_modes: the last N layers reuse the K/V of the last earlier layer of their attention
# type, which stores it).
TAIL_COUNT_KEYS = ("num_kv_shared_layers",)
# Config keys that hold the layer count a second time, beside the layers key: a cut sets them too where they equal it.
# xLSTM's `num_blocks` (configuration_xlstm.py xLSTMConfig.__post_init__ fills each of num_hidden_layers / num_blocks
# from the other; modeling_xlstm.py xLSTMModel builds `num_blocks` blocks, its init reads num_hidden_layers).
MIRROR_COUNT_KEYS = ("num_blocks",)
# Config keys that list layer indices, one slot per layer of some type: Zamba2's `hybrid_layer_ids`
# (configuration_zamba2.py Zamba2Config.__post_init__; a config.json that holds it overrides the derived one). Its
# shared blocks build one adapter per slot and a hybrid layer takes the slot of its index (modeling_zamba2.py Zamba2MLP
# `layer_dic`, Zamba2Attention): a cut keeps every slot, a kept layer's under its new index, a dropped one's under an
# index past the cut, so each block holds the real model's adapters and a kept layer runs its own.
LAYER_INDEX_KEYS = ("hybrid_layer_ids",)
# ModuleLists of which a layer calls only the entry of its slot (its place in LAYER_INDEX_KEYS): Zamba2's per-hybrid-
# layer adapters (modeling_zamba2.py Zamba2MLP.forward `gate_up_proj_adapter_list[layer_dic[layer_idx]]`,
# Zamba2Attention.forward `linear_q/k/v_adapter_list`). The other entries are held (and adapted by peft) but not run.
SLOT_LISTS = ("gate_up_proj_adapter_list", "linear_q_adapter_list", "linear_k_adapter_list", "linear_v_adapter_list")
TOP_K_KEYS = ("num_experts_per_tok", "moe_topk", "top_k", "num_experts_per_token", "moe_k", "n_activated_experts")


@dataclass(frozen=True, kw_only=True)
class Layout(ParamLayout):
    model_type: str                 # the decoder's (text) model type
    total: int
    signatures: tuple[Any, ...]
    attention: str                  # the attention implementation transformers chose (sdpa | eager | …)
    layers_key: str                 # the config key that holds the layer count
    dropout: bool = False           # the model holds an nn.Dropout with p > 0 (`active_dropout`)


def hf_config(cfg: dict[str, Any]) -> Any:
    """The transformers config object of a config.json dict (architecture keys only)."""
    from huggingface_hub.errors import StrictDataclassError
    from transformers import AutoConfig

    # a deep copy: transformers standardises nested dicts (rope_scaling) in place, which would change the caller's
    # config (and its hash, hpcmem.models.profile.config_hash)
    data = {k: copy.deepcopy(v) for k, v in cfg.items() if k not in (
        "architectures", "auto_map", "transformers_version", "torch_dtype", "dtype", "quantization_config")}
    model_type = data.pop("model_type")
    try:
        config = AutoConfig.for_model(model_type, **data)
    except (*BUILD_ERRORS, StrictDataclassError) as exc:
        # transformers' strict config classes validate each field (rms_norm_eps "x": StrictDataclassFieldValidationError)
        raise refused_by_transformers(model_type, "its config class", exc) from None
    text = config.get_text_config()       # the decoder's config builds the embedding (a composite's own id builds none)
    pad, vocab = getattr(text, "pad_token_id", None), getattr(text, "vocab_size", None)
    if isinstance(pad, int) and isinstance(vocab, int) and not -vocab <= pad < vocab:
        # the config class's default pad_token_id (the config.json named none: hpcmem.inputs.model_config checks a
        # named one) outside the vocabulary: torch's nn.Embedding(padding_idx=...) refuses it as the model is built
        raise SpecError(f"model config: pad_token_id {pad} ({type(text).__name__}'s default: the config names none) "
                        f"is not below vocab_size {vocab:,}: transformers builds nn.Embedding(vocab_size, hidden_size, "
                        "padding_idx=pad_token_id), which torch refuses; set pad_token_id in the config to a token id "
                        "below vocab_size (or null)")
    return config


def build_meta(cfg: dict[str, Any]) -> Any:
    """`AutoModelForCausalLM.from_config` on the meta device (no memory), attention left to transformers."""
    import torch
    from transformers import AutoModelForCausalLM

    text_heads.register()       # a text config transformers maps to no causal-LM class (Cosmos3 Edge's, Mistral Large 4's)
    config = hf_config(cfg)
    try:
        with torch.device("meta"):
            return AutoModelForCausalLM.from_config(config)
    except BUILD_ERRORS as exc:
        # e.g. CohereCompassRotaryEmbedding's KeyError for a rope_parameters with no entry per layer type
        raise refused_by_transformers(cfg.get("model_type"), type(config).__name__, exc) from None


# what transformers raises on a config it cannot turn into a model (beside its strict classes' StrictDataclassError)
BUILD_ERRORS = (KeyError, ValueError, TypeError, AttributeError, IndexError, AssertionError)


def refused_by_transformers(model_type: Any, where: str, exc: BaseException) -> SpecError:
    """The real code refuses this config as it builds the config or the model: a run of it would fail the same way,
    before any memory is used. One line naming transformers' error."""
    return SpecError(f"model config: transformers cannot build {model_type!r} from it ({where}: "
                     f"{type(exc).__name__}: {' '.join(str(exc).split())[:200]}); a training run of this config "
                     "fails the same way — fix the config")


def decoder_layers(model: Any) -> list[Any]:
    """The model's outermost GradientCheckpointingLayers (what its forward loops over: a Zamba/Zamba2 hybrid layer is
    one and holds its Mamba layer, another, which it calls inside its own forward — modeling_zamba2.py
    Zamba2HybridLayer.forward — so a checkpoint of the outer one recomputes the inner one too); for a model
    transformers builds none for (supports_gradient_checkpointing False: CTRL's `h`, OpenAI-GPT's `h`,
    GPT-NeoX-Japanese's and CPM-Ant's `layers`), the one nn.ModuleList holding the config's layer count of blocks,
    which those models run one after the other."""
    import torch
    from transformers.modeling_layers import GradientCheckpointingLayer

    tower = {id(b) for b in (*vision_blocks(model), *idle_tower_blocks(model))}
    layers = [m for m in model.modules() if isinstance(m, GradientCheckpointingLayer) and id(m) not in tower]
    inner = {id(c) for m in layers for c in m.modules()
             if c is not m and isinstance(c, GradientCheckpointingLayer)}
    if layers or getattr(model, "supports_gradient_checkpointing", True):
        return [m for m in layers if id(m) not in inner]
    count = getattr(model.config.get_text_config(), "num_hidden_layers", None)    # n_layer via attribute_map
    stacks = [m for m in model.modules() if isinstance(m, torch.nn.ModuleList) and len(m) == count]
    return list(stacks[0]) if len(stacks) == 1 else []


def vision_blocks(model: Any) -> list[Any]:
    """A vision-language model's vision tower blocks (GradientCheckpointingLayers too, which `decoder_layers` leaves
    out): those of the module transformers names `visual` (modeling_qwen2_5_vl.py Qwen2_5_VLModel.visual) or
    `vision_tower` (modeling_gemma3.py Gemma3Model.vision_tower, a SiglipVisionModel; modeling_llava.py
    LlavaModel.vision_tower) or `vision_model` (modeling_smolvlm.py SmolVLMModel.vision_model, Idefics3's too) or
    `image_tower` (modeling_video_llava.py VideoLlavaModel.image_tower; its `video_tower`, which images never run, is
    not the one), `vision_encoder` (modeling_lighton_ocr.py LightOnOcrModel.vision_encoder)."""
    from transformers.modeling_layers import GradientCheckpointingLayer

    names = ("visual", "vision_tower", "vision_model", "image_tower", "vision_encoder")
    towers = [m for name, m in model.named_modules()
              if name.rsplit(".", 1)[-1] in names and IDLE_TOWER not in name.split(".")]
    return [b for t in towers[:1] for b in t.modules() if isinstance(b, GradientCheckpointingLayer)]


# modeling_video_llava.py VideoLlavaModel.video_tower: a second CLIP tower that runs on videos only
IDLE_TOWER = "video_tower"


def idle_tower_blocks(model: Any) -> list[Any]:
    """The blocks of a tower no image runs (`IDLE_TOWER`): neither the vision tower's nor the decoder's."""
    from transformers.modeling_layers import GradientCheckpointingLayer

    return [b for name, m in model.named_modules() if name.rsplit(".", 1)[-1] == IDLE_TOWER
            for b in m.modules() if isinstance(b, GradientCheckpointingLayer)]


def owners(layers: list[Any]) -> dict[int, int]:
    """The decoder layer each parameter belongs to, by id: the last layer that holds it. Zamba's and Zamba2's hybrid
    layers each build a transformer block whose weights the model ties to the first `num_mem_blocks` ones
    (modeling_zamba2.py Zamba2Model.get_layers `_tied_weights_keys`; modeling_zamba.py ZambaModel.__init__): a tied
    weight is one tensor, and its gradient is allocated by the first backward that reaches it — the last layer's, in
    forward order (autograd's AccumulateGrad adds the earlier layers' into it). peft wraps each layer's module, so
    every holder still gets its own adapter."""
    out: dict[int, int] = {}
    for i, layer in enumerate(layers):
        for p in layer.parameters():
            out[id(p)] = i
    return out


def _signature(layer: Any, i: int, config: Any, owner: dict[int, int]) -> Any:
    shapes = tuple(sorted((n, tuple(p.shape)) for n, p in layer.named_parameters()))
    tied = tuple(sorted(n for n, p in layer.named_parameters() if owner[id(p)] != i))   # held by a later layer
    attrs = []
    for module in (layer, *layer.children()):
        for name in LAYER_ATTRS:
            value = getattr(module, name, None)
            if isinstance(value, (str, int, bool, float)) or value is None and hasattr(module, name):
                attrs.append((name, value))
    types = getattr(config, "layer_types", None)
    pattern = types[i] if isinstance(types, (list, tuple)) and i < len(types) else None
    return (type(layer).__name__, shapes, tuple(attrs), pattern) + ((tied,) if tied else ())


def _runs(path: str, slot: int | None) -> bool:
    """Whether a layer whose slot is `slot` (None: none known) calls the module at `path` (SLOT_LISTS)."""
    parts = path.split(".")
    return slot is None or not any(a in SLOT_LISTS and b.isdigit() and int(b) != slot
                                   for a, b in zip(parts, parts[1:]))


def _slot(config: Any, i: int) -> int | None:
    """Layer i's place in the config's LAYER_INDEX_KEYS list (None where it has none)."""
    for key in LAYER_INDEX_KEYS:
        ids = getattr(config, key, None)
        if isinstance(ids, list) and i in ids:
            return ids.index(i)
    return None


def _weights(layer: Any, mine: set[int], slot: int | None = None) -> tuple[Linear, ...]:
    """Every ≥2-D weight of a layer as peft sees it: nn.Linear modules and transformers' Conv1D (GPT-2's [in, out]
    linears, which peft's all-linear and target_modules reach alike: peft/tuners/tuners_utils.py
    _maybe_include_all_linear_layers), fused 3-D experts, bare 2-D routers. `mine`: the ids of the parameters the layer
    holds (`owners`); a weight tied to a later layer's is listed as not held."""
    import torch
    from transformers.pytorch_utils import Conv1D

    out = []
    for path, mod in layer.named_modules():
        if isinstance(mod, torch.nn.Linear):
            out.append(Linear(path, mod.in_features, mod.out_features, 1, True, mod.bias is not None,
                              id(mod.weight) in mine, _runs(path, slot)))
            continue
        if isinstance(mod, Conv1D):
            out.append(Linear(path, int(mod.weight.shape[0]), int(mod.weight.shape[1]), 1, True, mod.bias is not None,
                              id(mod.weight) in mine))
            continue
        for pname, p in mod.named_parameters(recurse=False):
            name = f"{path}.{pname}" if path else pname
            if p.dim() == 3:
                out.append(Linear(name, int(p.shape[2]), int(p.shape[1]), int(p.shape[0]), False, False, id(p) in mine))
            elif p.dim() == 2 and not isinstance(mod, torch.nn.Embedding):
                out.append(Linear(path or pname, int(p.shape[1]), int(p.shape[0]), 1, False, False, id(p) in mine))
    return tuple(out)


def _top_k(config: Any) -> int:
    for key in TOP_K_KEYS:
        value = getattr(config, key, None)
        if isinstance(value, int) and value > 0:
            return value
    return 0


def _kind(layer: Any, config: Any, mine: set[int], slot: int | None) -> LayerKind:
    own = [p for p in layer.parameters() if id(p) in mine]
    params = sum(p.numel() for p in own)
    experts = [p for p in own if p.dim() == 3]
    routed = sum(p.numel() for p in experts)
    top_k = _top_k(config)
    active = sum(p.numel() * min(top_k, p.shape[0]) // p.shape[0] for p in experts) if top_k else routed
    return LayerKind(params=params, experts=routed, experts_active=active, linears=_weights(layer, mine, slot))


def layers_key(config: Any, cfg: dict[str, Any] | None = None, built: int | None = None) -> str:
    """The config.json key that holds the layer count: the config class's attribute_map target (gpt2's n_layer, …),
    unless that is a derived count and another key of `cfg` holds the `built` layers (LongCat-Flash's
    `num_hidden_layers` is a property, 2 × `num_layers`: configuration_longcat_flash.py; its model builds
    `num_layers` GradientCheckpointingLayers)."""
    key = getattr(config, "attribute_map", {}).get("num_hidden_layers", "num_hidden_layers")
    if cfg is None or built is None or count_at(cfg, key) == built:
        return key
    return next((k for k, v in cfg.items() if "layers" in k and type(v) is int and v == built), key)


def count_at(cfg: dict[str, Any], key: str) -> Any:
    """The value of `key` in cfg, or in its text_config where only that holds it (Emu3's layer count)."""
    inner = cfg.get("text_config")
    return cfg[key] if key in cfg else inner.get(key) if isinstance(inner, dict) else None


def layout(cfg: dict[str, Any]) -> Layout:
    """The decoder's layout (cfg is the decoder config: hpcmem.models.profile.backbone_config)."""
    model = build_meta(cfg)
    config = model.config
    layers = decoder_layers(model)
    if not layers:
        raise SpecError(f"model_type {cfg.get('model_type')!r}: transformers builds no GradientCheckpointingLayer, so "
                        "gradient checkpointing cannot wrap its layers and hpcmem cannot tell them apart")
    seen: set[int] = set()
    total = 0
    for p in model.parameters():
        if id(p) not in seen:
            seen.add(id(p))
            total += p.numel()
    embed_w = model.get_input_embeddings().weight
    head = model.get_output_embeddings()
    tied = head is not None and head.weight is embed_w
    lm_head = 0 if head is None or tied else head.weight.numel()
    sigs, kinds, kind_of = [], [], {}
    layer_kinds = []
    owner = owners(layers)
    for i, layer in enumerate(layers):
        sig = _signature(layer, i, config, owner)
        sigs.append(sig)
        if sig not in kind_of:
            kind_of[sig] = len(kinds)
            kinds.append(_kind(layer, config, {pid for pid, j in owner.items() if j == i}, _slot(config, i)))
        layer_kinds.append(kind_of[sig])
    in_layers = sum(kinds[k].params for k in layer_kinds)
    other = total - embed_w.numel() - lm_head - in_layers
    if other < 0:
        raise SpecError(f"model_type {cfg.get('model_type')!r}: its layers share parameters ({-other:,} counted "
                        "twice); a per-layer profile cannot describe it")
    return Layout(model_type=str(config.model_type), hidden_size=int(embed_w.shape[1]),
                  vocab_size=int(embed_w.shape[0]), tie_word_embeddings=tied,
                  max_position_embeddings=int(getattr(config, "max_position_embeddings", 0) or 0),
                  embed=embed_w.numel(), lm_head=lm_head, other=other, total=total, kinds=tuple(kinds),
                  layer_kinds=tuple(layer_kinds), signatures=tuple(sigs),
                  attention=str(getattr(config, "_attn_implementation", None) or "sdpa"),
                  layers_key=layers_key(config, cfg, len(layers)), dropout=active_dropout(model))


def active_dropout(model: Any) -> bool:
    """Whether the model holds an `nn.Dropout` with p > 0: SFTTrainer trains with it active, while TRL's
    `disable_dropout_in_model` (trl/trainer/utils.py: every `nn.Dropout` module's p set to 0; DPO, KTO and Reward by
    default) turns it off — and with it what the dropout keeps for backward (its mask) and what its p decides
    elsewhere (GPT-2 hands `self.attn_dropout.p` to SDPA, modeling_gpt2.py). A dropout probability a model reads from
    its config as a float (`dropout=0.0 if not self.training else self.attention_dropout`) is no module and stays."""
    import torch

    return any(isinstance(m, torch.nn.Dropout) and m.p > 0 for m in model.modules())


def choose_depth(kinds: tuple[int, ...]) -> int:
    """The fewest layers D (≥ 3) whose middle layers 1..D−2 hold every kind found after layer 0 (layer 0 stands for
    itself), so each real layer has a stand-in that is neither first nor last (or the real depth, if that small)."""
    n = len(kinds)
    if n <= 3:
        return n
    wanted = set(kinds[1:-1]) if last_only(kinds) else set(kinds[1:])
    for depth in range(3, min(n, MAX_DEPTH) + 1):
        if set(kinds[1:depth - 1]) >= wanted:
            return depth
    if n <= MAX_DEPTH:
        return n
    raise SpecError(f"the layer pattern does not repeat within {MAX_DEPTH} layers: too deep to learn from a "
                    "reduced model")


def last_only(kinds: tuple[int, ...]) -> bool:
    """The real last layer alone has its kind, in a model too deep to trace whole (GPT-NeoX-Japanese: only the last
    layer's attention adds a dense bias, modeling_gpt_neox_japanese.py GPTNeoXJapaneseAttention `use_bias`). A cut
    config then makes its own last layer of that kind: the traced last layer stands for the real last one."""
    return len(kinds) > MAX_DEPTH and kinds[-1] not in kinds[:-1]


def candidate_depths(kinds: tuple[int, ...]) -> list[int]:
    """`choose_depth`, then — when its last layer's kind is not the real last layer's — the smallest deeper D ≤
    MAX_DEPTH that ends on the real last kind: some configs do not build cut elsewhere (transformers forces Gemma-4's
    last layer to full attention, whose per-layer head size the cut config then lacks)."""
    first = choose_depth(kinds)
    aligned = next((d for d in range(first, min(len(kinds), MAX_DEPTH) + 1) if kinds[d - 1] == kinds[-1]), None)
    return [first] + ([aligned] if aligned is not None and aligned != first else [])


def layer_map(kinds: tuple[int, ...], depth: int) -> tuple[int, ...]:
    """The traced layer each real layer takes its terms from: itself below depth − 1, the last middle traced layer of
    its kind further on, and for the real last layer the traced last one — or, when the two differ in kind, index
    `depth`: a stand-in made by `last_layer_terms`."""
    n = len(kinds)
    if depth == n:
        return tuple(range(n))
    rep = {kinds[r]: r for r in range(1, depth - 1)}
    last = depth - 1 if kinds[depth - 1] == kinds[-1] else depth
    return tuple(j if j < depth - 1 else last if j == n - 1 else rep[kinds[j]] for j in range(n))


def last_layer_terms(terms: list[Any], kinds: tuple[int, ...], depth: int) -> list[Any]:
    """`terms` (one per traced layer) plus, when the real last layer's kind differs from the traced last one's, its
    stand-in: its kind's middle terms + what being last added to the traced last layer (its terms − its kind's)."""
    rep = {kinds[r]: r for r in range(1, depth - 1)}
    if depth == len(kinds) or kinds[depth - 1] == kinds[-1]:
        return terms
    return [*terms, terms[rep[kinds[-1]]] + terms[depth - 1] - terms[rep[kinds[depth - 1]]]]


def subsequence(kinds: tuple[int, ...], size: int = 0) -> tuple[int, ...]:
    """The real layers a cut keeps where no prefix holds every kind within MAX_DEPTH (a kind first found deep in the
    stack: Gemma-3n's KV-sharing tail, layers 20–34 of 35): layer 0, the first layer of each kind found between the
    first and the last, and the real last layer — so each kind has a stand-in that is neither first nor last and the
    traced last layer is the real last one. Then, up to `size` layers, each kind's next layers in turn (in the order
    the kinds first appear), so a deeper cut repeats every kind."""
    n = len(kinds)
    first: dict[int, int] = {}
    for j in range(1, n - 1):
        first.setdefault(kinds[j], j)
    keep = {0, n - 1, *first.values()}
    if len(keep) > MAX_DEPTH:
        raise SpecError(f"the layers hold {len(first)} kinds between the first and the last: more than a "
                        f"{MAX_DEPTH}-layer reduced model can hold")
    rest = {k: [j for j in range(1, n - 1) if kinds[j] == k and j not in keep] for k in first}
    while len(keep) < min(size, n) and any(rest.values()):
        for k in first:
            if rest[k] and len(keep) < size:
                keep.add(rest[k].pop(0))
    return tuple(sorted(keep))


def subsequence_map(kinds: tuple[int, ...], keep: tuple[int, ...]) -> tuple[int, ...]:
    """The traced layer each real layer takes its terms from, for a cut keeping the real layers `keep` (ending on the
    real last one): a kept layer its own, any other the last traced middle layer of its kind."""
    rep = {kinds[keep[p]]: p for p in range(1, len(keep) - 1)}
    where = {j: p for p, j in enumerate(keep)}
    return tuple(where[j] if j in where else rep[kinds[j]] for j in range(len(kinds)))


def written_out(cfg: dict[str, Any], key: str, layers: int) -> dict[str, Any]:
    """cfg with every per-layer list its config class derives from the layer count written out (Gemma-3n's
    `layer_types`, `activation_sparsity_pattern` and `intermediate_size` left unset: configuration_gemma3n.py
    Gemma3nTextConfig.__post_init__ makes the first 10 of > 10 layers sparse, none of ≤ 10), so a cut takes the real
    layers' values instead of the defaults of its own count."""
    inner = cfg.get("text_config")
    if key not in cfg and isinstance(inner, dict) and key in inner:
        return {**cfg, "text_config": written_out(inner, key, layers)}
    built = hf_config(cfg).to_dict()
    return {**cfg, **{k: v for k, v in built.items()
                      if isinstance(v, list) and len(v) == layers and not isinstance(cfg.get(k), list)}}


def _layer_keyed(value: Any) -> bool:
    """A dict keyed by layer index (Gemma-4's `per_layer_config`: {"5": {...}, …})."""
    return isinstance(value, dict) and bool(value) and all(
        isinstance(k, int) or isinstance(k, str) and k.isdigit() for k in value)


def reduced_config(cfg: dict[str, Any], key: str, depth: int, layers: int,
                   keep: tuple[int, ...] | None = None) -> dict[str, Any]:
    """The config with `depth` layers: the layer count set, every per-layer list (length = layers) cut, and every
    dict keyed by layer index kept below `depth` — inside `text_config` where only that holds the count (Emu3's causal
    LM takes the whole config and builds text_config's layers: modeling_emu3.py Emu3ForCausalLM). With `keep` (the
    real layers to keep, `subsequence`), lists and layer-keyed dicts take those layers' entries, renumbered, and each
    TAIL_COUNT_KEYS value becomes the number of kept layers in its tail."""
    inner = cfg.get("text_config")
    if key not in cfg and isinstance(inner, dict) and key in inner:
        return {**cfg, "text_config": reduced_config(inner, key, depth, layers, keep)}
    if keep is not None:
        depth = len(keep)
    where = {j: p for p, j in enumerate(keep if keep is not None else range(depth))}
    out = {}
    for k, v in cfg.items():
        if k in LAYER_INDEX_KEYS and isinstance(v, list):
            v = [where.get(j, depth + s) for s, j in enumerate(v)]
        elif keep is not None and isinstance(v, list) and len(v) == layers:
            v = [v[j] for j in keep]
        elif keep is not None and _layer_keyed(v):
            v = {type(i)(p): v[i] for p, j in enumerate(keep) for i in v if int(i) == j}
        elif keep is not None and k in TAIL_COUNT_KEYS and type(v) is int:
            v = sum(1 for j in keep if j >= layers - v)
        elif isinstance(v, list) and len(v) == layers and layers > depth:
            v = v[:depth]
        elif _layer_keyed(v):
            v = {i: x for i, x in v.items() if int(i) < depth}
        out[k] = v
    for k in MIRROR_COUNT_KEYS:
        if k != key and type(cfg.get(k)) is int and cfg[k] == cfg.get(key):
            out[k] = depth
    out[key] = depth
    return out
