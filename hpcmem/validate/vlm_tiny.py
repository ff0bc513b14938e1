"""A tiny model of an image-text type: its config class's defaults (transformers' own choice of an example
checkpoint), every width at every level of nesting shrunk by hpcmem.validate.shrink, the depth kept (layer-type lists
and per-layer tables stay consistent), and what the config classes' validators require kept consistent: widths that
equalled the text decoder's hidden size or their own config's stay equal, multimodal RoPE sections sum to the shrunk
head width, and the ranges of vocabulary ids a codebook's codes map to stay inside the shrunk vocabulary.
Two widths no width key names: MoE widths a config class leaves None while its layers build experts get the
shrink's small ones, and a tower whose layer widths are planned from its patch gets a small patch. A vocabulary_map
the defaults leave None (the tokenizer's vocabulary, which Chameleon and Emu3 read their image id from) holds the image
placeholder alone.

    config = tiny_config("blip-2")      # a config.json dict; hpcmem.validate.trl_run builds and saves it
"""

from __future__ import annotations

from typing import Any

from hpcmem.validate.shrink import EXPERT_FFN, EXPERT_FFN_KEYS, EXPERT_KEYS, EXPERTS, ROUTED, ROUTED_KEYS, shrink_config

MAX_LENGTH = 32
CODEBOOK = 64


