"""The HF/TRL pieces a trace and a probe build a trainer from, made one way for both.

- `config_dict(name, spec)`: the model's config.json dict, looked up in one order — a config.json (or a folder
  holding one) named by the model, then the offline catalog (hpcmem.models), then, for a ModelSpec, rebuilt from the
  spec (hpcmem.trace.hf_config). A config found for a ModelSpec must agree with its sizes, else it is rebuilt.
- `auto_config(cfg, model_id)`: the transformers config (`AutoConfig.for_model`) without the keys that are not
  architecture (dtype, quantization, auto_map), with the tokenizer's special ids.
- `peft_config(job)`: TRL's own LoRA config from the ModelConfig fields (`trl.get_peft_config`), as `trl <trainer>`
  builds it.
- `chat_template(image)`: a vision-language job's chat template, each image written as `image`.
- `tokenizer(num_words)`: a word-level tokenizer, pad/eos/unk = 0/1/2 (`SPECIAL_IDS`), then the words "t3", "t4", …
  (one word, one token, whitespace-split), built in-process: no Hub.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

from hpcmem.errors import SpecError
from hpcmem.job.jobspec import JobSpec
from hpcmem.models import catalog_entry
from hpcmem.models.profile import backbone_config
from hpcmem.models.spec import ModelSpec
from hpcmem.trace.hf_config import SUPPORTED_MODEL_TYPES, hf_config_dict

SPECIAL_IDS = {"pad": 0, "eos": 1, "unk": 2}
FIRST_TOKEN_ID = 3                    # the first ordinary token
WORD = f"t{FIRST_TOKEN_ID}"           # its word: text of n words "t3 t3 …" is n tokens
NOT_ARCHITECTURE = ("architectures", "torch_dtype", "dtype", "quantization_config", "auto_map",
                    "transformers_version")
SIZES = ("hidden_size", "num_hidden_layers", "vocab_size")


def config_dict(name: str, spec: ModelSpec | None = None) -> dict[str, Any]:
    """The config.json dict of model `name` (see the module docstring for the order)."""
    # a learned profile carries its config.json (hpcmem.models); a vision-language model with a learned text part
    # (hpcmem.models.vlm_learned) is built from its own whole config below
    if spec is not None and spec.learned is not None and spec.vision is None:
        return copy.deepcopy(dict(backbone_config(spec.learned.config)))
    cfg: Any = _local_config(name)
    if cfg is None:
        entry = catalog_entry(name)
        cfg = dict(entry["config"]) if entry else None
    if spec is None:
        if not isinstance(cfg, dict):
            raise SpecError(f"no config for model {name!r}; pass a config.json or a catalog id")
        return copy.deepcopy(cfg)

    if spec.vision is not None and isinstance(cfg, dict):
        return copy.deepcopy(cfg)            # a vision-language model: the whole config builds the whole model
    if isinstance(cfg, dict) and cfg.get("model_type") not in SUPPORTED_MODEL_TYPES and cfg.get("text_config"):
        cfg = dict(cfg["text_config"])       # a wrapper (gemma3): the text decoder is what trains
    if isinstance(cfg, dict) and all(cfg.get(k) == getattr(spec, k) for k in SIZES):
        return copy.deepcopy(cfg)
    return hf_config_dict(spec)


def _local_config(name: str) -> dict[str, Any] | None:
    path = Path(name).expanduser()
    file = path / "config.json" if path.is_dir() else path
    if not (file.is_file() and file.suffix == ".json"):
        return None
    try:
        data = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def auto_config(cfg: dict[str, Any], model_id: str | None = None) -> Any:
    """`AutoConfig.for_model` of the dict with the tokenizer's special ids (pad 0, eos 1, no bos); a copy, since
    transformers standardises nested dicts (rope_scaling) in place."""
    from transformers import AutoConfig

    data = {k: copy.deepcopy(v) for k, v in cfg.items() if k not in NOT_ARCHITECTURE}
    model_type = data.pop("model_type")
    data.update(pad_token_id=SPECIAL_IDS["pad"], eos_token_id=SPECIAL_IDS["eos"], bos_token_id=None)
    try:
        config = AutoConfig.for_model(model_type, **data)
    except Exception as exc:  # noqa: BLE001 — CwmConfig, ModernBertDecoderConfig: bos_token_id must be an int
        if "bos_token_id" not in str(exc):
            raise
        config = AutoConfig.for_model(model_type, **{**data, "bos_token_id": SPECIAL_IDS["unk"]})
    if model_id is not None:
        config._name_or_path = model_id
    return config


def peft_config(job: JobSpec) -> Any:
    """`trl.get_peft_config(ModelConfig(...))` of the job's LoRA fields, or None without PEFT. The task type is the
    job's: a reward model's adapters run only as SEQ_CLS (peft then trains the score head as a module to save;
    hpcmem.job.lora_task_rules)."""
    t = job.train
    if not t.use_peft:
        return None
    from trl import ModelConfig, get_peft_config

    targets = list(t.lora_target_modules) or None
    if targets == ["all-linear"]:
        targets = "all-linear"          # peft's special value is a plain string (peft/tuners/tuners_utils.py)
    return get_peft_config(ModelConfig(
        use_peft=True, lora_r=t.lora_r, lora_alpha=t.lora_alpha, lora_target_modules=targets,
        lora_dropout=t.lora_dropout, use_dora=t.use_dora,
        lora_modules_to_save=list(t.lora_modules_to_save) or None,
        lora_target_parameters=list(t.lora_target_parameters) or None,
        lora_task_type=t.lora_task_type))


def chat_template(image: str) -> str:
    """The chat template of a vision-language trace: each image part written as `image` (the processor's placeholder,
    which it expands to the image's tokens), each text part as it is."""
    return ("{% for message in messages %}{% for part in message['content'] %}"
            "{% if part['type'] == 'image' %}" + image + "{% elif part['type'] == 'text' %}"
            "{{ part['text'] }}{% endif %}{% endfor %}{% endfor %}")


def tokenizer(num_words: int = 1) -> Any:
    """The word-level tokenizer: pad/eos/unk, then `num_words` words "t3" … (ids 3 …)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<pad>": SPECIAL_IDS["pad"], "<eos>": SPECIAL_IDS["eos"], "<unk>": SPECIAL_IDS["unk"]}
    vocab.update({f"t{i}": i for i in range(FIRST_TOKEN_ID, FIRST_TOKEN_ID + max(num_words, 1))})
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.Sequence([])
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>",
                                   model_max_length=1 << 30)
