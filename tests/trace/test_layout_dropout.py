"""Whether a learned type's model holds dropout that TRL turns off: the layout built on the meta device says so
(hpcmem.trace.layer_map `active_dropout`), and TRL's own `disable_dropout_in_model` takes it away."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytestmark = pytest.mark.torch
pytest.importorskip("transformers")
trl_utils = pytest.importorskip("trl.trainer.utils")

from hpcmem.trace.layer_map import active_dropout, build_meta, layout  # noqa: E402

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "tiny-configs.json"


def tiny(model_type: str) -> dict:
    return json.loads(FIXTURES.read_text())[model_type]


def test_gpt2_holds_dropout_that_trl_disables_and_llama_holds_none():
    cfg = tiny("gpt2")
    assert cfg["attn_pdrop"] > 0 and layout(cfg).dropout
    model = build_meta(cfg)
    trl_utils.disable_dropout_in_model(model)
    assert not active_dropout(model)
    assert not layout(tiny("llama")).dropout
