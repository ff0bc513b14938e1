"""A tiny model of an image-text type: its config class's defaults (transformers' own choice of an example
checkpoint), every width at every level of nesting shrunk by hpcmem.validate.shrink, the depth kept (layer-type lists
and per-layer tables stay consistent), and what the config classes' validators require kept consistent: widths that
equalled the text decoder's hidden size or their own config's stay equal, multimodal RoPE sections sum to the shrunk
head width, and a tokenizer vocabulary the model reads its image token from is given where the defaults leave none.

    config = tiny_config("blip-2")      # a config.json dict; hpcmem.validate.trl_run builds and saves it
"""

from __future__ import annotations

from typing import Any

from hpcmem.validate.shrink import shrink_config

MAX_LENGTH = 32


def tiny_config(model_type: str) -> dict[str, Any]:
    """The type's config class defaults, every width shrunk at every level of nesting (text_config, vision_config,
    an encoder-decoder's encoder and decoder and theirs)."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    config = CONFIG_MAPPING[model_type]().to_dict()
    small = _shrink_nested(shrink_config(config, max_length=MAX_LENGTH))
    _keep_equal_widths(config, small, _text_hidden(config), _text_hidden(small))
    _fit_rope_sections(small)
    _give_vocabulary_map(small)
    return small


def _text_hidden(config: dict[str, Any]) -> int | None:
    text = config.get("text_config") if isinstance(config.get("text_config"), dict) else config
    value = next((text[k] for k in ("hidden_size", "d_model") if isinstance(text.get(k), int)), None)
    return value


def _keep_equal_widths(before: dict[str, Any], after: dict[str, Any], text_before: int | None,
                       text_after: int | None) -> None:
    """A width that equalled the text decoder's hidden size (a tower's output, an audio encoder's, a codebook) or its
    own config's hidden size still equals it, as the config classes' validators require; attention heads the shrink
    does not name (an audio encoder's `encoder_attention_heads`) go to 4, so the shrunk width divides."""
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
        elif isinstance(own_before, int) and isinstance(own_after, int) and value == own_before and "dim" in key:
            after[key] = own_after
        elif key.endswith("attention_heads") and value > 4 and own_after != own_before:
            after[key] = 4


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


def _give_vocabulary_map(config: dict[str, Any]) -> None:
    """A config holding a copy of the tokenizer's vocabulary (`vocabulary_map`: Chameleon's, Emu3's) that its
    defaults leave None cannot build: the model reads its image token's id from it at construction
    (transformers/models/emu3/modeling_emu3.py `Emu3ImageVocabularyMapping.__init__`, chameleon's alike). It gets
    `<image>` at the shrunk text vocabulary's last id, and `image_token_id` follows, as the config's __post_init__
    derives it."""
    if "vocabulary_map" not in config or config["vocabulary_map"] is not None:
        return
    text = config.get("text_config") if isinstance(config.get("text_config"), dict) else config
    if isinstance(text.get("vocab_size"), int):
        config["vocabulary_map"] = {"<image>": text["vocab_size"] - 1}
        config["image_token_id"] = text["vocab_size"] - 1


def _shrink_nested(config: dict[str, Any]) -> dict[str, Any]:
    """shrink_config shrinks a config and the dicts it holds; the dicts those hold are shrunk here."""
    for value in config.values():
        if isinstance(value, dict):
            for key, inner in list(value.items()):
                if isinstance(inner, dict) and key != "per_layer_config":
                    value[key] = shrink_config(inner, max_length=MAX_LENGTH)
    return config
