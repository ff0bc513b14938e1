"""`dtype auto` on a local checkpoint whose config.json names no dtype: transformers 5.24 loads the dtype of the
checkpoint's first floating-point tensor (modeling_utils.py `_get_dtype`), and hpcmem reads it from the safetensors
header. The expected bytes are those of the model transformers itself loads with dtype="auto"; the files are written
by the `safetensors` library and by transformers' save_pretrained, not by hpcmem."""

import json

from click.testing import CliRunner

from hpcmem.cli import cli, run
from tests.helpers.light_install import run_json_without
from tests.cli.test_cli_hostile import _refused, _tiny_qwen


def _estimate(folder):
    res = CliRunner().invoke(cli, ["estimate", "sft", "--model_name_or_path", str(folder), "--dtype", "auto",
                                   "--json"])
    assert res.exit_code == 0, res.output
    return json.loads(res.output)


def _saved(folder, dtype, **save):
    """A tiny Qwen2 saved by save_pretrained in `dtype`, its config.json then stripped of every dtype key."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    _tiny_qwen(folder)
    model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(folder), dtype=getattr(torch, dtype))
    model.save_pretrained(folder, **save)
    cfg = {k: v for k, v in json.loads((folder / "config.json").read_text()).items()
           if k not in ("dtype", "torch_dtype")}
    (folder / "config.json").write_text(json.dumps(cfg))
    return folder


def _loaded_weight_bytes(folder):
    from transformers import AutoModelForCausalLM

    loaded = AutoModelForCausalLM.from_pretrained(folder, dtype="auto")
    return sum(p.numel() * p.element_size() for p in loaded.parameters())


def test_dtype_auto_reads_the_checkpoints_dtype_when_config_json_names_none(tmp_path):
    for dtype in ("float32", "bfloat16"):
        folder = _saved(tmp_path / dtype, dtype)
        assert (folder / "model.safetensors").is_file()
        out = _estimate(folder)
        assert out["per_gpu"]["components"]["weights"] == _loaded_weight_bytes(folder), dtype
        assert not [w for w in out["warnings"] if "dtype auto" in w], out["warnings"]
        assert f"dtype auto ({dtype} from model.safetensors)" in out["summary"], out["summary"]


def test_the_first_floating_tensor_is_taken_in_name_order_not_header_order(tmp_path):
    """safetensors writes the header largest dtype first; transformers walks `safe_open(...).keys()`, the names sorted:
    with the embedding (the first name) in bfloat16 and every other tensor in float32, the model loads in bfloat16."""
    import torch
    from safetensors.torch import load_file, save_file

    folder = _saved(tmp_path / "m", "float32")
    tensors = load_file(folder / "model.safetensors")
    first = sorted(tensors)[0]
    tensors[first] = tensors[first].to(torch.bfloat16)
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})
    raw = (folder / "model.safetensors").read_bytes()
    header = json.loads(raw[8:8 + int.from_bytes(raw[:8], "little")])
    in_header_order = [v["dtype"] for k, v in header.items() if k != "__metadata__"]
    assert in_header_order[0] == "F32"       # the trap: the header starts with a float32 tensor
    out = _estimate(folder)
    assert out["per_gpu"]["components"]["weights"] == _loaded_weight_bytes(folder)
    assert out["per_gpu"]["components"]["weights"] == out["model"]["num_params"] * 2       # bfloat16 (hand count)


def test_a_sharded_checkpoint_is_read_from_its_first_shard(tmp_path):
    folder = _saved(tmp_path / "m", "float32", max_shard_size="20KB")
    assert (folder / "model.safetensors.index.json").is_file() and not (folder / "model.safetensors").exists()
    out = _estimate(folder)
    assert out["per_gpu"]["components"]["weights"] == _loaded_weight_bytes(folder)


def test_the_checkpoint_dtype_is_read_without_torch(tmp_path):
    """The light install: torch, transformers, trl, safetensors and numpy are blocked in the subprocess; a float32
    checkpoint holds 4 bytes per weight (hand count)."""
    folder = _saved(tmp_path / "m", "float32")
    out = run_json_without(["estimate", "sft", "--model_name_or_path", str(folder), "--dtype", "auto", "--json"],
                           ("torch", "transformers", "trl", "safetensors", "numpy"))
    assert not [w for w in out["warnings"] if "dtype auto" in w], out["warnings"]
    assert out["per_gpu"]["components"]["weights"] == out["model"]["num_params"] * 4


def test_a_float64_checkpoint_is_refused_and_a_broken_header_is_said_so(tmp_path, capsys):
    folder = _saved(tmp_path / "f64", "float64")
    _refused(capsys, ["estimate", "sft", "--model_name_or_path", str(folder), "--dtype", "auto"], "float64",
             "model.safetensors", "dtype auto")
    assert run(["estimate", "sft", "--model_name_or_path", str(folder), "--dtype", "bfloat16"]) == 0
    broken = _tiny_qwen(tmp_path / "broken")
    (broken / "model.safetensors").write_bytes((2 ** 40).to_bytes(8, "little") + b"{}")
    out = _estimate(broken)
    warned = [w for w in out["warnings"] if "dtype auto" in w]
    assert warned and "could not read" in warned[0] and "header length" in warned[0], warned
    assert out["per_gpu"]["components"]["weights"] == out["model"]["num_params"] * 2
