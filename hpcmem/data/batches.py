"""Pure rules (stdlib only): which rows a TRL 1.16 trainer keeps for a max_length, and the shape of its micro-batches.

Sources, in the installed trl package:
- SFT  `sft_trainer.py` `_prepare_dataset`: sequences are cut to `max_length` (keep_start) unless packing; with a
  prompt-completion dataset (completion_only_loss, the default there) an example whose prompt alone reaches
  `max_length` is left without labels and dropped. `DataCollatorForLanguageModeling`: padded → [B, longest];
  padding-free → one row [1, sum of lengths]; `pad_to_multiple_of` rounds the sequence dimension up.
  Packing with bfd / bfd_split forces padding-free (`self.padding_free = args.padding_free or (packing and bfd*)`).
- DPO  `dpo_trainer.py`: drops examples whose prompt alone fills `max_length`; `DataCollatorForPreference` cuts
  prompt+chosen and prompt+rejected to `max_length` each and pads the 2·B rows together. padding_free falls back
  to padding in 1.16.
- Reward `reward_trainer.py`: drops (does not cut) pairs where chosen or rejected is longer than `max_length`;
  the collator pads the 2·B rows together.
- GRPO `grpo_trainer.py` `_tokenize_prompts`: prompts are not cut (there is no max_prompt_length in 1.16); a batch
  of B prompts is padded to its longest.
- KTO  `kto_trainer.py` `_prepare_dataset`: drops examples whose prompt alone fills `max_length`, then gives each
  example a KL completion, the previous example's within each batch of per_device_train_batch_size
  (`add_kl_completion_ids`, a batched map: the first takes the batch's last); `DataCollatorForUnpairedPreference`
  cuts prompt + completion and prompt + KL completion to `max_length` and pads each set of B rows to its longest.
- Image-text data (`vision=True`): SFT and DPO skip dataset preparation (`skip_prepare_dataset = _is_vision_dataset`),
  so no example is dropped; their vision collators (`DataCollatorForVisionLanguageModeling`,
  `DataCollatorForVisionPreference`) cut every row to `max_length` (keep_start) and always pad. GRPO as above.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from hpcmem.job.trainers import REGISTRY

# The trainers whose data makes a profile, and per trainer the parts (per-example token counts) that form the rows of
# a micro-batch, in row order: their registry entries' `lengths` (hpcmem.job.trainers)
TRAINERS = tuple(name for name, e in REGISTRY.items() if e.lengths.profiled)
ROW_PARTS = {name: REGISTRY[name].lengths.row_parts for name in TRAINERS}
PACKING_STRATEGIES = ("bfd", "bfd_split", "wrapped")


@dataclass(frozen=True, kw_only=True)
class Kept:
    """The rows a trainer trains on for one max_length, flat in dataset order: kept example i owns
    rows[i * rows_per_example : (i + 1) * rows_per_example] (chosen then rejected for DPO / Reward)."""

    rows: list[int]
    rows_per_example: int
    num_examples: int
    num_truncated: int      # kept examples with at least one row cut to max_length
    num_dropped: int        # examples the trainer filters out
    tokens_total: int       # tokens of all rows before any cut
    tokens_kept: int

    @property
    def tokens_lost(self) -> int:
        return self.tokens_total - self.tokens_kept


def kept_rows(trainer: str, parts: Mapping[str, Sequence[int]], max_length: int | None, *,
              vision: bool = False) -> Kept:
    """Apply the trainer's max_length rules (module docstring) to per-example part lengths in dataset order;
    `vision`: the rules of image-text data (rows cut, none dropped)."""
    if trainer not in TRAINERS:
        raise ValueError(f"trainer must be one of {', '.join(TRAINERS)}; got {trainer!r}")
    rules = REGISTRY[trainer].lengths
    columns = [parts[name] for name in rules.row_parts]
    prompts = parts.get("prompt") if rules.drops_long_prompt and not vision else None
    cut = max_length if rules.truncates else None
    total = sum(sum(column) for column in columns)
    if cut is None:
        rows = [n for full in zip(*columns) for n in full] if len(columns) > 1 else list(columns[0])
        return Kept(rows=rows, rows_per_example=len(columns), num_examples=len(columns[0]), num_truncated=0,
                    num_dropped=0, tokens_total=total, tokens_kept=total)
    if len(columns) == 1 and prompts is None:  # plain SFT: only cuts (the common, large case)
        rows = [n if n <= cut else cut for n in columns[0]]
        return Kept(rows=rows, rows_per_example=1, num_examples=len(rows), num_dropped=0,
                    num_truncated=sum(1 for n in columns[0] if n > cut), tokens_total=total, tokens_kept=sum(rows))
    rows = []
    truncated = dropped = 0
    for i, full in enumerate(zip(*columns)):
        longest = max(full)
        if (rules.drops_overlong and not vision and longest > cut) or (prompts is not None and prompts[i] >= cut):
            dropped += 1
            continue
        if longest > cut:
            truncated += 1
            full = tuple(min(n, cut) for n in full)
        rows.extend(full)
    return Kept(rows=rows, rows_per_example=len(columns), num_examples=len(columns[0]), num_truncated=truncated,
                num_dropped=dropped, tokens_total=total, tokens_kept=sum(rows))


def kto_kl_rows(prompts: Sequence[int], lengths: Sequence[int], max_length: int | None, batch: int) -> list[int]:
    """KTO's KL rows in dataset order (module docstring): over the examples kept, KL row i = prompt_i + the completion
    (length − prompt) of the previous example in its batch of `batch`, the first taking the batch's last; cut to
    max_length."""
    kept = [(p, n - p) for p, n in zip(prompts, lengths, strict=True) if max_length is None or p < max_length]
    rows = []
    for start in range(0, len(kept), batch):
        group = kept[start:start + batch]
        completions = [c for _, c in group]
        for (p, _), c in zip(group, completions[-1:] + completions[:-1]):
            rows.append(p + c if max_length is None else min(p + c, max_length))
    return rows


def round_up(n: int, multiple: int | None) -> int:
    """`trl.trainer.utils.pad`: the sequence dimension grows to the next multiple of `pad_to_multiple_of`."""
    if not multiple or n % multiple == 0:
        return n
    return n + multiple - n % multiple


def micro_batches(rows: Sequence[int], rows_per_batch: int, *, flatten: bool,
                  pad_to_multiple_of: int | None) -> list[tuple[int, int]]:
    """(real tokens, tensor tokens) of each micro-batch of `rows_per_batch` rows taken in order (the last may be
    short). rows_per_batch = per_device_train_batch_size × rows per example (2 for DPO / Reward).

    Padded: tensor = rows × round_up(longest row). Flattened (padding-free): tensor = round_up(sum of the rows).
    """
    if rows_per_batch < 1:
        raise ValueError(f"rows per micro-batch must be ≥ 1; got {rows_per_batch}")
    out = []
    for start in range(0, len(rows), rows_per_batch):
        group = rows[start:start + rows_per_batch]
        real = sum(group)
        if flatten:
            out.append((real, round_up(real, pad_to_multiple_of)))
        else:
            out.append((real, len(group) * round_up(max(group), pad_to_multiple_of)))
    return out


def nearest_rank(sorted_values: Sequence[int], fraction: float) -> int:
    """The smallest value with at least `fraction` of the values ≤ it (nearest-rank percentile)."""
    if not sorted_values:
        return 0
    rank = max(1, -(-round(fraction * len(sorted_values) * 1_000_000) // 1_000_000))
    return sorted_values[min(rank, len(sorted_values)) - 1]


def summarize(batches: Sequence[tuple[int, int]], *, num_rows: int) -> dict:
    """Rows, micro-batches, padding fraction, worst (max) and typical (median) tensor tokens per micro-batch."""
    real = sum(b[0] for b in batches)
    tensor = sum(b[1] for b in batches)
    sizes = sorted(b[1] for b in batches)
    return {
        "rows": num_rows,
        "micro_batches": len(batches),
        "tokens": real,
        "tensor_tokens": tensor,
        "padding_fraction": (tensor - real) / tensor if tensor else 0.0,
        "worst_tokens_per_micro_batch": sizes[-1] if sizes else 0,
        "typical_tokens_per_micro_batch": nearest_rank(sizes, 0.5),
    }
