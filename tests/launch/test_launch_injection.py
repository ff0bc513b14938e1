"""Every value that reaches the job script is a quoted word or refused: payload classes × every field.

For each field a user or an admin controls that reaches job.sbatch (the preset's keys, the submission's options, the
TRL fields the script reads), each payload goes in through the real edge (`presets.from_dict`, `LaunchOptions` +
`prepare`). Either hpcmem refuses it with one line naming the field, or the script is written and then RUN by bash
with stub srun / scontrol / accelerate / trl / apptainer / module on PATH, and:
- nothing in the payload executes (the marker file it would create does not exist),
- the script ran to its launcher (the accelerate stub saw its argv; a syntax error would run nothing at all),
- sbatch's own reading of the #SBATCH block (tests/helpers/sbatch_parser.py, ported from src/sbatch/opt.c) returns every
  directive hpcmem meant, value for value — no line lost, none cut short, none added.
A completeness check makes a new preset key or launch option fail here until it is classified.
"""

from __future__ import annotations

import dataclasses
import subprocess
from pathlib import Path

import pytest

from hpcmem.errors import HpcmemError
from hpcmem.launch import LaunchOptions, prepare, presets
from hpcmem.launch.sbatch import sbatch_directives
from tests.helpers.launch_helpers import PRESET, job
from tests.helpers.sbatch_parser import sbatch_arguments

MARK = "PWNED"
# Payload classes; {m} is the absolute path of the marker file a successful injection would create.
PAYLOADS = {
    "command substitution": "$(touch {m})",
    "backticks": "`touch {m}`",
    "semicolon": "x; touch {m}",
    "and / or": "x && touch {m} || touch {m}",
    "pipe": "x | touch {m}",
    "background": "x & touch {m} &",
    "redirect": "x > {m}",
    "line feed": "x\ntouch {m}",
    "carriage return": "x\rtouch {m}",
    "single-quote break-out": "x'; touch {m}; '",
    "double-quote break-out": "x\"; touch {m}; \"",
    "backslash escape": "x\\'; touch {m} #",
    "comment start": "x # $(touch {m})",
    "SLURM filename pattern": "%j%x%N%% $(touch {m})",
    "expansions and globs": "${{IFS}}touch${{IFS}}{m} $HOME ~root * ? [a] {{a,b}}",
    "NUL": "x\x00touch {m}",
    "unicode line separators": "x\u2028touch {m}\u0085",
    "tab, vertical tab, form feed": "x\t\x0b\x0ctouch {m}",
    "terminal escape": "x\x1b[2J$(touch {m})",
    "option injection": "--wrap=touch {m}",
}

# ---- which fields reach the script -----------------------------------------------------------------------------
# Preset keys, by how a payload gets there: text keys set as given, list keys as one item, env by name and value.
PRESET_TEXT = ("name", "partition", "account", "qos", "constraint", "gres_type", "max_time", "gpu_request")
PRESET_INTEGERS = ("gpus_per_node", "cpus_per_node", "memory_per_node_gb", "max_nodes", "signal_lead_s")
PRESET_LISTS = ("modules",)
PRESET_NOT_IN_SCRIPT = {
    "description": "shown by `presets show` only",
    "gpu": "a GPU catalog name or description: memory and speed for the fit check, never written to the script",
    "max_array_size": "an integer: bounds the calibration campaign's --array ranges, which hpcmem computes",
    "defaults": "TRL field defaults: typed by hpcmem.job.settings, written to trl.yaml (YAML-quoted)",
    "setup": "the admin's own shell lines, trusted as shell by design (README: Presets); a NUL is refused",
}
CONTAINER_FIELDS = ("image", "mounts", "options")           # for each kind; `kind` itself is a choice
OPTION_TEXT = ("job_name", "account", "qos", "time", "entry", "workdir", "vllm_placement")
OPTION_NOT_TEXT = {
    "requeue": "a bool", "max_restarts": "an int (click.IntRange)", "cpus_per_task": "an int",
    "reuse_output_dir": "a bool", "env": "tested by name and by value below", "trl_fields": "output_dir and "
    "model_name_or_path reach the script, tested below; the rest goes to trl.yaml",
}
TRL_FIELDS_IN_SCRIPT = ("output_dir", "model_name_or_path")

CASES = ([("preset", k) for k in PRESET_TEXT + PRESET_INTEGERS + PRESET_LISTS]
         + [("preset env", "name"), ("preset env", "value"), ("container", "kind")]
         + [(kind, k) for kind in ("pyxis", "apptainer") for k in CONTAINER_FIELDS]
         + [("option", k) for k in OPTION_TEXT] + [("option env", "name"), ("option env", "value")]
         + [("trl field", k) for k in TRL_FIELDS_IN_SCRIPT] + [("runs folder", "path")])


