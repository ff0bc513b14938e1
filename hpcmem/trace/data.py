"""The worst-case micro-batch, built from a pre-tokenized dataset that TRL's own pipeline turns into the batch.

The trace hands `SFTTrainer` a dataset with an `input_ids` column, so TRL skips tokenization but still builds labels,
truncates, packs (`trl.pack_dataset`) and collates (`DataCollatorForLanguageModeling`) exactly as in a real run.
The documents are chosen so that every micro-batch is the worst case of its layout:

| layout | documents per micro-batch (L = max_length, B = per_device_train_batch_size) | batch the model sees |
|---|---|---|
| padded | B rows of L tokens; for B > 1 the last row is one token shorter | [B, L] (rounded up to pad_to_multiple_of) |
| packing bfd / bfd_split | 2·B documents of ~L/2 tokens: B full bins of two documents | [1, B·L], position_ids restart per document |
| packing wrapped | B rows of L tokens cut from the document stream; for B > 1 the stream's last row shorter | [B, L] |
| padding-free, no packing | B pre-truncated rows of T/B tokens (T = tokens_per_micro_batch) | [1, T] |

Why these: tokens per micro-batch are at their maximum in every layout. The ragged last row of a padded batch, the
short wrapped chunk and the two documents per bin are what real data gives, and they decide a memory term (wrapped
packing cuts each map batch of the dataset into chunks of L, so every map batch ends in a shorter chunk: trl/
data_utils.py `_pack_wrapped`; the micro-batch that draws it is padded): with SDPA or eager attention,
transformers materialises a [B, 1, S, S] mask (masking_utils.py `_ignore_causal_mask_sdpa`, `find_packed_sequence_
indices`) and hands it to the kernel, where a batch of equal rows or a single document per bin would let SDPA run
with `is_causal` and no mask. With B = 1 a padded row has no padding unless pad_to_multiple_of adds some.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hpcmem.errors import SpecError
from hpcmem.job.jobspec import JobSpec
from hpcmem.job.shape import micro_batch
from hpcmem.job.trainers import entry
from hpcmem.trace.pieces import FIRST_TOKEN_ID, WORD


@dataclass(frozen=True)
class BatchDesign:
    """What one micro-batch looks like and the dataset rows that produce it."""

    layout: str
    documents: tuple[int, ...]      # document lengths of ONE micro-batch, in dataset order
    batch_shape: tuple[int, int]    # [rows, tokens per row] after collation (with pad_to_multiple_of)
    tokens: int                     # tokens fed to the model, padding included
    note: str


def profiled_rows(job: JobSpec) -> JobSpec:
    """A length profile's worst micro-batch for the trainers whose trace designs rows of max_length (DPO, Reward,
    KTO): the job with max_length set to that micro-batch's row length (hpcmem.job.shape.micro_batch, as the
    estimate takes it) — TRL's collator then pads the traced rows to it. SFT designs from tokens_per_micro_batch
    itself; GRPO/RLOO take the profile as max_prompt_length."""
    import dataclasses

    t = job.train
    if job.tokens_per_micro_batch is None or t.trainer == "sft" or entry(t.trainer).generates:
        return job
    seq = micro_batch(job).seq
    return dataclasses.replace(job, train=dataclasses.replace(t, max_length=seq), tokens_per_micro_batch=None,
                               label_tokens_per_micro_batch=None)


def design_batch(job: JobSpec) -> BatchDesign:
    """The worst-case micro-batch of the job's trainer (its registry hook `trace_design`)."""
    return entry(job.train.trainer).hook("trace_design")(job)


