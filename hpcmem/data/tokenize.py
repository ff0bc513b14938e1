"""Token counts per example, as TRL 1.16's trainers tokenize them (datasets, trl imported inside functions).

Followed step by step (trl/trainer/*_trainer.py, `_prepare_dataset`):
- SFT: from/value chats → ChatML; EOS appended to non-conversational text / completion; "prompt"+"completion" →
  prompt (with the generation prompt) and prompt+completion tokenized, the prompt part being their common prefix;
  "messages" → the chat template; else `dataset_text_field`. A dataset with "input_ids" is already tokenized.
- DPO: implicit prompt extracted (`trl.extract_prompt`); EOS appended to non-conversational chosen/rejected;
  prompt, prompt+chosen, prompt+rejected tokenized; the prompt part is the shorter common prefix.
- Reward: EOS appended (non-conversational); prompt+chosen and prompt+rejected tokenized.
- GRPO: the prompt, with the chat template and its generation prompt when conversational (`_tokenize_prompts`).
- KTO: implicit prompt extracted, paired data unpaired (`trl.unpair_preference_dataset`: each pair becomes a chosen
  and a rejected example, in TRL's order); EOS appended to a non-conversational completion; prompt and
  prompt+completion tokenized, the prompt part being their common prefix (as SFT's prompt-completion).
"""

from __future__ import annotations

from collections.abc import Mapping

from hpcmem.data.batches import TRAINERS
from hpcmem.data.errors import LengthsError, MissingColumn, TokenizerUnfit
from hpcmem.job.trainers import REGISTRY

# Per TRL dataset type (the trainer's registry entry, `lengths.dataset`): the parts a tokenized example gives
PARTS = {"language_modeling": ("length",), "preference": ("prompt", "chosen", "rejected"), "prompt_only": ("prompt",),
         "unpaired_preference": ("length", "prompt")}


def _dataset(trainer: str) -> str:
    """The TRL dataset type a profiled trainer tokenizes (its registry entry's `lengths.dataset`); "" for any other."""
    return REGISTRY[trainer].lengths.dataset if trainer in TRAINERS else ""


def detect_format(trainer: str, columns: list[str], first: Mapping, dataset_text_field: str) -> str:
    """The dataset type TRL sees for this trainer, or a MissingColumn error naming what it needs."""
    from trl.data_utils import is_conversational, is_conversational_from_value

    conv = is_conversational(first) or is_conversational_from_value(first)
    have = ", ".join(columns)
    dataset = _dataset(trainer)
    if dataset == "language_modeling":
        if "input_ids" in columns:
            return "tokenized"
        if "prompt" in columns:
            if "completion" not in columns:
                hint = " (preference data? use --trainer dpo or reward)" if "chosen" in columns else ""
                raise MissingColumn(f"SFT data with a 'prompt' column needs a 'completion' column; found: {have}"
                                    + hint)
            return "conversational_prompt_completion" if conv else "prompt_completion"
        if conv and ("messages" in columns or "conversations" in columns):
            return "conversational"
        if dataset_text_field in columns:
            return "text"
        raise MissingColumn(f"SFT data needs a {dataset_text_field!r} column (--dataset-text-field), 'messages' "
                            f"(chat), 'conversations' (from/value chat) or 'prompt'+'completion'; found: {have}")
    if dataset == "preference":
        missing = [c for c in ("chosen", "rejected") if c not in columns]
        if missing:
            raise MissingColumn(f"{trainer.upper()} data needs 'chosen' and 'rejected' columns (and optionally "
                                f"'prompt'); missing {', '.join(missing)}; found: {have}")
        return "conversational_preference" if conv else "preference"
    if dataset == "prompt_only":
        if "prompt" not in columns:
            raise MissingColumn(f"GRPO data needs a 'prompt' column; found: {have}")
        return "conversational_prompt" if conv else "prompt"
    if dataset == "unpaired_preference":      # after unpairing (tokenize_lengths): prompt + completion
        if "prompt" not in columns or "completion" not in columns:
            raise MissingColumn(f"KTO data needs 'prompt' and 'completion' columns (unpaired) or 'chosen' and "
                                f"'rejected' (paired); found: {have}")
        return "conversational_prompt_completion" if conv else "prompt_completion"
    raise LengthsError(f"trainer must be one of {', '.join(TRAINERS)}; got {trainer!r}")