def test_every_preset_key_and_launch_option_is_classified():
    tested = set(PRESET_TEXT + PRESET_INTEGERS + PRESET_LISTS) | {"env", "container"}
    assert tested | set(PRESET_NOT_IN_SCRIPT) == set(presets.YAML_KEYS)
    assert set(CONTAINER_FIELDS) | {"kind"} == set(presets.CONTAINER_KEYS)
    options = {f.name for f in dataclasses.fields(LaunchOptions)}
    assert set(OPTION_TEXT) | set(OPTION_NOT_TEXT) == options


# ---- stubs ------------------------------------------------------------------------------------------------------
STUBS = {
    # srun: run what follows srun's own options (`bash -c BODY`, possibly inside apptainer) as task 0
    "srun": 'for ((i = 1; i <= $#; i++)); do a=${!i}; n=$((i + 1))\n'
            '  if [[ $a == apptainer || ( $a == bash && ${!n} == -c ) ]]; then\n'
            '    SLURM_NODEID=0 SLURM_PROCID=0 SLURM_NNODES=1 exec "${@:i}"; fi; done\nexit 3\n',
    "apptainer": 'for ((i = 1; i <= $#; i++)); do a=${!i}; n=$((i + 1))\n'
                 '  if [[ $a == bash && ${!n} == -c ]]; then exec "${@:i}"; fi; done\nexit 3\n',
    "scontrol": 'case "$1 $2" in "show hostnames") echo n1;; "show node") echo "NodeName=n1 NodeAddr=127.0.0.1";;'
                ' esac\n',
    # the trainer of a vLLM-server job waits for the server (started first, in the background), as TRL's does; up to
    # 30 s, for a loaded machine (the server's argv appears whole: written aside, then renamed)
    "accelerate": 'for _ in {1..1500}; do [[ -z ${VLLM_PORT:-} || -f $STUB_DIR/trl.argv ]] && break; sleep 0.02; done\n'
                  'printf "%s\\0" "$@" > "$STUB_DIR/accelerate.argv"; env -0 > "$STUB_DIR/accelerate.env"\n',
    "trl": 'printf "%s\\0" "$@" > "$STUB_DIR/trl.argv.part" && mv "$STUB_DIR/trl.argv.part" "$STUB_DIR/trl.argv"\n',
    "module": 'printf "%s\\0" "$@" >> "$STUB_DIR/module.argv"\n',
}


def _stub_folder(folder: Path, table: dict[str, str]) -> Path:
    for name, body in table.items():
        (folder / name).write_text(f"#!/bin/bash\n{body}")
        (folder / name).chmod(0o755)
    return folder


@pytest.fixture(scope="module")
def stubs(tmp_path_factory):
    return _stub_folder(tmp_path_factory.mktemp("stubs"), STUBS)


# ---- building one case through the real edges ------------------------------------------------------------------
BASE_PRESET = {k: v for k, v in PRESET.items() if k != "setup"}
CONTAINERS = {"pyxis": {"kind": "pyxis", "image": "/img.sqsh", "mounts": ["/a:/a"], "options": ["--no-x"]},
              "apptainer": {"kind": "apptainer", "image": "/img.sif", "mounts": ["/a"], "options": ["--cleanenv"]}}


def _preset_data(kind: str, key: str, value: str) -> dict:
    data = dict(BASE_PRESET)
    if kind == "preset":
        data[key] = [value] if key in PRESET_LISTS else value
    elif kind == "preset env":
        data["env"] = {value: "1"} if key == "name" else {"HOSTILE": value}
    elif kind in ("container", "pyxis", "apptainer"):
        box = dict(CONTAINERS["apptainer" if kind == "container" else kind])
        box[key] = [value] if key in ("mounts", "options") else value
        data["container"] = box
    return data


def _build(kind: str, key: str, value: str, tmp: Path):
    """The prepared run for one (field, payload), or the HpcmemError that refused it."""
    pre = presets.from_dict(_preset_data(kind, key, value), source="site.yaml", default_name="site")
    trl = {"model_name_or_path": "Qwen/Qwen2.5-0.5B", "output_dir": str(tmp / "out")}
    opts: dict = {"workdir": str(tmp / "work"), "trl_fields": trl}
    spec = job(num_processes=8)
    if kind == "option":
        opts[key] = value
    elif kind == "option env":
        opts["env"] = {value: "1"} if key == "name" else {"HOSTILE": value}
    elif kind == "trl field":
        trl[key] = value if key == "model_name_or_path" else str(tmp / "out" / value)
        if key == "model_name_or_path":      # reaches the script as `trl vllm-serve --model …`
            spec = job("grpo", num_machines=2, num_processes=16, use_vllm=True, vllm_mode="server")
    run_dir = tmp / f"runs {value}" / "r" if kind == "runs folder" else tmp / "runs" / "r"
    return prepare(spec, pre, LaunchOptions(**opts), run_dir=run_dir, fit=False)


