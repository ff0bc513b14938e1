"""What a probe run is built from, all made locally: the model config, random weights, a tokenizer and a dataset.

The model reaches TRL the way a user's does — as a model id string — so TRL's own loading rules apply (float32 unless
`model_init_kwargs={"dtype": ...}`, reference models built "like the policy", device_map None under DDP/DeepSpeed).
`random_weights(config, model_id)` swaps TRL's `create_model_from_path` for one that builds the architecture from its
config with random weights (`from_config`, which honours DeepSpeed ZeRO-3's `zero.Init` like `from_pretrained`),
for that id only. A local folder with real weights is loaded for real. An SFT job with images gets the trace's
processor (transformers' own processor class around a PIL image processor and the word tokenizer with the type's
vision tokens, hpcmem.trace.vision) and the trace's image rows; so do DPO, GRPO and RLOO jobs with images.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from hpcmem.job.shape import rows_needed
from hpcmem.job.spec import load_dtype
from hpcmem.job.trainers import entry, names
from hpcmem.models.config import checkpoint_dtype
from hpcmem.trace import vision
from hpcmem.trace.data import design_batch, design_preference, make_dataset, make_preference_dataset
from hpcmem.trace.pieces import auto_config, config_dict
from hpcmem.trace.pieces import tokenizer as word_tokenizer
from hpcmem.trace.vision_pref import make_vision_preference_dataset
from hpcmem.trace.vision_rl import make_image_prompt_dataset

NUM_SPECIAL = 3     # pad 0, eos 1, unk 2 — hpcmem.trace.pieces.SPECIAL_IDS, so trace and probe feed TRL the same rows


def hf_config(model_name: str) -> dict[str, Any]:
    """The config.json dict of a model: a local file or folder, else the offline catalog (hpcmem.trace.pieces)."""
    return config_dict(model_name)


def has_weights(model_name: str) -> bool:
    path = Path(model_name).expanduser()
    return path.is_dir() and any(f.suffix in (".safetensors", ".bin") for f in path.iterdir())


@contextlib.contextmanager
def random_weights(cfg: dict[str, Any], model_id: str, init_device: str | None = None,
                   image_text: bool = False) -> Iterator[None]:
    """While active, TRL's `create_model_from_path(model_id, ...)` builds random weights from `cfg` (no download).
    With `image_text`, AutoModelForImageTextToText, the class the trace builds (hpcmem.trace.vision `build_vlm`): for
    a checkpoint's config it resolves to the class its `architectures` names, which create_model_from_path loads
    (trl/trainer/utils.py: `getattr(transformers, config.architectures[0])`)."""
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
            # `auto`: the checkpoint's dtype as config.json names it, as from_pretrained
            dtype = getattr(torch, load_dtype(dtype, checkpoint_dtype(cfg)))
        arch = architecture or (transformers.AutoModelForImageTextToText if image_text
                                else transformers.AutoModelForCausalLM)
        config = auto_config(cfg, model_id)
        attn = kwargs.get("attn_implementation")
        device = init_device if init_device and not _zero3_enabled() else None
        with torch.device(device) if device else contextlib.nullcontext():
            return arch.from_config(config, dtype=dtype, **({"attn_implementation": attn} if attn else {}))

    modules = [importlib.import_module(f"trl.trainer.{name}_trainer") for name in names()]
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


def image_config(job: Any, cfg: dict[str, Any]) -> dict[str, Any]:
    """The config with the image/video token ids of the processor the probe hands TRL (the trace's,
    hpcmem.trace.vision), so the model finds the image tokens that processor writes."""
    return {**cfg, **vision.token_ids(vision.processor(job))}


def image_dataset(job: Any, steps: int) -> Any:
    """SFT, DPO, GRPO or RLOO with images: the trace's rows (blank images of the job's size, text filling each
    designed row; DPO: an image prompt with chosen and rejected completions, hpcmem.trace.vision_pref; GRPO/RLOO: an
    image prompt, hpcmem.trace.vision_rl), so a probe and a trace of the same job see the same batches."""
    if job.train.trainer == "dpo":
        return make_vision_preference_dataset(job, design_batch(job), _micro_batches(job, steps))
    if entry(job.train.trainer).generates:      # GRPO/RLOO: conversational image prompts (hpcmem.trace.vision_rl)
        return make_image_prompt_dataset(job, rows_needed(job, steps))
    return vision.make_image_dataset(job, design_batch(job).documents, _micro_batches(job, steps))


def _zero3_enabled() -> bool:
    from transformers.integrations import is_deepspeed_zero3_enabled

    return bool(is_deepspeed_zero3_enabled())


def tokenizer(vocab_size: int) -> Any:
    """A word-level tokenizer whose words cover the vocabulary: pad/eos/unk = 0/1/2, then "t3" … "t{V-1}" (the
    trace's, hpcmem.trace.pieces)."""
    return word_tokenizer(vocab_size - NUM_SPECIAL)


def _words(n: int, seed: int, vocab: int) -> str:
    return " ".join(f"t{NUM_SPECIAL + (seed * 7919 + j * 104729) % vocab}" for j in range(n))


def dataset(job: Any, steps: int) -> Any:
    """Rows of the lengths the estimate assumes (the worst case), built by the trainer's registry hook
    `probe_dataset`."""
    return entry(job.train.trainer).hook("probe_dataset")(job, steps)


def _micro_batches(job: Any, steps: int) -> int:
    return job.train.gradient_accumulation_steps * job.parallel.world_size * (steps + 2)


def design_dataset(job: Any, steps: int) -> Any:
    """SFT: the trace's worst-case micro-batch design (`hpcmem.trace.data.design_batch`: full rows with a ragged last
    one, two documents per packed bin, …) so that a CPU probe and a trace see the same batches."""
    return make_dataset(design_batch(job), _micro_batches(job, steps), job.model.vocab_size)


def dpo_dataset(job: Any, steps: int) -> Any:
    """DPO: prompt + completion reach max_length."""
    from datasets import Dataset

    vocab = job.model.vocab_size - NUM_SPECIAL
    length = job.train.max_length or job.tokens_per_micro_batch or 1024
    num_rows = rows_needed(job, steps)
    prompt = length // 2
    rest = length - prompt
    return Dataset.from_dict({
        "prompt": [_words(prompt, i, vocab) for i in range(num_rows)],
        # TRL concatenates prompt + completion text: the leading space keeps the word boundary
        "chosen": [" " + _words(rest, i + 1, vocab) for i in range(num_rows)],
        "rejected": [" " + _words(rest, i + 2, vocab) for i in range(num_rows)],
    })


def prompt_dataset(job: Any, steps: int) -> Any:
    """GRPO/RLOO: prompts of max_prompt_length tokens (completions are forced to max_completion_length by
    `generation_kwargs`)."""
    from datasets import Dataset

    vocab = job.model.vocab_size - NUM_SPECIAL
    return Dataset.from_dict({"prompt": [_words(job.train.max_prompt_length, i, vocab)
                                         for i in range(rows_needed(job, steps))]})


def reward_dataset(job: Any, steps: int) -> Any:
    """Reward: the trace's worst case, chosen and rejected rows of max_length tokens each (pre-tokenized ids, which
    RewardTrainer keeps whole). Until 2026-11-29 the probe gave each max_length // 2 words, half the tokens the
    estimate assumes: the H200 reward record of that day ran that way (estimator/LOG.md)."""
    return make_preference_dataset(job, design_preference(job), _micro_batches(job, steps))


def reward_kwargs(job: Any) -> dict[str, Any]:
    """GRPO/RLOO take reward functions."""
    return {"reward_funcs": [length_reward]}


def length_reward(completions: list[Any], **_: Any) -> list[float]:
    """A reward for GRPO/RLOO probes: any number works, memory does not depend on it."""
    return [float(len(str(c)) % 7) for c in completions]