def part_names(trainer: str, fmt: str) -> tuple[str, ...]:
    rules = REGISTRY[trainer].lengths
    if rules.dataset == "language_modeling" and fmt.endswith("prompt_completion"):
        return PARTS["unpaired_preference"]             # a prompt-completion example: its length and its prompt's
    parts = PARTS[rules.dataset]
    return parts if rules.measures_prompt else tuple(p for p in parts if p != "prompt")


def kto_examples(dataset, num_proc: int | None = None):
    """The examples KTOTrainer tokenizes (`_prepare_dataset`): the implicit prompt extracted when there is no
    'prompt' column, a paired dataset unpaired with TRL's own functions (the order TRL trains in)."""
    from trl.data_utils import extract_prompt, unpair_preference_dataset

    columns = list(dataset.column_names)
    if "prompt" not in columns and {"chosen", "rejected"} <= set(columns):
        dataset = dataset.map(extract_prompt, num_proc=num_proc, keep_in_memory=True)
    if {"chosen", "rejected"} <= set(dataset.column_names):
        dataset = unpair_preference_dataset(dataset, num_proc=num_proc, keep_in_memory=True)
    return dataset


def check_tokenizer(tokenizer, fmt: str) -> None:
    if fmt.startswith("conversational") and not getattr(tokenizer, "chat_template", None):
        raise TokenizerUnfit(f"the data is conversational ({fmt}) but the tokenizer has no chat_template; "
                                "use the model's instruct tokenizer or set tokenizer.chat_template")
    if fmt in ("text", "prompt_completion", "preference") and tokenizer.eos_token is None:
        raise TokenizerUnfit("the tokenizer has no eos_token, which TRL appends to non-conversational text")


def text_lengths(tokenizer, texts: list[str], *, add_special_tokens: bool = True) -> list[int]:
    """len(tokenizer(text)["input_ids"]) for each text, without building the id lists.

    A fast tokenizer's Rust backend counts the tokens (`encode_batch_fast`: no offsets) once one ordinary call has
    set it up as `__call__` does (no truncation, no padding, special-token splitting); tests pin the equality.
    """
    if not texts:
        return []
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None or not hasattr(backend, "encode_batch_fast"):
        return [len(ids) for ids in tokenizer(texts, add_special_tokens=add_special_tokens)["input_ids"]]
    tokenizer(texts[:1], add_special_tokens=add_special_tokens)
    return [len(e) for e in backend.encode_batch_fast(texts, add_special_tokens=add_special_tokens)]


def _ids(tokenizer, texts: list[str], *, add_special_tokens: bool = True) -> list[list[int]]:
    return tokenizer(texts, add_special_tokens=add_special_tokens)["input_ids"] if texts else []


def _chat(tokenizer, example: Mapping, messages: list, **kwargs) -> str:
    import json

    tools = example.get("tools")
    tools = json.loads(tools) if isinstance(tools, str) else tools
    return tokenizer.apply_chat_template(messages, tokenize=False, tools=tools,
                                         **(example.get("chat_template_kwargs") or {}), **kwargs)


def _prefix(a: list[int], b: list[int]) -> int:
    from trl.data_utils import common_prefix_length

    return common_prefix_length(a, b)


