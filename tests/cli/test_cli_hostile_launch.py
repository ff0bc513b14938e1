"""`hpcmem plan` and `hpcmem submit` against layouts, presets, names and folders a careful user would not give:
what one command refuses the other refuses too, and every error path of `--json` leaves stdout empty (one line on
stderr) while every success is one JSON object."""

import json
import re
import shlex
from pathlib import Path

import pytest

from hpcmem.cli import run
from tests.cli.test_cli_hostile import SMALL, _refused

SHIPPED = Path(__file__).resolve().parents[2] / "hpcmem" / "presets" / "example-h100.yaml"   # 8 GPUs, 16 nodes


def _preset(tmp_path, **keys):
    text = SHIPPED.read_text()
    for key, value in keys.items():
        text = re.sub(rf"^{key}:.*$", f"{key}: {value}", text, flags=re.M)
    path = tmp_path / f"p{len(list(tmp_path.glob('p*.yaml')))}.yaml"
    path.write_text(text)
    return str(path)


def test_plan_for_a_preset_refuses_the_layouts_submit_refuses(tmp_path, capsys):
    """example-h100's nodes hold 8 GPUs and its partition 16 nodes: 16 processes on one machine, or 17 machines, were
    planned ("16×H100-80GB (1 node)") while `hpcmem submit` refused the same layout."""
    for layout, words in ((["--num_processes", "16"], ("16 GPUs per node", "example-h100 nodes have 8")),
                          (["--num_machines", "17", "--num_processes", "136"], ("17 nodes", "allows 16"))):
        for argv in (["plan", "sft", *SMALL, "--preset", "example-h100", *layout, "--json"],
                     ["submit", "sft", *SMALL, "--preset", "example-h100", *layout, "--dry-run", "--runs-dir",
                      str(tmp_path / "runs"), "--json"]):
            _refused(capsys, argv, *words)
    assert not (tmp_path / "runs").exists()
    assert run(["plan", "sft", *SMALL, "--preset", "example-h100", "--num_machines", "2", "--num_processes", "16",
                "--top", "1", "--json"]) == 0


def test_a_gpu_flag_naming_the_presets_gpu_by_alias_or_case_is_the_same_gpu(capsys):
    """`--gpu H100` alone is H100-80GB (hpcmem/gpus.json aliases): with the example-h100 preset it was refused as
    disagreeing with H100-80GB; another GPU still is."""
    for gpu in ("H100", " h100-80gb "):
        capsys.readouterr()
        assert run(["plan", "sft", *SMALL, "--preset", "example-h100", "--gpu", gpu, "--top", "1", "--json"]) == 0
        assert json.loads(capsys.readouterr().out)["gpu"] == "H100-80GB"
    _refused(capsys, ["plan", "sft", *SMALL, "--preset", "example-h100", "--gpu", "H200"], "--gpu H200",
             "disagrees", "H100-80GB")


