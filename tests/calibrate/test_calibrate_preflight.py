"""A calibration job whose environment cannot run hpcmem (an image without it, a setup that activates nothing) stops
before any step with one line saying what to fix and exit 78 — it is not requeued and measures nothing. bash runs
the rendered scripts; srun, apptainer and scontrol are stubs that run what they wrap, so `hpcmem` is found, or not,
exactly as the job's PATH has it."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from hpcmem.calibrate import submit as sub
from hpcmem.calibrate.scripts import NO_HPCMEM
from hpcmem.launch import presets
from tests.helpers.launch_helpers import PRESET, Recorder

STUBS = {
    "srun": 'for ((i = 1; i <= $#; i++)); do a=${!i}; n=$((i + 1))\n'
            '  if [[ $a == hpcmem || $a == apptainer || ( $a == bash && ${!n} == -c ) ]]; then\n'
            '    SLURM_PROCID=0 SLURM_LOCALID=0 SLURM_NTASKS=1 SLURM_NODEID=0 exec "${@:i}"; fi; done\nexit 3\n',
    "apptainer": 'for ((i = 1; i <= $#; i++)); do a=${!i}\n'
                 '  if [[ $a == hpcmem || $a == bash ]]; then exec "${@:i}"; fi; done\nexit 3\n',
    "scontrol": 'case "$1 $2" in "show hostnames") echo n1;; "show node") echo "NodeName=n1 NodeAddr=127.0.0.1";;'
                ' esac\necho "$@" >> "$STUB_DIR/scontrol.calls"\n',
    "module": "true\n",
}
HPCMEM = 'printf "%s " "$@" >> "$STUB_DIR/hpcmem.calls"; echo >> "$STUB_DIR/hpcmem.calls"\n'
BOXES = {"none": None, "pyxis": {"kind": "pyxis", "image": "/img.sqsh", "mounts": ["/a:/a"]},
         "apptainer": {"kind": "apptainer", "image": "/img.sif", "mounts": ["/a"]}}


def _stubs(folder: Path, table: dict[str, str]) -> Path:
    folder.mkdir()
    for name, body in table.items():
        (folder / name).write_text(f"#!/bin/bash\n{body}")
        (folder / name).chmod(0o755)
    return folder


def _run_scripts(tmp: Path, box, with_hpcmem: bool) -> list[subprocess.CompletedProcess]:
    data = {k: v for k, v in PRESET.items() if k != "setup"} | ({"container": box} if box else {})
    pre = presets.from_dict(data, source="site.yaml", default_name="site")
    plan = sub.plan(pre, sub.Options(campaign_dir=tmp / "camp", only="sft-qwen05-lora,zero3-2node-*", site="s"),
                    Recorder({}))
    stubs = _stubs(tmp / "bin", STUBS | ({"hpcmem": HPCMEM} if with_hpcmem else {}))
    out = []
    for sjob in plan.jobs:
        script = tmp / f"{sjob.group}.sbatch"
        script.write_text(plan.scripts[sjob.group])
        env = {"PATH": f"{stubs}:/usr/bin:/bin", "STUB_DIR": str(tmp), "SLURM_JOB_ID": "4242",
               "SLURM_ARRAY_TASK_ID": "0", "SLURM_JOB_NODELIST": "n1", "HOME": str(tmp)}
        out.append(subprocess.run(["bash", str(script)], env=env, cwd=tmp, capture_output=True, text=True,
                                  timeout=60))
    return out


@pytest.mark.parametrize("box", list(BOXES))
def test_without_hpcmem_every_job_stops_first_and_says_what_to_fix(box, tmp_path):
    done = _run_scripts(tmp_path, BOXES[box], with_hpcmem=False)
    assert len(done) == 3                                   # array, multi-node case, collect
    for d in done:
        assert d.returncode == NO_HPCMEM == 78, d.stderr
        lines = [line for line in d.stderr.splitlines() if line.startswith("hpcmem:")]
        assert len(lines) == 1 and "cannot run `hpcmem`" in lines[0], d.stderr
        assert ("/img." in lines[0]) == (box != "none") and "nothing was measured" in lines[0]
    assert not (tmp_path / "scontrol.calls").exists() or "requeue" not in (tmp_path / "scontrol.calls").read_text()


@pytest.mark.parametrize("box", list(BOXES))
def test_with_hpcmem_the_check_passes_and_the_steps_run(box, tmp_path):
    done = _run_scripts(tmp_path, BOXES[box], with_hpcmem=True)
    assert [d.returncode for d in done] == [0, 0, 0], [d.stderr for d in done]
    calls = (tmp_path / "hpcmem.calls").read_text().splitlines()
    assert calls.count("--version ") == 3 and any(c.startswith("calibrate --collect") for c in calls)
