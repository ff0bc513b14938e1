"""TRL's fused LM head on a tiny image-text model given image inputs: the call TRL's SFTTrainer makes for every step
(trl/trainer/sft_trainer.py `SFTTrainer.compute_loss`: `model(**inputs, fused_lm_head=True)`, the labels among the
inputs) after `add_fused_lm_head` (trl/trainer/utils.py), with the inputs the type's forward takes for one image.

    rec = image_call("blip-2")      # {"ran": False, "reason": "AttributeError: …", "raised_in": "trl/utils.py:…"}

For the types whose forward will not run on text rows alone (hpcmem.validate.vlm_trainable): it needs pixel values,
query ids or boxes before TRL's head is reached. The inputs are made from the tiny config (hpcmem.validate.vlm_tiny),
not by the type's processor, in the shapes the forward's docstring names (`IMAGE_INPUTS`); what this shows is where
TRL's head raises once the forward has what it needs, not what the processor would make of a real image.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from hpcmem.validate.trl_run import build_model, kept_autocast, one_line, raised_in_frames
from hpcmem.validate.vlm_tiny import tiny_config

TEXT_TOKENS = 16
IMAGE_TOKEN_ID = 100      # an id inside the shrunk vocabulary, set as the config's image token where it has one


def _pixels(config: dict[str, Any], *, frames: int = 0) -> Any:
    """[1, channels, size, size] at the tower's (or the config's own) image_size; with `frames`, [1, frames, …]."""
    import torch

    tower = config.get("vision_config") or config.get("encoder") or config
    size = tower.get("image_size", 224)
    size = size if isinstance(size, int) else size[0]
    pixels = torch.randn(1, tower.get("num_channels", 3), size, size)
    return pixels.unsqueeze(1).repeat(1, frames, 1, 1, 1) if frames else pixels


def _ids(n: int, *, image: int = 0) -> Any:
    """[1, n] text ids, after `image` image-token ids."""
    import torch

    return torch.cat([torch.full((1, image), IMAGE_TOKEN_ID), torch.randint(3, 60, (1, n))], dim=1)


def _text(ids: Any) -> dict[str, Any]:
    import torch

    return {"input_ids": ids, "attention_mask": torch.ones_like(ids)}


def _queries(config: dict[str, Any], frames: int = 0) -> dict[str, Any]:
    """BLIP-2 / InstructBLIP (modeling_blip_2.py `Blip2ForConditionalGeneration.forward`, modeling_instructblip*.py):
    pixel_values, and num_query_tokens image-token ids in input_ids where the Q-Former's outputs are scattered
    (`get_placeholder_mask`); InstructBLIP also takes the instruction as qformer_input_ids."""
    ids = _ids(TEXT_TOKENS, image=config["num_query_tokens"] * max(frames, 1))
    out = {**_text(ids), "pixel_values": _pixels(config, frames=frames)}
    if config["model_type"].startswith("instructblip"):
        out.update(qformer_input_ids=_ids(TEXT_TOKENS), qformer_attention_mask=_text(_ids(TEXT_TOKENS))["attention_mask"])
    return out


def _kosmos2(config: dict[str, Any]) -> dict[str, Any]:
    """Kosmos-2 (modeling_kosmos2.py `Kosmos2ForConditionalGeneration.forward`): pixel_values and
    image_embeds_position_mask marking latent_query_num positions for the image features."""
    import torch

    n = config["latent_query_num"]
    ids = _ids(TEXT_TOKENS + n)
    mask = torch.zeros_like(ids, dtype=torch.bool)
    mask[0, 1:1 + n] = True
    return {**_text(ids), "pixel_values": _pixels(config), "image_embeds_position_mask": mask}


def _pix2struct(config: dict[str, Any]) -> dict[str, Any]:
    """Pix2Struct (modeling_pix2struct.py `Pix2StructForConditionalGeneration.forward`): flattened_patches
    [1, patches, 2 + patch_embed_hidden_size] (row and column index first, from 1) and their mask; no input_ids (its
    text is the decoder's)."""
    import torch

    n = 8
    patches = torch.randn(1, n, 2 + config["vision_config"]["patch_embed_hidden_size"])
    patches[..., 0], patches[..., 1] = 1, torch.arange(1, n + 1)
    return {"flattened_patches": patches, "attention_mask": torch.ones(1, n)}


def _udop(config: dict[str, Any]) -> dict[str, Any]:
    """UDOP (modeling_udop.py `UdopForConditionalGeneration.forward`): input_ids, a bounding box per token, the page's
    pixel_values at the config's image_size."""
    import torch

    ids = _ids(TEXT_TOKENS)
    return {**_text(ids), "bbox": torch.zeros(1, ids.shape[1], 4, dtype=torch.long), "pixel_values": _pixels(config)}


def _idefics(config: dict[str, Any]) -> dict[str, Any]:
    """IDEFICS (modeling_idefics.py `IdeficsForVisionText2Text.forward`): pixel_values [1, images, channels, size,
    size] and image_attention_mask [1, tokens, images] (which text tokens attend to which image)."""
    import torch

    ids = _ids(TEXT_TOKENS)
    return {**_text(ids), "pixel_values": _pixels(config).unsqueeze(1),
            "image_attention_mask": torch.ones(1, ids.shape[1], 1, dtype=torch.long)}


IMAGE_INPUTS: dict[str, Callable[[dict[str, Any]], dict[str, Any]]] = {
    "blip": lambda c: {**_text(_ids(TEXT_TOKENS)), "pixel_values": _pixels(c)},
    "blip-2": _queries,
    "instructblip": _queries,
    "instructblipvideo": lambda c: _queries(c, frames=4),
    "kosmos-2": _kosmos2,
    "pix2struct": _pix2struct,
    "udop": _udop,
    "idefics": _idefics,
    # PP-FormulaNet (modeling_pp_formulanet.py `PPFormulaNetForConditionalGeneration.forward`): the page's pixel_values
    "pp_formulanet": lambda c: {**_text(_ids(TEXT_TOKENS)), "pixel_values": _pixels(c)},
    "vision-encoder-decoder": lambda c: {**_text(_ids(TEXT_TOKENS)), "pixel_values": _pixels(c)},
}
# the config keys that name where image features go (a shrunk default config leaves them None)
_IMAGE_TOKEN_KEYS = ("image_token_index", "video_token_index")


def image_call(model_type: str) -> dict[str, Any]:
    """{"ran", "reason", "raised_in"} of TRL's fused-head call on a tiny `model_type` with `IMAGE_INPUTS`. Raises
    KeyError for a type without image inputs here."""
    from trl.trainer.utils import add_fused_lm_head

    make = IMAGE_INPUTS[model_type]
    config = tiny_config(model_type)
    for key in _IMAGE_TOKEN_KEYS:
        if key in config:
            config[key] = IMAGE_TOKEN_ID
    model = build_model(config, image_text=True)
    add_fused_lm_head(model)
    inputs = make(config)
    labels = inputs.get("input_ids", _ids(TEXT_TOKENS)).clone()
    try:
        with kept_autocast():
            model(**inputs, labels=labels, fused_lm_head=True)
    except Exception as exc:  # noqa: BLE001 — the verdict: TRL's head (or the model under it) raised
        return {"ran": False, "reason": f"{type(exc).__name__}: {one_line(exc)}", "raised_in": raised_in_frames(exc)}
    return {"ran": True, "reason": "", "raised_in": ""}