def design_sft(job: JobSpec) -> BatchDesign:
    t = job.train
    b, length = t.per_device_train_batch_size, t.max_length
    tpmb = job.tokens_per_micro_batch
    mult = t.pad_to_multiple_of or 1
    if t.packing:
        if length is None:
            raise SpecError("packing needs max_length (the bin size); TRL raises without it")
        if t.packing_strategy == "wrapped":
            # the stream the copies make runs one token short per micro-batch: its chunks are full but the last,
            # the last micro-batch's last row (sequential sampling: hpcmem.trace.trainer `common_args`)
            docs = _last_row_short(length, b)
            ragged = " (the last micro-batch's last row shorter: padding, so an attention mask)" if docs[-1] < length \
                else ""
            return BatchDesign("packing wrapped", docs, (b, _round(length, mult)), b * _round(length, mult),
                               f"{b} rows cut from the document stream, {length} tokens each{ragged}")
        half = max(length // 2, 1)
        docs = tuple(x for _ in range(b) for x in ((half, length - half) if length > 1 else (1,)))
        total = _round(b * length, mult)
        return BatchDesign(f"packing {t.packing_strategy}", docs, (1, total), total,
                           f"one row of {b} full bins × {length} tokens, two documents per bin")
    if t.padding_free:
        if tpmb is None:
            raise SpecError("padding_free without packing has no max_length: give tokens_per_micro_batch "
                            "(the longest micro-batch of your pre-truncated data, e.g. from `hpcmem lengths`)")
        per_doc = -(-tpmb // b)
        docs = (per_doc,) * b
        total = _round(per_doc * b, mult)
        return BatchDesign("padding-free", docs, (1, total), total,
                           f"one row of {b} pre-truncated documents × {per_doc} tokens")
    row = length if tpmb is None else min(-(-tpmb // b), length or tpmb)
    if row is None:
        raise SpecError("max_length None on a padded batch: give tokens_per_micro_batch (the longest batch)")
    docs = _last_row_short(row, b)
    width = _round(row, mult)
    ragged = " (last row one token shorter: padding, so an attention mask)" if docs[-1] < row else ""
    return BatchDesign("padded", docs, (b, width), b * width, f"{b} rows of {row} tokens{ragged}")


def _last_row_short(row: int, b: int) -> tuple[int, ...]:
    """b rows of `row` tokens, the last one token shorter where there are two rows or more to differ (and a token to
    spare): the ragged row real batches have."""
    return (row,) * b if b == 1 or row == 1 else (row,) * (b - 1) + (row - 1,)


def _round(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


def dataset_rows(design: BatchDesign, num_micro_batches: int, vocab_size: int) -> list[list[int]]:
    """Token ids for `num_micro_batches` copies of the design (distinct ids, never the pad/eos token)."""
    span = max(vocab_size - FIRST_TOKEN_ID, 1)
    rows: list[list[int]] = []
    for _ in range(num_micro_batches):
        for n in design.documents:
            start = len(rows) * 7
            rows.append([FIRST_TOKEN_ID + (start + i) % span for i in range(n)])
    return rows


def make_dataset(design: BatchDesign, num_micro_batches: int, vocab_size: int) -> Any:
    from datasets import Dataset

    return Dataset.from_dict({"input_ids": dataset_rows(design, num_micro_batches, vocab_size)})


# -- preference trainers (DPO, reward) ---------------------------------------------------------------------------------


def design_preference(job: JobSpec) -> BatchDesign:
    """The worst-case DPO / reward micro-batch: B chosen rows then B rejected rows, all max_length tokens long except
    the last rejected one (one token shorter: padding, so an attention mask, as real pairs of unequal length give).

    DPO rows are prompt + completion truncated per row with keep_start (DataCollatorForPreference): the chosen rows
    are longer than max_length before truncation. Reward rows are pre-tokenized and kept whole (RewardTrainer drops
    pairs longer than max_length, it never truncates)."""
    t = job.train
    b, length = t.per_device_train_batch_size, t.max_length
    if length is None:
        raise SpecError(f"the {t.trainer} trace needs max_length (the longest chosen/rejected sequence)")
    if length < 4:
        raise SpecError(f"the {t.trainer} trace needs max_length ≥ 4; got {length}")
    mult = t.pad_to_multiple_of or 1
    rows = (length,) * (2 * b - 1) + (length - 1,)
    width = _round(length, mult)
    return BatchDesign("preference", rows, (2 * b, width), 2 * b * width,
                       f"{b} chosen + {b} rejected rows of {length} tokens (last rejected row one token shorter)")


def preference_prompt_length(job: JobSpec) -> int:
    """DPO prompt tokens per row: half of max_length (a prompt must be shorter than max_length or TRL drops it)."""
    return max(1, (job.train.max_length or 4) // 2)


def preference_label_tokens(job: JobSpec) -> int:
    """The tokens a DPO micro-batch of this design scores, at most: each of the 2·B rows' completion, max_length less
    the prompt (DPOTrainer labels the prompt -100)."""
    t = job.train
    return 2 * t.per_device_train_batch_size * max((t.max_length or 4) - preference_prompt_length(job), 1)


def make_preference_dataset(job: JobSpec, design: BatchDesign, num_micro_batches: int) -> Any:
    """DPO: text rows of the word tokenizer (DPOTrainer always tokenizes; it appends eos to each completion).
    Reward: pre-tokenized `chosen_ids` / `rejected_ids` (RewardTrainer skips tokenization for them)."""
    from datasets import Dataset

    b = job.train.per_device_train_batch_size
    length = design.documents[0]
    last = design.documents[-1]
    if entry(job.train.trainer).head == "score":     # RewardTrainer reads pre-tokenized chosen/rejected ids
        span = max(job.model.vocab_size - FIRST_TOKEN_ID, 1)
        chosen, rejected = [], []
        for _ in range(num_micro_batches):
            for i in range(b):
                chosen.append([FIRST_TOKEN_ID + (7 * i + k) % span for k in range(length)])
                n = last if i == b - 1 else length
                rejected.append([FIRST_TOKEN_ID + (11 * i + k) % span for k in range(n)])
        return Dataset.from_dict({"chosen_ids": chosen, "rejected_ids": rejected})
    prompt_len = preference_prompt_length(job)
    over = 8                                     # chosen rows run past max_length: keep_start truncation cuts them
    words = lambda n: " ".join([WORD] * n)      # noqa: E731
    prompts, chosen, rejected = [], [], []
    for _ in range(num_micro_batches):
        for i in range(b):
            prompts.append(words(prompt_len))
            chosen.append(" " + words(length - prompt_len - 1 + over))          # + eos
            n = (last if i == b - 1 else length + over) - prompt_len - 1
            rejected.append(" " + words(n))
    return Dataset.from_dict({"prompt": prompts, "chosen": chosen, "rejected": rejected})
