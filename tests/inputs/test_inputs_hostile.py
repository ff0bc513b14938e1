"""One reproducer per class of hostile input that once ended in an internal error (exit 70) or was read wrongly:
each now gets exit 2 and one line naming the field, the value and the rule — or the right answer."""

from __future__ import annotations

import json
import struct

import pytest
import yaml

from hpcmem.cli import run

SMALL = ["--model_name_or_path", "Qwen/Qwen2.5-0.5B"]


def refused(capsys, argv, *words) -> str:
    capsys.readouterr()
    status = run(argv)
    err = capsys.readouterr().err.strip()
    assert status == 2, (status, err)
    assert err.startswith("hpcmem: error: ") and "\n" not in err, err
    for word in words:
        assert word in err, (word, err)
    return err


def test_a_json_flag_nested_deeper_than_any_config_is_refused(capsys):
    deep = '{"a":' * 2000 + "1" + "}" * 2000
    refused(capsys, ["estimate", "sft", *SMALL, "--gradient_checkpointing_kwargs", deep],
            "--gradient_checkpointing_kwargs", "nested too deeply")


@pytest.mark.parametrize("where", ["trl yaml", "accelerate yaml", "preset", "config.json"])
def test_an_integer_of_thousands_of_digits_in_any_input_file_is_refused(where, tmp_path, capsys):
    """Python refuses int() of over 4,300 digits with a ValueError (sys.int_info): hpcmem refuses at 64, naming the
    file (YAML) or the field (JSON)."""
    huge = "9" * 5000
    if where == "trl yaml":
        (tmp_path / "c.yaml").write_text(f"model_name_or_path: Qwen/Qwen2.5-0.5B\nmax_length: {huge}\n")
        refused(capsys, ["estimate", "sft", "--config", str(tmp_path / "c.yaml")], "c.yaml", "5,000 digits", "line 2")
    elif where == "accelerate yaml":
        (tmp_path / "a.yaml").write_text(f"distributed_type: MULTI_GPU\nnum_processes: {huge}\n")
        refused(capsys, ["estimate", "sft", *SMALL, "--accelerate_config", str(tmp_path / "a.yaml")], "5,000 digits")
    elif where == "preset":
        (tmp_path / "p.yaml").write_text(f"partition: gpu\ngpu: H100-80GB\ngpus_per_node: {huge}\ncpus_per_node: 8\n"
                                         "max_time: '1:00:00'\n")
        refused(capsys, ["presets", "show", str(tmp_path / "p.yaml")], "5,000 digits")
    else:
        cfg = json.loads(json.dumps({"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2,
                                     "num_attention_heads": 4, "intermediate_size": 128, "vocab_size": 100}))
        text = json.dumps(cfg).replace('"vocab_size": 100', f'"vocab_size": {huge}')
        (tmp_path / "config.json").write_text(text)
        refused(capsys, ["estimate", "sft", "--model_name_or_path", str(tmp_path / "config.json")], "5,000 digits")


def _model_folder(tmp_path):
    cfg = {"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
           "num_key_value_heads": 4, "intermediate_size": 128, "vocab_size": 100, "torch_dtype": "bfloat16"}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    return tmp_path


@pytest.mark.parametrize("dtype", [[], ["--dtype", "auto"]])
def test_a_safetensors_header_nested_deep_is_not_an_internal_error(dtype, tmp_path, capsys):
    folder = _model_folder(tmp_path)
    header = ('{"a":' * 3000 + "1" + "}" * 3000).encode()
    (folder / "model.safetensors").write_bytes(struct.pack("<Q", len(header)) + header)
    status = run(["estimate", "sft", "--model_name_or_path", str(folder), *dtype])
    assert status in (0, 2) and "internal error" not in capsys.readouterr().err


def test_a_nul_byte_in_a_shard_name_is_not_an_internal_error(tmp_path, capsys):
    folder = _model_folder(tmp_path)
    (folder / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"w": "shard\u0000.safetensors"}}))
    assert run(["estimate", "sft", "--model_name_or_path", str(folder), "--dtype", "auto"]) == 0
    out = capsys.readouterr()
    assert "internal error" not in out.err and "dtype auto" in out.out


def test_a_trl_yaml_written_for_an_older_trl_is_refused_naming_the_new_field(tmp_path, capsys):
    path = tmp_path / "typo.yaml"
    path.write_text("model_name_or_path: Qwen/Qwen2.5-7B\nmax_seq_length: 2048\ngpu: H100-80GB\n")
    refused(capsys, ["estimate", "sft", "--config", str(path)], "max_seq_length", "write max_length")


def test_an_accelerate_key_misspelt_is_refused_as_accelerate_refuses_it(tmp_path, capsys):
    path = tmp_path / "typo-acc.yaml"
    path.write_text(yaml.safe_dump({"distributed_type": "DEEPSPEED", "num_proceses": 8,
                                    "deepspeed_config": {"zero_stage": 3}}))
    refused(capsys, ["estimate", "sft", *SMALL, "--accelerate_config", str(path)], "num_proceses",
            "did you mean num_processes")


def _preset(tmp_path, **over):
    doc = {"partition": "gpu", "gpu": "H100-80GB", "gpus_per_node": 8, "cpus_per_node": 32, "max_time": "12:00:00",
           **over}
    path = tmp_path / "site.yaml"
    path.write_text(yaml.safe_dump(doc, allow_unicode=True))
    return str(path)


def test_a_preset_is_held_to_what_a_partition_can_be(tmp_path, capsys):
    refused(capsys, ["presets", "show", _preset(tmp_path, gpus_per_node=1_000_000_000)], "gpus_per_node", "1..64")
    refused(capsys, ["presets", "show", _preset(tmp_path, defaults={"max_length": -1})], "max_length", "≥ 1")
    refused(capsys, ["presets", "show", _preset(tmp_path, partition="gpu\u202e")], "partition", "U+202E")