def lengths_batch(batch: dict[str, list], *, tokenizer, trainer: str, fmt: str, text_field: str) -> dict:
    """datasets.map(batched=True) body: a batch of raw examples → their part lengths."""
    eos = tokenizer.eos_token or ""
    if fmt == "text":
        texts = [t if t.endswith(eos) else t + eos for t in batch[text_field]]
        return {"length": text_lengths(tokenizer, texts)}
    from trl.data_utils import extract_prompt, maybe_convert_to_chatml

    n = len(next(iter(batch.values())))
    examples = [maybe_convert_to_chatml({k: batch[k][i] for k in batch}) for i in range(n)]
    rules = REGISTRY[trainer].lengths
    if rules.dataset == "language_modeling" and fmt == "conversational":
        rendered = [_chat(tokenizer, ex, ex["messages"]) for ex in examples]
        return {"length": text_lengths(tokenizer, rendered, add_special_tokens=False)}
    if rules.dataset == "prompt_only":
        if fmt == "prompt":
            return {"prompt": text_lengths(tokenizer, [ex["prompt"] for ex in examples])}
        rendered = [_chat(tokenizer, ex, ex["prompt"], add_generation_prompt=True) for ex in examples]
        return {"prompt": text_lengths(tokenizer, rendered, add_special_tokens=False)}
    preference = rules.dataset == "preference"
    if preference and rules.measures_prompt and "prompt" not in examples[0]:
        examples = [{**ex, **extract_prompt(ex)} for ex in examples]
    seconds = ("chosen", "rejected") if preference else ("completion",)
    conv = fmt.startswith("conversational")
    # prompt alone (sft, dpo) and prompt + each second part, as strings ready for the tokenizer
    if conv:
        prompts = [_chat(tokenizer, ex, ex["prompt"], add_generation_prompt=True) for ex in examples] \
            if rules.measures_prompt else []
        fulls = {k: [_chat(tokenizer, ex, ex.get("prompt", []) + ex[k]) for ex in examples] for k in seconds}
    else:
        prompts = [ex["prompt"] for ex in examples] if rules.measures_prompt else []
        fulls = {k: [ex.get("prompt", "") + (ex[k] if ex[k].endswith(eos) else ex[k] + eos) for ex in examples]
                 for k in seconds}
    special = not conv
    if not rules.measures_prompt:
        return {k: text_lengths(tokenizer, fulls[k], add_special_tokens=special) for k in seconds}
    prompt_ids = _ids(tokenizer, prompts, add_special_tokens=special)
    full_ids = {k: _ids(tokenizer, fulls[k], add_special_tokens=special) for k in seconds}
    prompt_len = [min(_prefix(p, full_ids[k][i]) for k in seconds) for i, p in enumerate(prompt_ids)]
    if not preference:
        return {"length": [len(ids) for ids in full_ids["completion"]], "prompt": prompt_len}
    return {"prompt": prompt_len, **{k: [len(ids) for ids in full_ids[k]] for k in seconds}}


def tokenize_lengths(dataset, tokenizer, *, trainer: str, dataset_text_field: str = "text",
                     num_proc: int | None = None) -> tuple[str, dict[str, list[int]]]:
    """(format, {part: lengths in dataset order}) for the whole dataset, with a progress bar."""
    import pyarrow.compute as pc

    if _dataset(trainer) == "unpaired_preference" and len(dataset):
        dataset = kto_examples(dataset, num_proc)
    columns = list(dataset.column_names)
    fmt = detect_format(trainer, columns, dataset[0], dataset_text_field)
    if fmt == "tokenized":
        return fmt, {"length": pc.list_value_length(dataset.data.column("input_ids")).to_pylist()}
    check_tokenizer(tokenizer, fmt)
    try:
        # keep_in_memory: the lengths are small, and no cache file lands in the user's save_to_disk folder
        out = dataset.map(lengths_batch, batched=True, num_proc=num_proc, remove_columns=columns, keep_in_memory=True,
                          desc=f"Tokenizing for {trainer} ({fmt})",
                          fn_kwargs={"tokenizer": tokenizer, "trainer": trainer, "fmt": fmt,
                                     "text_field": dataset_text_field})
    except (KeyError, TypeError, AttributeError) as exc:
        raise LengthsError(f"could not tokenize the {fmt} data for {trainer}: {exc.__class__.__name__}: {exc} "
                           "(a row with a missing or non-text value?)") from exc
    return fmt, {name: out.data.column(name).to_pylist() for name in part_names(trainer, fmt)}
