"""A multimodal config whose decoder a family covers (gemma3's text_config) is estimated as its decoder alone; the
estimate says so in its warnings and its not-modelled list, since TRL loads and trains the whole model."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from hpcmem.cli import cli

transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")
pytestmark = pytest.mark.torch


def _estimate(folder) -> dict:
    res = CliRunner().invoke(cli, ["estimate", "sft", "--model_name_or_path", str(folder), "--gpu", "H100-80GB",
                                   "--json"])
    assert res.exit_code == 0, res.output
    return json.loads(res.output)


def test_gemma3_says_the_towers_are_not_counted(tmp_path):
    config = transformers.AutoConfig.for_model("gemma3")
    (tmp_path / "config.json").write_text(json.dumps(config.to_dict()))
    out = _estimate(tmp_path)
    assert any("multimodal config" in w and "vision" in w for w in out["warnings"]), out["warnings"]
    assert any("multimodal" in n for n in out["not_modelled"])
    # what the warning is about: the whole model TRL would load has more parameters than the estimate counts
    with torch.device("meta"):
        whole = transformers.AutoModelForImageTextToText.from_config(config)
    assert sum(p.numel() for p in whole.parameters()) > out["model"]["num_params"]


def test_a_text_model_has_no_such_note(tmp_path):
    config = transformers.AutoConfig.for_model("gemma3_text")
    (tmp_path / "config.json").write_text(json.dumps(config.to_dict()))
    out = _estimate(tmp_path)
    assert not any("multimodal" in w for w in out["warnings"] + out["not_modelled"])
