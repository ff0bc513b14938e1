"""Regenerate hpcmem/models/peft_moe.json — which model types peft rewrites LoRA targets for — from the installed
transformers and peft.

peft 0.21.2 (peft/utils/transformers_weight_conversion.py `convert_peft_config_for_transformers`, called first in
peft/tuners/tuners_utils.py `BaseTuner.inject_adapter`) rewrites a LoraConfig when
`transformers.conversion_mapping.get_checkpoint_conversion_mapping(model_type)` is not None and peft's copy of
`_MODEL_TO_CONVERSION_PATTERN` maps the type to a base that `_MOE_TARGET_MODULE_MAPPING` and `_MOE_FUSED_TARGETS`
both hold (`_convert_peft_config_moe`). The table records those types, each base's name mapping (transformers v4
projection name → v5 parameter) and which v4 names one v5 parameter fuses; hpcmem.models.peft_targets applies them
without torch (peft looks types up by `config.model_type`, so the two class-name keys of transformers' pattern table
never match and are kept only as peft has them). tests/models/test_peft_targets_torch.py holds the shipped file to
this function.

    python -m hpcmem.trace.peft_moe_table        # rewrite the shipped table
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from hpcmem.models.peft_targets import TABLE_PATH


def build_table() -> dict[str, Any]:
    """The table as the installed libraries define it: {"versions", "bases", "types"}."""
    import peft
    import transformers
    from peft.utils import transformers_weight_conversion as conv
    from transformers.conversion_mapping import get_checkpoint_conversion_mapping

    bases = {base: {"modules": dict(conv._MOE_TARGET_MODULE_MAPPING[base]),
                    "fused": {new: list(old) for new, old in conv._MOE_FUSED_TARGETS[base].items()}}
             for base in conv._MOE_TARGET_MODULE_MAPPING
             if conv._MOE_TARGET_MODULE_MAPPING[base] and conv._MOE_FUSED_TARGETS.get(base)}
    types = {model_type: base for model_type, base in sorted(conv._MODEL_TO_CONVERSION_PATTERN.items())
             if base in bases and get_checkpoint_conversion_mapping(model_type) is not None}
    return {"versions": {"peft": peft.__version__, "transformers": transformers.__version__},
            "bases": bases, "types": types}


def write_table(path: Path = TABLE_PATH) -> None:
    path.write_text(json.dumps(build_table(), indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    write_table()
