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


def peft_all_linear_targets(model: Any) -> set[str]:
    """The module names peft's "all-linear" resolves to on `model` (peft/tuners/tuners_utils.py
    `_maybe_include_all_linear_layers`: every nn.Linear but the output embedding), what the vision tests hold
    hpcmem's adapted linears to."""
    from peft import LoraConfig
    from peft.tuners.tuners_utils import _maybe_include_all_linear_layers

    return _maybe_include_all_linear_layers(LoraConfig(target_modules="all-linear"), model).target_modules


def meta_part_counts(model: Any, *, tower: str = ".vision_tower.", merger: str = ".multi_modal_projector.") -> dict:
    """Parameters of a meta model by part: the projector's (names holding `merger`), the tower's (`tower`), the
    language model's (the rest)."""
    count = {"tower": 0, "merger": 0, "language": 0}
    for name, p in model.named_parameters():
        count["merger" if merger in name else "tower" if tower in name else "language"] += p.numel()
    return count


def assert_tower_and_projector_match(cut: Any, class_name: str, *, projector: str = "multi_modal_projector",
                                     tower: str = "vision_tower", layers: str = "encoder.layers") -> tuple[Any, Any]:
    """The meta model transformers builds from the cut config file `cut` is `class_name`, and its tower, projector
    and language parts' parameters and its tower's and projector's nn.Linear layers (`.<tower>.<layers>`,
    `.<projector>.`; a linear of any other part named below `<tower>.`, as Gemma 4's patch embedder) are those
    hpcmem's spec counts (GLM-4.1V: tower `visual`, layers `blocks`, projector `visual.merger`). Returns (meta model,
    spec)."""
    import json

    import torch

    from hpcmem.models.resolve import resolve_model

    model = meta_image_text_model(json.loads(cut.read_text()))
    spec = resolve_model(str(cut))
    assert type(model).__name__ == class_name
    ours = {"tower": spec.vision.tower_params, "merger": spec.vision.merger_params, "language": spec.num_params}
    assert meta_part_counts(model, tower=f".{tower}.", merger=f".{projector}.") == ours
    linears = {n.split("model.", 1)[1] for n, m in model.named_modules()
               if isinstance(m, torch.nn.Linear) and (f".{tower}." in n or f".{projector}." in n)}
    mine = {f"{tower}.{layers}.{i}.{x.name}" for x in spec.vision.linears()
            if x.part == "tower" for i in range(x.count)}
    mine |= {f"{projector}.{x.name}" for x in spec.vision.linears() if x.part == "merger"}
    mine |= {f"{tower}.{x.name}" for x in spec.vision.linears() if x.part not in ("tower", "merger")}
    assert linears == mine
    return model, spec
