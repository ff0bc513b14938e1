"""The worst-case micro-batch a trainer feeds the model, and the precisions its tensors take.

Shapes follow TRL 1.16's collators: SFT pads each batch to its longest row (worst case: every row max_length long);
packing bfd/bfd_split turns padding-free on, so the micro-batch is ONE row of ≤ B × max_length tokens
(sft_trainer.py: `self.padding_free = args.padding_free or (args.packing and strategy in {bfd, bfd_split})`);
wrapped packing keeps B rows of max_length; DPO and Reward run chosen and rejected in one forward of 2B rows;
GRPO/RLOO train on B rows of prompt + completion.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from hpcmem.job.image_rules import image_mask, prompt_image_tokens
from hpcmem.job.generation_batch import generation_batch_size
from hpcmem.job.position_table import model_positions
from hpcmem.job.trainers import entry

if TYPE_CHECKING:
    from hpcmem.job.protocol import Job


@dataclass(frozen=True, kw_only=True)
class MicroBatch:
    rows: int
    seq: int                 # tokens per row (padded)
    label_tokens: int        # positions the LM head projects (label ≠ −100; CUDA/Triton path scores only those)
    padding_free: bool
    source: str              # how the size was chosen, for the output

    attn_implementation: str = "sdpa"
    image_mask: bool = False    # Gemma 3's bidirectional mask over each image's tokens (hpcmem.job.image_rules)
    padded_with: int = 0        # rows padded as one batch before the split into micro-batches (generating trainers)

    @property
    def masked(self) -> bool:
        """Whether attention gets a 4-D mask (transformers masking_utils): padded rows of different lengths (the worst
        case keeps one row a token shorter, as real batches are) — a generating trainer's single row too, when the
        generation batch it was cut from held more rows (`padded_with`) —, or — without a FlashAttention kernel —
        the block-diagonal mask of several documents in one padding-free row, or Gemma 3's image mask. One unpadded
        row of text needs none."""
        if self.image_mask:
            return True
        if self.padding_free:
            return "flash" not in self.attn_implementation
        return max(self.rows, self.padded_with) > 1

    @property
    def tokens(self) -> int:
        return self.rows * self.seq


@dataclass(frozen=True, kw_only=True)
class Precision:
    weight: int              # bytes per loaded weight element
    act: int                 # bytes of matmul outputs (autocast dtype when bf16/fp16 is on)
    residual: int            # bytes of the residual stream (follows the weights: fp32 weights keep it fp32)
    autocast: bool           # weights in fp32 but compute in bf16/fp16: autocast caches 16-bit weight copies
    amp: bool = True         # autocast is active at all (False: fp32 LoRA adapters compute, and save, in fp32)


def _round_up(value: int, multiple: int | None) -> int:
    return value if not multiple else -(-value // multiple) * multiple


def scored(job: Job, positions: int) -> int:
    """The tokens a micro-batch scores: every position but each row's last (`positions`, the bound), or fewer where a
    length profile counted them (`label_tokens_per_micro_batch`: a DPO or KTO row's prompt is labelled -100,
    trl/trainer/dpo_trainer.py and kto_trainer.py, and TRL's fused LM head gathers the labelled positions only)."""
    counted = job.label_tokens_per_micro_batch
    return positions if counted is None else min(positions, counted)


def _counted(job: Job, labels: int) -> str:
    """The micro-batch's description of a counted label total (`scored`), or nothing where every position counts."""
    return "" if job.label_tokens_per_micro_batch is None else f", {labels:,} scored tokens (length profile)"


def micro_batch(job: Job) -> MicroBatch:
    t, m = job.train, job.model
    e = entry(t.trainer)
    b = t.per_device_train_batch_size
    if e.generates:
        seq = _round_up(t.max_prompt_length + t.max_completion_length, t.pad_to_multiple_of)
        # the whole generation batch is padded as one (prompts left, completions right to the longest) and only then
        # split into micro-batches (grpo_trainer.py / distillation_trainer.py `_generate_and_score_completions`, then
        # `_prepare_inputs`: split_tensor_dict), so a one-row micro-batch carries the padding of the rows beside it
        generated = generation_batch_size(job) // job.parallel.world_size
        # GRPO/RLOO hand the processor's token_type_ids to every forward (grpo_trainer.py
        # `_generate_and_score_completions`: extended with zeros over the completion), so Gemma 3 builds its image mask
        return MicroBatch(rows=b, seq=seq, label_tokens=b * t.max_completion_length, padding_free=False,
                          image_mask=image_mask(job), padded_with=generated,
                          source=f"{b} completions × (prompt {t.max_prompt_length} + completion "
                                 f"{t.max_completion_length})")
    # max_length None: TRL truncates nothing, every row is taken as long as the model's positions (MPT's max_seq_len)
    positions_key, positions = model_positions(m)
    max_len = t.max_length if t.max_length is not None else positions
    if e.rows_per_example > 1:
        rows = e.rows_per_example * b
        if job.tokens_per_micro_batch is not None:
            # the profile's worst micro-batch: chosen + rejected rows padded together (hpcmem.data.profile)
            seq = _round_up(-(-job.tokens_per_micro_batch // rows), t.pad_to_multiple_of)
            src = " (length profile)"
        else:
            seq = _round_up(max_len, t.pad_to_multiple_of)
            src = "" if t.max_length is not None else \
                f" (max_length none: every row {positions_key} {positions} — pass --lengths)"
        # a row's images sit in its prompt (vision DPO), so their tokens are never labels (hpcmem.job.image_rules)
        labels = scored(job, rows * max(seq - 1 - prompt_image_tokens(job), 0))
        return MicroBatch(rows=rows, seq=seq, label_tokens=labels, padding_free=False, image_mask=image_mask(job),
                          source=f"chosen+rejected: {e.rows_per_example}×{b} rows × {seq}{src}{_counted(job, labels)}")
    padding_free = t.padding_free or (t.packing and t.packing_strategy in ("bfd", "bfd_split"))
    if job.tokens_per_micro_batch is not None:
        tokens = job.tokens_per_micro_batch
        src = "length profile"
    else:
        tokens = b * max_len
        src = ("worst case: every row max_length" if t.max_length is not None else
               f"max_length none: every row {positions_key} {positions} — pass --lengths")
    if padding_free:
        seq = _round_up(tokens, t.pad_to_multiple_of)
        labels = scored(job, seq - 1)
        return MicroBatch(rows=1, seq=seq, label_tokens=labels, padding_free=True,
                          attn_implementation=t.attn_implementation,
                          source=f"padding-free: one row of {seq} tokens ({src}){_counted(job, labels)}")
    seq = _round_up(-(-tokens // b), t.pad_to_multiple_of)
    labels = scored(job, b * (seq - 1))
    return MicroBatch(rows=b, seq=seq, label_tokens=labels, padding_free=False, image_mask=image_mask(job),
                      source=f"padded: {b} rows × {seq} ({src}){_counted(job, labels)}")


def precision(job: Job) -> Precision:
    t = job.train
    weight = 2 if job.parallel.deepspeed and (t.bf16 or t.fp16) else job.weight_bytes  # DeepSpeed casts the module
    if job.parallel.fsdp and (t.bf16 or t.fp16):
        # accelerate's FSDP2 upcasts trainable parameters to fp32 under 16-bit mixed precision (utils/fsdp_utils.py;
        # measured per rank on CPU, estimator/LOG.md): shards, gradients and Adam states are fp32, units gathered in
        # 16-bit. Frozen (LoRA base) weights keep the load dtype.
        weight = job.weight_bytes if t.use_peft else 4
    mixed = t.bf16 or t.fp16
    fsdp_mixed = job.parallel.fsdp and mixed       # FSDP's MixedPrecisionPolicy gathers 16-bit params: no autocast
    if not entry(t.trainer).autocast and not fsdp_mixed:
        # the trainer's forward never enters accelerate's autocast wrapper (trainers/entry.py `autocast`)
        return Precision(weight=weight, act=weight, residual=weight, autocast=False, amp=False)
    act = 2 if mixed or weight == 2 else 4
    # bf16/fp16 off: accelerate's mixed_precision "no" wraps the forward in no autocast (accelerator.py
    # `prepare_model`), so fp32 LoRA adapters over 16-bit weights compute, and save, in fp32 (amp False)
    return Precision(weight=weight, act=act, residual=act if fsdp_mixed else weight,
                     autocast=mixed and weight == 4 and not fsdp_mixed, amp=mixed)


def rows_needed(job: Job, steps: int) -> int:
    t = job.train
    per_step = t.per_device_train_batch_size * t.gradient_accumulation_steps * job.parallel.world_size
    if entry(t.trainer).generates:
        per_step = max(per_step, t.generation_batch_size or 0) * (t.steps_per_generation or 1)
    return max(16, per_step * (steps + 2))