def test_an_empty_runs_dir_is_refused_not_read_as_the_current_folder(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    _refused(capsys, ["submit", "sft", *SMALL, "--preset", "example-h100", "--dry-run", "--runs-dir", ""],
             "--runs-dir ''", "empty")
    assert list(tmp_path.iterdir()) == []


def _bad(tmp_path):
    """(argv, words of the one-line refusal) for hostile plan/submit inputs, each with --json."""
    runs = ["--dry-run", "--runs-dir", str(tmp_path / "runs")]
    sub = ["submit", "sft", *SMALL, "--preset", "example-h100"]
    plan = ["plan", "sft", *SMALL]
    afile = tmp_path / "afile"
    afile.write_text("x")
    return [
        ([*plan, "--gpu", "H100", "--num_machines", "2", "--num_processes", "3"], ("num_processes 3", "num_machines 2")),
        ([*plan, "--gpu", "H100", "--num_processes", "8", "--global_batch_size", "4"], ("global_batch_size 4",)),
        ([*plan, "--gpu", "H100", "--global_batch_size", str(10 ** 18)], ("global_batch_size", str(10 ** 18))),
        ([*plan, "--gpu", "H100", "--max_length", str(10 ** 18)], ("max_length", str(10 ** 18))),
        ([*plan, "--gpu", "H100\n"], ("gpu", "control characters")),
        ([*plan, "--gpu", "0GB"], ("gpu memory", "0GB")),
        ([*plan, "--gpu", "H100 80GB"], ("unknown GPU", "'H100 80GB'")),
        *[([*plan, "--preset", _preset(tmp_path, memory_per_node_gb=v)], ("memory_per_node_gb", shown))
          for v, shown in (("0", "got 0"), ("-1", "got -1"), (".nan", "got nan"), (".inf", "got inf"))],
        *[([*sub, "--preset", _preset(tmp_path, memory_per_node_gb=".nan"), *runs], ("memory_per_node_gb", "nan"))],
        ([*sub, "--requeue", "--max-restarts", "0", *runs], ("max_restarts", "0", "requeue")),
        ([*sub, "--requeue", "--max-restarts", "-1", *runs], ("--max-restarts", "-1")),
        ([*sub, "--max-restarts", "5", *runs], ("--max-restarts 5", "--requeue")),
        ([*sub, "--dry-run", "--runs-dir", str(tmp_path / "new\nline")], ("run folder", "control characters")),
        ([*sub, "--dry-run", "--runs-dir", str(afile)], ("is a file",)),
        ([*sub, "--dry-run", "--runs-dir", str(afile / "sub")], ("cannot", str(afile))),
        ([*sub, "--job-name", "a\nb", *runs], ("job name", "control characters")),
        ([*sub, "--plan", "--num_processes", str(10 ** 6), *runs], ("--plan", "host RAM")),
        ([*sub, "--time", "99999999-00:00:00", *runs], ("--time", "too large")),
    ]


def test_every_refusal_of_plan_and_submit_json_is_one_line_and_no_stdout(tmp_path, capsys):
    for argv, words in _bad(tmp_path):
        capsys.readouterr()
        status = run([*argv, "--json"])
        got = capsys.readouterr()
        assert status == 2, (argv, got.err)
        assert got.out == "", (argv, got.out[:200])
        line = got.err.strip()
        assert line.startswith("hpcmem: error: "), (argv, line)
        # submit --plan's "nothing fits" names one problem per line (hpcmem.cli.submit._top_plan); all others: one
        assert "\n" not in line or "--plan" in argv, (argv, line)
        for word in words:
            assert word in line, (argv, word, line)
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("runs", ["with space", "..", "$(touch pwned)", "'q'", "-x"])
def test_odd_runs_dir_names_write_one_json_object_and_only_under_that_folder(tmp_path, runs, capsys, monkeypatch):
    """Shell metacharacters, quotes, a leading dash and `..` are folder names like any other: the run folder is made
    under exactly the path given (resolved as the OS resolves it), and the script quotes it."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "inner").mkdir()
    root = tmp_path / "inner" / runs
    capsys.readouterr()
    assert run(["submit", "sft", *SMALL, "--preset", "example-h100", "--dry-run", "--runs-dir", str(root),
                "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    folder = Path(out["run_dir"])
    assert folder.parent.resolve() == root.resolve() and folder.is_dir(), out
    assert not (tmp_path / "pwned").exists()
    script = (folder / "job.sbatch").read_text()
    # the line as a POSIX shell splits it (Python's shlex, not hpcmem's quoting): one word, the folder verbatim
    line = next(x for x in script.splitlines() if x.startswith("export HPCMEM_RUN_DIR="))
    assert shlex.split(line) == ["export", f"HPCMEM_RUN_DIR={folder}"], line


def test_requeue_without_a_time_limit_is_refused(tmp_path, capsys):
    """sbatch(1) --signal: the signal comes sig_time seconds before the job's end time; a job without a time limit
    has none, so `--requeue` on a preset whose max_time is UNLIMITED (or with --time UNLIMITED) never requeued."""
    unlimited = _preset(tmp_path, max_time='"UNLIMITED"')
    runs = ["--dry-run", "--runs-dir", str(tmp_path / "runs")]
    for extra in ([], ["--time", "UNLIMITED"], ["--time", "0"]):
        _refused(capsys, ["submit", "sft", *SMALL, "--preset", unlimited, "--requeue", *extra, *runs, "--json"],
                 "--requeue", "signal_lead_s 600", "UNLIMITED", "--time")
    assert not (tmp_path / "runs").exists()
    assert run(["submit", "sft", *SMALL, "--preset", unlimited, "--requeue", "--time", "1-00:00:00", *runs]) == 0


def test_plan_takes_the_gpu_of_the_config_yaml_as_estimate_does(tmp_path, capsys):
    """The shipped example YAML names its GPU (`gpu: H100-80GB`); plan read only --gpu and refused it."""
    example = Path(__file__).resolve().parents[2] / "hpcmem" / "examples" / "sft-qwen2.5-7b-lora.yaml"
    assert run(["plan", "sft", "--config", str(example), "--json", "--top", "1"]) == 0
    assert json.loads(capsys.readouterr().out)["gpu"] == "H100-80GB"
    bare = tmp_path / "bare.yaml"
    bare.write_text("model_name_or_path: Qwen/Qwen2.5-0.5B\n")
    assert run(["plan", "sft", "--config", str(bare)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "needs --gpu" in err and "gpu:" in err


def test_an_empty_output_dir_is_refused_not_split_between_two_folders(tmp_path, capsys):
    """transformers keeps output_dir '' as given (only None becomes trainer_output), so TRL would save checkpoint-N
    into the job's working folder, while the script's resume marker and search went to <run>/output."""
    transformers = pytest.importorskip("transformers")
    assert transformers.TrainingArguments(output_dir="", use_cpu=True).output_dir == ""
    runs = tmp_path / "runs"
    assert run(["submit", "sft", *SMALL, "--preset", "example-l40s", "--dry-run", "--runs-dir", str(runs),
                "--output_dir", ""]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "output_dir '' is empty" in err and not runs.exists()
