"""The step of a model whose per-layer terms were learned from traces (hpcmem.models.profile), not derived.

Everything that does not depend on the layers' insides stays the estimate's own: model states, sharding, the LoRA
adapters' states and what they keep (hpcmem.estimate.lora), TRL's fused LM head (hpcmem.estimate.loss), the last
instant of backward and the optimizer step (hpcmem.estimate.step.closing_phases). The profile adds, per real layer,
what its traced stand-in left alive after its forward (`fwd`), kept into backward (`kept`) and the highest bytes
above its entry during its backward (`peak`), and three remainders (`forward_other`, `head_other`, `entry_other`).
The phases are the derived ones' (hpcmem.estimate.step) with those terms in place of the formulas:

    forward          states + Σ fwd + forward_other + LM head (saved + forward temporaries)
    LM head backward states + Σ kept + head_other + LM head backward temporaries
    layer k backward states + Σ_{j≤k} kept_j + entry_other + gradients of layers > k (and the head) + peak_k
                     + Σ_{j>k} left_j (what layer j's backward leaves alive until its next forward; the forward of
                     layer k and the optimizer step also hold the left_j they find)

The lora cells were traced with TRL's LoRA at r = 16 on every Linear, or on the attention projections where peft
refuses that (the profile's `lora_reference`), as peft resolved those targets on the traced model (`traced_leaves`:
its MoE conversion leaves a dense DeepSeek-V3 layer's MLP unadapted under all-linear); a job with other targets or
rank gets the difference of the two adapters' saved inputs and backward temporaries, from hpcmem.estimate.lora, and
an adapted dense MLP linear the reference left out its forward instant (`untraced_mlp_instant`). A profile may also
hold the `lora-default` cell, traced on peft's default targets (provenance `lora_default`): a job whose adapters sit
where those put them takes that cell instead (the formulas' difference from all-linear misses where the default is a
fused projection: GPT-BigCode's c_attn, Falcon's query_key_value; estimator/LOG.md).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from hpcmem.errors import SpecError
from hpcmem.estimate.activations import (
    checkpoint_inputs_offloaded,
    final_norm_restored,
    offloaded_on_gpu,
    sliding_mask_alone,
)
from hpcmem.estimate.breakdown import Component, Phase
from hpcmem.estimate.closing import backward_components, closing_phases, resident_components, tied_head_gradient
from hpcmem.estimate.lora import LoraLayout, backward_transient, lora_dropout_active, lora_layout
from hpcmem.estimate.lora_fp32_compute import recompute_transient
from hpcmem.estimate.lora_variants import GATED_MLP, forward_instant, saved_weights, wrapped_weight_gradient
from hpcmem.estimate.loss import LossBytes, fused_head_bytes
from hpcmem.estimate.names import ACTIVATIONS, GATHERED, HEAD_BACKWARD, PREFETCHED_UNIT
from hpcmem.estimate.recurrent_tail import tail_bytes
from hpcmem.estimate.states import ParamParts, States
from hpcmem.job.jobspec import JobSpec
from hpcmem.job.shape import MicroBatch, Precision
from hpcmem.job.spec import TrainSpec
from hpcmem.models.params import LinearModule
from hpcmem.models.peft_targets import resolve
from hpcmem.models.profile import (
    ONE_ROW_PACKED,
    UNMASKED_SCORES,
    Cell,
    LayerKind,
    LearnedProfile,
    Linear,
    Poly,
    Term,
    cell_key,
    fit_poly,
    one_row_key,
    pieces,
)

REFERENCE_ADAPTER_BYTES = 4       # peft keeps adapters in fp32 (autocast_adapter_dtype) in the traced jobs
DEFAULT_LORA = "lora-default"     # the technique name of the cells traced on peft's default targets
DORA = "dora"                     # the cells traced with use_dora on the reference adapters
# the cells traced on peft's default targets (TRL passes target_modules=None unless the user names some) without
# dropout and with DoRA: a DPO, KTO or Reward job on them (TRL's disable_dropout) or a DoRA one. From the reference's
# cells (all-linear on most types) the difference formulas take every other adapter away at the cell's peak instant,
# whether or not their tensors are alive there (estimator/LOG.md): DoRA on GPT-NeoX's query_key_value alone read
# +7.7 %, the same job with all-linear +0.02 %
DEFAULT_NODROP = "lora-default-nodrop"
DORA_DEFAULT = "dora-default"
DEFAULT_VARIANTS = (DEFAULT_LORA, DEFAULT_NODROP, DORA_DEFAULT)
# the cells traced with the reference adapters at lora_dropout 0: what a LoRA job without dropout keeps — lora_dropout
# 0 (peft's nn.Identity), or TRL's disable_dropout (DPO, KTO, Reward: an nn.Dropout at p = 0, which returns its input)
NODROP = "lora-nodrop"
# DoRA on the reference adapters at lora_dropout 0 (a DoRA job of DPO, KTO or Reward, or one at lora_dropout 0): peft's
# DoRA forward without dropout keeps the input itself where the dropout cell kept the dropped copy beside it, which
# changes what the weight norm's instant and the layer's backward hold together (`learned_cell`)
DORA_NODROP = "dora-nodrop"
# the cells traced with reentrant checkpointing, named for the technique they vary ("full-reentrant", …): a job with
# gradient_checkpointing_kwargs use_reentrant True, or with PEFT under ZeRO-3, where TRL forces it. torch's
# CheckpointFunction (torch/utils/checkpoint.py) runs the layer's forward under no_grad and its whole recompute in the
# backward, where the non-reentrant default packs saved tensors through hooks and recomputes up to the last one it
# needs: another set of tensors per layer, and which of them a layer's peak holds is the type's own
REENTRANT = "-reentrant"
REENTRANT_OF = ("full", "lora", NODROP, DEFAULT_NODROP, DORA, DORA_NODROP)
# the cells traced without autocast (TRL's bf16 and fp16 off) on 16-bit weights, named for the technique they vary: a
# job that sets both off computes every op in its operands' dtype — an op that mixes a 16-bit tensor with an fp32 one
# (an MoE's fp32 routing weights, a state-space model's fp32 A_log, a norm's fp32 upcast kept past it) promotes to
# fp32, and peft's fp32 adapters compute, and save their inputs, in fp32 (accelerate's mixed_precision "no" runs the
# forward without torch.autocast: accelerator.py `prepare_model`) — which of those a layer keeps is the type's own
NOAMP_OF = {"full": "full-noamp", "lora": "lora-noamp", NODROP: "lora-nodrop-noamp"}
# the cells traced with the model's own nn.Dropout modules at p = 0 (trl/trainer/utils.py `disable_dropout_in_model`,
# which DPO, KTO and Reward apply by default: `disable_dropout`), named for the cell they vary: a type that holds
# dropout modules with p > 0 (GPT-2's family; provenance "dropout") keeps their masks in the other cells, SFT's — and
# GPT-2 hands its attention dropout's p to SDPA (modeling_gpt2.py), so the kernel changes with it; the full cell
# without autocast has one too (a Reward or DPO full fine-tune with bf16 off on 16-bit weights: random seed 2 job 279,
# OpenAI-GPT, +24.6 % on the dropout-on no-autocast cell)
NOMDROP = "-nomdrop"
NOMDROP_OF = ("full", NODROP, DORA_NODROP, DEFAULT_NODROP, NOAMP_OF["full"])


def variant_techniques() -> tuple[str, ...]:
    """The techniques of the variant cells the learner adds to a stored profile that lacks them (hpcmem.trace.learn
    `missing_cells`)."""
    return (NODROP, DORA_NODROP, DEFAULT_NODROP, DORA_DEFAULT, *(t + REENTRANT for t in REENTRANT_OF),
            *NOAMP_OF.values(), *(t + NOMDROP for t in NOMDROP_OF))


def base_technique(technique: str) -> tuple[str, bool]:
    """(the technique a cell's name varies, whether the cell is its REENTRANT variant)."""
    return (technique[:-len(REENTRANT)], True) if technique.endswith(REENTRANT) else (technique, False)
# the traced heads lie on one line where the quadratic part of the polynomial through them is at most this share of
# the head's bytes at the longest learned length (hpcmem.estimate.loss is linear below the tile's limit: c is rounding)
LINE_TOLERANCE = 1e-3


def precision_key(prec: Precision) -> str | None:
    """The profile cell for a precision: fp32 weights under 16-bit autocast (w4a2) or 16-bit weights (w2a2)."""
    if prec.act != 2:
        return None
    return {4: "w4a2", 2: "w2a2"}.get(prec.weight)


def no_grad_layer_peak(job: JobSpec, rows: int, seq: int, prec: Precision) -> int | None:
    """The highest bytes above a layer's input while a no-grad pass of the learned model runs its widest layer over
    rows × seq padded tokens (a reference's or a teacher's pass): without autocast, the checkpointed no-autocast full
    cell's forward peak where learned; else the no-grad pass the profile traced itself (`LearnedProfile.no_grad`, a
    DPO reference pass), else the checkpointed full-fine-tuning cell's forward peak
    `fpeak`, the layer's output included. A checkpointed layer's forward keeps nothing for backward
    (torch/utils/checkpoint.py: the reentrant variant runs it under no_grad, the non-reentrant one packs every saved
    tensor into a placeholder), so its highest instant is mostly the one a no-grad pass holds — attention scores, MLA's
    expanded keys, routed experts and all — but not where an op takes another kernel with grad enabled (SDPA with a
    float mask that requires grad, Inkling's relative position bias: torch's CPU dispatch takes the math path and its
    fp32 scores, the no-grad pass its flash kernel with the mask), hence the traced pass first. Profiles learned before
    the learner traced it everywhere have it only where transformers will not checkpoint. None without a learned
    profile or either, or for fp32 weights (their cell's forward holds autocast's cached weight copies, which a frozen
    model's pass does not make)."""
    p = job.model.learned
    key = precision_key(prec)
    if p is None or key != "w2a2":
        return None
    quad = rows * seq * seq         # the passes' rows are padded to the longest (chosen and rejected, or completions)
    # without autocast the pass runs as the no-autocast cells' forward did (an MoE's fp32 routing promotes its experts'
    # outputs there: dots3 Note's reference pass, traced, 64 % above its autocast one); the no-grad pass and the other
    # cells were traced under autocast
    if not prec.amp and (cell := p.cell(key, NOAMP_OF["full"], True)) is not None:
        return max(cell.fpeak[r].at(rows * seq, quad) for r in set(p.layer_map))
    if p.no_grad:
        return max(p.no_grad[r].at(rows * seq, quad) for r in set(p.layer_map))
    if (cell := p.cell(key, "full", True)) is not None:
        return max(cell.fpeak[r].at(rows * seq, quad) for r in set(p.layer_map))
    return None


def no_grad_entry(job: JobSpec, rows: int, seq: int, prec: Precision) -> int:
    """What a learned no-grad pass (`LearnedProfile.no_grad`) holds from its start beyond the embeddings' output and
    the boolean mask counted apart (CPM-Ant's [rows, heads, seq, seq] position bias, a float mask); 0 elsewhere."""
    p = job.model.learned
    if p is None or p.no_grad_entry is None or precision_key(prec) != "w2a2":
        return 0
    return max(p.no_grad_entry.at(rows * seq, rows * seq * seq), 0)


def _nn_linears(kind: LayerKind) -> list[Linear]:
    """A layer kind's nn.Linear layers (what target_modules and all-linear reach), in order."""
    return [lin for lin in kind.linears if lin.nn_linear]


def traced_leaves(p: LearnedProfile, targets: list[str] | tuple[str, ...]) -> frozenset[str]:
    """The last name parts of the nn.Linear layers peft adapted in the traced jobs for these target_modules (the
    reference's, the default's): peft's own resolution for the model the learner traced — its cut decoder config,
    provenance "traced_type" (hpcmem/trace/learn.py `learning_probe`) —, which may not be the type a user's job loads.
    "all-linear" is every nn.Linear leaf of the layers (peft/tuners/tuners_utils.py
    `_maybe_include_all_linear_layers`), and on a type whose LoraConfig peft's transformers-5 MoE conversion rewrites
    (peft/utils/transformers_weight_conversion.py `_convert_peft_config_moe`: DeepSeek-V3, GLM-4-MoE, …) the names
    it moves to target_parameters leave target_modules whole: a dense layer's gate_proj / up_proj / down_proj
    nn.Linear is not adapted there (hpcmem.models.peft_targets `resolve`). The Kimi K2.5 image model, whose
    model_type peft does not convert, adapts them: the text cut traced as deepseek_v3 did not."""
    leaves = tuple(dict.fromkeys(lin.leaf for kind in p.kinds for lin in _nn_linears(kind)))
    peft_type = str(p.provenance.get("traced_type") or p.model_type)
    return frozenset(resolve(peft_type, tuple(targets), (), leaves).modules) & frozenset(leaves)


def one_row(job: JobSpec, mb: MicroBatch) -> bool:
    """Whether the micro-batch takes the profile's one-row cells where learned (hpcmem/trace/learn.py
    `one_row_cells`, profile `one_row_key`): one row without padding — unmasked, or a packed row of several documents
    where the learner held the one-row cells on one (`ONE_ROW_PACKED`); not one a generating trainer cut from a padded
    batch."""
    p = job.model.learned
    return (mb.rows == 1 and not mb.padded_with
            and (not mb.masked or (mb.padding_free and bool(p.held.get(ONE_ROW_PACKED)))))


def unlearned_offloading(t: TrainSpec) -> bool:
    """Activation offloading the cells do not hold: without checkpointing (`_cell`; with it,
    `checkpoint_inputs_offloaded`)."""
    return t.activation_offloading and not t.gradient_checkpointing


def variant_cells_apply(t: TrainSpec) -> bool:
    """Whether a job may take a LoRA variant's cells (DoRA, lora-default, lora-nodrop): none under what no cell holds —
    selective checkpointing, offloading without checkpointing, a 4/8-bit base —, which `_cell` refuses with its
    reasons."""
    return not (t.selective_checkpointing or unlearned_offloading(t) or t.quantized)


def variant_cell(p: LearnedProfile, key: str, base: str, variant: str, gc: bool, one: bool) -> Cell | None:
    """A variant's cell (`variant` of the `base` technique), its one-row variant where the micro-batch takes one; None
    where it is not learned, or where the base has a one-row cell and the variant none (the padded cell does not scale
    down to this profile's one row: `one_row`)."""
    if one and one_row_key(cell_key(key, base, gc)) in p.cells \
            and one_row_key(cell_key(key, variant, gc)) not in p.cells:
        return None
    return p.cell(key, variant, gc, one)


def reentrant_cell(job: JobSpec, prec: Precision, technique: str, one: bool = False) -> Cell | None:
    """The reentrant variant of a `technique` cell (REENTRANT_OF) a job checkpointing reentrantly takes where learned,
    else None."""
    key = precision_key(prec)
    if not (key and technique in REENTRANT_OF and job.reentrant_checkpointing and variant_cells_apply(job.train)):
        return None
    return variant_cell(job.model.learned, key, technique, technique + REENTRANT, True, one)


def nodrop_cell(job: JobSpec, prec: Precision, one: bool = False) -> Cell | None:
    """The `lora-nodrop` cell a plain LoRA job without dropout takes where the profile has it (lora_dropout 0, or
    TRL's disable_dropout: `lora_dropout_active`), else None. Without dropout the saved tensors and backward of peft's
    forward differ from the dropout cells' in a way the difference formulas do not place — which of them a layer's
    peak holds is the type's own (estimator/LOG.md) —, so the cell traced without it; other targets or rank add the
    formulas' difference at dropout 0 on both sides."""
    t, p, key = job.train, job.model.learned, precision_key(prec)
    if not (t.use_peft and not t.use_dora and not lora_dropout_active(t) and key and variant_cells_apply(t)):
        return None
    return variant_cell(p, key, "lora", NODROP, t.gradient_checkpointing, one)


def noamp_base(job: JobSpec) -> str:
    """The technique whose NOAMP_OF cell a job without autocast takes: LoRA without dropout (lora_dropout 0, or TRL's
    disable_dropout) the no-dropout one's, other LoRA the LoRA one's, else the full one's."""
    t = job.train
    if not t.use_peft:
        return "full"
    return "lora" if lora_dropout_active(t) else NODROP


def noamp_taken(job: JobSpec, prec: Precision, lora: LoraLayout, mb: MicroBatch) -> tuple[Cell, dict] | None:
    """(the cell traced without autocast, its LoRA reference marked so) a full or plain LoRA job on 16-bit weights with
    bf16 and fp16 off takes where the profile has it (NOAMP_OF of `noamp_base`: a LoRA job without dropout the
    `lora-nodrop-noamp` cell), else None. Not for DoRA or reentrant checkpointing (no such cell: their own cells,
    traced under autocast, keep the estimate's warning); a LoRA job without dropout on a profile without its cell
    takes its no-dropout cell, and `learned_phases` the larger of that and the no-autocast LoRA one
    (`nodrop_noamp_alternative`); a LoRA job on other
    targets or rank adds the difference formulas at the job's own precision on both sides (`layer_bytes`). On a type
    with eager attention, only for padded rows: the cells were traced on padded rows and no rows check ran on them,
    and HY-V4's read +34 % on one unpadded row (LoRA, 1 × 9,760 tokens) and +8.4 % on a packed one, where its traces
    without autocast equal those with it (-1.1 / +1.0 % from the autocast cells) — at 2 padded rows -1.3 %: what its
    padded rows hold beyond, not located (estimator/LOG.md)."""
    padded = mb.masked and not mb.padding_free and mb.rows > 1
    if not padded and job.model.learned.provenance.get("attention") == "eager":
        return None
    base = noamp_base(job)
    if base == NODROP and default_targets(job, prec, lora):
        # on peft's default targets the no-dropout cell traced there (under autocast) stays nearer than the
        # reference's cell without autocast with every other adapter taken away (random jobs drawn for the default
        # cells, seed 21: GPT-J DPO +0.05 → −9.66 %, GPT-SW3 DPO +0.86 → −3.87 %)
        return None
    return _noamp_cell(job, prec, mb, base)


def _noamp_cell(job: JobSpec, prec: Precision, mb: MicroBatch, base: str) -> tuple[Cell, dict] | None:
    """(the NOAMP_OF cell of `base` for a full or plain LoRA job on 16-bit weights without autocast, its reference
    marked so) where learned, else None: not for DoRA or reentrant checkpointing, whose cells have no such variant."""
    t, p, key = job.train, job.model.learned, precision_key(prec)
    if prec.amp or key != "w2a2" or t.use_dora or job.reentrant_checkpointing or not variant_cells_apply(t):
        return None
    cell = variant_cell(p, key, base, NOAMP_OF[base], t.gradient_checkpointing, one_row(job, mb))
    dropout = {"lora_dropout": 0.0} if base == NODROP else {}
    return None if cell is None else (cell, {**p.lora_reference, "autocast": False, **dropout})


def dora_nodrop_cell(job: JobSpec, prec: Precision, one: bool = False) -> Cell | None:
    """The DORA_NODROP cell a DoRA job without dropout takes where the profile has it (after the DoRA cell on peft's
    default targets, `default_cell`), else None; other targets or rank add the formulas' difference at dropout 0 on
    both sides."""
    t, key = job.train, precision_key(prec)
    if not (t.use_peft and t.use_dora and key and variant_cells_apply(t) and not lora_dropout_active(t)):
        return None
    return variant_cell(job.model.learned, key, DORA, DORA_NODROP, t.gradient_checkpointing, one)


def default_targets(job: JobSpec, prec: Precision, lora: LoraLayout) -> bool:
    """Whether a LoRA job adapts exactly peft's default targets on a learned type whose profile traced them
    (provenance lora_default), in a precision and with techniques its variant cells hold."""
    t, p = job.train, job.model.learned
    default = p.provenance.get("lora_default")
    return bool(t.use_peft and default and precision_key(prec) and variant_cells_apply(t)
                and {m.leaf for m in lora.adapted} == traced_leaves(p, default["lora_target_modules"]))


def default_cell(job: JobSpec, prec: Precision, lora: LoraLayout, one: bool = False) -> tuple[Cell, dict] | None:
    """(the cell traced on peft's default targets for this job's variant, the LoRA it was traced with) where the
    profile has it, else None: DoRA's (`DORA_DEFAULT`), LoRA without dropout's (`DEFAULT_NODROP`), else the
    `lora-default` one (traced with dropout; a job without dropout then adds the dropout's difference:
    `nodrop_taken`)."""
    if not default_targets(job, prec, lora):
        return None
    t, p, key = job.train, job.model.learned, precision_key(prec)
    gc, default = t.gradient_checkpointing, p.provenance["lora_default"]
    if t.use_dora:
        cell = variant_cell(p, key, DEFAULT_LORA, DORA_DEFAULT, gc, one)
        return None if cell is None else (cell, {**default, "use_dora": True})
    if not lora_dropout_active(t) and (cell := variant_cell(p, key, DEFAULT_LORA, DEFAULT_NODROP, gc, one)):
        return cell, {**default, "lora_dropout": 0.0}
    cell = p.cell(key, DEFAULT_LORA, gc, one)
    return None if cell is None else (cell, default)


def widest_leaves(p: LearnedProfile) -> frozenset[str]:
    """The last name parts of the nn.Linear layers that read or write the profile's widest linear dimension (a dense
    MLP's intermediate size: its up, gate and down projections)."""
    lins = [lin for kind in p.kinds for lin in _nn_linears(kind)]
    widest = max((max(lin.in_features, lin.out_features) for lin in lins), default=0)
    return frozenset(lin.leaf for lin in lins if widest in (lin.in_features, lin.out_features))


def beside_leaves(p: LearnedProfile, leaves: frozenset[str]) -> frozenset[str]:
    """The last name parts of the nn.Linear layers of the layer kinds that hold one of `leaves`."""
    kinds = [[lin.leaf for lin in _nn_linears(kind)] for kind in p.kinds]
    return frozenset(leaf for names in kinds if leaves & set(names) for leaf in names)


def nearer_default_cell(job: JobSpec, prec: Precision, lora: LoraLayout, one: bool = False
                        ) -> tuple[Cell, dict] | None:
    """(the cell traced on peft's default targets for a plain LoRA job's dropout — `lora-default`, or
    `lora-default-nodrop` without dropout —, its LoRA reference) where the job's adapted linears are neither the
    reference's nor the default's but fewer of them differ from the default's (by last name part: its cell then takes
    the difference formulas for fewer adapters), else None. From the reference's cell (all-linear on most types) the
    formulas take every other adapter away at the cell's peak instant, whether or not its tensors are alive there:
    StableLM RLOO on k_proj and v_proj read +6.04 % from the all-linear cell, -0.02 % from the q_proj/v_proj one;
    Nemotron-H SFT on q/k/o_proj -4.69 and -1.44 % (random jobs, estimator/LOG.md). A job adapting an MLP linear the
    default does not (`widest_leaves`), or a linear of a layer kind the default adapts nothing in (`beside_leaves`),
    keeps the reference's cell. Not for DoRA, reentrant checkpointing, or compute without autocast, whose cells on the
    default targets are not all traced."""
    t, p, key = job.train, job.model.learned, precision_key(prec)
    default = p.provenance.get("lora_default")
    if not (t.use_peft and not t.use_dora and lora.enabled and default and key and prec.amp
            and not job.reentrant_checkpointing and variant_cells_apply(t)):
        return None
    mine = {m.leaf for m in lora.adapted}
    ref_leaves = traced_leaves(p, p.lora_reference["lora_target_modules"])
    default_leaves = traced_leaves(p, default["lora_target_modules"])
    if mine in (ref_leaves, default_leaves) or len(mine ^ default_leaves) >= len(mine ^ ref_leaves):
        return None
    # an adapter the default lacks on an MLP's wide linear (up, gate, down: [H ↔ I]), or in a layer kind where the
    # default adapts nothing (Nemotron-H's Mamba in_proj), keeps the reference's cell, whose peak instants hold such
    # adapters; from the default's the formulas add it at an instant of the attention (random jobs: OPT on fc1 and
    # v_proj +1.37 → −7.86 %, Nemotron-H on in_proj and v_proj +0.03 → +3.56 %)
    if (mine - default_leaves) & widest_leaves(p) or not (mine - default_leaves) <= beside_leaves(p, default_leaves):
        return None
    gc = t.gradient_checkpointing
    if lora_dropout_active(t):
        cell = variant_cell(p, key, "lora", DEFAULT_LORA, gc, one)
        return None if cell is None else (cell, default)
    cell = variant_cell(p, key, NODROP, DEFAULT_NODROP, gc, one)
    return None if cell is None else (cell, {**default, "lora_dropout": 0.0})


def nodrop_taken(job: JobSpec, prec: Precision, lora: LoraLayout, one: bool = False) -> tuple[Cell, dict] | None:
    """(the cell traced without dropout a job takes, its LoRA reference), else None: the `lora-nodrop` cell
    (`nodrop_cell`), on peft's default targets the `DEFAULT_NODROP` one. A job without dropout on peft's default
    targets whose profile has only the `lora-default` cell takes that one (None here), unless it checkpoints
    reentrantly (the nodrop cell has a reentrant variant, `lora-default` none; `lora-default-nodrop` has one where
    learned): the difference the formulas then add is the dropout's on the default targets (two attention
    projections on most types), where from the nodrop cell it is every other adapter of the reference's all-linear
    (random jobs of DPO and KTO on default targets: estimator/LOG.md)."""
    cell = nodrop_cell(job, prec, one)
    if cell is None:
        return None
    ref = {**job.model.learned.lora_reference, "lora_dropout": 0.0}
    default = default_cell(job, prec, lora, one)
    nodrop_default = default is not None and default[1].get("lora_dropout") == 0.0
    if job.reentrant_checkpointing:
        if nodrop_default and (again := reentrant_cell(job, prec, DEFAULT_NODROP, one)) is not None:
            return again, default[1]
        return reentrant_cell(job, prec, NODROP, one) or cell, ref
    if default is None:
        return cell, ref
    return default if nodrop_default else None


def model_dropout_off(job: JobSpec, taken: tuple[Cell, dict]) -> tuple[Cell, dict]:
    """`taken`, or its NOMDROP variant where the job turns the model's dropout off (`disable_dropout`), the profile's
    type holds dropout modules and the variant is learned."""
    p = job.model.learned
    if not ((job.train.disable_dropout or job.model_dropout_off) and p.provenance.get("dropout")):
        return taken
    key = next((k for k, c in p.cells.items() if c is taken[0]), "")
    parts = key.split("/")
    if len(parts) < 3 or parts[1] not in NOMDROP_OF:
        return taken
    other = p.cells.get("/".join([parts[0], parts[1] + NOMDROP, *parts[2:]]))
    return taken if other is None else (other, taken[1])


def takes_model_dropout_off(job: JobSpec, prec: Precision, lora: LoraLayout, mb: MicroBatch) -> bool:
    """Whether `learned_cell` gives the job a NOMDROP cell."""
    cell = learned_cell(job, prec, lora, mb)[0]
    return any(c is cell and k.split("/")[1].endswith(NOMDROP) for k, c in job.model.learned.cells.items())


def learned_cell(job: JobSpec, prec: Precision, lora: LoraLayout, mb: MicroBatch) -> tuple[Cell, dict]:
    """`_learned_cell`, its NOMDROP variant where the job turns the model's dropout off (`model_dropout_off`)."""
    return model_dropout_off(job, _learned_cell(job, prec, lora, mb))


def _learned_cell(job: JobSpec, prec: Precision, lora: LoraLayout, mb: MicroBatch) -> tuple[Cell, dict]:
    """(the profile's terms for this job, the LoRA reference they were traced with), or a SpecError naming what was
    not learned. A LoRA job on the adapters of peft's default targets takes the cell traced on them for its variant
    where learned (`default_cell`: with dropout, without, DoRA); a DoRA job else the `dora` cell (the reference's
    targets with use_dora; other targets add the difference), a plain LoRA job on targets nearer peft's default
    ones than the reference's the default targets' cell (`nearer_default_cell`), a LoRA job without dropout the
    `lora-nodrop` cell (`nodrop_taken`); a job checkpointing reentrantly the reentrant variant of its DoRA,
    lora-nodrop, LoRA or full cell (`reentrant_cell`) before peft's default targets' cells (which have none); each its
    one-row variant where the micro-batch is one row (`one_row`) and the profile has it."""
    t, p = job.train, job.model.learned
    one = one_row(job, mb)
    if lora.enabled and lora.targeted and not t.gradient_checkpointing:
        # the profile's LoRA cells are traced with adapters on nn.Linear layers only (provenance lora_reference); what a
        # lora.ParamWrapper keeps (the adapted weight W + ΔW, its gradient) is added to a checkpointed layer's
        # backward (`wrapped_stacks`), where the recompute holds it; without checkpointing it would sit among the
        # forward's saved tensors, which the cells do not order
        raise SpecError(f"model {job.model.name} (learned profile): LoRA on parameters ({lora.placement()}) is not "
                        f"learned without checkpointing: the profile's LoRA cells adapt "
                        f"{', '.join(p.lora_reference['lora_target_modules'])} only (peft wraps fused experts and "
                        "routers as parameters for all-linear or expert names on this type); turn "
                        "gradient_checkpointing on, or name nn.Linear modules instead")
    if taken := noamp_taken(job, prec, lora, mb):
        return taken
    key = precision_key(prec)
    if t.use_dora and not job.reentrant_checkpointing and (taken := default_cell(job, prec, lora, one)):
        return taken
    if (cell := dora_nodrop_cell(job, prec, one)) is not None:
        return reentrant_cell(job, prec, DORA_NODROP, one) or cell, \
            {**p.lora_reference, "use_dora": True, "lora_dropout": 0.0}
    if (t.use_peft and t.use_dora and key and variant_cells_apply(t)
            and (cell := p.cell(key, DORA, t.gradient_checkpointing, one)) is not None):
        return reentrant_cell(job, prec, DORA, one) or cell, {**p.lora_reference, "use_dora": True}
    if taken := nearer_default_cell(job, prec, lora, one):
        return taken
    if taken := nodrop_taken(job, prec, lora, one):
        return taken
    if (cell := reentrant_cell(job, prec, "lora" if t.use_peft else "full", one)) is not None:
        return cell, p.lora_reference
    if taken := default_cell(job, prec, lora, one):
        return taken
    return _cell(job, prec, one), p.lora_reference


def _cell(job: JobSpec, prec: Precision, one: bool = False) -> Cell:
    t, p = job.train, job.model.learned
    problems = []
    if t.selective_checkpointing:
        problems.append("selective checkpointing is not learned (the profile traces GC full and off)")
    if unlearned_offloading(t):
        # without checkpointing what stays on the GPU is the storages a layer saves twice (hpcmem.estimate.activations
        # `offload_kept_on_gpu`), which the learned terms do not split out; with checkpointing only the layers' inputs
        # are saved, and they are the `kept` terms (`checkpoint_inputs_offloaded`)
        problems.append("activation offloading without checkpointing is not learned (the profile traces GC full and "
                        "off; with gradient_checkpointing on it is estimated)")
    if t.quantized:
        problems.append("4/8-bit bases are not learned (the trace cannot run bitsandbytes)")
    key = precision_key(prec)
    cell = p.cell(key, "lora" if t.use_peft else "full", t.gradient_checkpointing, one) if key else None
    if key is None:
        problems.append("only 16-bit compute is learned (bf16/fp16 on); this job computes in fp32")
    elif cell is None:
        want = cell_key(key, "lora" if t.use_peft else "full", t.gradient_checkpointing)
        problems.append(f"cell {want} is not in the profile (learned: {', '.join(p.cell_keys()) or 'none'}); "
                        "run `hpcmem models learn` for it")
    if problems:
        raise SpecError([f"model {job.model.name} (learned profile): {x}" for x in problems])
    return cell


def _kind_modules(kind: LayerKind, leaves: set[str] | None) -> tuple[LinearModule, ...]:
    """The kind's nn.Linear layers whose last name part is in `leaves` (None: all of them), one layer's worth; not
    those the layer never calls, nor those it calls without a graph (`LayerKind.idle_linears`: the traced step left
    their adapters without a gradient): their adapters save nothing and get no gradient."""
    return tuple(LinearModule(lin.name, lin.in_features, lin.out_features, lin.count, 1, "mlp", True, lin.bias)
                 for lin in _nn_linears(kind) if lin.runs and lin.name not in kind.idle_linears
                 and (leaves is None or lin.leaf in leaves))


def layer_adapters(kind: LayerKind, lora: LoraLayout, reference: dict | None,
                   profile: LearnedProfile | None = None) -> LoraLayout:
    """The adapters one layer of `kind` carries: the user's, or (`reference`) those the lora cells were traced with —
    the reference's targets as peft resolved them on the traced model (`traced_leaves`, from `profile`)."""
    if reference is not None:
        if profile is None:
            raise ValueError("layer_adapters: a reference's adapters need the profile whose traced model peft adapted")
        return LoraLayout(enabled=True, r=reference["lora_r"], adapted=_kind_modules(
            kind, set(traced_leaves(profile, reference["lora_target_modules"]))),
            adapter_bytes=REFERENCE_ADAPTER_BYTES, num_layers=1, dropout=reference.get("lora_dropout", 0.05) > 0,
            dropout_module=reference.get("lora_dropout", 0.05) > 0, dora=bool(reference.get("use_dora")))
    # the user's variant travels with the adapters (DoRA's saved tensors and forward: hpcmem.estimate.lora_variants)
    leaves = {m.leaf for m in lora.adapted}
    return LoraLayout(enabled=True, r=lora.r, adapted=_kind_modules(kind, leaves), adapter_bytes=lora.adapter_bytes,
                      num_layers=1, dropout=lora.dropout, dropout_module=lora.dropout_module,
                      dora=lora.dora)


def untraced_mlp_instant(job: JobSpec, kind: LayerKind, mine: LoraLayout, ref: LoraLayout, tokens: int,
                         prec: Precision) -> int:
    """The forward instant — and its recompute's under checkpointing — at an adapter of a dense gated MLP's linear
    that the reference did not adapt, beyond what the layer's forward keeps; 0 where the job adapts no such linear
    (plain LoRA only). The cells never ran it: a Kimi K2.5 job (model_type kimi_k25, which peft does not convert)
    adapts the DeepSeek-V3 layers' gate_proj / up_proj / down_proj, the text cut traced as deepseek_v3 did not
    (`traced_leaves`). down_proj runs last in a dense gated MLP layer (modeling_deepseek_v3.py DeepseekV3MLP.forward,
    then the residual add of DeepseekV3DecoderLayer.forward), with every tensor the layer keeps already made; beside
    them peft's forward of its adapter holds its input, the fp32 copy, the dropout's output and the outputs — the
    derived estimate's instant (hpcmem.estimate.lora_fp32_compute `recompute_transient`, with the kind's own widths:
    down_proj's input is the MLP's width)."""
    traced = {m.leaf for m in ref.adapted}
    extra = tuple(m for m in mine.adapted if m.leaf in GATED_MLP and m.leaf not in traced)
    widths = {lin.leaf: lin for lin in _nn_linears(kind)}
    if not extra or mine.dora or any(leaf not in widths for leaf in GATED_MLP):
        return 0
    down = widths["down_proj"]
    mlp = replace(job.model, intermediate_size=down.in_features, hidden_size=down.out_features, gated_mlp=True,
                  fused_gate_up=False)
    return recompute_transient(replace(mine, adapted=extra, targeted=()), tokens, prec, mlp)


@dataclass(frozen=True)
class LayerBytes:
    fwd: list[int]
    fpeak: list[int]
    kept: list[int]
    peak: list[int]
    grads: list[int]          # gradient bytes each layer's backward leaves (its weights', or its adapters')
    left: list[int]           # other bytes each layer's backward leaves alive until its next forward (profile `left`)


def _quad(job: JobSpec, mb: MicroBatch, layer: int | None = None, cell: Cell | None = None) -> int:
    """rows·seq² where the traced terms had it (the cells are learned on padded rows): masked batches, attention that
    always builds scores (eager, or what the rows check found holding them: UNMASKED_SCORES), and a sliding layer
    whose window needs its own mask on an unpadded row (hpcmem.estimate.activations `sliding_mask_alone`) — `layer`
    None: the terms outside the layers, which hold the masks (there the padded rows' causal mask counts beside the
    sliding one: one [rows, seq, seq] boolean more). A one-row cell (`cell.rows` 1) was traced on the row it is used
    for: its rows·seq² terms are that row's own."""
    m, attn = job.model, job.train.attn_implementation
    if (cell is not None and cell.rows == 1) or mb.masked or m.learned.provenance.get("attention") == "eager" \
            or m.learned.held.get(UNMASKED_SCORES):
        return mb.rows * mb.seq * mb.seq
    alone = sliding_mask_alone(m, mb, attn) and (layer is None or layer in m.sliding_layers)
    return mb.rows * mb.seq * mb.seq if alone else 0


def shared_once_quad(kept: Poly, quad: int, gc: bool, repeat: bool) -> int:
    """The rows·seq² a real layer's `kept` takes from its traced layer: none of a positive c for a real layer that
    repeats a traced one under checkpointing. There a layer keeps only its checkpointed inputs
    (torch/utils/checkpoint.py), so a kept term growing with rows·seq² is a tensor made outside the layers — the
    causal mask (transformers masking_utils `create_causal_mask`) — that every layer of the kind takes as an input and
    that dies with the lowest one's backward: the traced layer that first holds the kind (hpcmem/trace/learn.py `kept`
    is what dies at a layer's backward end). hpcmem.trace.layer_map maps the real layers past the traced depth onto
    the last traced layer of their kind, which is that first one where the cut holds the kind once (LFM2's attention
    layers: 1 of 4 traced), so without this each real layer of the kind would count one more mask. Without
    checkpointing the layers save their own [rows, seq, seq] tensors (efficient attention's bias), which repeat."""
    return 0 if gc and repeat and kept.c > 0 else quad


def _in_kind(kind: LayerKind, lora: LoraLayout) -> LoraLayout:
    """The layout of the parameters peft wraps in one layer of `kind` (lora.ParamWrapper), one layer's worth."""
    names = {lin.name for lin in kind.linears if not lin.nn_linear}
    return replace(lora, adapted=(), targeted=tuple(m._replace(num_layers=1) for m in lora.targeted
                                                    if m.name in names))


def wrapped_stacks(kind: LayerKind, wrapped: LoraLayout, tokens: int, hidden: int, prec: Precision) -> int:
    """What a checkpointed layer's backward holds beyond the learned LoRA cell when peft wraps the layer's parameters
    (`wrapped`: `_in_kind`; lora.ParamWrapper: fused expert stacks, a router's weight), by the derived step's terms
    (hpcmem.estimate.lora_variants): the recompute's adapted weights W + ΔW and the factors' casts
    (`saved_weights`), the routed input [tokens·k, H] and gated product [tokens·k, I] the trained experts keep
    (`trained_experts_saved`; k from the kind's active share of its expert parameters), or — not both — the worst
    instant of the stacks' weight gradients (`wrapped_weight_gradient`): a stack's gradient x^T · dy is made by the
    experts' backward that frees the routed input x after it, so the routed tensors and the gradients are not all
    alive at one instant (estimator/LOG.md)."""
    if not wrapped.targeted:
        return 0
    saved = saved_weights(wrapped, (), prec)
    names = {m.name for m in wrapped.targeted}
    stacks = [lin for lin in kind.linears if not lin.nn_linear and lin.count > 1 and lin.name in names]
    routed = 0
    if stacks and kind.experts:
        k = round(stacks[0].count * kind.experts_active / kind.experts)
        # gate_up [H ↔ 2I] and down [I ↔ H]: the smaller of the sides that are not the hidden size is I
        inner = min(lin.in_features if lin.out_features == hidden else lin.out_features for lin in stacks)
        routed = tokens * k * (hidden + inner) * prec.act
    return saved + max(routed, wrapped_weight_gradient(wrapped, prec))


def layer_bytes(job: JobSpec, mb: MicroBatch, prec: Precision, lora: LoraLayout, cell: Cell,
                reference: dict | None = None) -> LayerBytes:
    p: LearnedProfile = job.model.learned
    tokens, gc = mb.tokens, job.train.gradient_checkpointing
    out = LayerBytes([], [], [], [], [], [])
    per_kind: dict[int, tuple[int, int, int, int]] = {}
    # a DoRA cell traced DoRA on the reference's adapters: its backward peak may be the reference's DoRA instant (the
    # recompute's weight-norm copies, `forward_instant`) or a backward instant. The user's DoRA instant is the
    # reference's shifted by the difference of their forward transients; the user's backward instants are bounded
    # from the plain LoRA cell with DoRA's saved terms and backward by the formulas (hpcmem.estimate.lora_variants),
    # so a user's DoRA on fewer or narrower linears does not keep the reference's larger DoRA instant (estimator/LOG.md)
    # (a DORA_DEFAULT cell traced DoRA on the job's own targets: no reference instant to shift; a DORA_NODROP cell's
    # plain cell is the no-dropout one, its reference at lora_dropout 0)
    # (a reentrant DoRA cell's plain cell is the reentrant variant of that one, where learned)
    nodrop_dora = reference is not None and reference.get("lora_dropout") == 0.0
    one = cell.rows == 1
    again = (reentrant_cell(job, prec, NODROP if nodrop_dora else "lora", one)
             if cell is reentrant_cell(job, prec, DORA_NODROP if nodrop_dora else DORA, one) else None)
    plain = (again or (variant_cell(p, precision_key(prec) or "", "lora", NODROP, True, one) if nodrop_dora
                       else _cell(job, prec, one))
             if gc and reference is not None and reference.get("use_dora")
             and reference.get("lora_target_modules") == p.lora_reference.get("lora_target_modules") else None)
    plain_reference = {**p.lora_reference, "lora_dropout": 0.0} if nodrop_dora else p.lora_reference
    backward_bound: dict[int, tuple[int, int]] = {}
    # the cells were traced under autocast (TRL's bf16: a w2a2 / w4a2 cell) but the NOAMP_OF ones; a job without it
    # (bf16 and fp16 off) has peft's fp32 adapters compute in fp32 on fp32 copies of their inputs: its side of each
    # difference is taken at its own precision, the reference's at the traced one
    traced = prec if reference is not None and reference.get("autocast") is False else replace(prec, amp=True)
    for kind_id in set(p.layer_kinds):
        kind = p.kinds[kind_id]
        if not lora.enabled:
            # what the traced step left without a gradient gets none (`LayerKind.idle`)
            per_kind[kind_id] = (0, 0, (kind.params - kind.idle) * prec.weight, 0, 0)
            continue
        mine, ref = layer_adapters(kind, lora, None), layer_adapters(kind, lora, reference or p.lora_reference, p)
        d_saved = mine.saved_per_layer(tokens, prec) - ref.saved_per_layer(tokens, traced)
        d_temp = backward_transient(mine, tokens, prec) - backward_transient(ref, tokens, traced)
        # DoRA's forward instant (the weight norm's dense copies beside the dropped input, the locals, the output
        # products: one linear at a time, hpcmem.estimate.lora_variants `forward_instant`) sits on top of the layer's
        # forward, and of its recompute under checkpointing, as in the derived step (hpcmem.estimate.step), beyond the
        # reference's (a DoRA cell traced its own): a job without dropout loses the dropped input and F.linear's cast
        # the cell's instant held (traced: learned DoRA jobs with lora_dropout 0, random seed 1 job 154: +7.6 % with
        # the weight norm and products alone)
        q = job.train.quantized
        dora_t = forward_instant(mine, tokens, prec, q) - forward_instant(ref, tokens, traced, q)
        # wrapped parameters (fused experts, a router): their recompute-time terms join the backward's temporaries,
        # their adapters' gradients the layer's
        wrapped = _in_kind(kind, lora)
        per_kind[kind_id] = (d_saved, d_temp + wrapped_stacks(kind, wrapped, tokens, job.model.hidden_size, prec),
                             (mine.num_params + wrapped.num_params) * lora.adapter_bytes, dora_t,
                             untraced_mlp_instant(job, kind, mine, ref, tokens, prec))
        if plain is not None:       # DoRA's saved terms and backward beyond plain LoRA, on the reference's adapters
            base = layer_adapters(kind, lora, plain_reference, p)
            backward_bound[kind_id] = (ref.saved_per_layer(tokens, traced) - base.saved_per_layer(tokens, traced),
                                       backward_transient(ref, tokens, traced) - backward_transient(base, tokens, traced))
    tail = tail_bytes(job, mb, prec)        # xLSTM's step-by-step remainder, which no learned length ran
    seen: set[int] = set()
    for j, r in enumerate(p.layer_map):
        d_saved, d_temp, grad, dora_t, untraced = per_kind[p.layer_kinds[j]]
        quad = _quad(job, mb, j, cell)
        raw = (cell.fwd[r].at(tokens, quad), cell.fpeak[r].at(tokens, quad),
               cell.kept[r].at(tokens, shared_once_quad(cell.kept[r], quad, gc, r in seen)),
               cell.peak[r].at(tokens, quad))
        seen.add(r)
        fwd, fpeak, kept, peak = raw
        # an untraced MLP adapter's instant (`untraced_mlp_instant`) sits on what the layer's forward keeps: the
        # plain LoRA cell without checkpointing measured that (its `fwd`); the recompute under checkpointing keeps
        # the same
        forward_kept = None
        if untraced and (nogc := p.cell(precision_key(prec) or "", "lora", False, cell.rows == 1)) is not None:
            forward_kept = nogc.fwd[r].at(tokens, quad) + d_saved + untraced
        if gc:
            peak += tail
        else:
            fwd, fpeak, kept = fwd + tail, fpeak + tail, kept + tail
        if gc:              # the adapters' saved inputs exist only in the recompute
            # DoRA's forward temporaries and the backward's compete for the recompute's peak; without DoRA on either
            # side there are none, and the adapters' backward difference (negative for fewer targets) applies as is
            fpeak += dora_t
            if plain is not None:
                dora_saved, dora_temp = backward_bound[p.layer_kinds[j]]
                # the cell's backward instants: at least the plain cell's with DoRA's own terms, at most its peak
                backward = min(peak, plain.peak[r].at(tokens, quad) + tail + dora_saved + dora_temp)
                peak = max(peak + d_saved + dora_t, backward + d_saved + d_temp)
            else:
                peak += d_saved + (max(d_temp, dora_t) if dora_t else d_temp)
            if forward_kept is not None:
                peak = max(peak, forward_kept + tail)
        else:
            fwd, fpeak, kept, peak = fwd + d_saved, fpeak + d_saved + dora_t, kept + d_saved, peak + d_temp
            if forward_kept is not None:
                fpeak = max(fpeak, forward_kept + tail)
        # an adapter change never takes a term below zero; a learned term that is negative stays as learned (layer 0's
        # kept is, where the embeddings' backward entry holds more than layer 0 left: Gemma-4's per-layer inputs)
        for dest, value, learned in zip((out.fwd, out.fpeak, out.kept, out.peak), (fwd, fpeak, kept, peak), raw,
                                        strict=True):
            dest.append(max(value, min(learned, 0)))
        out.grads.append(grad)
        out.left.append(max(cell.left[r].at(tokens, quad), 0) if cell.left else 0)
    return out


def accumulated_peaks(job: JobSpec, mb: MicroBatch, cell: Cell, lb: LayerBytes, prec: Precision) -> list[int]:
    """Each layer's backward peak under gradient accumulation, full fine-tuning. The cells were traced without
    accumulation: a weight's new gradient became its `.grad` and stayed, so each instant of a layer's backward holds
    the gradients the layer has made by then. Under accumulation every micro-batch after the first adds each new
    gradient into the existing `.grad` and frees it (torch/csrc/autograd/functions/accumulate_grad.h
    `accumulateGrad`): only the one being written is alive beside the gradients the estimate counts whole
    (`gradients`). The backward peak is the highest of the cell's instants (profile.Envelope, each a + b·tokens +
    c·rows·seq²), and a gradient's bytes do not grow with the tokens: an instant's constant term, up to the layer's
    gradients, is taken as the gradients made by then, replaced by at most the largest single weight's — and the
    highest instant is taken again. An instant before the gradients (an activation-bound backward at long rows) keeps
    its bytes; one at the end of an MoE layer's backward, after its expert stacks' gradients, loses all but one stack's
    (traced: MiMo-V2-Flash, 1 × 577 tokens, accumulation 1 → 2: 8.2 GB of the layer's 12.2 GB; estimator/LOG.md)."""
    p: LearnedProfile = job.model.learned
    out = []
    for j, (peak, grads) in enumerate(zip(lb.peak, lb.grads, strict=True)):
        kind = p.kinds[p.layer_kinds[j]]
        written = max((lin.in_features * lin.out_features * (1 if lin.nn_linear else lin.count)
                       for lin in kind.linears if lin.runs), default=0) * prec.weight
        term, quad = cell.peak[p.layer_map[j]], _quad(job, mb, j, cell)
        instants = pieces(term)
        made = [min(max(piece.a, 0), grads) for piece in instants]
        highest = max(piece.at(mb.tokens, quad) - g + min(written, g)
                      for piece, g in zip(instants, made, strict=True))
        # what layer_bytes added to the cell's instant (a recurrent tail) stays
        out.append(min(peak, highest + peak - term.at(mb.tokens, quad)))
    return out


# A learned term may be negative (the learner's accounting puts what a boundary holds on one side of it), and so may
# a sum of them at some instant; a component is not: a negative sum counts as 0 there (the estimate is then above the
# traced instant, never below).


def _forward_phase(lb: LayerBytes, entry: int, head_other: int, loss: LossBytes, held: tuple[Component, ...],
                   note: str, off: list[int], cap: int) -> Phase:
    """The forward's highest instant: inside a layer (what layers before it left + its own peak) or in the LM head
    (every layer's + the head's saved and forward bytes + what else the head holds). `off`: the bytes of each layer's
    input activation offloading sends to the host (0 without it), of which the offloader's stash keeps up to `cap`
    on the GPU (`offloaded_on_gpu`)."""
    below, pending, gone = entry, sum(lb.left), 0
    worst, worst_at = -1, None
    for k, (fwd, top, left) in enumerate(zip(lb.fwd, lb.fpeak, lb.left, strict=True)):
        # the previous step's backward of this layer and those after it left lb.left until their forward runs
        here = below - gone + min(gone, cap)
        if here + top + pending > worst:
            worst, worst_at = here + top + pending, k
        below += fwd
        pending -= left
        gone += off[k]
    below = below - gone + min(gone, cap)
    head = below + loss.saved + head_other + loss.forward_transient
    if head >= worst:
        return Phase(name="forward", components=(
            *held, Component(name=ACTIVATIONS, bytes=max(below + loss.saved + head_other, 0), note=note),
            Component(name="loss / fused LM head", bytes=loss.forward_transient, note=loss.note)))
    return Phase(name=f"forward (layer {worst_at})", components=(
        *held, Component(name=ACTIVATIONS, bytes=max(worst, 0), note=f"{note}; layers < {worst_at} and layer {worst_at}")))


def traced_head(job: JobSpec, mb: MicroBatch, prec: Precision, lora: LoraLayout) -> LossBytes:
    """The fused LM head's own bytes in the job the cells were traced on (hpcmem.trace.learn `learn_job`): SFT on
    unmasked rows of this micro-batch's shape, every position scored but each row's last (hpcmem.job.shape
    `micro_batch`), whatever this job scores — a DPO row's image prompt, or its prompt, scores nothing
    (dpo_trainer.py `concatenated_forward`: labels -100 there), and the fused head's saved hidden rows, statistics
    and tiles are those of the scored positions only (hpcmem.estimate.loss `fused_head_bytes`). The same for a
    trainer with its own loss (hpcmem.job.trainers `hook("loss")`) or a score head: the terms hold the SFT head
    either way, and the estimate adds the job's own loss or head beside them."""
    return fused_head_bytes(job, replace(mb, label_tokens=mb.rows * (mb.seq - 1)), prec, head_trains=not lora.enabled)


def _without_head(term: Term, tokens: int, quad: int, traced: list[int], at_job: int, seqs: tuple[int, ...],
                  rows: int) -> int:
    """A head term's bytes at this micro-batch with the traced jobs' fused LM head taken out (see `head_out`)."""
    instants = pieces(term)
    line = fit_poly([float(v) for v in traced], seqs, rows)
    through = line.at(tokens, quad)
    if abs(line.c) * rows * seqs[-1] ** 2 <= LINE_TOLERANCE * traced[-1]:
        return max(p.at(tokens, quad) for p in instants) - through
    return max(p.at(tokens, quad) - (through if p.c < 0 else at_job) for p in instants)


def head_out(job: JobSpec, mb: MicroBatch, prec: Precision, lora: LoraLayout, cell: Cell) -> tuple[int, int]:
    """forward_other and head_other at this micro-batch without the fused LM head of the jobs the cell was traced on
    (the estimate adds this job's own head).

    The learner solves each instant of a head term through three lengths at its rows (provenance "seqs", "rows"); the
    terms are linear in the values they are solved from, so an instant that holds the head holds the polynomial
    through the head's bytes of the traced jobs. Those bytes are linear in the scored tokens until the head's tile
    stops growing at TOKEN_CHUNK_SIZE scored tokens (hpcmem.estimate.loss), then linear with a smaller slope:
    - where every learned length lies below that limit (types of ≤ 2,048 positions) the traced heads lie on one line,
      which the term carries on past the limit, where the head no longer rises: that line comes out;
    - where the limit falls between the learned lengths the polynomial through them bends (c < 0: a concave
      quadratic, which nothing else in a layer's or the head's instants is — masks and scores are c ≥ 0), so the
      pieces of the term (profile.Envelope) with c < 0 hold the head and lose that polynomial; the other pieces —
      instants before the tile — hold the head's linear part only, which is this job's shape's own (`traced_head`)."""
    p: LearnedProfile = job.model.learned
    tokens, quad = mb.tokens, _quad(job, mb, cell=cell)
    at = traced_head(job, mb, prec, lora)
    at_fwd, at_bwd = at.saved + at.forward_transient, at.backward_transient
    seqs, rows = tuple(p.provenance.get("seqs") or ()), cell.rows or int(p.provenance.get("rows") or 0)
    if len(seqs) != 3 or not rows:
        return cell.forward_other.at(tokens, quad) - at_fwd, cell.head_other.at(tokens, quad) - at_bwd
    heads = [traced_head(job, replace(mb, rows=rows, seq=s, padding_free=False, padded_with=0), prec, lora)
             for s in seqs]
    return (_without_head(cell.forward_other, tokens, quad, [h.saved + h.forward_transient for h in heads], at_fwd,
                          seqs, rows),
            _without_head(cell.head_other, tokens, quad, [h.backward_transient for h in heads], at_bwd, seqs, rows))


def nodrop_noamp_alternative(job: JobSpec, prec: Precision, lora: LoraLayout, mb: MicroBatch
                             ) -> tuple[Cell, dict] | None:
    """For a plain LoRA job without dropout and without autocast on a profile without the cell traced both ways
    (`lora-nodrop-noamp`, which `noamp_taken` gives where learned), the no-autocast LoRA cell with its reference —
    the other of the two cells that hold one of its two differences (the no-dropout cell `learned_cell` takes holds
    the dropout's, and adds the fp32 copies of the adapters' inputs by the formulas; this one holds autocast's, and
    adds the dropout's by the formulas); None where it does not apply or is not learned. Neither is traced both ways,
    and each missed on the side of the mechanism it lacks: the no-dropout cell under where the type's own layers
    promote to fp32 without autocast (AXK1's MoE: −5.6 %), the no-autocast cell under where the dropout's tensors
    are most of the difference (Jamba −4.4 %, LFM2 −6.4 %); `learned_phases` keeps the larger (estimator/LOG.md)."""
    if noamp_base(job) != NODROP or noamp_taken(job, prec, lora, mb) is not None:
        return None
    return _noamp_cell(job, prec, mb, "lora")


def learned_phases(job: JobSpec, mb: MicroBatch, prec: Precision, parts: ParamParts, s: States, lora: LoraLayout,
                   loss: LossBytes, opt_transient: int, extra_resident: tuple[Component, ...] = ()
                   ) -> tuple[list[Phase], int]:
    """(phases, host bytes of offloaded activations) from the profile's cells: the cell `learned_cell` takes, or for a
    LoRA job without dropout and without autocast the larger of its two cells (`nodrop_noamp_alternative`)."""
    args = (job, mb, prec, parts, s, lora, loss, opt_transient, extra_resident)
    out = _phases_of(*args, learned_cell(job, prec, lora, mb))
    if (other := nodrop_noamp_alternative(job, prec, lora, mb)) is not None:
        alt = _phases_of(*args, other)
        if max(p.bytes for p in alt[0]) > max(p.bytes for p in out[0]):
            return alt
    return out


def _phases_of(job: JobSpec, mb: MicroBatch, prec: Precision, parts: ParamParts, s: States, lora: LoraLayout,
               loss: LossBytes, opt_transient: int, extra_resident: tuple[Component, ...],
               taken: tuple[Cell, dict]) -> tuple[list[Phase], int]:
    t, p = job.train, job.model.learned
    cell, reference = taken
    accum = s.accumulated
    lb = layer_bytes(job, mb, prec, lora, cell, reference)
    if accum and not lora.enabled:
        lb = replace(lb, peak=accumulated_peaks(job, mb, cell, lb, prec))
    tokens, quad, L = mb.tokens, _quad(job, mb, cell=cell), len(lb.kept)
    resident = resident_components(s, lora) + list(extra_resident)
    gathered = [Component(name=GATHERED, bytes=s.gathered)] if s.gathered else []
    accum_c = [Component(name="gradients", bytes=accum, note=s.notes["accumulated"])] if accum else []
    one = "; its cells traced on one row" if cell.rows == 1 else ""
    how = f"learned profile ({p.provenance.get('summary', 'traced')}{one})"
    if cell.head_with_loss:     # the traced jobs' fused LM head is in the terms: what they hold of it out
        forward_other, head_other = head_out(job, mb, prec, lora, cell)
    else:
        forward_other, head_other = cell.forward_other.at(tokens, quad), cell.head_other.at(tokens, quad)
    # activation offloading under checkpointing: the layers' inputs live on the host; on the GPU, the offloader's
    # stash in the forward (the five largest: `offloaded_on_gpu`), none at the head's backward (the loss's node, the
    # first to bring an offloaded tensor back, empties the stash in its post-hook: hpcmem.estimate.step), and in a
    # layer's backward its own input and the next layer's, which the node running the recompute holds — in the last
    # layer's, the final norm's input its backward brought back (`final_norm_restored`)
    offload = checkpoint_inputs_offloaded(t)
    # what goes: the hidden state each layer's checkpoint saves; the rest of a learned `kept` is not a saved tensor
    # of the checkpoint (Gemma 4's K/V shared with later layers, referenced by its cache) and stays on the GPU
    hidden = tokens * job.model.hidden_size * prec.residual
    off = [min(max(v, 0), hidden) if offload else 0 for v in lb.kept]
    stays = [v - o for v, o in zip(lb.kept, off, strict=True)]
    cap = offloaded_on_gpu(off)
    if offload:
        how += " + activation offloading (the layers' inputs on the host)"
    forward = _forward_phase(lb, cell.forward_entry.at(tokens, quad), forward_other, loss,
                             (*resident, *gathered, *accum_c), f"{how}: {mb.source}; {L} layers", off, cap)
    buckets = backward_components(job)
    kept_all = sum(stays)
    head = Phase(name=HEAD_BACKWARD, components=(
        *resident, *gathered, *buckets, *accum_c,
        Component(name=ACTIVATIONS, bytes=max(kept_all + head_other, 0), note=how),
        Component(name="loss / fused LM head", bytes=loss.backward_transient,
                  note="fp32 grad accumulators + tile at the head's backward")))
    head_grads = 0 if lora.enabled else (parts.lm_head or parts.embed) * prec.weight
    entry = cell.entry_other.at(tokens, quad)
    below, stayed = [0], 0
    last = final_norm_restored(p.model_type, job.model.hidden_size, tokens, prec.residual) if offload else 0
    above = [*off[1:], last]
    for k, v in enumerate(stays):
        stayed += v
        below.append(stayed + off[k] + above[k])
    after, left = [0] * (L + 1), [0] * (L + 1)
    for k in range(L - 1, -1, -1):
        after[k] = after[k + 1] + lb.grads[k]
        left[k] = left[k + 1] + lb.left[k]

    def instant(k: int) -> int:
        return below[k + 1] + entry + left[k + 1] + (accum or head_grads + after[k + 1]) + lb.peak[k]

    worst = max(range(L - 1, -1, -1), key=instant)
    # FSDP's prefetched unit: the learned terms do not split the layer's instants, so it is counted for the whole
    # layer, also where it arrives only at the attention projections (hpcmem.estimate.fsdp_units)
    prefetched = [Component(name=PREFETCHED_UNIT, bytes=s.prefetched, note="the next layer, all-gathered ahead")] \
        if s.prefetched else []
    # a tied head's new gradient waits for the embedding's through the layers' backward under accumulation; the
    # cells were traced without accumulation, where it is the head's `.grad` (`head_grads`)
    waiting = tied_head_gradient(job, prec, parts, lora)
    layer = Phase(name=f"backward (layer {worst})", components=(
        *resident, *gathered, *buckets, *waiting, *prefetched,
        Component(name=ACTIVATIONS, bytes=max(below[worst + 1] + entry, 0) + left[worst + 1],
                  note=f"{how}: layers ≤ {worst}" + (f"; what the backward of layers > {worst} left"
                                                     if left[worst + 1] else "")),
        Component(name="gradients", bytes=accum or head_grads + after[worst + 1],
                  note=s.notes["accumulated"] if accum else f"layers > {worst} done"),
        Component(name="backward temporaries", bytes=max(lb.peak[worst], 0), note=f"{how}: recompute + temporaries")))
    kept_past = [Component(name="left by the layers' backward", bytes=left[0],
                           note=f"{how}: alive until each layer's next forward")] if left[0] else []
    return [forward, head, layer, *closing_phases(job, mb, prec, parts, s, resident + kept_past, opt_transient)], \
        sum(off)
