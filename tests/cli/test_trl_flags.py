"""A `trl <trainer>` command line pasted after `hpcmem estimate <trainer>` is read as TRL's own parser reads it: the
command lines are the examples in the installed TRL scripts' docstrings (trl/scripts/<trainer>.py), TRL's
TrlParser is the oracle for every field hpcmem models, and the field kinds hpcmem ships (flag_kinds.json) are rebuilt
from that parser."""

from __future__ import annotations

import argparse
import ast
import importlib
import json
import re
import shlex
from pathlib import Path

import click
import pytest

from hpcmem.cli import run
from hpcmem.cli.estimate import command as estimate_command
from hpcmem.cli.trl_argv import split_argv
from hpcmem.job.settings import checkers
from hpcmem.job.trainers import REGISTRY
from hpcmem.job.trl_config import build_job
from hpcmem.models.resolve import catalog

pytest.importorskip("trl")
pytestmark = pytest.mark.torch

KINDS = Path(__file__).resolve().parents[2] / "hpcmem" / "job" / "trainers" / "flag_kinds.json"


def parser_kinds(trainer: str) -> dict:
    parser = importlib.import_module(REGISTRY[trainer].script).make_parser()
    out = {"bool": set(), "list": set(), "int": set(), "float": set(), "negated": {}}
    for a in parser._actions:
        if not a.option_strings or a.dest == "help":
            continue
        if isinstance(a, argparse._StoreFalseAction):
            out["negated"].update({o[2:]: a.dest for o in a.option_strings if o.startswith("--no_")})
        elif a.nargs == "?" and a.const is True:
            out["bool"].add(a.dest)
        elif a.nargs in ("+", "*"):
            out["list"].add(a.dest)
        elif a.type in (int, float):        # argparse parses a string default with it (TrlParser's YAML values)
            out[a.type.__name__].add(a.dest)
    return {"bool": sorted(out["bool"]), "list": sorted(out["list"]), "int": sorted(out["int"]),
            "float": sorted(out["float"]), "negated": dict(sorted(out["negated"].items()))}


def test_shipped_flag_kinds_are_trls_parsers():
    assert json.loads(KINDS.read_text()) == {t: parser_kinds(t) for t in REGISTRY}


def doc_lines(trainer: str) -> list[list[str]]:
    """The example command lines of trl/scripts/<trainer>.py's docstring, as argument lists."""
    module = importlib.import_module(REGISTRY[trainer].script)
    doc = ast.get_docstring(ast.parse(Path(module.__file__).read_text())) or ""
    out = []
    for block in re.findall(r"```bash\n(.*?)```", doc, re.S):
        words = shlex.split(block.replace("\\\n", " "))
        script = next(i for i, w in enumerate(words) if w.endswith(f"{trainer}.py"))
        out.append(words[script + 1:])
    return out


CASES = [(t, i) for t in REGISTRY for i in range(len(doc_lines(t)))]
STAND_IN = "Qwen/Qwen2.5-0.5B"       # a catalog id for models the offline catalog does not hold (TRL reads only ids)


@pytest.mark.parametrize("trainer,i", CASES)
def test_a_trl_docs_command_line_reads_as_trl_reads_it(trainer, i, tmp_path):
    argv = doc_lines(trainer)[i]
    parser = importlib.import_module(REGISTRY[trainer].script).make_parser()
    trl_argv = [*argv, "--output_dir", str(tmp_path), "--use_cpu", "true"]
    script_args, training_args, model_args, *_ = parser.parse_args_and_config(trl_argv)
    ctx = estimate_command.make_context("estimate", [trainer, *argv])
    settings = ctx.params["trl_flags"]
    flags = {**{k: v for k, v in ctx.params.items() if v not in (None, ()) and k in checkers()}, **settings}
    for name in ("model_name_or_path", "teacher_model_name_or_path"):
        if flags.get(name) and flags[name] not in catalog():
            flags[name] = STAND_IN
    job, ignored = build_job(trainer, {k: (list(v) if isinstance(v, tuple) else v) for k, v in flags.items()})
    assert script_args.dataset_name == settings.get("dataset_name")
    for field in ("per_device_train_batch_size", "gradient_accumulation_steps", "gradient_checkpointing"):
        assert getattr(job.train, field) == getattr(training_args, field), field
    for field in ("use_peft", "lora_r", "lora_alpha"):
        assert getattr(job.train, field) == getattr(model_args, field), field
    if hasattr(training_args, "packing"):
        assert job.train.packing == training_args.packing
    assert "learning_rate" in ignored and "dataset_name" in ignored


def test_list_flags_take_words_and_the_last_occurrence_wins_as_in_trl(tmp_path):
    argv = ["--model_name_or_path", "Qwen/Qwen2.5-0.5B", "--use_peft", "--lora_target_modules", "q_proj",
            "--lora_target_modules", "k_proj", "v_proj", "--dataset_name", "trl-lib/Capybara"]
    parser = importlib.import_module("trl.scripts.sft").make_parser()
    _, _, model_args, *_ = parser.parse_args_and_config([*argv, "--output_dir", str(tmp_path), "--use_cpu", "true"])
    ctx = estimate_command.make_context("estimate", ["sft", *argv])
    assert list(ctx.params["lora_target_modules"]) == model_args.lora_target_modules == ["k_proj", "v_proj"]
    assert ctx.params["trl_flags"] == {"dataset_name": "trl-lib/Capybara"}
    own = {opt: p for p in estimate_command.params if isinstance(p, click.Option) for opt in p.opts}
    assert split_argv(["sft", "--lora_target_modules", "q_proj", "v_proj", "--bf16"], own)[0] == [
        "sft", "--bf16", "--lora_target_modules", "q_proj", "--lora_target_modules", "v_proj"]


def test_an_unknown_flag_is_refused_in_one_line_with_the_nearest_field(capsys):
    assert run(["estimate", "sft", "--model_name_or_path", "Qwen/Qwen2.5-0.5B", "--datset_name", "x"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "datset_name" in err and "did you mean dataset_name" in err
    assert run(["estimate", "sft", "--model_name_or_path", "Qwen/Qwen2.5-0.5B", "--max_seq_length", "2048"]) == 2
    assert "write max_length" in capsys.readouterr().err


def test_help_names_the_trainers_own_trl_fields(capsys):
    assert run(["estimate", "grpo", "--help"]) == 0
    out = capsys.readouterr().out
    assert "as `trl grpo` reads them" in out and "reward_funcs" in out and "dataset_name" in out
    assert run(["estimate", "sft", "--help"]) == 0
    assert "reward_funcs" not in capsys.readouterr().out


def test_hpcmems_own_repeatable_options_still_append(tmp_path):
    """--env is hpcmem's (submit): every occurrence counts; only TRL's list fields keep the last occurrence."""
    from hpcmem.cli.submit import command as submit_command

    ctx = submit_command.make_context("submit", ["sft", "--model_name_or_path", "Qwen/Qwen2.5-0.5B", "--preset",
                                                 "example-h100", "--env", "A=1", "--env", "B=2 3", "--dry-run"])
    assert ctx.params["env"] == ("A=1", "B=2 3")
