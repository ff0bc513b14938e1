"""Where a learned profile is held, and the warning an estimate outside it carries.

A profile (hpcmem.models.profile) says in its `held` field up to which row length each technique it learned was
checked within a few percent of a trace of the same job (hpcmem/trace/learn.py `held`: full, LoRA and DoRA, with and
without checkpointing), and — where its rows check ran (`held_rows`) — over which rows per micro-batch. A job past that length, or with a technique no check covered, is estimated all the same —
the terms are the profile's — but never silently: the estimate's warnings say what is not held.
"""

from __future__ import annotations

from hpcmem.estimate.learned import (
    DEFAULT_NODROP,
    DORA_NODROP,
    NODROP,
    NOMDROP,
    NOAMP_OF,
    REENTRANT,
    default_cell,
    dora_nodrop_cell,
    noamp_base,
    noamp_taken,
    nodrop_taken,
    one_row,
    reentrant_cell,
    takes_model_dropout_off,
)
from hpcmem.estimate.activations import checkpoint_inputs_offloaded
from hpcmem.estimate.lora import lora_dropout_active, lora_layout
from hpcmem.job.jobspec import JobSpec
from hpcmem.job.shape import MicroBatch, precision
from hpcmem.models.module_names import reaches


def held_name(technique: str, gc: bool) -> str:
    """The name a profile's `held.techniques` gives a technique: "full gc", "lora no gc", "dora gc", …"""
    return f"{technique} {'gc' if gc else 'no gc'}"


def held_technique(name: str) -> tuple[str, bool]:
    """(technique, checkpointing) of a `held_name`."""
    return name.split(" ", 1)[0], not name.endswith(" no gc")


def job_technique(job: JobSpec, mb: MicroBatch) -> str:
    """The held name of the cell the job takes: full, LoRA, DoRA, or LoRA without dropout where the profile learned it
    (hpcmem.estimate.learned `nodrop_taken`), each but DoRA its reentrant variant where the job checkpoints reentrantly
    and the profile learned it (`reentrant_cell`) — for this micro-batch's one-row variant as the estimate asks."""
    t, prec, one = job.train, precision(job), one_row(job, mb)
    lora = lora_layout(job)
    if noamp_taken(job, prec, lora, mb):
        name = NOAMP_OF[noamp_base(job)]
        return held_name(name + (NOMDROP if takes_model_dropout_off(job, prec, lora, mb) else ""),
                         t.gradient_checkpointing)
    taken = nodrop_taken(job, prec, lora, one)
    name = NODROP if taken else "dora" if t.use_peft and t.use_dora else "lora" if t.use_peft else "full"
    on_default = t.use_dora and not job.reentrant_checkpointing and default_cell(job, prec, lora, one) is not None
    if name == "dora" and not on_default and dora_nodrop_cell(job, prec, one) is not None:
        name = DORA_NODROP
    # the reentrant variant of the no-dropout cell on peft's default targets is held as the no-dropout one's
    default_again = taken is not None and taken[0] is reentrant_cell(job, prec, DEFAULT_NODROP, one)
    if default_again or reentrant_cell(job, prec, name, one) is not None:
        name += REENTRANT
    if takes_model_dropout_off(job, prec, lora, mb):
        name += NOMDROP
    return held_name(name, t.gradient_checkpointing)


# What each "not held" warning says lies outside the profile's range, and the words it carries whatever its numbers
# (`learned_warnings` writes them; hpcmem.validate.random_report classes a random job's miss by them), in the order a
# class names them
OUTSIDE = {"rows per micro-batch": "per micro-batch (its rows check",
           "row length": "this job's rows are",
           "LoRA dropout / modules to save": "its LoRA cells were traced with dropout",
           "model dropout": "traced with the model's dropout on",
           "reentrant checkpointing": "traced with non-reentrant checkpointing",
           "reentrant checkpointing + offloading": "its reentrant cells were traced without activation offloading",
           "no autocast": "computes without it (bf16 and fp16 off)",
           "format-2 profile": "DoRA was not traced in that format",
           "technique": "is not among them",
           "not held anywhere": "not held (learned without its checks"}


