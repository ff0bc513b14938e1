"""The tiny models the trainability record builds (hpcmem.validate.vlm_tiny): a config that reads its image token from
a copy of the tokenizer's vocabulary its defaults leave None (Emu3's, Chameleon's `vocabulary_map`) is given one, and
the real class builds from the shrunk dict."""

from __future__ import annotations

import pytest

pytest.importorskip("transformers")

from hpcmem.validate.vlm_tiny import tiny_config  # noqa: E402

pytestmark = [pytest.mark.torch]


@pytest.mark.parametrize("model_type", ["emu3", "chameleon"])
def test_a_vocabulary_map_the_defaults_leave_none_is_given(model_type: str) -> None:
    import torch
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    from hpcmem.validate.trl_run import build_model

    assert CONFIG_MAPPING[model_type]().vocabulary_map is None
    config = tiny_config(model_type)
    vocab = (config.get("text_config") or config)["vocab_size"]
    assert config["vocabulary_map"] == {"<image>": vocab - 1}   # the shrunk vocabulary (512 ids) holds it
    with torch.device("meta"):
        model = build_model(config, image_text=True)
    assert model.config.image_token_id == vocab - 1


def test_a_config_without_a_vocabulary_map_is_left_alone() -> None:
    assert "vocabulary_map" not in tiny_config("llava")
