"""`model_init_kwargs` of a TRL config, as `trl <trainer>` hands it to from_pretrained.

Every TRL 1.16 training script (trl/scripts/sft.py, dpo.py, reward.py, grpo.py, rloo.py, kto.py, distillation.py,
`main`) builds `dict(revision=..., trust_remote_code=..., attn_implementation=model_args.attn_implementation,
dtype=model_args.dtype)` and then `.update(training_args.model_init_kwargs)`: a key of model_init_kwargs wins over
ModelConfig's field of the same name. Since that dict always holds `dtype`, transformers 5 from_pretrained ignores a
`torch_dtype` beside it (modeling_utils.py `from_pretrained`: "dtype if dtype is not None else torch_dtype").
"""

from __future__ import annotations

from typing import Any

from hpcmem.errors import Problems
from hpcmem.inputs.values import json_object, shown

# keys that take the place of the ModelConfig field of the same name
READ = ("dtype", "attn_implementation")
# from_pretrained arguments that choose where the checkpoint comes from, not what is allocated
NO_EFFECT = frozenset({"revision", "trust_remote_code", "cache_dir", "token", "local_files_only", "force_download",
                       "use_safetensors", "subfolder"})


def apply_model_init_kwargs(settings: dict[str, Any]) -> None:
    """Pop `model_init_kwargs` from `settings` and write its dtype / attn_implementation over the settings' own, as
    TRL's scripts do; any other key (device_map, quantization_config, torch_dtype, ...) is refused, naming it."""
    raw = settings.pop("model_init_kwargs", None)
    if raw is None:
        return
    kwargs = json_object("model_init_kwargs", raw)
    p = Problems()
    for key, value in kwargs.items():
        if key in READ:
            settings[key] = value
        elif key == "torch_dtype":
            p.add(f"model_init_kwargs.torch_dtype={shown(value)} has no effect: TRL's script always passes dtype "
                  "(ModelConfig's, float32 unless set) and from_pretrained then ignores torch_dtype — write dtype")
        elif key not in NO_EFFECT:
            name = key if key.isprintable() else shown(key)
            p.add(f"model_init_kwargs.{name}={shown(value)} is not modelled (a "
                  "from_pretrained argument hpcmem does not read): remove it, or set the TRL field that means it "
                  "(dtype, attn_implementation, load_in_4bit ...)")
    p.raise_if_any()