def learned_warnings(job: JobSpec, mb: MicroBatch) -> list[str]:
    """The estimate's warnings for a learned model outside where its profile is held; [] inside (or derived)."""
    p = job.model.learned
    if p is None:
        return []
    held = p.held
    techniques: dict[str, int] = held.get("techniques") or {}
    name = job_technique(job, mb)
    longest = int(held.get("max_length") or 0)
    where = (f"learned profile of {p.model_type} (format 2, learned at ≤ 768 tokens per row) held at ≤ "
             f"{longest:,} tokens per row by hpcmem validate coverage" if held.get("format") else
             f"learned profile of {p.model_type} held within {held.get('within_pct', 3)} % at ≤ "
             f"{longest:,} tokens per row" + (f" ({', '.join(f'{k} {v:,}' for k, v in techniques.items())})"
                                              if techniques else ""))
    if not held.get("format") and not longest and not techniques:
        return [f"learned profile of {p.model_type}: {OUTSIDE['not held anywhere']}, "
                f"up to {held.get('learned_to', '?')} tokens per row): the layer terms are not checked against a "
                "trace; `hpcmem models learn` checks them"]
    out = []
    if held.get("format") and job.train.use_peft and job.train.use_dora:
        out.append(f"{where}; {OUTSIDE['format-2 profile']} (its adapters are the difference formulas' over "
                   "plain LoRA): not held; `hpcmem models learn` traces it")
    elif techniques and name not in techniques:
        out.append(f"{where}; this job's technique ({name}) {OUTSIDE['technique']} (not learned, or its check was not "
                   "within): not held")
    elif mb.seq > techniques.get(name, longest):
        out.append(f"{where}; {OUTSIDE['row length']} {mb.seq:,} tokens: its layer terms are extrapolated past where "
                   "they were held")
    rows = held.get("rows_held")
    if rows and not rows[0] <= mb.rows <= rows[1]:
        span = f"{rows[0]}–{rows[1]} rows" if rows[0] != rows[1] else f"{rows[0]} rows only"
        out.append(f"learned profile of {p.model_type}: held at {span} {OUTSIDE['rows per micro-batch']}: "
                   f"hpcmem validate coverage --rows-checks); this job's {mb.rows} rows scale its terms per row "
                   "past that: not held")
    t = job.train
    # the cells were traced with TRL's LoRA dropout 0.05 (or 0: the lora-nodrop cells, where learned) and no module
    # copies (hpcmem/trace/learn.py learn_job); other adapters add hpcmem.estimate.lora's difference formulas, which no
    # check holds on a learned type
    nodrop = name.startswith((NODROP, DORA_NODROP))     # traced without dropout (or its reentrant variant): held
    # a lora_modules_to_save name that reaches no module of the type copies nothing (hpcmem.models.module_names)
    copied = [n for n in t.lora_modules_to_save if reaches(p.model_type, n) is not None]
    changed = ([] if lora_dropout_active(t) or nodrop else ["no LoRA dropout"]) + \
        ([f"lora_modules_to_save {', '.join(copied)}"] if copied else [])
    if t.use_peft and changed:
        out.append(f"learned profile of {p.model_type}: {OUTSIDE['LoRA dropout / modules to save']} "
                   f"{'0' if nodrop else '0.05'} and no modules to save; this job's {' and '.join(changed)} is the "
                   "difference formulas' "
                   "(hpcmem.estimate.lora): not held")
    if not precision(job).amp and not noamp_taken(job, precision(job), lora_layout(job), mb):
        # every cell but the NOAMP_OF ones is traced under autocast (hpcmem/trace/learn.py: bf16 on); where the job
        # takes none of those (not learned; DoRA, reentrant checkpointing) an op that mixes a 16-bit
        # tensor with an fp32 one promotes to fp32 (an MoE's fp32 routing weights times its experts' outputs: their
        # gradients fp32 too; estimator/LOG.md), and peft's fp32 adapters compute in fp32 on fp32 input copies
        out.append(f"learned profile of {p.model_type}: its cells were traced under autocast (bf16 on); this job "
                   f"{OUTSIDE['no autocast']}, where 16-bit and fp32 operands promote to fp32 and "
                   "LoRA adapters compute in fp32: not held")
    if job.reentrant_checkpointing and not name.endswith(REENTRANT + " gc"):
        # no reentrant cell for this job's technique (peft's default targets but the no-dropout one have none;
        # profiles learned before the learner traced them): the cells run TRL's default, use_reentrant False
        # (trl/trainer/sft_trainer.py sets it when unset); the reentrant variant (torch/utils/checkpoint.py
        # CheckpointFunction) runs the layer's forward under no_grad and its whole recompute in the backward, the
        # non-reentrant one packs saved tensors through hooks and recomputes up to the last one it needs. The peaks
        # differ by type: the same traced jobs with use_reentrant True were 0.1 % (AXK1, full), 5.5 % (Gemma 4, LoRA)
        # and 8.3 % (RecurrentGemma, LoRA) lower (estimator/LOG.md; why per type: not analysed)
        out.append(f"learned profile of {p.model_type}: its cells were {OUTSIDE['reentrant checkpointing']} "
                   "(TRL's default); this job's is reentrant, which keeps a different set of tensors per "
                   "layer: not held")
    if job.reentrant_checkpointing and name.endswith(REENTRANT + " gc") and checkpoint_inputs_offloaded(t):
        # TRL keeps the offloading context open through the backward too (trl/trainer/sft_trainer.py `training_step`:
        # `with self.maybe_activation_offload_context`), and a reentrant checkpoint recomputes its layer inside the
        # backward with grad enabled (torch/utils/checkpoint.py CheckpointFunction.backward), so the recompute's saved
        # tensors go through the offloader's pack hook to the host as well (trl/models/activation_offloading.py
        # `pack_tensor`) and come back one autograd node at a time; the reentrant cells hold them all on the GPU at
        # the layer's backward. Traced, 2 × 8,192 tokens full fine-tuning on 3-layer cuts of ten types: the estimate
        # +0.3 to +21 % over (estimator/LOG.md); what stays depends on which saved tensors the backward peak needs
        out.append(f"learned profile of {p.model_type}: {OUTSIDE['reentrant checkpointing + offloading']}; with "
                   "activation offloading a reentrant recompute's saved tensors go to the host too (TRL keeps the "
                   "offloading context open through the backward), which the cells keep on the GPU: over, not held")
    if (t.disable_dropout or job.model_dropout_off) and p.provenance.get("dropout") and NOMDROP not in name:
        # the profile's cells are SFTTrainer's (hpcmem/trace/learn.py), which keeps the model's nn.Dropout modules;
        # TRL's disable_dropout_in_model (trl/trainer/utils.py) sets each to p = 0: no dropout masks are kept, and a
        # model that hands a module's p to its attention (GPT-2's SDPA dropout) computes that with p = 0 too
        out.append(f"learned profile of {p.model_type}: {OUTSIDE['model dropout']} (it holds nn.Dropout "
                   "modules with p > 0); this job sets them to p = 0 (disable_dropout, the default of DPO, KTO and "
                   "Reward), so its layers keep less than the profile's terms: not held")
    return out