def _run(prepared, stubs: Path, tmp: Path) -> subprocess.CompletedProcess:
    script = tmp / "job.sbatch"
    script.write_text(prepared.contents["job.sbatch"])
    env = {"PATH": f"{stubs}:/usr/bin:/bin", "STUB_DIR": str(tmp), "SLURM_JOB_ID": "4242",
           "SLURM_JOB_NODELIST": "n1", "HOME": str(tmp)}
    (tmp / "work").mkdir(exist_ok=True)
    return subprocess.run(["bash", str(script)], env=env, cwd=tmp / "work", capture_output=True, timeout=60)


def _expected_arguments(prepared) -> list[str]:
    return [f"--{k}" if v is None else f"--{k}={v}" for k, v in sbatch_directives(prepared.launch, prepared.files)]


TALLY = {"ran": 0, "refused": 0}


@pytest.fixture(scope="module", autouse=True)
def _tally():
    yield
    print(f"\ninjection: {len(PAYLOADS)} payload classes × ({len(CASES)} job + {len(CAMPAIGN_CASES)} campaign) fields "
          f"= {sum(TALLY.values())} cases: "
          f"{TALLY['ran']} scripts run by bash, {TALLY['refused']} refused")


@pytest.mark.parametrize("kind,key", CASES, ids=[f"{k}:{f}" for k, f in CASES])
def test_payloads_stay_data_or_are_refused(kind, key, stubs, tmp_path):
    ran = refused = 0
    for name, template in PAYLOADS.items():
        tmp = tmp_path / f"p{ran + refused}"
        tmp.mkdir()
        mark = tmp / MARK
        value = template.format(m=mark)
        try:
            prepared = _build(kind, key, value, tmp)
        except HpcmemError as exc:
            problems = getattr(exc, "problems", None) or [str(exc)]
            assert problems and all("\n" not in p for p in problems), (name, problems)
            refused += 1
            continue
        done = _run(prepared, stubs, tmp)
        assert not mark.exists() and not (tmp / "work" / MARK).exists(), f"{name}: the payload ran"
        assert done.returncode == 0 and (tmp / "accelerate.argv").is_file(), (name, done.stderr.decode()[-2000:])
        assert sbatch_arguments(prepared.contents["job.sbatch"]) == _expected_arguments(prepared), name
        _arrives_intact(kind, key, value, tmp)
        ran += 1
    assert ran + refused == len(PAYLOADS)
    TALLY["ran"] += ran
    TALLY["refused"] += refused


def _arrives_intact(kind: str, key: str, value: str, tmp: Path) -> None:
    """Where the value lands in the launcher's argv or environment, it arrives byte for byte."""
    argv = (tmp / "accelerate.argv").read_bytes().split(b"\0")
    env = dict(item.split(b"=", 1) for item in (tmp / "accelerate.env").read_bytes().split(b"\0") if b"=" in item)
    if (kind, key) == ("option", "entry"):
        assert value.encode() in argv
    if key == "value" and kind in ("preset env", "option env"):
        assert env[b"HOSTILE"] == value.encode()
    if (kind, key) == ("trl field", "model_name_or_path"):
        assert value.encode() in (tmp / "trl.argv").read_bytes().split(b"\0")


# ---- the calibration campaign's scripts (hpcmem calibrate) -------------------------------------------------------
CAMPAIGN_CASES = ([("preset", k) for k in PRESET_TEXT + PRESET_INTEGERS + PRESET_LISTS]
                  + [("preset env", "name"), ("preset env", "value")]
                  + [(kind, k) for kind in ("pyxis", "apptainer") for k in CONTAINER_FIELDS]
                  + [("campaign", "folder"), ("campaign", "time"), ("campaign", "collect_time")])
