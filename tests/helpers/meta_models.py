"""A vision-language model built from its config dict on the meta device, as `AutoModelForImageTextToText` builds it
(what TRL loads for image-text fine-tuning): the parameter counts the vision tests hold hpcmem's to."""

from __future__ import annotations

from typing import Any


def meta_image_text_model(cfg: dict[str, Any]) -> Any:
    import torch
    import transformers

    data = {k: v for k, v in cfg.items() if k not in ("architectures", "torch_dtype", "transformers_version")}
    config = transformers.AutoConfig.for_model(data.pop("model_type"), **data)
    with torch.device("meta"):
        return transformers.AutoModelForImageTextToText.from_config(config)


def meta_part_counts(model: Any, *, tower: str = ".vision_tower.", merger: str = ".multi_modal_projector.") -> dict:
    """Parameters of a meta model by part: the projector's (names holding `merger`), the tower's (`tower`), the
    language model's (the rest)."""
    count = {"tower": 0, "merger": 0, "language": 0}
    for name, p in model.named_parameters():
        count["merger" if merger in name else "tower" if tower in name else "language"] += p.numel()
    return count
