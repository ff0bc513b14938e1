"""Where input enters hpcmem, it is checked here once: typed values (`values`), files read with size, encoding,
nesting and YAML-alias limits (`files`), the job settings namespace (`settings`) and a model's config.json
(`model_config`). Every refusal is one line naming the field or file, the value and the rule (stdlib + PyYAML).
"""

from hpcmem.inputs.values import MAX_COUNT, InputError

__all__ = ["MAX_COUNT", "InputError"]
