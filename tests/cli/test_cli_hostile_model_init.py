"""How a TRL YAML names the load dtype and attention, as `trl <trainer>` reads it: TRL's own TrlParser (the parser of
trl/scripts/sft.py `make_parser`) is the oracle for the top-level keys; for model_init_kwargs the expected values are
worked out by hand from the scripts' `main` (quoted in each test)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from hpcmem.errors import SpecError
from hpcmem.job.trl_config import build_job

ROOT = Path(__file__).resolve().parents[2]
BASE = {"model_name_or_path": "Qwen/Qwen2.5-0.5B", "gpu": "H100-80GB"}


def test_torch_dtype_is_not_read_as_dtype_because_trl_does_not(tmp_path):
    pytest.importorskip("trl")
    from trl.scripts.sft import make_parser

    path = tmp_path / "old.yaml"
    path.write_text(yaml.safe_dump({"torch_dtype": "bfloat16", "output_dir": str(tmp_path / "out")}))
    *dataclasses, config_remaining, _ = make_parser().parse_args_and_config(
        ["--config", str(path), "--dataset_name", "x", "--use_cpu", "true", "--bf16", "false"],
        return_remaining_strings=True, separate_remaining_strings=True)
    model_args = next(d for d in dataclasses if type(d).__name__ == "ModelConfig")
    assert model_args.dtype == "float32" and config_remaining == ["--torch_dtype", "bfloat16"]   # not a field
    with pytest.raises(SpecError, match="torch_dtype .*write dtype"):
        build_job("sft", {**BASE, "torch_dtype": "bfloat16"})


def test_model_init_kwargs_dtype_and_attention_win_over_model_config():
    # trl/scripts/sft.py main: model_init_kwargs = dict(..., attn_implementation=model_args.attn_implementation,
    # dtype=model_args.dtype); model_init_kwargs.update(training_args.model_init_kwargs) → the YAML's
    # model_init_kwargs {dtype: float32, attn_implementation: eager} replaces dtype bfloat16 and sdpa.
    job, _ = build_job("sft", {**BASE, "dtype": "bfloat16", "attn_implementation": "sdpa",
                               "model_init_kwargs": {"dtype": "float32", "attn_implementation": "eager"}})
    assert (job.train.dtype, job.train.attn_implementation) == ("float32", "eager")


@pytest.mark.parametrize("kwargs, named", [({"torch_dtype": "bfloat16"}, "model_init_kwargs.torch_dtype="),
                                           ({"device_map": "auto"}, "model_init_kwargs.device_map="),
                                           ({"dtype": "bfloat16", "foo": 1}, "model_init_kwargs.foo=1")])
def test_model_init_kwargs_hpcmem_does_not_read_are_refused_in_one_line(kwargs, named, tmp_path):
    path = tmp_path / "sft.yaml"
    path.write_text(yaml.safe_dump({**BASE, "model_init_kwargs": kwargs}))
    done = subprocess.run([sys.executable, "-m", "hpcmem", "estimate", "sft", "--config", str(path)], cwd=ROOT,
                          capture_output=True, text=True, timeout=120, env={"PYTHONPATH": str(ROOT),
                                                                            "HF_HUB_OFFLINE": "1", "PATH": "/usr/bin"})
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.count("\n") == 1 and named in done.stderr and "Traceback" not in done.stderr


def test_model_init_kwargs_that_only_choose_the_checkpoint_pass():
    job, ignored = build_job("sft", {**BASE, "model_init_kwargs": {"revision": "main", "trust_remote_code": False,
                                                                   "dtype": "bfloat16"}})
    assert job.train.dtype == "bfloat16"
