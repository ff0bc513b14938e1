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
