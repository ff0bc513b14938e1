"""Golden files: the exact text hpcmem renders for each template and config, pinned in tests/golden/.

A change to a template or renderer shows up here as a diff to review. After an intended change, regenerate with

    HPCMEM_REGEN_GOLDEN=1 pytest tests/launch/test_launch_golden.py

and commit the new files with the change (tests/golden/README.md says the same).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import yaml

from hpcmem.launch.configs import accelerate_config, deepspeed_config
from hpcmem.launch.sbatch import render_sbatch
from hpcmem.launch.trl_yaml import trl_config
from tests.helpers.launch_helpers import files, job, launch, preset

GOLDEN = Path(__file__).parent.parent / "golden"
REGEN = os.environ.get("HPCMEM_REGEN_GOLDEN") == "1"
USER_YAML = {"model_name_or_path": "Qwen/Qwen2.5-0.5B", "dataset_name": "trl-lib/Capybara", "learning_rate": 2.0e-5,
             "save_steps": 200, "output_dir": "Qwen2.5-0.5B-SFT"}
PYXIS = {"kind": "pyxis", "image": "/shared/trl.sqsh", "mounts": ["/shared:/shared", "/home/user/project"]}
APPTAINER = {"kind": "apptainer", "image": "/shared/trl.sif", "mounts": ["/scratch", "/shared"]}


def _cases():
    return {
        "single": launch(job(num_processes=8), trl_fields=USER_YAML),
        "multi-zero3-requeue": launch(
            job(num_machines=2, num_processes=16, distributed_type="DEEPSPEED", zero_stage=3,
                expandable_segments=True),
            trl_fields=USER_YAML, requeue=True, job_name="sft 0.5B (zero3)"),
        "multi-fsdp2-pyxis": launch(job(num_machines=4, num_processes=32, distributed_type="FSDP"),
                                    preset(container=PYXIS, gres_type="h100"), trl_fields=USER_YAML),
        "single-apptainer-gpus-per-node": launch(job(num_processes=4),
                                                 preset(container=APPTAINER, gpu_request="gpus_per_node"),
                                                 trl_fields=USER_YAML),
        "vllm-node": launch(job("grpo", num_machines=2, num_processes=16, use_vllm=True, vllm_mode="server",
                                vllm_tensor_parallel_size=2), trl_fields=USER_YAML),
        "vllm-split": launch(job("grpo", num_processes=6, use_vllm=True, vllm_mode="server",
                                 vllm_tensor_parallel_size=2, per_device_train_batch_size=4),
                             trl_fields=USER_YAML, vllm_placement="split"),
    }


def _rendered(name: str) -> dict[str, str]:
    lnch = _cases()[name]
    f = files(lnch, output_dir=USER_YAML["output_dir"])
    out = {f"{name}.sbatch": render_sbatch(lnch, f),
           f"{name}.accelerate.yaml": yaml.safe_dump(accelerate_config(lnch.job, deepspeed_config_file=f.deepspeed_config),
                                                     sort_keys=False),
           f"{name}.trl.yaml": yaml.safe_dump(trl_config(lnch.job, USER_YAML, output_dir=f.output_dir), sort_keys=False)}
    if lnch.job.parallel.deepspeed:
        out[f"{name}.deepspeed.json"] = json.dumps(deepspeed_config(lnch.job), indent=2) + "\n"
    return out


@pytest.mark.parametrize("name", list(_cases()))
def test_golden(name):
    for filename, text in _rendered(name).items():
        path = GOLDEN / filename
        if REGEN:
            GOLDEN.mkdir(exist_ok=True)
            path.write_text(text)
            continue
        assert path.is_file(), f"{path} missing: HPCMEM_REGEN_GOLDEN=1 pytest tests/launch/test_launch_golden.py"
        assert text == path.read_text(), (f"{filename} differs from its golden file; if intended, regenerate with "
                                          "HPCMEM_REGEN_GOLDEN=1 pytest tests/launch/test_launch_golden.py")


def test_no_stray_golden_files():
    expected = {f for name in _cases() for f in _rendered(name)} | {"README.md"}
    assert {p.name for p in GOLDEN.iterdir()} == expected
