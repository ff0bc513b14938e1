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
