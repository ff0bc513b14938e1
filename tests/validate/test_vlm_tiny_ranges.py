"""A tiny config keeps the ranges of vocabulary ids a codebook's codes map to inside the shrunk vocabulary: Apertus
1.5's image codes start at image_token_offset and end where the audio codes start, whose range ends inside the
vocabulary (configuration_apertus1p5.Apertus1p5Config.validate_architecture); the full defaults' layout is
131272 + 131072 = 262344, 262344 + 4096 = 266440 <= 266752."""

from __future__ import annotations

import pytest

pytest.importorskip("transformers")

from hpcmem.validate.vlm_tiny import tiny_config  # noqa: E402


def test_the_codebook_ranges_fit_the_shrunk_vocabulary_in_order():
    small = tiny_config("apertus1p5")
    # by hand: 512 ids, the ranges from 512 // 2 = 256, each codebook cut to 64 entries, adjacent as before
    assert small["text_config"]["vocab_size"] == 512
    assert (small["image_token_offset"], small["vision_config"]["codebook_size"]) == (256, 64)
    assert (small["audio_token_offset"], small["audio_config"]["codebook_size"]) == (320, 64)


def test_the_config_class_takes_the_tiny_config():
    from transformers import Apertus1p5Config

    config = Apertus1p5Config(**tiny_config("apertus1p5"))
    assert config.audio_token_offset + config.audio_config.codebook_size <= config.text_config.vocab_size


def test_a_config_without_token_ranges_is_left_as_it_was():
    small = tiny_config("llava")
    assert not any(k.endswith("_token_offset") for k in small)
    assert "codebook_size" not in small.get("vision_config", {})
