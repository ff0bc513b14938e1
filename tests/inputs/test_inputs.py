"""The input edges by hand (the fuzz in test_inputs_fuzz.py covers them at random): typed values, file limits,
YAML aliases and nesting, the settings layer, bounded planner work, and the CLI's one-line answers."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from hpcmem.cli import cli, run
from hpcmem.errors import SpecError
from hpcmem.inputs import values as v
from hpcmem.inputs.files import MAX_BYTES, load_yaml, load_yaml_file
from hpcmem.job.settings import check_settings


@pytest.mark.parametrize("value,expected", [(8, 8), ("8", 8), (" 16 ", 16), ("-3", -3)])
def test_integers_as_trl_reads_them(value, expected):
    assert v.integer("n", value) == expected


@pytest.mark.parametrize("value,rule", [(1.5, "a fraction is not a count"), (8.0, "without a fraction"),
                                        (float("nan"), "NaN and infinity"), (True, "an integer"),
                                        ("eight", "an integer"), (2**31, "≤ 2147483647"), ([8], "an integer")])
def test_integer_refusals_name_field_value_and_rule(value, rule):
    with pytest.raises(SpecError) as err:
        v.integer("per_device_train_batch_size", value)
    message = err.value.problems[0]
    assert message.startswith("per_device_train_batch_size must be an integer") and rule in message
    assert repr(value)[:20] in message and "\n" not in message


def test_booleans_are_trls_words_and_text_has_no_control_characters():
    assert [v.boolean("b", x) for x in (True, "yes", "T", "n", "0")] == [True, True, True, False, False]
    with pytest.raises(SpecError, match="use_peft must be true or false .*got 'maybe'"):
        v.boolean("use_peft", "maybe")
    with pytest.raises(SpecError, match=r"account must be text without control characters .*got 'x\\ny'"):
        v.text("account", "x\ny")
    not_utf8 = b"q_\xff".decode("utf-8", "surrogateescape")       # what argv holds for bytes that are not UTF-8
    with pytest.raises(SpecError, match="lora_target_modules must be text in UTF-8"):
        v.text("lora_target_modules", not_utf8)
    assert v.text("name", "Qwen2.5 — é ✓") == "Qwen2.5 — é ✓"
    assert v.json_object("k", '{"selective": true}') == {"selective": True}
    with pytest.raises(SpecError, match="model_init_kwargs must be a JSON object"):
        v.json_object("model_init_kwargs", "{bad")


def test_settings_layer_names_its_source_and_converts_trl_text():
    out = check_settings({"per_device_train_batch_size": "4", "use_peft": "yes", "max_length": "none",
                          "learning_rate": float("nan")}, "config sft.yaml")
    assert out == {"per_device_train_batch_size": 4, "use_peft": True, "max_length": None,
                   "learning_rate": out["learning_rate"]}             # not a field hpcmem reads: passed on as written
    with pytest.raises(SpecError) as err:
        check_settings({"max_length": 1.5}, "config sft.yaml")
    assert err.value.problems == ["config sft.yaml: max_length must be an integer ≤ 2147483647 or null (a fraction "
                                  "is not a count); got 1.5"]
    with pytest.raises(SpecError, match="config sft.yaml: key 1 is not a field name"):
        check_settings({1: 2}, "config sft.yaml")


def test_yaml_aliases_cycles_and_nesting_are_limited():
    # 10 × 10 × 10 × 10 × 10 copies of one list: 12 lines of YAML stand for more than 100,000 values
    bomb = "a: &a [1,1,1,1,1,1,1,1,1,1]\n" + "".join(
        f"{n}: &{n} [{', '.join([f'*{p}'] * 10)}]\n" for p, n in zip("abcd", "bcde"))
    with pytest.raises(SpecError, match="expands to more than 100,000 values through YAML aliases"):
        load_yaml(bomb, "config x.yaml")
    assert load_yaml("a: &a [1, 2]\nb: *a\n", "config x.yaml") == {"a": [1, 2], "b": [1, 2]}   # aliases as such: fine
    with pytest.raises(SpecError, match="a YAML alias refers to a node that contains it"):
        load_yaml("a: &a [*a]\n", "config x.yaml")
    with pytest.raises(SpecError, match="nested deeper than 64 levels"):
        load_yaml("a: " + "[" * 65 + "]" * 65, "config x.yaml")
    with pytest.raises(SpecError, match=r"not valid YAML: found unhashable key \(line 1, column 3\)$"):
        load_yaml("? [1]\n: 2\n", "config x.yaml")


def test_files_are_regular_bounded_and_utf8(tmp_path):
    big = tmp_path / "big.yaml"
    big.write_bytes(b"#" * (MAX_BYTES["config"] + 1))
    with pytest.raises(SpecError, match=r"config .*big.yaml is 1.0 MiB; hpcmem reads at most 1.0 MiB for a config"):
        load_yaml_file(big, "config")
    with pytest.raises(SpecError, match="is not a regular file"):
        load_yaml_file("/dev/zero", "config")                        # would never end
    (tmp_path / "bad.yaml").write_bytes(b"a: 1\nb: \xff\n")
    with pytest.raises(SpecError, match="is not UTF-8 text: byte 0xff at offset 8"):
        load_yaml_file(tmp_path / "bad.yaml", "config")


def test_the_planners_batch_axis_is_bounded_whatever_the_global_batch():
    from hpcmem.plan.fixed import MAX_SEARCHED_BATCH
    from hpcmem.plan.knobs import axes
    from tests.helpers.launch_helpers import job

    j = job(per_device_train_batch_size=4096)
    # 2**31 - 1 is prime (Mersenne M31): only 1 divides it below the cap; the job's own 4096 does not divide it
    assert axes(j, (), 2**31 - 1, False)["batch"] == [1]
    # 4096 per GPU: the powers of two up to the cap, then the job's own value
    assert axes(j, (), 4096, False)["batch"] == [2**k for k in range(11)] + [4096] and MAX_SEARCHED_BATCH == 1024


def _one_line(argv: list[str], capsys) -> str:
    status = run(argv)
    err = capsys.readouterr().err
    assert status == 2 and err.count("\n") == 1 and err.startswith("hpcmem: error: "), err
    return err


def test_the_cli_answers_bad_flags_in_one_line(capsys):
    model = ["--model_name_or_path", "Qwen/Qwen2.5-0.5B"]
    assert "'--top': -1 is not in the range 1<=x<=1000" in _one_line(["plan", "sft", *model, "--gpu", "L4", "--top",
                                                                      "-1"], capsys)
    assert "'--max_length' / '--max-length': '1.5' is not an integer or 'none'" in _one_line(
        ["estimate", "sft", *model, "--max_length", "1.5"], capsys)
    assert "command line: beta must be a finite number" in _one_line(["estimate", "dpo", *model, "--beta", "nan"],
                                                                    capsys)
    assert "--time: time limit '1:2:3:4' is not a SLURM time" in _one_line(
        ["submit", "sft", *model, "--preset", "example-h100", "--dry-run", "--time", "1:2:3:4"], capsys)


def test_a_bug_is_one_line_and_exit_70_unless_debugging(monkeypatch, capsys):
    import hpcmem.cli.estimate as estimate_cli

    def broken(*args, **kwargs):
        raise KeyError("boom")

    monkeypatch.setattr(estimate_cli, "job_from_cli", broken)
    assert run(["estimate", "sft"]) == 70
    err = capsys.readouterr().err
    assert err.startswith("hpcmem: error: internal error (KeyError: 'boom')") and "HPCMEM_DEBUG=1" in err
    assert err.count("\n") == 1 and "Traceback" not in err
    monkeypatch.setenv("HPCMEM_DEBUG", "1")
    with pytest.raises(KeyError):
        run(["estimate", "sft"])


def test_presets_list_json_lists_each_preset_with_its_problem(tmp_path, monkeypatch):
    (tmp_path / "broken.yaml").write_text("partition: gpu\n")
    monkeypatch.setenv("HPCMEM_PRESETS", str(tmp_path))
    rows = {r["name"]: r for r in json.loads(CliRunner().invoke(cli, ["presets", "list", "--json"]).output)}
    assert rows["example-h100"]["problem"] is None and rows["example-h100"]["gpus_per_node"] == 8
    assert rows["example-h100"]["max_time"] == "2-00:00:00"
    assert "gpu is required" in rows["broken"]["problem"] and rows["broken"]["partition"] is None