def tiny_config(model_type: str) -> dict[str, Any]:
    """The type's config class defaults, every width shrunk at every level of nesting (text_config, vision_config,
    an encoder-decoder's encoder and decoder and theirs)."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    config = CONFIG_MAPPING[model_type]().to_dict()
    small = _shrink_nested(shrink_config(config, max_length=MAX_LENGTH))
    _keep_equal_widths(config, small, _text_hidden(config), _text_hidden(small))
    _fit_rope_sections(small)
    _fill_unset_experts(small)
    _cut_planned_patches(small)
    _fit_token_ranges(config, small)
    _fill_vocabulary_map(small)
    return small


def _text_hidden(config: dict[str, Any]) -> int | None:
    text = config.get("text_config") if isinstance(config.get("text_config"), dict) else config
    value = next((text[k] for k in ("hidden_size", "d_model") if isinstance(text.get(k), int)), None)
    return value


def _keep_equal_widths(before: dict[str, Any], after: dict[str, Any], text_before: int | None,
                       text_after: int | None) -> None:
    """A width that equalled the text decoder's hidden size (a tower's output, an audio encoder's, a codebook) or its
    own config's hidden size (an adapter's input width) still equals it, as the config classes' validators require;
    attention heads the shrink does not name (an audio encoder's `encoder_attention_heads`) go to 4, so the shrunk
    width divides."""
    own = next((k for k in ("hidden_size", "d_model", "embed_dim") if isinstance(before.get(k), int)), "hidden_size")
    own_before, own_after = before.get(own), after.get(own)
    for key, value in after.items():
        old = before.get(key)
        if isinstance(value, dict) and isinstance(old, dict):
            _keep_equal_widths(old, value, text_before, text_after)
        elif (not isinstance(key, str) or not isinstance(value, int) or isinstance(value, bool) or value != old
              or key == own):
            continue
        elif text_before and text_after and value == text_before and ("hidden" in key or "dim" in key):
            after[key] = text_after
        elif isinstance(own_before, int) and isinstance(own_after, int) and value == own_before and _names_width(key):
            after[key] = own_after
        elif key.endswith("attention_heads") and value > 4 and own_after != own_before:
            after[key] = 4


def _fill_vocabulary_map(config: dict[str, Any]) -> None:
    """A `vocabulary_map` the defaults leave None is the checkpoint tokenizer's vocabulary, which the model reads its
    image placeholder from when it is built (modeling_chameleon.ChameleonImageVocabularyMapping and
    modeling_emu3.Emu3ImageVocabularyMapping call `vocab_map.get("<image>")`): it becomes a map that holds the
    placeholder alone, at the shrunk vocabulary's last id, and `image_token_id` follows it as the config classes'
    __post_init__ set it."""
    if "vocabulary_map" not in config or config["vocabulary_map"] is not None:
        return
    text = config.get("text_config") if isinstance(config.get("text_config"), dict) else config
    vocab = text.get("vocab_size")
    if isinstance(vocab, int) and vocab > 0:
        config["vocabulary_map"] = {"<image>": vocab - 1}
        config["image_token_id"] = vocab - 1


def _names_width(key: str) -> bool:
    """A key that names a layer's width: `*_dim`, or an adapter's `*input_size` (an audio adapter's
    `adapter_input_size`), not a count or a picture size."""
    return "dim" in key or key.endswith("input_size")


def _fit_rope_sections(config: dict[str, Any], head_dim: int | None = None) -> None:
    """Multimodal RoPE's `mrope_section` (time, height, width) sums to half the rotary head width; it is scaled to the
    shrunk one (the head width of the config that holds it: qk_rope_head_dim, head_dim, or hidden / heads)."""
    for key in ("qk_rope_head_dim", "head_dim"):
        if isinstance(config.get(key), int):
            head_dim = config[key]
            break
    else:
        if isinstance(config.get("hidden_size"), int) and isinstance(config.get("num_attention_heads"), int):
            head_dim = config["hidden_size"] // max(config["num_attention_heads"], 1)
    for key, value in config.items():
        if isinstance(value, dict):
            _fit_rope_sections(value, head_dim)
        elif key == "mrope_section" and isinstance(value, list) and head_dim and sum(value) != head_dim // 2:
            total, target = sum(value), head_dim // 2
            sections = [max(1, v * target // total) for v in value]
            sections[0] += target - sum(sections)
            config[key] = sections


# a mixture-of-experts block's widths: the expert count, the experts routed per token (Gemma 4's `top_k_experts` among
# them) and one expert's FFN width, with the shrink's small value for each
_MOE_WIDTHS = ((EXPERT_KEYS, EXPERTS), (ROUTED_KEYS + ("top_k_experts",), ROUTED), (EXPERT_FFN_KEYS, EXPERT_FFN))


def _fill_unset_experts(config: dict[str, Any]) -> None:
    """A config that names its MoE widths and leaves every one None, with no switch that turns the block off, gets the
    shrink's small ones: its class leaves the example checkpoint's widths out of the defaults while its layers build a
    router and experts unconditionally (models/diffusion_gemma/modeling_diffusion_gemma.py
    `DiffusionGemmaEncoderTextLayer.__init__` builds `DiffusionGemmaTextRouter(config)`, an
    nn.Linear(hidden_size, num_experts)). A switch (Gemma 4's `enable_moe_block`, any boolean key naming moe or experts)
    means None is "no experts", and the widths stay None."""
    for value in config.values():
        if isinstance(value, dict):
            _fill_unset_experts(value)
    named = [[key for key in keys if key in config] for keys, _ in _MOE_WIDTHS]
    switch = any(isinstance(v, bool) and isinstance(k, str) and ("moe" in k.lower() or "expert" in k.lower())
                 for k, v in config.items())
    if switch or not all(named) or any(config[key] is not None for keys in named for key in keys):
        return
    for keys, (_, small) in zip(named, _MOE_WIDTHS):
        for key in keys:
            config[key] = small


# towers whose layer widths are planned from the patch, not named by a width key: the config class's model_type → the
# patch size the tiny tower gets. Inkling's vision tower is the one transformers has (plan_out_scales is defined and
# used only in models/inkling/modeling_inkling.py): InklingVisionModel.__init__ sizes its layers by `plan_out_scales(
# temporal_patch_size, patch_size, …)`, whose last stage is patch_size² · channels · temporal_patch_size · 64 wide
# (614,400 at the defaults' 40 × 40 × 2 patch: two 614,400² projections, 755 G parameters), and reads no hidden size;
# 2 is the smallest patch that still folds space (a 1,536-wide last stage)
_PLANNED_PATCH = {"inkling_vision": 2}


def _cut_planned_patches(config: dict[str, Any]) -> None:
    for value in config.values():
        if isinstance(value, dict):
            _cut_planned_patches(value)
    patch = _PLANNED_PATCH.get(config.get("model_type"))
    if patch and isinstance(config.get("patch_size"), int) and config["patch_size"] > patch:
        config["patch_size"] = patch
def _fit_token_ranges(before: dict[str, Any], after: dict[str, Any]) -> None:
    """A range of vocabulary ids that a codebook's codes map to (`<name>_token_offset` plus a sub-config's
    `codebook_size`: modeling_apertus1p5.Apertus1p5Model.get_image_tokens adds image_token_offset to each code) stays
    inside the shrunk vocabulary, the ranges in their order and adjacency (configuration_apertus1p5.Apertus1p5Config
    .validate_architecture: the image range ends where the audio range begins, the audio range inside the vocabulary):
    each codebook shrinks to CODEBOOK entries and the ranges start halfway up the shrunk vocabulary, the ids below
    staying text ids as they were. A range no sub-config's codebook fills is left as it was."""
    vocab_before, vocab_after = _text_vocab(before), _text_vocab(after)
    offsets = sorted((v, k) for k, v in before.items() if k.endswith("_token_offset") and _is_int(v))
    if not offsets or not vocab_before or not vocab_after:
        return
    books = {k: v["codebook_size"] for k, v in before.items() if isinstance(v, dict) and _is_int(v.get("codebook_size"))}
    start = vocab_after // 2
    for i, (offset, key) in enumerate(offsets):
        end = offsets[i + 1][0] if i + 1 < len(offsets) else vocab_before
        fits = [(size == end - offset, size, name) for name, size in books.items() if offset + size <= end]
        if not fits:
            continue
        adjacent, size, name = max(fits)
        after[key], after[name]["codebook_size"] = start, min(size, CODEBOOK)
        start += after[name]["codebook_size"] + (0 if adjacent else 1)
        del books[name]


def _text_vocab(config: dict[str, Any]) -> int | None:
    text = config.get("text_config") if isinstance(config.get("text_config"), dict) else config
    return text.get("vocab_size") if _is_int(text.get("vocab_size")) else None


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _shrink_nested(config: dict[str, Any]) -> dict[str, Any]:
    """shrink_config shrinks a config and the dicts it holds; the dicts those hold are shrunk here."""
    for value in config.values():
        if isinstance(value, dict):
            for key, inner in list(value.items()):
                if isinstance(inner, dict) and key != "per_layer_config":
                    value[key] = shrink_config(inner, max_length=MAX_LENGTH)
    return config
