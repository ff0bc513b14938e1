"""What the image-text tests of a cut config ask of it the same way: the real processor on one blank image, and the
refusal of a cut whose text config has no learned profile (the types whose decoder is learned)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def processed_one_image(job: Any, height: int, width: int) -> tuple[Any, Any, Any, Any]:
    """(the processor's output, its input_ids row, hpcmem's image geometry, the processor) for one blank
    width × height image before a word, through the processor the trace runs (hpcmem.trace.vision `processor`)."""
    from PIL import Image

    from hpcmem.job.images import image_geometry
    from hpcmem.trace.vision import processor

    proc = processor(job)
    out = proc(text=[proc.image_token + " t3"], images=[[Image.new("RGB", (width, height))]], return_tensors="pt")
    return out, out["input_ids"][0], image_geometry(job.train, job.model.vision), proc


def assert_processor_geometry(cut: Path, height: int, width: int, processor_class: str,
                              patch_columns: bool = False) -> Any:
    """The cut's processor (of class `processor_class` or a subclass) on one blank width × height image: its
    image_grid_thw, pixel rows and image tokens equal hpcmem.job.images' geometry (`patch_columns`: pixel_values is
    [patches, the spec's patch_dim], a Qwen-style processor's flattened patches). Returns the processor."""
    from hpcmem.validate.cases import case_job

    job = case_job({"trainer": "sft", "model_name_or_path": str(cut), "max_length": 8192, "images_per_example": 1,
                    "image_height": height, "image_width": width, "dtype": "bfloat16", "bf16": True})
    out, ids, g, proc = processed_one_image(job, height, width)
    assert processor_class in [c.__name__ for c in type(proc).__mro__]
    assert tuple(out["image_grid_thw"][0].tolist()) == g.grid_thw
    assert out["pixel_values"].shape[0] == g.patches
    if patch_columns:
        assert tuple(out["pixel_values"].shape) == (g.patches, job.model.vision.patch_dim)
    assert int((ids == proc.image_token_id).sum()) == g.tokens
    return proc


def assert_refused_without_text_profile(cut: Path, tmp_path: Path, **text_config: Any) -> None:
    """The cut with `text_config` changed (a depth no profile was learned for) is refused in one line naming it."""
    import pytest

    from hpcmem.errors import SpecError
    from hpcmem.models.resolve import resolve_model

    cfg = json.loads(cut.read_text())
    cfg["text_config"].update(text_config)
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(SpecError, match="no learned profile of its text config"):
        resolve_model(str(tmp_path / "config.json"))
