"""The worst-case micro-batch, built from a pre-tokenized dataset that TRL's own pipeline turns into the batch.

The trace hands `SFTTrainer` a dataset with an `input_ids` column, so TRL skips tokenization but still builds labels,
truncates, packs (`trl.pack_dataset`) and collates (`DataCollatorForLanguageModeling`) exactly as in a real run.
The documents are chosen so that every micro-batch is the worst case of its layout:

| layout | documents per micro-batch (L = max_length, B = per_device_train_batch_size) | batch the model sees |
|---|---|---|
| padded | B rows of L tokens; for B > 1 the last row is one token shorter | [B, L] (rounded up to pad_to_multiple_of) |
| packing bfd / bfd_split | 2·B documents of ~L/2 tokens: B full bins of two documents | [1, B·L], position_ids restart per document |
| packing wrapped | B rows of L tokens (rows are cut from the document stream) | [B, L] |
| padding-free, no packing | B pre-truncated rows of T/B tokens (T = tokens_per_micro_batch) | [1, T] |

Why these: tokens per micro-batch are at their maximum in every layout. The ragged last row of a padded batch and the
two documents per bin are what real data gives, and they decide a memory term: with SDPA or eager attention,
transformers materialises a [B, 1, S, S] mask (masking_utils.py `_ignore_causal_mask_sdpa`, `find_packed_sequence_
indices`) and hands it to the kernel, where a batch of equal rows or a single document per bin would let SDPA run
with `is_causal` and no mask. With B = 1 a padded row has no padding unless pad_to_multiple_of adds some.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hpcmem.errors import SpecError
from hpcmem.spec import JobSpec

PAD_ID, EOS_ID, UNK_ID = 0, 1, 2
FIRST_TOKEN_ID = 3


@dataclass(frozen=True)
class BatchDesign:
    """What one micro-batch looks like and the dataset rows that produce it."""

    layout: str
    documents: tuple[int, ...]      # document lengths of ONE micro-batch, in dataset order
    batch_shape: tuple[int, int]    # [rows, tokens per row] after collation (with pad_to_multiple_of)
    tokens: int                     # tokens fed to the model, padding included
    note: str


def design_batch(job: JobSpec) -> BatchDesign:
    t = job.train
    b, length = t.per_device_train_batch_size, t.max_length
    tpmb = job.tokens_per_micro_batch
    mult = t.pad_to_multiple_of or 1
    if t.packing:
        if length is None:
            raise SpecError("packing needs max_length (the bin size); TRL raises without it")
        if t.packing_strategy == "wrapped":
            docs = (length,) * b
            return BatchDesign("packing wrapped", docs, (b, _round(length, mult)), b * _round(length, mult),
                               f"{b} rows cut from the document stream, {length} tokens each")
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
    docs = (row,) * b if b == 1 or row == 1 else (row,) * (b - 1) + (row - 1,)
    width = _round(row, mult)
    ragged = " (last row one token shorter: padding, so an attention mask)" if b > 1 and row > 1 else ""
    return BatchDesign("padded", docs, (b, width), b * width, f"{b} rows of {row} tokens{ragged}")


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


def make_tokenizer() -> Any:
    """A three-token WordLevel tokenizer (pad 0, eos 1, unk 2): the dataset is pre-tokenized, TRL only needs the
    special tokens and a `PreTrainedTokenizerBase`. Built in-process, no Hub access."""
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    vocab = {"<pad>": PAD_ID, "<eos>": EOS_ID, "<unk>": UNK_ID}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>")