CAMPAIGN_STUBS = {
    # srun: run what follows its own options (hpcmem, bash -c BODY, or apptainer) as task 0 of 1
    "srun": 'for ((i = 1; i <= $#; i++)); do a=${!i}; n=$((i + 1))\n'
            '  if [[ $a == hpcmem || $a == apptainer || ( $a == bash && ${!n} == -c ) ]]; then\n'
            '    SLURM_PROCID=0 SLURM_LOCALID=0 SLURM_NTASKS=1 SLURM_NODEID=0 exec "${@:i}"; fi; done\nexit 3\n',
    "apptainer": 'for ((i = 1; i <= $#; i++)); do a=${!i}\n'
                 '  if [[ $a == hpcmem || $a == bash ]]; then exec "${@:i}"; fi; done\nexit 3\n',
    "scontrol": STUBS["scontrol"],
    "module": STUBS["module"],
    "hpcmem": 'printf "%s\\0" "$@" >> "$STUB_DIR/hpcmem.argv"; printf "\\n" >> "$STUB_DIR/hpcmem.argv"\n',
}


@pytest.fixture(scope="module")
def campaign_stubs(tmp_path_factory):
    return _stub_folder(tmp_path_factory.mktemp("campaign-stubs"), CAMPAIGN_STUBS)


def _campaign_plan(kind: str, key: str, value: str, tmp: Path):
    from hpcmem.calibrate import submit as sub
    from tests.helpers.launch_helpers import Recorder

    pre = presets.from_dict(_preset_data(kind, key, value), source="site.yaml", default_name="site")
    opts = {"campaign_dir": tmp / (f"camp {value}" if key == "folder" else "camp"),
            "only": "sft-qwen05-lora,zero3-2node-*", "site": "s"}
    if kind == "campaign" and key != "folder":
        opts[key] = value
    return sub.plan(pre, sub.Options(**opts), Recorder({})), pre


@pytest.mark.parametrize("kind,key", CAMPAIGN_CASES, ids=[f"{k}:{f}" for k, f in CAMPAIGN_CASES])
def test_campaign_scripts_keep_payloads_data(kind, key, campaign_stubs, tmp_path):
    """The array, multi-node and collect scripts of a campaign: each payload is refused in one line or stays data
    (bash runs every script to its hpcmem step; sbatch reads back every directive hpcmem meant)."""
    from hpcmem.calibrate.scripts import job_directives

    ran = refused = 0
    for n, (name, template) in enumerate(PAYLOADS.items()):
        tmp = tmp_path / f"p{n}"
        tmp.mkdir()
        mark = tmp / MARK
        value = template.format(m=mark)
        try:
            plan, pre = _campaign_plan(kind, key, value, tmp)
        except HpcmemError as exc:
            problems = getattr(exc, "problems", None) or [str(exc)]
            assert all("\n" not in p for p in problems), (name, problems)
            refused += 1
            continue
        assert [j.kind for j in plan.jobs] == ["array", "multi", "collect"], name
        for sjob in plan.jobs:
            text = plan.scripts[sjob.group]
            script = tmp / f"{sjob.group}.sbatch"
            script.write_text(text)
            env = {"PATH": f"{campaign_stubs}:/usr/bin:/bin", "STUB_DIR": str(tmp), "SLURM_JOB_ID": "4242",
                   "SLURM_ARRAY_TASK_ID": "0", "SLURM_JOB_NODELIST": "n1", "HOME": str(tmp)}
            done = subprocess.run(["bash", str(script)], env=env, cwd=tmp, capture_output=True, timeout=60)
            assert done.returncode == 0, (name, sjob.group, done.stderr.decode()[-2000:])
            time = plan.campaign.data.get("collect_time") if sjob.kind == "collect" else None
            expected = job_directives(sjob, pre, campaign_dir=str(plan.campaign.root),
                                      time=_time(sjob.kind, kind, key, value, time))
            assert sbatch_arguments(text) == [f"--{k}" if v is None else f"--{k}={v}" for k, v in expected], name
        assert not mark.exists() and not list(tmp.rglob(MARK)), f"{name}: the payload ran"
        calls = [c.split(b"\0")[:-1] for c in (tmp / "hpcmem.argv").read_bytes().split(b"\n") if c]
        assert calls.count([b"--version"]) == len(plan.jobs), name        # each script first checks hpcmem runs
        calls = [c for c in calls if c != [b"--version"]]
        folder = str(plan.campaign.root).encode()
        # array: --run-task; multi: prepare, one rank, finish; collect: --collect — the folder arrives intact
        assert [c[1:3] for c in calls] == [[b"--run-task", folder], [b"--run-task", folder], [b"--rank-worker",
                                           folder + b"/work/zero3-2node-x16-l1b"], [b"--run-task", folder],
                                           [b"--collect", folder]], name
        ran += 1
    assert ran + refused == len(PAYLOADS)
    TALLY["ran"] += ran
    TALLY["refused"] += refused


def _time(job_kind: str, kind: str, key: str, value: str, _unused) -> str:
    if kind == "campaign" and key == ("collect_time" if job_kind == "collect" else "time"):
        return value
    return "20" if job_kind == "collect" else "30"
