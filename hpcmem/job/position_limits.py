"""Rows past a model's position table: the model types whose real step stops there, and the jobs that reach it.

Most decoder types use rotary positions and run past `max_position_embeddings` (they only extrapolate). Some keep a
table of that size, and transformers' step then raises on a longer row — TRL does not check: its SFTTrainer
truncates to `max_length`, never to the model's positions. Two kinds, as position_limits.json records them per type
(measured with TRL's real SFTTrainer on the CPU by hpcmem.lab.position_limits, which says what each run is):

- `row` raises, `packed` runs: the table is indexed by position id (GPT-2's `wpe`, BioGPT's learned positions,
  CTRL's sinusoid table). TRL's padding-free collation restarts the ids at each packed sequence, so only a sequence
  longer than the table stops the step: one row of a padded batch, or one packed sequence (≤ max_length).
- `packed` raises too: the table is sliced by the row (MPT's ALiBi built at `max_seq_len`, OpenAI GPT's causal `bias`
  buffer), so a whole packed row longer than it stops the step as well.

The limit is the config's own value under the key the type names it by (`keys`: `n_positions`, `max_seq_len`, …).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from hpcmem.job.position_table import limited_by, model_positions, table
from hpcmem.job.shape import micro_batch

if TYPE_CHECKING:
    from hpcmem.job.protocol import Job


def position_problems(job: Job) -> list[str]:
    """Why the job's step stops at the model's position table ([] when it does not)."""
    m, t = job.model, job.train
    kinds = limited_by(m.model_type)
    if not kinds:
        return []
    key, limit = model_positions(m)
    mb = micro_batch(job)
    # a padding-free row holds whole sequences of at most max_length tokens, the ids restarting at each
    sequence = min(mb.seq, t.max_length) if mb.padding_free and t.max_length is not None else mb.seq
    if sequence > limit:
        return [f"{sequence} tokens per sequence ({mb.source}): {m.model_type}'s position table ({key} {limit}) "
                f"ends there and transformers' step raises past it ({_raised(m.model_type, 'row')}); set "
                f"max_length ≤ {limit}"]
    if "row" in kinds and mb.seq > limit:
        return [f"{mb.seq} tokens in one padding-free row ({mb.source}): {m.model_type}'s position table ({key} "
                f"{limit}) is sliced by the whole row, not by each packed sequence, and transformers' step raises "
                f"past it ({_raised(m.model_type, 'packed')}); keep per_device_train_batch_size × max_length ≤ "
                f"{limit} or turn packing and padding_free off"]
    return []


def _raised(model_type: str, run: str) -> str:
    """What the probe's run raised, by exception type (its message carries the shrunken model's sizes)."""
    return f"TRL's SFTTrainer on a shrunken {model_type}: {str(table()['types'][model_type][run]).split(':')[0]}"
