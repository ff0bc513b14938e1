"""Full fine-tuning with reentrant checkpointing on a type whose rotary embedding trains (hpcmem.job.reentrant_rules):
refused, as the real code fails it.

Known answers: the trace of the real transformers/TRL code (on fake tensors) raising torch's own error for the job
hpcmem refuses and running the jobs it lets through, and a scan of transformers' modeling files for rotary
embeddings that create an nn.Parameter."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

from hpcmem.job.reentrant_rules import TRAINABLE_ROTARY
from tests.helpers.cli_main import run_main

# the shipped profile's config (hpcmem/profiles/mistral_large4_text-*.json): the class defaults at 2 layers
CONFIG = {"model_type": "mistral_large4_text", "num_hidden_layers": 2, "tie_word_embeddings": False}


def _config(tmp_path: Path) -> str:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(CONFIG))
    return str(path)


def _args(path: str, reentrant: bool, *extra: str) -> list[str]:
    return ["estimate", "sft", "--model_name_or_path", path, "--dtype", "bfloat16", "--max_length", "128",
            "--gradient_checkpointing", "true", "--gradient_checkpointing_kwargs",
            json.dumps({"use_reentrant": reentrant}), *extra]


def test_refused_in_one_line_naming_the_field(tmp_path, capsys) -> None:
    code, out, err = run_main(_args(_config(tmp_path), True), capsys)
    assert code == 2, (out, err)
    line = err.strip()
    assert "\n" not in line and "use_reentrant" in line and "mistral_large4_text" in line, err


@pytest.mark.parametrize("extra", [(), ("--use_peft", "true", "--lora_target_modules", "all-linear")])
def test_non_reentrant_and_lora_are_not_refused_for_it(tmp_path, capsys, extra) -> None:
    reentrant = bool(extra)             # LoRA with use_reentrant True; full fine-tuning with it False
    code, out, err = run_main(_args(_config(tmp_path), reentrant, *extra), capsys)
    assert code == 0 and "peak allocated" in out, (out, err)


def test_the_types_are_the_rotary_embeddings_that_train() -> None:
    import transformers

    root = Path(transformers.__file__).parent / "models"
    found = set()
    for path in root.glob("*/modeling_*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef) and "Rotary" in node.name and "nn.Parameter(" in ast.unparse(node):
                found.add(path.parent.name)
    assert found == {"mistral_large4"}
    from transformers import CONFIG_MAPPING

    assert TRAINABLE_ROTARY <= set(CONFIG_MAPPING)
    assert {CONFIG_MAPPING[t].__module__.split(".")[-2] for t in TRAINABLE_ROTARY} == found


@pytest.mark.slow
@pytest.mark.torch
@pytest.mark.parametrize(("reentrant", "fails"), [(True, True), (False, False)])
def test_the_real_code_fails_what_is_refused(tmp_path, reentrant: bool, fails: bool) -> None:
    pytest.importorskip("trl")
    from hpcmem.job.trl_config import build_job
    from hpcmem.trace.run import run_trace
    from hpcmem.validate.random_trace import trl_rules_off

    settings = {"model_name_or_path": _config(tmp_path), "dtype": "bfloat16", "bf16": True, "max_length": 128,
                "gradient_checkpointing": True, "gradient_checkpointing_kwargs": {"use_reentrant": reentrant}}
    with trl_rules_off():
        spec = build_job("sft", settings)[0]
        if fails:
            with pytest.raises(RuntimeError, match="backward through the graph a second time"):
                run_trace(spec, kernels="cuda")
        else:
            assert run_trace(spec, kernels="cuda").peak_allocated_bytes > 0
