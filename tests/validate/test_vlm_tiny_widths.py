"""The tiny-model shrink keeps an adapter's input width equal to its own config's hidden size (the config classes'
validators require it: dots3_note's audio `adapter_input_size`), and leaves counts and picture sizes alone."""

from hpcmem.validate.vlm_tiny import _keep_equal_widths


def test_adapter_input_width_follows_its_own_hidden_size():
    before = {"hidden_size": 1280, "adapter_input_size": 1280, "image_size": 1280, "num_mel_bins": 128}
    after = {"hidden_size": 64, "adapter_input_size": 1280, "image_size": 1280, "num_mel_bins": 128}
    _keep_equal_widths(before, after, None, None)
    assert after == {"hidden_size": 64, "adapter_input_size": 64, "image_size": 1280, "num_mel_bins": 128}


def test_dots3_note_tiny_config_passes_its_validators():
    from transformers import Dots3NoteConfig

    from hpcmem.validate.vlm_tiny import tiny_config

    small = tiny_config("dots3_note")
    config = Dots3NoteConfig(**{k: v for k, v in small.items() if k != "model_type"})
    assert config.audio_config.adapter_input_size == config.audio_config.hidden_size == 64
