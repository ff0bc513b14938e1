"""A config.json whose fully rotated head is odd is refused, exactly where transformers refuses to build the config
(RoPE rotates pairs of dimensions): the installed transformers' own config validation is the oracle."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import hpcmem
from hpcmem.errors import SpecError
from hpcmem.models.config import model_spec_from_config

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.torch

QWEN = json.loads((Path(hpcmem.__file__).parent / "models" / "catalog" / "Qwen--Qwen2.5-0.5B.json").read_text())


def transformers_refuses(cfg: dict) -> bool:
    try:
        transformers.AutoConfig.for_model(**cfg)
    except Exception as exc:    # huggingface_hub's StrictDataclassClassValidationError wrapping the ValueError
        assert "RoPE requires an even rotary dimension" in str(exc)
        return True
    return False


@pytest.mark.parametrize("change", [{"head_dim": 7}, {"head_dim": 8}, {"head_dim": 3},
                                    {"head_dim": 7, "rope_parameters": {"rope_type": "default", "rope_theta": 1e6,
                                                                         "partial_rotary_factor": 0.5}}])
def test_an_odd_rotary_head_is_refused_where_transformers_refuses_it(change):
    cfg = {**QWEN["config"], **change}
    refused = transformers_refuses(cfg)
    try:
        model_spec_from_config(cfg, "odd")
        assert not refused
    except SpecError as exc:
        assert refused and "head_dim" in str(exc)
    assert refused == (change == {"head_dim": 7})      # the one case: odd, wider than 4, fully rotated
