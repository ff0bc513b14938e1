"""`hpcmem models learn CONFIG`: fit a model type's per-layer memory terms from traces of its own modelling code.

1. The layout (hpcmem.trace.layer_map): the meta model's parameters by place and its layer kinds; the fewest layers D
   whose middle layers hold every kind (`choose_depth`); the config cut to D layers, checked to build the same first
   D layers as the real model. Where no prefix of ≤ 12 layers holds every kind, the cut keeps real layers that are not
   a prefix (`layout.subsequence`: layer 0, each kind's first layer, the last layer), checked alike.
2. For each precision (float32 load → `w4a2`, bfloat16 → `w2a2`), technique (full; LoRA at r = 16 on every Linear,
   or on the attention projections where peft refuses that: `lora_reference`; with checkpointing also LoRA on peft's
   default targets, `default_lora`; the variants beside them: DoRA, LoRA at lora_dropout 0 and, with checkpointing,
   the reentrant full, LoRA and no-dropout cells) and checkpointing (full, off), TRL's
   SFTTrainer is traced (hpcmem.trace.run_trace, CUDA mapping, timeline on) on the D-layer model with 2 padded rows of
   SEQS tokens each, for one optimizer step (TRACED_STEP). From that step's timeline (hpcmem.trace.phases names the
   phase and layer of every point; start(k): bytes when layer k starts its forward, start(D): when the LM head does):
     fwd[k]   = start(k+1) − start(k);  fpeak[k] = the highest bytes during layer k's forward − start(k)
     kept[k]  = entry(k) − entry(k−1) + the gradients layer k's backward creates + left[k]
                (entry(k): bytes when the gradient reaches layer k; entry(−1): when it reaches the embeddings)
     left[k]  = the bytes born in layer k's backward still alive when the backward ends (not gradients;
                hpcmem.trace.tracker.live_by_birth_phase): they outlive the layer, so the layers below hold them
     peak[k]  = the highest bytes during layer k's backward − entry(k)
     forward_entry = start(0) − states
     forward_other = the LM head's forward peak − start(D)
     head_other    = LM head backward peak − states − Σ kept
                     (both with the fused LM head's own bytes: the estimate takes its own out, Cell.head_with_loss)
     entry_other   = entry(D−1) − states − Σ kept − the head's gradients
   States, gradients and the head are the estimate's own (hpcmem.estimate), computed for the same D-layer job, so the
   estimate of that job reproduces the trace's step by construction; what the profile adds is how the layers' terms
   repeat over the real depth (hpcmem.trace.layer_map.layer_map).
3. Each term is solved exactly as a + b·tokens + c·rows·seq² from the three lengths (SEQS: 512, 2,048 and 8,192
   tokens per row, scaled down to the model's max_position_embeddings). A term that is a phase's highest instant
   (fpeak, peak, forward_other, head_other) is not one polynomial: each instant of the phase is solved on its own
   (the same ops run at every length — the phase's points line up one to one; where they do not, the highest
   instant is solved as one polynomial, as before) and the term is the highest of them (profile.Envelope), so the
   instant that is highest may change with the length without a quadratic fitted through the change.
4. The profile says where it is held (provenance "held"): the longest row length at which the estimate of the
   reduced model is within HELD_PCT of a two-step trace of the same job, for each technique checked (full and LoRA,
   with and without checkpointing, DoRA), at the longest learned length and at CHECK_FACTOR times it — or, where the
   caller asks for the shorter checks (`long_checks=False`: the two-step traces at CHECK_FACTOR times the length took a
   third of a learning run here: estimator/LOG.md), at the longest learned length only, and held there.
"""

from __future__ import annotations

import sys
import time
from dataclasses import fields, replace
from typing import Any

from hpcmem.errors import SpecError
from hpcmem.estimate import estimate
from hpcmem.estimate.activations import own_pass_mask_bytes
from hpcmem.estimate.closing import resident_components
from hpcmem.estimate.learned import (
    DEFAULT_LORA,
    DEFAULT_NODROP,
    DEFAULT_VARIANTS,
    DORA,
    DORA_DEFAULT,
    DORA_NODROP,
    NOAMP_OF,
    NODROP,
    NOMDROP,
    NOMDROP_OF,
    REENTRANT,
    REENTRANT_OF,
    base_technique,
    layer_adapters,
)
from hpcmem.estimate.learned_range import held_name, held_technique
from hpcmem.estimate.lora import lora_layout
from hpcmem.estimate.states import job_param_parts, model_states
from hpcmem.estimate.workspaces import tensor_bytes
from hpcmem.job.jobspec import JobSpec
from hpcmem.job.kernel_limits import xlstm_problems
from hpcmem.job.shape import micro_batch, precision
from hpcmem.job.spec import TrainSpec
from hpcmem.models.coverage import required_settings, settings_beside_checkpointing
from hpcmem.models.profile import (
    ONE_ROW,
    ONE_ROW_PACKED,
    REFERENCE_LORA,
    Cell,
    Envelope,
    LayerKind,
    LearnedProfile,
    ParamLayout,
    Poly,
    backbone_config,
    UNMASKED_SCORES,
    cell_key,
    config_hash,
    fit_poly,
    one_row_key,
    spec_from_profile,
)
from hpcmem.trace import layer_map as lay
from hpcmem.trace import run_trace
from hpcmem.trace.kernels_autocast import LAYER_NORM_FP32
from hpcmem.trace.oracle import MAX_KNOWN_NUMEL, ROUTING_NOTE
from hpcmem.trace.result import versions
from hpcmem.trace.threads import share_cpus

ROWS = 2
SEQS = (512, 2048, 8192)
CHECK_FACTOR = 4            # the held check also runs at 4 × the longest learned length (32,768 tokens per row)
HELD_PCT = 3.0
# the row counts beside ROWS the held check also runs at (one technique, at its longest held length): the cells are
# learned at ROWS rows and the estimate scales them per row, which a type that mixes rows breaks; 8 is TRL's default
# per_device_train_batch_size, 16 a preference trainer's chosen and rejected rows at 8
ROWS_CHECKED = (1, 4, 8, 16)
PRECISIONS = {"float32": "w4a2", "bfloat16": "w2a2"}
CELLS = (("full", True), ("lora", True), ("full", False), ("lora", False))
PEFT_MAMBA_REFUSED = {"out_proj", "conv1d"}
# The first optimizer step holds every activation term the second does, shifted by the optimizer states born at its
# end (same bytes at every point of forward and backward, minus those states: compared on Llama, full and LoRA), at
# half the tracing time.
TRACED_STEP = 1


