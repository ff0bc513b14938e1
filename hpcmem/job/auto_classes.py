"""What the real libraries refuse for a model type before a step runs, beside TRL's own rules:

- RewardTrainer loads the policy with AutoModelForSequenceClassification (trl/trainer/reward_trainer.py,
  `create_model_from_path`), which raises "Unrecognized configuration class" for a model type transformers has no
  sequence-classification class for (seq_cls_types.json: MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES of
  transformers 5.24; 110 of its 196 causal-LM types have none).
- peft refuses LoRA on a Mamba block's `out_proj` and `conv1d` for its Mamba-based model types
  (peft/tuners/tuners_utils.py `_check_lora_target_modules_mamba`, peft 0.21.2).
"""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING

from hpcmem.errors import Problems
from hpcmem.models.coverage import classification
from hpcmem.models.params import all_linear_targets, peft_default_targets

if TYPE_CHECKING:
    from hpcmem.job.protocol import Job

MAMBA_TYPES = frozenset({"falcon_h1", "mamba", "mamba2", "falcon_mamba", "nemotron_h"})
MAMBA_INCOMPATIBLE = frozenset({"out_proj", "conv1d"})


@lru_cache(maxsize=1)
def seq_cls_types() -> frozenset[str]:
    text = Path(__file__).with_name("seq_cls_types.json").read_text(encoding="utf-8")
    return frozenset(json.loads(text)["types"])


def auto_class_problems(job: Job, p: Problems) -> None:
    t, model_type = job.train, job.model.model_type
    if (t.trainer == "reward" and model_type in classification().get("types", {})
            and model_type not in seq_cls_types()):
        p.add(f"reward: RewardTrainer loads AutoModelForSequenceClassification, and transformers 5.24 has no "
              f"sequence-classification class for model_type {model_type!r} (it raises 'Unrecognized configuration "
              "class'); choose a model type that has one")
    if t.use_peft and model_type in MAMBA_TYPES:
        targets = set(t.lora_target_modules)
        try:
            if not targets:
                targets = set(peft_default_targets(job.model))
            elif "all-linear" in targets:
                targets = set(all_linear_targets(job.model))
        except Exception:  # noqa: BLE001 - no default targets: the LoRA rules say so
            return
        bad = sorted(targets & MAMBA_INCOMPATIBLE)
        if bad:
            p.add(f"lora_target_modules reach {', '.join(bad)}, which peft refuses on Mamba-based models "
                  f"(model_type {model_type!r}: 'Module ... is incompatible with Mamba-based models'); name the "
                  "modules to adapt without them")
