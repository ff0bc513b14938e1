"""A site's own campaign cases (`hpcmem calibrate --cases FILE`): the models and settings its users train.

    - name: site-llama8b-lora          # letters, digits and ._+-; unique in the campaign
      trainer: sft                     # sft | dpo | reward | grpo | rloo
      model: meta-llama/Llama-3.1-8B   # a catalog id or a config.json (hpcmem models list)
      flags: {use_peft: true, max_length: 2048, per_device_train_batch_size: 2, dtype: bfloat16}
      gpus: 1                          # per node (default 1); nodes: 1 (default)

`flags` are TRL's field names as in a --config YAML, checked like one (hpcmem.job.settings).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from hpcmem.calibrate.case import CampaignCase
from hpcmem.errors import HpcmemError, Problems
from hpcmem.inputs import values as v
from hpcmem.inputs.files import load_yaml_file
from hpcmem.job.settings import check_settings
from hpcmem.job.spec import TRAINERS  # every registered trainer (hpcmem.job.trainers)
from hpcmem.job.trl_config import build_job
from hpcmem.probe.matrix import Case

NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]{0,99}")
KEYS = ("name", "trainer", "model", "flags", "gpus", "nodes")


def load(path: str | Path, *, gpus_per_node: int, max_nodes: int | None) -> list[CampaignCase]:
    data = load_yaml_file(path, "config")
    where = f"cases {path}"
    if not isinstance(data, list):
        raise v.InputError(f"{where} must be a YAML list of cases; got {v.shown(data)}")
    problems, out = Problems(), []
    for i, item in enumerate(data):
        try:
            out.append(_case(item, f"{where} [{i}]", gpus_per_node, max_nodes))
        except v.InputError as exc:
            problems.add(exc.problems[0])
    problems.raise_if_any()
    return out


def _case(item: Any, where: str, gpus_per_node: int, max_nodes: int | None) -> CampaignCase:
    if not isinstance(item, dict):
        raise v.InputError(f"{where} must be a mapping with keys {', '.join(KEYS)}; got {v.shown(item)}")
    unknown = sorted(str(k) for k in item if k not in KEYS)
    if unknown:
        raise v.InputError(f"{where}: unknown key {', '.join(unknown)}; keys: {', '.join(KEYS)}")
    name = v.text(f"{where} name", item.get("name"), max_len=100)
    if not NAME.fullmatch(name):
        raise v.InputError(f"{where} name must be letters, digits and ._+- (at most 100); got {v.shown(name)}")
    trainer = v.choice(f"{where} trainer", item.get("trainer"), TRAINERS)
    model = v.text(f"{where} model", item.get("model"), max_len=4096)
    flags = check_settings(item.get("flags") or {}, f"{where} flags")
    gpus = v.integer(f"{where} gpus", item.get("gpus", 1), lo=1, hi=gpus_per_node)
    nodes = v.integer(f"{where} nodes", item.get("nodes", 1), lo=1, hi=max_nodes or v.MAX_COUNT)
    if gpus * nodes > 1:
        flags.setdefault("num_processes", gpus * nodes)
        flags.setdefault("num_machines", nodes)
    try:        # the job as a probe will build it: ranges, the model's config, the trainer's rules — now, not mid-run
        build_job(trainer, {"model_name_or_path": model, **flags})
    except HpcmemError as exc:
        raise v.InputError(f"{where}: {'; '.join(getattr(exc, 'problems', None) or [str(exc)])}") from None
    return CampaignCase(case=Case(name, trainer, model, flags, 60.0, solo=gpus * nodes > 1), family="site",
                        gpus=gpus, nodes=nodes)
