"""Gemma 3 (Gemma3ForConditionalGeneration: a SigLIP tower and projector beside its text decoder) is a vision-language
model hpcmem counts whole: a text-only job loads the tower too (TRL's create_model_from_path builds the config's
architecture), so the estimate counts the tower's and projector's weights and says they are unused; a text model has
no such note."""

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


def test_a_text_only_gemma3_job_counts_the_unused_tower(tmp_path):
    config = transformers.AutoConfig.for_model("gemma3")
    (tmp_path / "config.json").write_text(json.dumps(config.to_dict()))
    out = _estimate(tmp_path)
    assert any("text-only job" in w and "vision tower" in w for w in out["warnings"]), out["warnings"]
    assert not any("multimodal" in n for n in out["not_modelled"])
    # the whole model TRL loads: the language model the estimate's num_params counts, and the tower and projector
    with torch.device("meta"):
        whole = transformers.AutoModelForImageTextToText.from_config(config)
    vision = out["vision"]
    assert vision["trained"] == "no images: unused"
    assert sum(p.numel() for p in whole.parameters()) == (out["model"]["num_params"] + vision["tower_params"]
                                                          + vision["merger_params"])


def test_a_text_model_has_no_such_note(tmp_path):
    config = transformers.AutoConfig.for_model("gemma3_text")
    (tmp_path / "config.json").write_text(json.dumps(config.to_dict()))
    out = _estimate(tmp_path)
    assert not any("multimodal" in w for w in out["warnings"] + out["not_modelled"])
