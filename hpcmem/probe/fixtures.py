"""What a probe run is built from, all made locally: the model config, random weights, a tokenizer and a dataset.

The model reaches TRL the way a user's does — as a model id string — so TRL's own loading rules apply (float32 unless
`model_init_kwargs={"dtype": ...}`, reference models built "like the policy", device_map None under DDP/DeepSpeed).
`random_weights(config, model_id)` swaps TRL's `create_model_from_path` for one that builds the architecture from its
config with random weights (`from_config`, which honours DeepSpeed ZeRO-3's `zero.Init` like `from_pretrained`),
for that id only. A local folder with real weights is loaded for real.
"""

from __future__ import annotations

import contextlib
import copy
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

TRL_MODULES = ("sft_trainer", "dpo_trainer", "grpo_trainer", "rloo_trainer", "reward_trainer")
NUM_SPECIAL = 3     # pad 0, eos 1, unk 2 — the trace's ids (hpcmem.trace.data), so both feed TRL the same rows


def hf_config(model_name: str) -> dict[str, Any]:
    """The config.json dict of a model: a local file or folder, else the offline catalog."""
    from hpcmem.errors import SpecError
    from hpcmem.models import catalog_entry

    path = Path(model_name).expanduser()
    if path.exists():
        file = path / "config.json" if path.is_dir() else path
        return json.loads(file.read_text(encoding="utf-8"))
    entry = catalog_entry(model_name)
    if entry is None:
        raise SpecError(f"probe: no config for model {model_name!r}; pass a config.json or a catalog id")
    return dict(entry["config"])


def has_weights(model_name: str) -> bool:
    path = Path(model_name).expanduser()
    return path.is_dir() and any(f.suffix in (".safetensors", ".bin") for f in path.iterdir())


def special_ids(vocab_size: int) -> dict[str, int]:
    return {"pad": 0, "eos": 1, "unk": 2}


def make_config(cfg: dict[str, Any], model_id: str) -> Any:
    """A transformers config from the dict, with our tokenizer's special ids and `_name_or_path` = model_id."""
    from transformers import AutoConfig

    data = {k: copy.deepcopy(v) for k, v in cfg.items() if k not in ("architectures", "transformers_version", "auto_map")}
    data.pop("torch_dtype", None)
    data.pop("dtype", None)
    model_type = data.pop("model_type")
    ids = special_ids(int(cfg.get("vocab_size") or (cfg.get("text_config") or {}).get("vocab_size") or 0))
    data.update(pad_token_id=ids["pad"], eos_token_id=ids["eos"], bos_token_id=None)
    try:
        config = AutoConfig.for_model(model_type, **data)
    except Exception as exc:  # noqa: BLE001 — CwmConfig, ModernBertDecoderConfig: bos_token_id must be an int
        if "bos_token_id" not in str(exc):
            raise
        config = AutoConfig.for_model(model_type, **{**data, "bos_token_id": ids["unk"]})
    config._name_or_path = model_id
    return config


@contextlib.contextmanager
def random_weights(cfg: dict[str, Any], model_id: str, init_device: str | None = None) -> Iterator[None]:
    """While active, TRL's `create_model_from_path(model_id, ...)` builds random weights from `cfg` (no download)."""
    import importlib

    import torch
    import transformers

    import trl.trainer.utils as trl_utils

    original = trl_utils.create_model_from_path

    def create(model_name: str, architecture: Any = None, **kwargs: Any) -> Any:
        if model_name != model_id:
            return original(model_name, architecture, **kwargs)
        dtype = kwargs.get("dtype", "float32")          # TRL's default, as in create_model_from_path
        if isinstance(dtype, str):
            dtype = torch.bfloat16 if dtype == "auto" else getattr(torch, dtype)
        arch = architecture or transformers.AutoModelForCausalLM
        config = make_config(cfg, model_id)
        attn = kwargs.get("attn_implementation")
        device = init_device if init_device and not _zero3_enabled() else None
        with torch.device(device) if device else contextlib.nullcontext():
            return arch.from_config(config, dtype=dtype, **({"attn_implementation": attn} if attn else {}))

    modules = [importlib.import_module(f"trl.trainer.{m}") for m in TRL_MODULES]
    saved = [(m, m.create_model_from_path) for m in modules if hasattr(m, "create_model_from_path")]
    try:
        for m, _ in saved:
            m.create_model_from_path = create
        trl_utils.create_model_from_path = create
        yield
    finally:
        for m, fn in saved:
            m.create_model_from_path = fn
        trl_utils.create_model_from_path = original