def learn_lengths(max_positions: int) -> tuple[int, ...]:
    """SEQS, or where the model holds fewer positions (GPT-2: 1,024) the same ratios ending at its limit."""
    if not max_positions or max_positions >= SEQS[-1]:
        return SEQS
    return tuple(max(16, max_positions * s // SEQS[-1]) for s in SEQS)


# decoder types whose "indexed_attention" layers read the causal mask's values: Qwen4-Exp's QSA indexer
# (modeling_qwen4_exp.py `Qwen4ExpTextQSAIndexer.forward`: `torch.nonzero` of each query's row of the [rows, 1, S, S]
# mask). The other types that name a layer "indexed_attention" (deepseek_v32, glm_moe_dsa, hy_v4, mistral_large4, axk2,
# dots3_note: a DeepSeek-style sparse-attention indexer) take top-k over scores with the mask added, which needs no
# values, and learn at the usual lengths.
MASK_READING_TYPES = frozenset({"qwen4_exp", "qwen4_exp_text"})


def mask_read_limit(model_type: str, layer_types: tuple[str, ...], rows: int = ROWS) -> int:
    """The longest row length the trace can run where a layer reads the causal mask's values (`MASK_READING_TYPES`):
    the trace knows a tensor's values up to hpcmem.trace.oracle.MAX_KNOWN_NUMEL elements, so the longest multiple of
    64 tokens whose mask fits. Other layers read none (SEQS[-1])."""
    if model_type not in MASK_READING_TYPES or "indexed_attention" not in layer_types:
        return SEQS[-1]
    return int((MAX_KNOWN_NUMEL // rows) ** 0.5) // 64 * 64


# a grid of (rows, tokens per row) that keeps an envelope's pieces: those highest at some point of it, with and without
# the rows·seq² term
_GRID = [(r, 2 ** e) for r in (1, 2, 4, 8, 16, 64) for e in range(4, 21)]


def envelope(series: list[list[int]], seqs: tuple[int, ...], rows: int = ROWS) -> Envelope:
    """Each instant of a phase solved on its own over the lengths (series[i][j]: instant j at seqs[i]), keeping the
    instants that are highest somewhere on _GRID (and at the traced lengths themselves)."""
    import numpy as np

    values = np.asarray(series, dtype=np.float64)                       # [lengths, instants]
    # only an instant where the bytes stop rising at some length can be the highest one
    rising = np.ones(values.shape[1], dtype=bool)
    rising[:-1] = (values[:, :-1] < values[:, 1:]).all(axis=0)
    rising[-1] = False
    values = values[:, ~rising]
    basis = np.array([[1.0, rows * s, rows * s * s] for s in seqs])
    coef = np.linalg.solve(basis, values)                              # [3, instants]
    # rows·seq² counts only where the job has it (learned._quad: masked rows or eager attention): both kinds of job
    points = np.array([[1.0, r * q, r * q * q * m] for r, q in _GRID for m in (1, 0)] + basis.tolist())
    at = points @ coef                                                  # [points, instants]
    keep = sorted(set(np.argmax(at, axis=1).tolist()))
    return Envelope(tuple(Poly(*map(float, coef[:, j])) for j in keep))


# -- a step's timeline → per-layer bytes ---------------------------------------------------------------------------
def _segments(timeline: list[Any], step: int = 2) -> tuple[dict[str, int], dict[str, int], list[Any]]:
    """(bytes just before each phase's first point, each phase's highest bytes, the step's points)."""
    prefix = f"step {step} / "
    before: dict[str, int] = {}
    peak: dict[str, int] = {}
    prev = None
    points = []
    for point in timeline:
        if point.phase.startswith(prefix):
            points.append(point)
            if point.phase not in before:
                before[point.phase] = prev.current_bytes if prev is not None else 0
            peak[point.phase] = max(peak.get(point.phase, 0), point.current_bytes)
        prev = point
    return before, peak, points


def measure(timeline: list[Any], depth: int, step: int = 2) -> dict[str, Any]:
    before, peak, points = _segments(timeline, step)
    fwd, bwd = f"step {step} / forward", f"step {step} / backward"
    try:
        start = [before[f"{fwd} / layer {k}"] for k in range(depth)] + [before[f"{fwd} / lm head / loss"]]
        entry = [before[f"{bwd} / layer {k}"] for k in range(depth)]
        # without a gradient into the embeddings (LoRA, GC off: nothing before layer 0 requires grad) layer 0
        # keeps what layer 1 keeps (its own entry − exit cannot be read)
        entry_embed = before.get(f"{bwd} / embeddings")
        bwd_peak = [peak[f"{bwd} / layer {k}"] for k in range(depth)]
    except KeyError as exc:
        raise SpecError(f"the trace's timeline has no phase {exc}: the layers did not run as hpcmem.trace.phases "
                        "expects (one decoder layer after the other)") from None
    fwd_peak = [peak[f"{fwd} / layer {k}"] for k in range(depth)]
    head_fwd_peak = peak[f"{fwd} / lm head / loss"]
    head_peak = peak[f"{bwd} / lm head / loss"]
    # every point of the phases whose highest point is a term (profile.Envelope fits them one by one)
    series: dict[str, list[int]] = {}
    for point in points:
        series.setdefault(point.phase, []).append(point.current_bytes)
    return {"start": start, "entry": entry, "entry_embed": entry_embed, "bwd_peak": bwd_peak, "fwd_peak": fwd_peak,
            "head_fwd_peak": head_fwd_peak, "head_peak": head_peak,
            "series": {"fpeak": [series[f"{fwd} / layer {k}"] for k in range(depth)],
                       "peak": [series[f"{bwd} / layer {k}"] for k in range(depth)],
                       "forward_other": series[f"{fwd} / lm head / loss"],
                       "head_other": series[f"{bwd} / lm head / loss"]}}


def known_parts(job: JobSpec, idle: list[dict[str, list[int]]] | None = None) -> dict[str, Any]:
    """What the estimate computes itself for the job: states, each layer's gradients, the head's gradients (the fused
    LM head's activation bytes stay in the head terms: Cell.head_with_loss). `idle`: per traced layer, the parameters
    the trace left without a gradient (TraceResult.idle_in_layers, of a probe that has none recorded): their bytes
    are no gradient the layer's backward leaves."""
    prec, parts, lora = precision(job), job_param_parts(job), lora_layout(job)
    s = model_states(job, prec, lora)
    p = job.model.learned
    grads = [(layer_adapters(p.kinds[k], lora, None).num_params * lora.adapter_bytes) if lora.enabled
             else p.kinds[k].params * prec.weight for k in p.layer_kinds]
    if idle:
        # an adapter on a linear the layer never calls (`Linear.runs`) is out of `layer_adapters` already
        gone = [{lin.name for lin in p.kinds[k].linears if not lin.runs} for k in p.layer_kinds]
        grads = [g - sum(n * size for name, (n, size) in idle[j].items()
                         if not (lora.enabled and name.split(".lora_", 1)[0] in gone[j]))
                 for j, g in enumerate(grads)]
    # the traced step is the first: no optimizer state exists yet (every activation term is step 2's: checked)
    base = sum(c.bytes for c in resident_components(s, lora)) + s.gathered - s.optimizer - s.master
    return {"base": base, "grads": grads,
            "head_grads": 0 if lora.enabled else (parts.lm_head or parts.embed) * prec.weight}


def terms(meas: dict[str, Any], known: dict[str, Any]) -> dict[str, Any]:
    depth = len(meas["entry"])
    entry = meas["entry"]
    down = [meas["entry_embed"]] + entry                # down[k] = entry(k − 1)
    # what layer k's backward leaves alive past its end (not its gradients) is not what it kept: it stays
    left = meas.get("left") or [0] * depth
    kept = [entry[k] - down[k] + known["grads"][k] + left[k] if down[k] is not None else None for k in range(depth)]
    if kept[0] is None:
        kept[0] = kept[1] if depth > 1 else 0
    fwd = [meas["start"][k + 1] - meas["start"][k] for k in range(depth)]
    base, start = known["base"], meas["start"]
    raw = meas.get("series")
    series = {} if raw is None else {
        "fpeak": [[b - start[k] for b in raw["fpeak"][k]] for k in range(depth)],
        "peak": [[b - entry[k] for b in raw["peak"][k]] for k in range(depth)],
        "forward_other": [b - start[depth] for b in raw["forward_other"]],
        "head_other": [b - base - sum(kept) for b in raw["head_other"]]}
    return {"series": series,
        "fwd": fwd, "kept": kept, "left": left, "peak": [meas["bwd_peak"][k] - entry[k] for k in range(depth)],
        "fpeak": [meas["fwd_peak"][k] - start[k] for k in range(depth)],
        "forward_entry": start[0] - base,
        # the fused LM head's own bytes stay in (profile.Cell.head_with_loss): the estimate's formula for them is not
        # a polynomial in the tokens, so a remainder left after it would not be either
        "forward_other": meas["head_fwd_peak"] - start[depth],
        "head_other": meas["head_peak"] - base - sum(kept),
        "entry_other": entry[-1] - base - sum(kept) - known["head_grads"],
    }


def fit_cell(samples: list[dict[str, Any]], kinds: tuple[int, ...] | None = None,
             seqs: tuple[int, ...] = SEQS, rows: int = ROWS) -> Cell:
    """Fit every term; with the real model's layer kinds, add the real last layer's stand-in (layout.layer_map).
    A highest-instant term whose phase has the same points at every length is an Envelope of its instants. `rows`:
    the rows per micro-batch the samples were traced with."""
    def term(name: str, values: list[float], series: list[list[int]] | None) -> Any:
        if series is not None and len({len(x) for x in series}) == 1 and series[0]:
            return envelope(series, seqs, rows)
        return fit_poly(values, seqs, rows)

    def series_of(name: str, k: int | None = None) -> list[list[int]] | None:
        got = [s.get("series", {}).get(name) for s in samples]
        if any(g is None for g in got):
            return None
        return [g[k] for g in got] if k is not None else got

    def per_layer(name: str) -> tuple[Any, ...]:
        depth = len(samples[0][name])
        polys = [term(name, [s[name][k] for s in samples], series_of(name, k) if name in ENVELOPED else None)
                 for k in range(depth)]
        return tuple(lay.last_layer_terms(polys, kinds, depth) if kinds else polys)

    def one(name: str) -> Any:
        return term(name, [s[name] for s in samples], series_of(name) if name in ENVELOPED else None)

    return Cell(fwd=per_layer("fwd"), fpeak=per_layer("fpeak"), kept=per_layer("kept"), peak=per_layer("peak"),
                left=per_layer("left") if any(any(s.get("left") or ()) for s in samples) else (),
                forward_entry=one("forward_entry"), forward_other=one("forward_other"),
                head_other=one("head_other"), entry_other=one("entry_other"), head_with_loss=True,
                rows=0 if rows == ROWS else rows)


ENVELOPED = ("fpeak", "peak", "forward_other", "head_other")


# -- the whole learning run ----------------------------------------------------------------------------------------
def _peft_defaults(cfg: dict[str, Any]) -> tuple[str, ...] | None:
    """peft's default LoRA targets (peft/utils/constants.py TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING) for
    the model TRL loads: peft looks them up by that model's config.model_type (peft/tuners/lora/model.py
    LoraModel._prepare_adapter_config) — for a multimodal config, of whichever class AutoModelForCausalLM builds
    (Gemma-4's text-only Gemma4ForCausalLM reads "gemma4_text", which has none). None where peft has none, or only a
    regex (hpcmem then asks for the targets)."""
    from peft.utils.constants import TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING as mapping

    loaded = _loaded_type(cfg) if isinstance(cfg.get("text_config"), dict) else cfg.get("model_type")
    targets = mapping.get(loaded)
    return tuple(targets) if isinstance(targets, list) else None


def _loaded_type(cfg: dict[str, Any]) -> str:
    """The model_type of the class AutoModelForCausalLM builds for a multimodal config: its meta model's — or, where a
    tower needs a package the decoder does not (Gemma-3n's vision tower is timm's TimmWrapperModel:
    modeling_gemma3n.py Gemma3nModel.__init__, AutoModel.from_config(vision_config)), its causal-LM mapping's class's
    config class (transformers/models/auto/modeling_auto.py MODEL_FOR_CAUSAL_LM_MAPPING; the same type where both
    build: gemma3, gemma4)."""
    try:
        return str(lay.build_meta(cfg).config.model_type)
    except ImportError:
        from transformers import AutoModelForCausalLM

        return str(AutoModelForCausalLM._model_mapping[type(lay.hf_config(cfg))].config_class.model_type)


def _profile(lo: lay.Layout, *, model_type: str, sha: str, cfg: dict[str, Any], layer_map: tuple[int, ...],
             cells: dict[str, Cell], peft: tuple[str, ...] | None, provenance: dict[str, Any],
             no_grad: tuple[Any, ...] = (), no_grad_entry: Any = None) -> LearnedProfile:
    params = {f.name: getattr(lo, f.name) for f in fields(ParamLayout)}
    return LearnedProfile(**params, model_type=model_type, config_sha256=sha, layer_map=layer_map,
                          peft_default_targets=peft, cells=cells, config=cfg, provenance=provenance, no_grad=no_grad,
                          no_grad_entry=no_grad_entry)


# -- a no-grad pass's layer instants (reference and teacher passes) ---------------------------------------------------
NO_GRAD_ROWS = 2 * ROWS     # DPO's reference pass runs the chosen and the rejected rows together


def no_grad_job(spec: Any, seq: int) -> JobSpec:
    """The traced job whose reference pass is a no-grad pass of the model: DPO with the LoRA reference adapters (the
    reference is the policy with its adapters disabled, under no_grad: trl/trainer/dpo_trainer.py), bf16, without
    checkpointing, ROWS chosen and ROWS rejected rows of `seq` tokens, padded together."""
    ref = spec.learned.lora_reference
    return JobSpec(model=spec, train=TrainSpec(
        trainer="dpo", dtype="bfloat16", use_peft=True, lora_r=ref["lora_r"],
        lora_target_modules=tuple(ref["lora_target_modules"]), gradient_checkpointing=False, max_length=seq,
        per_device_train_batch_size=ROWS, **settings_beside_checkpointing(spec.model_type)))


def no_grad_sample(job: JobSpec, depth: int) -> tuple[list[list[int]], int]:
    """(each traced layer's instants while the reference pass runs it, in bytes above the bytes just before it; what
    the pass holds when its first layer starts beyond the embeddings' output and the boolean mask the estimate counts,
    hpcmem.estimate.activations `own_pass_mask_bytes`)."""
    result = run_trace(job, timeline=True, steps=TRACED_STEP)
    before, _, points = _segments(result.timeline, TRACED_STEP)
    start = f"step {TRACED_STEP} / forward / reference forward"
    first = f"{start} / layer 0"
    if start not in before or first not in before:
        raise SpecError(f"the no-grad trace's timeline has no phase {first!r}: the reference pass did not run as "
                        "hpcmem.trace.phases expects")
    mb = micro_batch(job)
    entry = before[first] - before[start] - mb.tokens * job.model.hidden_size * precision(job).act - \
        own_pass_mask_bytes(mb, job.model, job.train.attn_implementation)
    out = []
    for k in range(depth):
        name = f"step {TRACED_STEP} / forward / reference forward / layer {k}"
        if name not in before:
            raise SpecError(f"the no-grad trace's timeline has no phase {name!r}: the reference pass did not run its "
                            "layers as hpcmem.trace.phases expects")
        out.append([p.current_bytes - before[name] for p in points if p.phase == name])
    return out, entry


def no_grad_terms(samples: list[list[list[int]]], seqs: tuple[int, ...], kinds: tuple[int, ...] | None,
                  depth: int) -> tuple[Any, ...]:
    """Per traced layer (plus the last layer's stand-in, as `fit_cell`): its no-grad instants over the lengths, each
    solved on its own (`envelope`) where every length ran the same ops, else the highest one as one polynomial."""
    terms = []
    for k in range(depth):
        series = [s[k] for s in samples]
        if len({len(x) for x in series}) == 1 and series[0]:
            terms.append(envelope(series, seqs, rows=NO_GRAD_ROWS))
        else:
            terms.append(fit_poly([float(max(x, default=0)) for x in series], seqs, NO_GRAD_ROWS))
    return tuple(lay.last_layer_terms(terms, kinds, depth) if kinds else terms)


def traced_in(dtype: str, technique: str) -> bool:
    """Whether a cell of `technique` is traced in `dtype`: the NOAMP_OF cells (autocast off) on 16-bit weights only —
    fp32 weights without autocast compute in fp32, which no cell holds."""
    return dtype == "bfloat16" or technique.removesuffix(NOMDROP) not in NOAMP_OF.values()


def learn_job(spec: Any, dtype: str, technique: str, gc: bool, seq: int, rows: int = ROWS) -> JobSpec:
    """A traced job of a cell, with the settings the type trains only with (router_aux_loss_coef 0 for some MoE
    types: hpcmem.models.coverage.settings_beside_checkpointing; checkpointing is the cell's); `lora-default` and its
    variants leave the targets to peft (TRL passes target_modules=None); `lora-nodrop` and `lora-default-nodrop` run
    at lora_dropout 0, `dora` and `dora-default` with use_dora, `dora-nodrop` with both; a technique's REENTRANT
    variant checkpoints with
    use_reentrant True; a NOAMP_OF variant runs its technique with bf16 and fp16 off, a NOMDROP one with the model's
    dropout modules at p = 0 (JobSpec `model_dropout_off`, which hpcmem.trace.trainer `build_sft` applies as DPO's
    disable_dropout does)."""
    mdrop_off = technique.endswith(NOMDROP)
    technique = technique.removesuffix(NOMDROP)
    technique, re = base_technique(technique)
    noamp = technique in NOAMP_OF.values()
    technique = next((base for base, v in NOAMP_OF.items() if v == technique), technique)
    lora, ref = technique in ("lora", DORA, NODROP, DORA_NODROP), spec.learned.lora_reference
    needs = settings_beside_checkpointing(spec.model_type)
    return JobSpec(model=spec, model_dropout_off=mdrop_off, train=TrainSpec(
        trainer="sft", dtype=dtype, use_peft=technique != "full", lora_r=ref["lora_r"],
        use_dora=technique in (DORA, DORA_DEFAULT, DORA_NODROP),
        lora_target_modules=tuple(ref["lora_target_modules"]) if lora else (),
        lora_dropout=0.0 if technique in (NODROP, DEFAULT_NODROP, DORA_NODROP) else TrainSpec.lora_dropout,
        gradient_checkpointing=gc, gradient_checkpointing_kwargs={"use_reentrant": True} if re else {},
        max_length=seq, per_device_train_batch_size=rows, **({"bf16": False, "fp16": False} if noamp else {}),
        **needs))


def runnable_cells(model_type: str, cells: Any) -> list[tuple[str, bool]]:
    """The cells whose jobs the type's real trainer runs: none with checkpointing where transformers refuses it."""
    gc = required_settings(model_type).get("gradient_checkpointing")
    return [(t, g) for t, g in cells if gc is None or g == gc]


def _linear_like(m: Any) -> bool:
    """Whether an nn.Linear subclass with its own forward still maps [.., in] to one [.., out] tensor, as peft's LoRA
    Linear assumes when it adds its delta to the base output (Falcon's FalconLinear: `input @ weight.T` + bias), run on
    the meta device. PhiMoE's router (a tuple) and DeepSeek-V4's grouped o_a_proj (a reshaped weight) do not."""
    import torch

    try:
        out = m(torch.empty(2, m.in_features, device="meta", dtype=m.weight.dtype))
    except Exception:  # noqa: BLE001 — a forward that cannot take a plain [rows, in] input is not linear-like
        return False
    return isinstance(out, torch.Tensor) and tuple(out.shape) == (2, m.out_features)


def lora_reference(cfg: dict[str, Any], lo: lay.Layout) -> dict[str, Any] | None:
    """The LoRA the lora cells are traced with: TRL's (r 16, dropout 0.05) on all-linear where peft takes it on this
    model (peft turns fused experts into ParamWrappers, which refuse dropout), else on the attention projections —
    else on those whose name no other weight of the layers bears (AfMoE's and Beam's attention has a `gate_proj`, a
    name peft's transformers-v5 MoE conversion takes for the fused experts' gate_up_proj and refuses without
    `up_proj`: peft/utils/transformers_weight_conversion.py _convert_peft_config_moe); None when peft takes none.
    No set takes an nn.Linear subclass with its own forward (PhiMoE's router returns a tuple, DeepSeek-V4's grouped
    o_a_proj multiplies a reshaped weight): peft's LoRA Linear adds its [.., out] delta to the base layer's output
    (peft/tuners/lora/layer.py Linear.forward), and the first step raises."""
    import peft
    import torch

    odd = {n.rsplit(".", 1)[-1] for n, m in lay.build_meta(cfg).named_modules()
           if isinstance(m, torch.nn.Linear) and type(m).forward is not torch.nn.Linear.forward
           and not _linear_like(m)}
    layer_linears = [x for k in lo.kinds for x in k.linears]
    attention = sorted({x.name.rsplit(".", 1)[-1] for x in layer_linears
                        if x.nn_linear and "attn" in x.name.lower()} - odd)
    elsewhere = {x.name.rsplit(".", 1)[-1] for x in layer_linears if "attn" not in x.name.lower()}
    only_attention = [leaf for leaf in attention if leaf not in elsewhere]
    # peft refuses out_proj and conv1d on Mamba-based types (peft/tuners/tuners_utils.py
    # `_check_lora_target_modules_mamba`): a pure Mamba model then takes every other linear of its layers. Where that
    # is one name (Mamba-2: in_proj), it is named twice: TRL's ModelConfig.__post_init__ turns a one-name list into a
    # string, which peft matches as a regex against the whole module path (no module is found), but keeps a
    # two-name list, which peft's LoraConfig.__post_init__ makes a set (tuners/lora/config.py)
    linears = sorted({x.name.rsplit(".", 1)[-1] for x in layer_linears if x.nn_linear} - PEFT_MAMBA_REFUSED - odd)
    names = linears * 2 if len(linears) == 1 else linears
    for targets in ([] if odd else ["all-linear"], attention, only_attention, names):
        if not targets:
            continue
        try:
            peft.get_peft_model(lay.build_meta(cfg), peft.LoraConfig(
                r=REFERENCE_LORA["lora_r"], lora_alpha=32, lora_dropout=0.05, bias="none", task_type="CAUSAL_LM",
                target_modules=targets[0] if targets == ["all-linear"] else targets))
        except Exception:  # noqa: BLE001 — peft refuses this target set: try the next
            continue
        return {"lora_r": REFERENCE_LORA["lora_r"], "lora_target_modules": targets}
    return None


def default_lora(peft: tuple[str, ...] | None, reference: dict[str, Any] | None,
                 lo: lay.Layout) -> dict[str, Any] | None:
    """The LoRA of the `lora-default` cell: peft's default targets at the reference's rank, where peft has them and
    they adapt other layers than the reference does (checkpointing on only, TRL's default: what a job without
    lora_target_modules runs). The reference's difference formulas miss where the default is a fused projection
    (GPT-BigCode's c_attn −7.9 %, Falcon's query_key_value −4.4 %: estimator/LOG.md), so that job is traced."""
    if not peft or not reference:
        return None
    leaves = {x.name.rsplit(".", 1)[-1] for k in lo.kinds for x in k.linears if x.nn_linear}
    targets = reference["lora_target_modules"]
    if (leaves if targets == ["all-linear"] else leaves & set(targets)) == leaves & set(peft):
        return None
    return {"lora_r": reference["lora_r"], "lora_target_modules": list(peft)}


def reduced_cut(decoder: dict[str, Any]) -> tuple[lay.Layout, lay.Layout, tuple[int, ...], dict[str, Any]]:
    """(full layout, reduced layout, the real layers the reduced model's layers are, reduced config). The depths of
    `layout.candidate_depths` are tried in turn, each a prefix of the real layers (the real first D); where no prefix
    of ≤ MAX_DEPTH layers holds every kind, the layers of `layout.subsequence` (TAIL_COUNT_KEYS scaled to them).
    Either way the reduced model must build exactly the real layers it stands for (their signatures)."""
    full = lay.layout(decoder)
    count = lay.count_at(decoder, full.layers_key)
    layers = count if isinstance(count, int) else -1
    why = ""
    try:
        depths = lay.candidate_depths(full.layer_kinds)
    except SpecError as exc:
        depths, why = [], str(exc)
    for depth in depths:
        if depth == len(full.layer_kinds):
            return full, full, tuple(range(depth)), decoder
        small_cfg = lay.reduced_config(decoder, full.layers_key, depth, layers)
        try:
            small = lay.layout(small_cfg)
        except (ValueError, TypeError, IndexError, KeyError) as exc:   # transformers refuses the cut config
            why = f"a {depth}-layer config does not build ({type(exc).__name__}: {exc})"
            continue
        last = full.signatures[-1:] if lay.last_only(full.layer_kinds) else ()
        if small.signatures == full.signatures[:depth - len(last)] + last:
            return full, small, tuple(range(depth)), small_cfg
        why = (f"a {depth}-layer config does not build the real first layers (the layer pattern is not set per layer "
               "in the config)")
    if not depths:
        # the fewest layers first, then each kind's next layers in turn (`subsequence` grown), until the cut builds
        # the layers it keeps: Zamba2 numbers its hybrid layers' blocks by their count (modeling_zamba2.py
        # Zamba2Model.get_layers `block_id = hybrid_layer_count % num_mem_blocks`), so a cut whose hybrid layers
        # skip an odd number of them gives a kept layer another block's adapter slots
        tried = []
        for size in range(len(lay.subsequence(full.layer_kinds)), lay.MAX_DEPTH + 1):
            keep = lay.subsequence(full.layer_kinds, size)
            if tried and keep == tried[-1]:
                break
            tried.append(keep)
            small_cfg = lay.reduced_config(lay.written_out(decoder, full.layers_key, layers), full.layers_key,
                                           len(keep), layers, keep)
            try:
                small = lay.layout(small_cfg)
            except (ValueError, TypeError, IndexError, KeyError) as exc:
                raise SpecError(f"model_type {decoder.get('model_type')!r}: {why}; a config of its layers "
                                f"{list(keep)} does not build ({type(exc).__name__}: {exc}); cannot learn it") from None
            if small.signatures == tuple(full.signatures[j] for j in keep):
                return full, small, keep, small_cfg
        why += f"; a config of its layers {list(tried[0])} (or more, up to {lay.MAX_DEPTH}) does not build those layers"
    raise SpecError(f"model_type {decoder.get('model_type')!r}: {why}; cannot learn it")


def _grouped(skipped: dict[str, str]) -> str:
    """"cells a, b: why; cell c: why" — one line however many cells failed for the same reason."""
    by_why: dict[str, list[str]] = {}
    for key, why in skipped.items():
        by_why.setdefault(why, []).append(key)
    return "; ".join(f"{'cells' if len(keys) > 1 else 'cell'} {', '.join(keys)}: {why}" for why, keys in by_why.items())


def learning_probe(cfg: dict[str, Any], cells: Any = CELLS, *, image_text: bool = False
                   ) -> tuple[LearnedProfile, lay.Layout, tuple[int, ...], dict[str, Any] | None, dict[str, Any] | None]:
    """The reduced model a learn traces, as a profile without cells (the held checks estimate it with the cells
    learned), the full model's layout, the real layers kept, the LoRA reference adapters and peft's default ones.
    `image_text`: `cfg` is a vision-language type's text part (hpcmem.models.vlm_learned `learned_text`)."""
    decoder = backbone_config(cfg)
    full, small, keep, small_cfg = reduced_cut(decoder)
    depth = len(keep)
    outer = str(cfg.get("model_type", full.model_type))
    peft = _peft_defaults(cfg)
    reference = lora_reference(small_cfg, small) if any(t == "lora" for t, _ in cells) else None
    default = default_lora(peft, reference, small) if ("lora", True) in set(cells) else None
    provenance: dict[str, Any] = {"attention": small.attention, "depth": depth, "rows": ROWS,
                                  "seqs": list(learn_lengths(full.max_position_embeddings)),
                                  "traced_type": full.model_type, "lora_reference": reference,
                                  "lora_default": default, "dropout": full.dropout}
    if image_text:
        # the text part of a vision-language type: its jobs are traced with layer_norm in fp32 under autocast
        # (hpcmem.trace.kernels_autocast `layer_norm_fp32`, mapped for vision-language models), so its cells are too
        provenance[LAYER_NORM_FP32] = True
    if keep != tuple(range(depth)):
        provenance["layers"] = list(keep)
    probe = _profile(small, model_type=outer, sha="", cfg=small_cfg, layer_map=tuple(range(depth)), cells={},
                     peft=peft, provenance=provenance)
    return probe, full, keep, reference, default


def learn(cfg: dict[str, Any], name: str = "model", *, dtypes: tuple[str, ...] = tuple(PRECISIONS),
          cells: Any = CELLS, workers: int = 2, check: bool = True, progress: Any = None,
          dora: bool = True, nodrop: bool = True, reentrant: bool = True, noamp: bool = True,
          long_checks: bool = True,
          image_text: bool = False,
          seqs: tuple[int, ...] = ()) -> LearnedProfile:
    """Trace the reduced model for every cell and return the real model's profile (not yet saved); `image_text`: `cfg`
    is a vision-language type's text part (`learning_probe`); `seqs`: the three row lengths to learn at (default: SEQS
    within the model's positions and the trace's mask limit)."""
    start = time.perf_counter()
    if progress:    # the first trace line comes after torch, transformers and the meta model load (10-20 s)
        progress(f"{name}: loading torch and transformers, building the model on the meta device to choose the "
                 "layers to trace")
    sha = config_hash(cfg)                      # before anything reads it: the profile is this config's
    decoder = backbone_config(cfg)
    unmapped = xlstm_problems(str(cfg.get("model_type")), decoder)   # the trace would measure code the GPU skips
    if unmapped:
        raise SpecError(f"model {name}: " + "; ".join(unmapped))
    probe, full, keep, reference, default = learning_probe(cfg, cells, image_text=image_text)
    depth, provenance = len(keep), dict(probe.provenance)
    layer_types = tuple(getattr(lay.hf_config(decoder), "layer_types", None) or ())
    seqs = seqs or learn_lengths(min(full.max_position_embeddings or SEQS[-1],
                                         mask_read_limit(str(decoder.get("model_type")), layer_types)))
    provenance["seqs"] = list(seqs)
    prefix = keep == tuple(range(depth))
    outer, peft = probe.model_type, probe.peft_default_targets
    spec = spec_from_profile(probe, probe.model_type)
    asked = [(tech, gc) for tech, gc in runnable_cells(outer, CELLS) if (tech, gc) in set(cells)]
    unreferenced = [(tech, gc) for tech, gc in asked if tech != "full" and not reference]
    wanted = [c for c in asked if c not in unreferenced]
    # peft's default targets, where they are not the reference's: with dropout, and (`default_cell`) without and with
    # DoRA, what a DPO / KTO / Reward or a DoRA job without lora_target_modules runs
    wanted += runnable_cells(outer, [(t, True) for t in (DEFAULT_LORA, *(DEFAULT_NODROP,) * nodrop,
                                                         *(DORA_DEFAULT,) * dora)]) if default else []
    # DoRA on the reference adapters, beside each LoRA cell: its weight norms and fp32 products are traced, not the
    # difference formulas' (hpcmem.estimate.lora_variants), which a layer's own instants place better
    wanted += [(DORA, gc) for tech, gc in wanted if tech == "lora" and dora]
    # and without dropout (DPO/KTO/Reward's disable_dropout, lora_dropout 0): `nodrop_cell`, `dora_nodrop_cell`
    wanted += [(NODROP, gc) for tech, gc in wanted if tech == "lora" and nodrop]
    wanted += [(DORA_NODROP, gc) for tech, gc in wanted if tech == DORA and nodrop]
    # and, with checkpointing, reentrant (use_reentrant True; PEFT under ZeRO-3): `reentrant_cell`
    wanted += [(tech + REENTRANT, gc) for tech, gc in wanted if tech in REENTRANT_OF and gc and reentrant]
    # and, for a type that holds dropout modules, with them off (DPO/KTO/Reward's disable_dropout): `model_dropout_off`
    if probe.provenance.get("dropout"):
        wanted += [(tech + NOMDROP, gc) for tech, gc in wanted if tech in NOMDROP_OF]
    # and, on 16-bit weights, without autocast (bf16 and fp16 off): `noamp_taken`
    wanted += [(NOAMP_OF[tech], gc) for tech, gc in wanted if tech in NOAMP_OF and noamp and "bfloat16" in dtypes]
    tasks = [(PRECISIONS[d], d, tech, gc, seq, ROWS) for d in dtypes for tech, gc in wanted for seq in seqs
             if traced_in(d, tech)]
    done = _run_samples(probe, [t[1:] for t in tasks], depth, workers, progress, start)
    skipped: dict[str, str] = {cell_key(PRECISIONS[d], tech, gc): "peft adapts none of this model's linears as "
                               "learn tries them (all-linear, the attention projections, the other linears): no LoRA "
                               "reference" for d in dtypes for tech, gc in unreferenced}
    ends_last = lay.last_only(full.layer_kinds)
    fitted, failed = fit_cells(done, dtypes, wanted, seqs, None if ends_last or not prefix else full.layer_kinds)
    skipped |= failed
    layer_map = lay.layer_map(full.layer_kinds, depth) if prefix else lay.subsequence_map(full.layer_kinds, keep)
    if ends_last and prefix:    # the traced last layer is the real last one's kind (layout.last_only): no stand-in
        layer_map = tuple(depth - 1 if r == depth else r for r in layer_map)
    if not fitted:
        raise SpecError(f"model {name}: no cell could be traced: " + _grouped(skipped))
    # what the traced steps left without a gradient (a module under torch.no_grad), on the reduced model's kinds (the
    # held checks estimate it) and the real model's (traced layer k is real layer keep[k])
    probe = replace(probe, kinds=idle_kinds(probe.kinds, list(probe.layer_kinds), done))
    full = replace(full, kinds=idle_kinds(full.kinds, [full.layer_kinds[j] for j in keep], done))
    # a no-grad pass's layer instant (hpcmem.estimate.learned `no_grad_layer_peak`): trace one (the LoRA reference's
    # DPO reference pass); the checkpointed cell's forward stands in for it only where no op changes kernel with grad
    # enabled, and where transformers refuses checkpointing there is no such cell
    no_grad: tuple[Any, ...] = ()
    no_grad_entry = None
    if "bfloat16" in dtypes and reference:
        samples, entries = [], []
        for seq in seqs:
            if progress:
                progress(f"no-grad pass: a DPO reference pass at {seq:,} tokens per row")
            try:
                layers, entry = no_grad_sample(no_grad_job(spec, seq), depth)
            except Exception as exc:  # noqa: BLE001 — without it the estimate keeps the formulas' instant
                skipped["no-grad pass"] = f"{type(exc).__name__}: {exc}"[:300]
                break
            samples.append(layers)
            entries.append(float(entry))
        else:
            no_grad = no_grad_terms(samples, seqs, None if ends_last or not prefix else full.layer_kinds, depth)
            no_grad_entry = fit_poly(entries, seqs, NO_GRAD_ROWS)
    gc = runnable_cells(outer, (("full", True), ("full", False)))[0][1]     # checkpointing where it runs
    if progress and check:
        progress(f"check: full {'gc' if gc else 'no gc'} at {seqs[1]:,} tokens per row")
    checks = {key: _check(probe, fitted, learn_job(spec, dtype, "full", gc, seqs[1]))
              for dtype in dtypes if check and (key := cell_key(PRECISIONS[dtype], "full", gc)) in fitted}
    provenance["held"] = held(probe, fitted, spec, dtypes, wanted, seqs, full.max_position_embeddings,
                              factor=CHECK_FACTOR if long_checks else 1, progress=progress) \
        if check else not_held(seqs)
    if check and (provenance["held"].get("rows_held") or [1])[0] > 1:
        fitted |= one_row_cells(probe, fitted, spec, dtypes, wanted, seqs, depth,
                                None if ends_last or not prefix else full.layer_kinds, provenance["held"],
                                workers=workers, progress=progress, start=start)
    routed = any(isinstance(d, dict) and d.get("routing_assumed") for d in done.values())
    provenance |= {"seconds": round(time.perf_counter() - start, 1), "check_err_pct": checks,
                   "not_learned": skipped, "versions": _versions(),
                   "summary": f"traced at {depth} of {len(full.layer_kinds)} layers"
                   + ("" if prefix else f" (real layers {list(keep)})")
                   + ("; expert routing assumed balanced" if routed else "")}
    if routed:
        provenance["routing"] = ROUTING_NOTE
    return _profile(full, model_type=outer, sha=sha, cfg=cfg,
                    layer_map=layer_map, cells=fitted, peft=peft, provenance=provenance, no_grad=no_grad,
                    no_grad_entry=no_grad_entry)


def learn_cells(cfg: dict[str, Any], stored: LearnedProfile, wanted: list[tuple[str, bool]], *,
                workers: int = 1, long_checks: bool = False, progress: Any = None) -> LearnedProfile:
    """`stored` (a profile of `cfg`) with the cells `wanted` — (technique, checkpointing) — learned and held-checked
    in its precisions, at its lengths and on its cut, its other cells, checks and terms untouched: the cells a
    profile learned before the learner traced them (the `lora-nodrop` ones) without tracing the rest again. The held
    checks run at the longest learned length (`long_checks`: and at CHECK_FACTOR times it); the rows check is the
    stored one's. Where the stored profile has one-row LoRA cells, the added cells are traced on one row too (their
    one-row variants). Refused in one line for another config, cut or LoRA reference."""
    start = time.perf_counter()
    probe, full, keep, reference, seqs, dtypes = _stored_cut(cfg, stored)
    depth = len(keep)
    cells = runnable_cells(probe.model_type, [c for c in wanted if reference or base_technique(
        c[0].removesuffix(NOMDROP))[0] in ("full", NOAMP_OF["full"])])
    prefix, ends_last = keep == tuple(range(depth)), lay.last_only(full.layer_kinds)
    kinds = None if ends_last or not prefix else full.layer_kinds
    # where the stored profile has one-row LoRA cells (`one_row_cells`: its padded cells do not scale down to one row),
    # the added cells are traced on one row too
    one = {(tech, gc) for tech, gc in cells if one_row_key(cell_key(PRECISIONS[dtypes[0]], "lora", gc)) in stored.cells}
    tasks = [(d, tech, gc, seq, rows) for d in dtypes for tech, gc in cells for rows in (ROWS, 1)
             if (rows == ROWS or (tech, gc) in one) and traced_in(d, tech) for seq in seqs]
    done = _run_samples(probe, tasks, depth, workers, progress, start)
    fitted, failed = fit_cells(done, dtypes, cells, seqs, kinds)
    fitted_one, failed_one = fit_cells(done, dtypes, [c for c in cells if c in one], seqs, kinds, rows=1)
    fitted |= fitted_one
    skipped = {**(stored.provenance.get("not_learned") or {}), **failed, **failed_one}
    probe = replace(probe, kinds=idle_kinds(probe.kinds, list(probe.layer_kinds), done))
    checked = held(probe, {**stored.cells, **fitted}, spec_from_profile(probe, probe.model_type), dtypes,
                   [c for c in cells if any(cell_key(PRECISIONS[d], *c) in fitted for d in dtypes)], seqs,
                   full.max_position_embeddings, factor=CHECK_FACTOR if long_checks else 1, progress=progress,
                   rows=False)
    was = stored.held
    techniques = {**was.get("techniques", {}), **checked["techniques"]}
    now = {**was, "techniques": techniques, "max_length": min(techniques.values(), default=0),
           "err_pct": {**was.get("err_pct", {}), **checked["err_pct"]}}
    provenance = {**stored.provenance, "held": now, "not_learned": skipped,
                  "added_cells": {**(stored.provenance.get("added_cells") or {}),
                                  **{key: {"seconds": round(time.perf_counter() - start, 1), "versions": _versions()}
                                     for key in fitted}}}
    return replace(stored, cells={**stored.cells, **fitted}, provenance=provenance)


def _stored_cut(cfg: dict[str, Any], stored: LearnedProfile) -> tuple[LearnedProfile, Any, tuple[int, ...], Any,
                                                                    tuple[int, ...], tuple[str, ...]]:
    """(the learning probe of `cfg` with `stored`'s lengths and held checks, the full layout, the kept layers, the LoRA
    reference, the stored lengths, the held precisions' load dtypes) for work on a stored profile without learning it
    again (`learn_cells`, `hold_longer`); refused in one line for another config, cut, LoRA reference or lengths, or a
    profile that names no held precision."""
    name = stored.model_type
    if config_hash(cfg) != stored.config_sha256:
        raise SpecError(f"model {name}: the stored profile was learned from another config (config_sha256 "
                        f"{stored.config_sha256[:12]}…, this one {config_hash(cfg)[:12]}…); learn it again instead")
    probe, full, keep, reference, _ = learning_probe(cfg, CELLS, image_text=bool(stored.provenance.get(LAYER_NORM_FP32)))
    seqs = tuple(stored.provenance.get("seqs") or ())
    if len(keep) != stored.provenance.get("depth") or reference != stored.provenance.get("lora_reference") \
            or len(seqs) != 3:
        raise SpecError(f"model {name}: the stored profile's cut, LoRA reference or lengths are not what the learner "
                        "builds today; learn it again instead")
    # an earlier held check named its one precision ("precision"), today's all of them ("precisions")
    named = stored.held.get("precisions") or [stored.held.get("precision")]
    dtypes = tuple(d for d, key in PRECISIONS.items() if key in named)
    if not dtypes:
        raise SpecError(f"model {name}: the stored profile names no held precision; learn it again instead")
    probe = replace(probe, provenance={**probe.provenance, "seqs": list(seqs), "held": stored.held})
    return probe, full, keep, reference, seqs, dtypes


def hold_longer(cfg: dict[str, Any], stored: LearnedProfile, lengths: tuple[int, ...], *,
                progress: Any = None) -> LearnedProfile:
    """`stored` (a profile of `cfg`) held-checked again at longer rows: each technique held as far as the profile's
    longest check is checked at each of `lengths` past it (within the model's max_position_embeddings), in every
    precision it was held in, and held up to the longest length from which every shorter check is within HELD_PCT —
    the check `held` runs, at lengths its CHECK_FACTOR does not reach. Where the longest held length grows, the rows
    check (`held_rows`: 1, 4, 8 and 16 rows) runs again there and replaces the stored one — at the longest new length
    where it holds at least the stored rows range, to which the techniques' held lengths are then capped (none grows
    where no new length keeps the range: a rows range is claimed only where it was checked). Cells and terms untouched: what a job at those lengths reads is what it read before,
    now either held or still said not to be. Refused in one line for another config, cut or LoRA reference."""
    name = stored.model_type
    probe, full, _, _, _, dtypes = _stored_cut(cfg, stored)
    if any(key.endswith("/" + ONE_ROW) for key in stored.cells):
        # one unpadded row takes these cells, whose packed-row check (`one_row_cells`) ran at the stored length only
        raise SpecError(f"model {name}: its one-row cells were checked on a packed row at its stored length only; "
                        "--hold-longer does not extend such a profile (learn it again with the longer checks)")
    techniques: dict[str, int] = dict(stored.held.get("techniques") or {})
    if not techniques:
        raise SpecError(f"model {name}: the stored profile names no held technique; learn it again instead")
    spec = spec_from_profile(probe, probe.model_type)
    top = max(techniques.values())
    longer = sorted(n for n in set(lengths) if n > top and (not full.max_position_embeddings
                                                           or n <= full.max_position_embeddings))
    errors = {k: dict(v) for k, v in (stored.held.get("err_pct") or {}).items()}
    for label, at in list(techniques.items()):
        if at < top:
            continue                # it missed a shorter check already: no longer one can hold it
        technique, gc = held_technique(label)
        for n in longer:
            ok = True
            for dtype in dtypes:
                if cell_key(PRECISIONS[dtype], technique, gc) not in stored.cells:
                    continue
                if progress:
                    progress(f"held check: {PRECISIONS[dtype]} {label} at {n:,} tokens per row")
                try:
                    err: float | str = _check(probe, stored.cells, learn_job(spec, dtype, technique, gc, n))
                except Exception as exc:  # noqa: BLE001 — a check that cannot run holds nothing
                    err = f"{type(exc).__name__}: {exc}"[:200]
                # profiles held before the keys named their precision keep their key
                key = f"{PRECISIONS[dtype]} {label}"
                errors.setdefault(label if key not in errors and label in errors else key, {})[str(n)] = err
                ok = ok and isinstance(err, float) and abs(err) <= HELD_PCT
            if not ok:
                break
            techniques[label] = n
    now = {**stored.held, "techniques": techniques, "max_length": min(techniques.values(), default=0),
           "err_pct": errors}
    first, was = rows_technique(now), int(stored.held.get("max_length") or 0)
    if first and stored.held.get("rows_err_pct") and now["max_length"] > was:
        # the rows check at the longest new length the techniques reach that holds as many rows as the stored one
        # did (one unpadded row's error grows with the row on some types); the techniques are held up to it — none
        # past the stored lengths where no longer length keeps the rows range
        technique, gc = held_technique(first)
        lo, hi = stored.held.get("rows_held") or (ROWS, ROWS)
        reach = [n for n in longer if n <= now["max_length"]]
        for n in sorted(reach, reverse=True):
            rows = held_rows(probe, stored.cells, spec, dtypes[0], technique, gc, n, progress=progress)
            if rows["rows_held"][0] <= lo and rows["rows_held"][1] >= hi:
                capped = {k: min(v, n) if v > was else v for k, v in techniques.items()}
                now |= rows | {"techniques": capped, "max_length": min(capped.values(), default=0)}
                break
        else:
            now |= {"techniques": dict(stored.held.get("techniques") or {}), "max_length": was}
    return replace(stored, provenance={**stored.provenance, "held": now})


def missing_cells(stored: LearnedProfile) -> list[tuple[str, bool]]:
    """The variant cells a stored profile lacks beside the cells it has — what `learn_cells` adds to a profile learned
    before the learner traced them: the no-dropout LoRA and DoRA cells (NODROP, DORA_NODROP, with and without
    checkpointing), then the
    variants on peft's default targets beside a `lora-default` cell (DEFAULT_NODROP, DORA_DEFAULT, where it has the
    no-dropout and DoRA cells), then the reentrant variants (REENTRANT: checkpointing only) of its full, LoRA and
    no-dropout cells, those added here included, then the cells without autocast (NOAMP_OF) of its full, LoRA and
    no-dropout cells (those added here included) on 16-bit weights, then — for a type that holds dropout modules — the NOMDROP variants of its full,
    no-dropout and no-autocast full cells, those added here included; empty where it has them all."""
    named = stored.held.get("precisions") or [stored.held.get("precision")]
    key = next((k for k in PRECISIONS.values() if k in named), None) or next(iter(PRECISIONS.values()))
    names = ("full", "lora", NODROP, DORA, DORA_NODROP, *DEFAULT_VARIANTS, *NOAMP_OF.values(),
             *(t + NOMDROP for t in NOMDROP_OF),
             *(x + REENTRANT for x in REENTRANT_OF))
    has = {(t, gc) for t in names for gc in (True, False)
           if cell_key("w2a2" if t.removesuffix(NOMDROP) in NOAMP_OF.values() else key, t, gc) in stored.cells}
    wanted = [(NODROP, gc) for gc in (True, False) if ("lora", gc) in has and (NODROP, gc) not in has]
    wanted += [(DORA_NODROP, gc) for gc in (True, False) if (DORA, gc) in has and (DORA_NODROP, gc) not in has]
    if (DEFAULT_LORA, True) in has:
        wanted += [(variant, True) for variant, of in ((DEFAULT_NODROP, NODROP), (DORA_DEFAULT, DORA))
                   if (of, True) in has | set(wanted) and (variant, True) not in has]
    base = has | set(wanted)
    wanted += [(t + REENTRANT, True) for t in REENTRANT_OF if (t, True) in base and (t + REENTRANT, True) not in has]
    # then the cells without autocast beside the full, LoRA and no-dropout cells, those added here included, on 16-bit
    # weights (`traced_in`)
    if "w2a2" in named:
        wanted += [(NOAMP_OF[t], gc) for t in NOAMP_OF for gc in (True, False)
                   if ((t, gc) in has or (t, gc) in wanted) and (NOAMP_OF[t], gc) not in has]
    # then, for a type that holds dropout modules, those with them off beside the cells they vary
    if stored.provenance.get("dropout"):
        wanted += [(t + NOMDROP, gc) for t in NOMDROP_OF for gc in (True, False)
                   if ((t, gc) in has or (t, gc) in wanted) and (t + NOMDROP, gc) not in has]
    return wanted


def added_held(profile: LearnedProfile, wanted: list[tuple[str, bool]]) -> dict[str, Any]:
    """Where the cells `learn_cells` added are held: {"held": technique → longest length, "err_pct": each check}."""
    names = {held_name(t, gc) for t, gc in wanted}
    return {"held": {k: v for k, v in profile.held.get("techniques", {}).items() if k in names},
            "err_pct": {k: v for k, v in profile.held.get("err_pct", {}).items() if k.split(" ", 1)[1] in names}}


def fit_cells(done: dict[tuple, Any], dtypes: tuple[str, ...], cells: list[tuple[str, bool]], seqs: tuple[int, ...],
              kinds: tuple[int, ...] | None, rows: int = ROWS) -> tuple[dict[str, Cell], dict[str, str]]:
    """The cells of `done`'s samples ((dtype, technique, gc, seq, rows) → terms or an error message) at `rows` rows
    per micro-batch, keyed `cell_key` (`one_row_key` at one row), and for each cell a sample of which failed, the first
    error instead."""
    fitted: dict[str, Cell] = {}
    skipped: dict[str, str] = {}
    for dtype in dtypes:
        for technique, gc in cells:
            if not traced_in(dtype, technique):
                continue
            key = cell_key(PRECISIONS[dtype], technique, gc)
            key = key if rows == ROWS else one_row_key(key)
            got = [done[(dtype, technique, gc, seq, rows)] for seq in seqs]
            errors = [g for g in got if isinstance(g, str)]
            if errors:
                skipped[key] = errors[0]
            else:
                fitted[key] = fit_cell(got, kinds, seqs, rows=rows)
    return fitted, skipped


def _run_samples(probe: LearnedProfile, tasks: list[tuple], depth: int, workers: int, progress: Any,
                 start: float) -> dict[tuple, Any]:
    """(dtype, technique, gc, seq) → the sample's terms, or its error message; in `workers` processes."""
    args = [(probe, *task, depth) for task in tasks]
    out: dict[tuple, Any] = {}
    if progress:    # said before the first trace, which takes seconds to minutes: the run is working, not hung
        progress(f"{len(tasks)} traces of a {depth}-layer cut in {max(workers, 1)} process(es), then the held checks; "
                 "nothing is written before the end (Ctrl-C stops it)")
    if workers <= 1:
        results = map(_sample_task, args)
        pool = None
    else:
        import multiprocessing as mp

        pool = mp.get_context("spawn").Pool(processes=workers, initializer=share_cpus, initargs=(workers,))
        results = pool.imap(_sample_task, args)
    try:
        for i, (task, result) in enumerate(zip(tasks, results, strict=True), 1):
            out[task] = result
            if progress:
                state = f"not traced: {result}" if isinstance(result, str) else "traced"
                progress(f"[{i}/{len(tasks)}] {task[0]} {task[1]} {'gc' if task[2] else 'no gc'} seq {task[3]}: "
                         f"{state} ({time.perf_counter() - start:.1f} s)")
    finally:
        if pool is not None:
            pool.close()
            pool.join()
    return out


def _sample_task(args: tuple) -> Any:
    """One traced job's terms (a worker's task): (probe profile, dtype, technique, gc, seq, rows, depth)."""
    probe, dtype, technique, gc, seq, rows, depth = args
    try:
        return _sample(learn_job(spec_from_profile(probe, probe.model_type), dtype, technique, gc, seq, rows), depth)
    except Exception as exc:  # noqa: BLE001 — one cell that cannot run leaves the others learned
        return f"{type(exc).__name__}: {exc}"[:300]


def _sample(job: JobSpec, depth: int) -> dict[str, Any]:
    result = run_trace(job, timeline=True, steps=TRACED_STEP)
    routed = any(n.startswith(ROUTING_NOTE) for n in result.reimplemented)
    meas = measure(result.timeline, depth, TRACED_STEP)
    meas["left"] = [result.left_after_backward.get(f"step {TRACED_STEP} / backward / layer {k}", 0)
                    for k in range(depth)]
    idle = result.idle_in_layers[:depth]
    return {**terms(meas, known_parts(job, idle)), "routing_assumed": routed, "idle": idle}


def idle_kinds(kinds: tuple[LayerKind, ...], traced_kinds: list[int],
               samples: dict[tuple, Any]) -> tuple[LayerKind, ...]:
    """`kinds` with what the traced steps left without a gradient (`_sample`'s "idle": per traced layer, name inside
    the layer → [elements, bytes]; traced layer k is of kind traced_kinds[k]): `LayerKind.idle`, the elements of the
    full fine-tuning samples' idle parameters (the same in every full sample, or SpecError), and `idle_linears`, the
    linears whose LoRA adapters (lora_A / lora_B, peft's names) got no gradient in a LoRA sample — or, where no LoRA
    cell was traced, whose weight got none in a full one."""
    idle: dict[int, set[int]] = {}
    lora_linears: dict[int, set[str]] = {}
    weight_linears: dict[int, set[str]] = {}
    any_lora = False
    for (_, technique, *_), got in samples.items():
        if isinstance(got, str):
            continue
        for k, names in enumerate(got.get("idle") or ()):
            kind = traced_kinds[k]
            linears = {lin.name for lin in kinds[kind].linears if lin.nn_linear}
            if base_technique(technique)[0] == "full":
                idle.setdefault(kind, set()).add(sum(n for n, _ in names.values()))
                weight_linears.setdefault(kind, set()).update(
                    name[:-len(".weight")] for name in names if name.endswith(".weight")
                    and name[:-len(".weight")] in linears)
            else:
                any_lora = True
                lora_linears.setdefault(kind, set()).update(
                    name.split(".lora_", 1)[0] for name in names if ".lora_" in name
                    and name.split(".lora_", 1)[0] in linears)
    out = []
    for i, kind in enumerate(kinds):
        counts = idle.get(i, {0})
        if len(counts) > 1:
            raise SpecError(f"layer kind {i}: the full fine-tuning traces left different parameter counts without a "
                            f"gradient ({sorted(counts)}); the profile would hold one")
        names = (lora_linears if any_lora else weight_linears).get(i, set())
        out.append(replace(kind, idle=counts.pop(), idle_linears=tuple(sorted(names))))
    return tuple(out)


def held(probe: LearnedProfile, cells: dict[str, Cell], spec: Any, dtypes: tuple[str, ...],
         wanted: list[tuple[str, bool]], seqs: tuple[int, ...], max_positions: int,
         factor: int = CHECK_FACTOR, progress: Any = None, rows: bool = True) -> dict[str, Any]:
    """Where the profile is held: each technique learned (full, LoRA, DoRA; the cells on peft's default targets are
    the LoRA, no-dropout and DoRA ones' on other targets: not checked apart) checked against a two-step trace of the
    reduced model at the longest learned length and at `factor` times it (within max_position_embeddings; factor 1: that length only); a technique is held
    up to the longest length from which every shorter check is within HELD_PCT, in every precision learned; `rows`:
    the rows check after them (`held_rows`)."""
    lengths = [seqs[-1]] + ([seqs[-1] * factor] if factor > 1 and (
        not max_positions or max_positions >= seqs[-1] * factor) else [])
    errors: dict[str, dict[str, float | str]] = {}
    techniques: dict[str, int] = {}
    for t, gc in wanted:
        if base_technique(t.removesuffix(NOMDROP))[0] in DEFAULT_VARIANTS:
            continue
        name = held_name(t, gc)
        reached = []
        for dtype in dtypes:
            if cell_key(PRECISIONS[dtype], t, gc) not in cells:
                continue
            errors[f"{PRECISIONS[dtype]} {name}"] = got = {}
            reached.append(0)
            for n in lengths:
                if progress:        # each check is a two-step trace: seconds to minutes
                    progress(f"held check: {PRECISIONS[dtype]} {name} at {n:,} tokens per row")
                try:
                    err: float | str = _check(probe, cells, learn_job(spec, dtype, t, gc, n))
                except Exception as exc:  # noqa: BLE001 — a check that cannot run holds nothing
                    err = f"{type(exc).__name__}: {exc}"[:200]
                got[str(n)] = err
                if not isinstance(err, float) or abs(err) > HELD_PCT:
                    break
                reached[-1] = n
        if reached and min(reached):
            techniques[name] = min(reached)
    out = {"max_length": min(techniques.values(), default=0), "techniques": techniques, "rows": ROWS,
           "precisions": [PRECISIONS[d] for d in dtypes], "within_pct": HELD_PCT, "err_pct": errors}
    first = rows_checked(wanted, techniques) if rows else None
    if first:
        out |= held_rows(probe, cells, spec, dtypes[0], *first, techniques[held_name(*first)], progress=progress)
    return out


def rows_checked(wanted: list[tuple[str, bool]], techniques: dict[str, int]) -> tuple[str, bool] | None:
    """The technique the rows check runs (`held_rows`, and `one_row_cells` after it): the first of `wanted` that is
    held at some length."""
    return next(((t, gc) for t, gc in wanted if held_name(t, gc) in techniques), None)


def held_rows(probe: LearnedProfile, cells: dict[str, Cell], spec: Any, dtype: str, technique: str, gc: bool,
              length: int, progress: Any = None, known: dict[str, float | str] | None = None) -> dict[str, Any]:
    """The held check at ROWS_CHECKED rows per micro-batch (one technique, at `length` tokens per row): the rows
    range the profile is held over ("rows_held": [fewest, most]; ROWS alone where a check missed) and the errors.
    `known`: the errors of an earlier check of the same technique and length; only the rows it lacks are traced."""
    errors: dict[str, float | str] = dict(known or {})
    unmasked_scores = False
    for rows in ROWS_CHECKED:
        if str(rows) in errors:
            continue
        if progress:
            progress(f"rows check: {held_name(technique, gc)} at {length:,} tokens per row × {rows} rows")
        try:
            job = learn_job(spec, dtype, technique, gc, length, rows=rows)
            traced = run_trace(job).peak_allocated_bytes
            errors[str(rows)] = err = _error(probe, cells, job, traced)
            if rows == 1 and err < -HELD_PCT:
                # one unpadded row runs unmasked, and the estimate drops the rows·seq² terms the padded rows learned:
                # right for a mask, wrong for [seq, seq] tensors a layer builds anyway (a DSA indexer's scores). The
                # same trace tells them apart: kept where the terms with rows·seq² hold it (UNMASKED_SCORES)
                kept = _error(probe, cells, job, traced, {UNMASKED_SCORES: True})
                errors["1 with rows·seq²"] = kept
                if abs(kept) <= HELD_PCT:
                    errors[str(rows)], unmasked_scores = kept, True
        except Exception as exc:  # noqa: BLE001 — a check that cannot run holds nothing
            errors[str(rows)] = f"{type(exc).__name__}: {exc}"[:200]

    def held_at(rows: int) -> bool:
        err = errors[str(rows)]
        return isinstance(err, float) and abs(err) <= HELD_PCT

    fewer = [r for r in ROWS_CHECKED if r < ROWS]
    more = [r for r in ROWS_CHECKED if r > ROWS]
    lo = min((r for r in fewer if all(held_at(x) for x in fewer if x >= r)), default=ROWS)
    hi = max((r for r in more if all(held_at(x) for x in more if x <= r)), default=ROWS)
    out: dict[str, Any] = {"rows_held": [lo, hi],
                           "rows_err_pct": {f"{PRECISIONS[dtype]} {held_name(technique, gc)} {length}": errors}}
    if known is None:
        out[UNMASKED_SCORES] = unmasked_scores
    return out


def missing_rows(stored: LearnedProfile) -> tuple[int, ...]:
    """The row counts of ROWS_CHECKED a stored profile's rows check has not run: those it lacks (a profile checked
    before the check took 8 and 16 rows), or all of them where no rows check ran; empty where it has them all or holds
    no technique to check them on."""
    checks = stored.held.get("rows_err_pct") or {}
    if not checks:
        return ROWS_CHECKED if rows_technique(stored.held) else ()
    ((_, errors),) = checks.items()
    return tuple(r for r in ROWS_CHECKED if str(r) not in errors)


def rows_technique(held: dict[str, Any]) -> str | None:
    """The held technique (of a profile's `held`) a rows check runs on: full fine-tuning first, as `rows_checked`
    picks."""
    techniques = held.get("techniques") or {}
    return next((n for n in ("full gc", "full no gc", *techniques) if n in techniques), None)


def add_rows(cfg: dict[str, Any], stored: LearnedProfile, progress: Any = None) -> LearnedProfile:
    """`stored` (a profile of `cfg`) with its rows check run at the rows it lacks (`missing_rows`), on its own
    technique, precision, length and cells (where none ran: its first held technique at its held length, in its first
    precision). A range checked before keeps its fewest rows (one row may hold on the strength of one-row cells,
    `one_row_cells`) and reaches as far as every row count up to the new one holds; the rows already checked keep
    their errors."""
    if config_hash(cfg) != stored.config_sha256:
        raise SpecError(f"model {stored.model_type}: the stored profile was learned from another config; learn it "
                        "again instead")
    checks = stored.held.get("rows_err_pct") or {}
    if checks:
        ((name, errors),) = checks.items()
        key, rest = name.split(" ", 1)
        label, length = rest.rsplit(" ", 1)
    else:
        named = stored.held.get("precisions") or [stored.held.get("precision")]
        label = rows_technique(stored.held)
        key, length, errors = next(k for k in PRECISIONS.values() if k in named), stored.held["techniques"][label], None
    technique, gc = held_technique(label)
    dtype = next(d for d, k in PRECISIONS.items() if k == key)
    probe = learning_probe(cfg, CELLS, image_text=bool(stored.provenance.get(LAYER_NORM_FP32)))[0]
    got = held_rows(probe, stored.cells, spec_from_profile(probe, probe.model_type), dtype, technique, gc,
                    int(length), progress=progress, known=errors)
    if errors is not None:
        got["rows_held"][0] = (stored.held.get("rows_held") or [ROWS, ROWS])[0]
    return replace(stored, provenance={**stored.provenance, "held": {**stored.held, **got}})


def complete(cfg: dict[str, Any], stored: LearnedProfile, wanted: list[tuple[str, bool]], rows: tuple[int, ...], *,
             workers: int = 1, long_checks: bool = True, progress: Any = None) -> LearnedProfile:
    """`stored` (a profile of `cfg`) with the variant cells `wanted` added (`missing_cells`, `learn_cells`) and its
    rows check run at `rows` (`missing_rows`, `add_rows`): what `--add-missing` does to a stored profile."""
    profile = stored
    if wanted:
        profile = learn_cells(cfg, profile, wanted, workers=workers, long_checks=long_checks, progress=progress)
    if rows:
        profile = add_rows(cfg, profile, progress=progress)
    return profile


def one_row_cells(probe: LearnedProfile, cells: dict[str, Cell], spec: Any, dtypes: tuple[str, ...],
                  wanted: list[tuple[str, bool]], seqs: tuple[int, ...], depth: int, kinds: tuple[int, ...] | None,
                  held: dict[str, Any], *, workers: int, progress: Any, start: float) -> dict[str, Cell]:
    """Cells traced on one unpadded row per micro-batch, for a profile whose rows check missed at one row both ways
    (`held_rows`: the padded rows' rows·seq² terms dropped, and kept): some of those terms exist on one unpadded row
    and some not. DeepSeek-V3.2-style sparse attention always reads a 4-D mask and builds [rows, seq, seq] index
    scores (models/deepseek_v32/modeling_deepseek_v32.py: `attention_mask[:, 0, :, :]` into the indexer), while
    padded rows add more [rows, seq, seq] tensors on top. Each technique of `wanted` is traced again at `seqs` on one
    row and fitted as its own cell (`one_row_key`); the estimate takes them for a micro-batch of one unpadded row
    (hpcmem.estimate.learned `one_row`). Then the rows check at one row runs again with them — "rows_held" starts at
    1 where it holds — and once more on a packed row (padding-free, two documents), which sets ONE_ROW_PACKED where
    they hold it too. `held` gains both results; the cells come back keyed by `one_row_key`."""
    tasks = [(d, tech, gc, seq, 1) for d in dtypes for tech, gc in wanted for seq in seqs if traced_in(d, tech)]
    if progress:
        progress("one unpadded row: the rows check missed at one row; tracing each cell on one row")
    done = _run_samples(probe, tasks, depth, workers, progress, start)
    out, _ = fit_cells(done, dtypes, wanted, seqs, kinds, rows=1)     # a cell a sample failed for is not kept
    first = rows_checked(wanted, held.get("techniques", {}))
    if not out or not held.get("rows_err_pct") or first is None:
        return out
    ((name, errors),) = held["rows_err_pct"].items()
    job = learn_job(spec, dtypes[0], *first, held["techniques"][held_name(*first)], rows=1)
    packed = replace(job, train=replace(job.train, packing=True, packing_strategy="bfd"))
    for label, one, flag in (("1 with one-row cells", job, {}), ("1 packed with one-row cells", packed,
                                                                 {ONE_ROW_PACKED: True})):
        if progress:
            progress(f"rows check: {name} × {label}")
        try:
            errors[label] = err = _error(probe, {**cells, **out}, one, run_trace(one).peak_allocated_bytes, flag)
        except Exception as exc:  # noqa: BLE001 — a check that cannot run holds nothing
            errors[label] = f"{type(exc).__name__}: {exc}"[:200]
            continue
        if abs(err) <= HELD_PCT and not flag:
            held["rows_held"] = [1, held["rows_held"][1]]
        elif abs(err) <= HELD_PCT:
            held[ONE_ROW_PACKED] = True
    return out


def not_held(seqs: tuple[int, ...]) -> dict[str, Any]:
    """A profile learned without its checks: held nowhere (the estimate says so), learned up to seqs[-1]."""
    return {"max_length": 0, "techniques": {}, "rows": ROWS, "learned_to": seqs[-1], "within_pct": HELD_PCT}


def _check(probe: LearnedProfile, cells: dict[str, Cell], job: JobSpec) -> float:
    """Signed error (%) of the estimate against a full two-step trace of one traced job (the states, the optimizer
    step and the last instant of backward are the estimate's own there: this is what the check sees)."""
    return _error(probe, cells, job, run_trace(job).peak_allocated_bytes)


def _error(probe: LearnedProfile, cells: dict[str, Cell], job: JobSpec, traced: int,
           held: dict[str, Any] | None = None) -> float:
    """`_check`'s error against a traced peak, the profile's `held` given `held`'s keys."""
    provenance = {**probe.provenance, "held": {**(probe.provenance.get("held") or {}), **(held or {})}}
    spec = spec_from_profile(replace(probe, cells=cells, provenance=provenance), job.model.name)
    est = max(tensor_bytes(p) for p in estimate(replace(job, model=spec)).phases)
    return round(100.0 * (est - traced) / traced, 3)


def _versions() -> dict[str, str]:
    return versions()


def stderr_progress(message: str) -> None:
    print(f"learn: {message}", file=sys.stderr, flush=True)


def provisional_spec(cfg: dict[str, Any], name: str) -> Any:
    """A ModelSpec from the meta model alone (parameters, layers; no learned terms): what a probe needs to run a
    type that has no family descriptor and no profile. Its estimate is refused (no cell learned), and says so."""
    lo = lay.layout(backbone_config(cfg))
    profile = _profile(lo, model_type=str(cfg.get("model_type", lo.model_type)), sha=config_hash(cfg), cfg=cfg,
                       layer_map=tuple(range(len(lo.layer_kinds))), cells={},
                       peft=_peft_defaults(cfg),
                       provenance={"attention": lo.attention, "summary": "not learned: parameters only"})
    return spec_from_profile(profile, name)