def _zero3_enabled() -> bool:
    from transformers.integrations import is_deepspeed_zero3_enabled

    return bool(is_deepspeed_zero3_enabled())


def tokenizer(vocab_size: int) -> Any:
    """A word-level tokenizer: pad/eos/unk = 0/1/2, then "t3" … "t{V-1}": one word = one token, every id decodes."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    ids = special_ids(vocab_size)
    vocab = {"<pad>": ids["pad"], "<eos>": ids["eos"], "<unk>": ids["unk"]}
    vocab.update({f"t{i}": i for i in range(NUM_SPECIAL, vocab_size)})
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.Sequence([])
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>",
                                   model_max_length=1 << 30)


def _words(n: int, seed: int, vocab: int) -> str:
    return " ".join(f"t{NUM_SPECIAL + (seed * 7919 + j * 104729) % vocab}" for j in range(n))


def dataset(job: Any, steps: int) -> Any:
    """Rows of the lengths the estimate assumes (the worst case). SFT and reward: the trace's worst-case micro-batch
    design (`hpcmem.trace.data.design_batch`: full rows with a ragged last one, two documents per packed bin, B
    chosen + B rejected rows of max_length, …) so that a CPU probe and a trace see the same batches. DPO: prompt +
    completion reach max_length. GRPO/RLOO: prompts of max_prompt_length tokens (completions are forced to
    max_completion_length by `generation_kwargs`)."""
    from datasets import Dataset

    t = job.train
    vocab = job.model.vocab_size - NUM_SPECIAL
    length = t.max_length or job.tokens_per_micro_batch or 1024
    micro_batches = t.gradient_accumulation_steps * job.parallel.world_size * (steps + 2)
    num_rows = rows_needed(job, steps)
    if t.trainer == "sft":
        from hpcmem.trace.data import design_batch, make_dataset

        return make_dataset(design_batch(job), micro_batches, job.model.vocab_size)
    if t.trainer == "dpo":
        prompt = length // 2
        rest = length - prompt
        return Dataset.from_dict({
            "prompt": [_words(prompt, i, vocab) for i in range(num_rows)],
            # TRL concatenates prompt + completion text: the leading space keeps the word boundary
            "chosen": [" " + _words(rest, i + 1, vocab) for i in range(num_rows)],
            "rejected": [" " + _words(rest, i + 2, vocab) for i in range(num_rows)],
        })
    if t.trainer in ("grpo", "rloo"):
        return Dataset.from_dict({"prompt": [_words(t.max_prompt_length, i, vocab) for i in range(num_rows)]})
    if t.trainer == "reward":
        # the trace's worst case: chosen and rejected rows of max_length tokens each (pre-tokenized ids, which
        # RewardTrainer keeps whole). Until 2026-11-29 the probe gave each max_length // 2 words, half the tokens
        # the estimate assumes: the H200 reward record of that day ran that way (estimator/LOG.md).
        from hpcmem.trace.data import design_preference, make_preference_dataset

        return make_preference_dataset(job, design_preference(job), micro_batches)
    raise ValueError(f"no probe dataset for trainer {t.trainer}")


def rows_needed(job: Any, steps: int) -> int:
    t = job.train
    per_step = t.per_device_train_batch_size * t.gradient_accumulation_steps * job.parallel.world_size
    if t.trainer in ("grpo", "rloo"):
        per_step = max(per_step, t.generation_batch_size or 0) * (t.steps_per_generation or 1)
    return max(16, per_step * (steps + 2))


def length_reward(completions: list[Any], **_: Any) -> list[float]:
    """A reward for GRPO/RLOO probes: any number works, memory does not depend on it."""
    return [float(len(str(c)) % 7) for c in completions]
