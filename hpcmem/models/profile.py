"""Learned profiles: the per-layer memory terms of a model type that no family descriptor covers, fitted from traces
of its own modelling code (`hpcmem models learn`, hpcmem/trace/learn.py) and read here without torch.

A profile belongs to one config.json (its canonical SHA-256). It holds what the estimate needs and cannot derive:

- the parameter layout of `AutoModelForCausalLM.from_config` on the meta device: embedding, LM head, everything
  outside the decoder layers, and per layer kind its parameter count, routed-expert share and Linear layers;
- per precision (`w4a2`: fp32 weights under bf16 autocast, TRL's default; `w2a2`: 16-bit weights), technique (full,
  lora, dora) and checkpointing (gc, nogc) a `Cell` of terms, each a polynomial in the micro-batch
  bytes = a + b·tokens + c·rows·seq²  (linear in tokens; c carries the [rows, seq, seq] attention masks/scores),
  fitted exactly on three sequence lengths at two rows (hpcmem/trace/learn.py says how each is measured) — or, for a
  phase's highest instant (fpeak, peak, forward_other, head_other; format 3), the highest of such polynomials, one
  per instant of the phase (`Envelope`):
    fwd[k]   bytes layer k leaves alive when its forward ends (what it keeps, plus autocast's weight cache)
    fpeak[k] the highest bytes above layer k's start while its forward runs
    kept[k]  bytes layer k keeps into backward (freed when its backward ends)
    left[k]  bytes layer k's backward leaves alive past its end, not gradients (RecurrentGemma's RG-LRU keeps its
             recomputed scan's graph in a module attribute until its next forward); absent in older profiles: 0
    peak[k]  the highest bytes above its entry while layer k runs its backward (recompute + temporaries)
    forward_entry: what the forward holds when layer 0 starts (embeddings, masks, rotary tables) beyond the states;
    forward_other, head_other, entry_other: what the LM head's forward, its backward and every layer's backward
             entry hold beyond the states, the layers' terms, the gradients done and the fused LM head's own terms.
  Terms are indexed by a layer of the traced reduced-depth model; `layer_map` says which one each real layer takes.

`provenance["held"]` says where the profile is held: the row lengths and techniques checked against a trace
(hpcmem/trace/learn.py `held`); the estimate warns outside them (hpcmem.estimate.learned_range).

Profiles are found by the config's hash in the data search path (hpcmem/datapath.py, kind "profiles"): a site's or a
user's own (`hpcmem models learn` writes to `write_dir("profiles")`), then those shipped for catalog models.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hpcmem.datapath import search_dirs, write_dir
from hpcmem.errors import SpecError
from hpcmem.inputs.files import load_json_file
from hpcmem.models.config import sliding_layers, sliding_window
from hpcmem.models.coverage import classification
from hpcmem.models.profile_check import check_profile_doc
from hpcmem.models.spec import ModelSpec

FORMAT = "hpcmem-learned-profile/3"
# Format 2 (terms solved on 256–768 tokens per row, each highest instant as one polynomial) still loads, held where
# `hpcmem validate coverage` held it: 2 rows of 1,024 tokens (its quadratic bends away beyond: estimator/LOG.md)
OLD_FORMATS = {"hpcmem-learned-profile/2": 1024}
KIND = "profiles"
# `held` key: the rows·seq² terms stay on an unpadded row (the layers build [seq, seq] tensors without a mask; set by
# the rows check, hpcmem/trace/learn.py `held_rows`)
UNMASKED_SCORES = "unmasked_scores"
ONE_ROW = "1row"
# held: the one-row cells also hold a packed (padding-free) row of several documents (hpcmem/trace/learn.py)
ONE_ROW_PACKED = "one_row_packed"
PRECISIONS = ("w4a2", "w2a2")           # fp32 weights + bf16 autocast (TRL's default load) | bf16/fp16 weights
TECHNIQUES = ("full", "lora")
CHECKPOINTING = ("gc", "nogc")
# keys of a config.json that do not change the architecture (left out of the hash)
VOLATILE_KEYS = ("_name_or_path", "transformers_version", "torch_dtype", "dtype", "architectures", "auto_map",
                 "_commit_hash", "use_cache")
# The LoRA the lora cells are traced with (TRL's get_peft_config defaults, all-linear; where peft refuses that — fused
# experts become ParamWrappers, which refuse dropout — the attention projections): the profile records the one used
# (provenance "lora_reference"), and the estimate adds the difference of the user's adapters to it with
# hpcmem.estimate.lora's own formulas.
REFERENCE_LORA = {"lora_r": 16, "lora_target_modules": ["all-linear"]}


def config_hash(cfg: dict[str, Any]) -> str:
    """SHA-256 (first 16 hex digits) of the config.json without its volatile keys, keys sorted."""
    import hashlib      # stdlib, deferred: it loads OpenSSL, which only a profile lookup needs

    kept = {k: v for k, v in cfg.items() if k not in VOLATILE_KEYS}
    text = json.dumps(kept, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


@dataclass(frozen=True)
class Poly:
    """bytes = a + b·tokens + c·rows·seq²."""

    a: float
    b: float
    c: float

    def at(self, tokens: int, quad: int) -> int:
        return round(self.a + self.b * tokens + self.c * quad)

    def __add__(self, other: Poly) -> Poly:
        return Poly(self.a + other.a, self.b + other.b, self.c + other.c)

    def __sub__(self, other: Poly) -> Poly:
        return Poly(self.a - other.a, self.b - other.b, self.c - other.c)


def _solve3(rows: list[list[float]], rhs: list[float]) -> list[float]:
    """Gaussian elimination with partial pivoting for a 3×3 system."""
    m = [r[:] + [v] for r, v in zip(rows, rhs, strict=True)]
    for col in range(3):
        piv = max(range(col, 3), key=lambda r: abs(m[r][col]))
        m[col], m[piv] = m[piv], m[col]
        for r in range(3):
            if r != col:
                f = m[r][col] / m[col][col]
                m[r] = [a - f * b for a, b in zip(m[r], m[col], strict=True)]
    return [m[i][3] / m[i][i] for i in range(3)]


def fit_poly(values: list[float], seqs: tuple[int, ...], rows: int) -> Poly:
    """The Poly through three values measured at `rows` rows of each of three lengths `seqs` (solved exactly): how
    the learner turns one term's samples into a + b·tokens + c·rows·seq² (hpcmem/trace/learn.py)."""
    a, b, c = _solve3([[1.0, rows * s, rows * s * s] for s in seqs], values)
    return Poly(a, b, c)


@dataclass(frozen=True)
class Envelope:
    """bytes = the highest of several Polys: a term that is a phase's highest instant (a layer's forward or backward
    peak, the LM head's). Each instant of the phase holds tensors whose sizes are a + b·tokens + c·rows·seq² (the
    same ops run at every length: hpcmem/trace/learn.py checks it), so each piece is one instant fitted exactly,
    and which instant is highest can change with the length — a single polynomial fitted to the highest instant of
    short rows bends where the instants cross, and carries that bend to long rows."""

    pieces: tuple[Poly, ...]

    def at(self, tokens: int, quad: int) -> int:
        return max(p.at(tokens, quad) for p in self.pieces)

    def _shifted(self, other: Poly | Envelope, sign: int) -> Envelope:
        """Piece by piece where `other` has the same instants (one layer's terms and another of its kind), else by
        the piece of `other` highest at ENVELOPE_TOP (the stand-in of a last layer whose kind differs)."""
        if isinstance(other, Envelope) and len(other.pieces) == len(self.pieces):
            return Envelope(tuple(a + b if sign > 0 else a - b for a, b in zip(self.pieces, other.pieces,
                                                                                 strict=True)))
        top = other.top() if isinstance(other, Envelope) else other
        return Envelope(tuple(a + top if sign > 0 else a - top for a in self.pieces))

    def top(self) -> Poly:
        return max(self.pieces, key=lambda p: p.at(*ENVELOPE_TOP))

    def __add__(self, other: Poly | Envelope) -> Envelope:
        return self._shifted(other, 1)

    def __sub__(self, other: Poly | Envelope) -> Envelope:
        return self._shifted(other, -1)


# (tokens, rows·seq²) of 2 rows × 8,192 tokens: where a difference of two envelopes without the same instants is read
ENVELOPE_TOP = (2 * 8192, 2 * 8192 * 8192)
Term = Poly | Envelope


def pieces(term: Term) -> tuple[Poly, ...]:
    """A term's instants: an Envelope's pieces, a Poly alone."""
    return term.pieces if isinstance(term, Envelope) else (term,)


@dataclass(frozen=True)
class Cell:
    fwd: tuple[Poly, ...]
    fpeak: tuple[Term, ...]
    kept: tuple[Poly, ...]
    peak: tuple[Term, ...]
    forward_entry: Poly
    forward_other: Term
    head_other: Term
    entry_other: Poly
    left: tuple[Poly, ...] = ()     # () where not measured (profiles learned before the term): none
    # forward_other and head_other hold the fused LM head's own bytes of the traced job (format 3; the estimate takes
    # its own formula for them out), not what is left beside them (format 2)
    head_with_loss: bool = False
    # the rows per micro-batch its traces ran (hpcmem/trace/learn.py): 0 for the profile's own (provenance "rows"); 1
    # for a one-row cell (`one_row_key`), traced on one unpadded row
    rows: int = 0


@dataclass(frozen=True)
class Linear:
    """One weight of a decoder layer (path inside the layer, as peft names it), from the meta model."""

    name: str
    in_features: int
    out_features: int
    count: int                # matrices of this shape (E for fused 3-D experts)
    nn_linear: bool           # an nn.Linear: LoRA target_modules / all-linear reach it
    bias: bool
    held: bool = True         # False: its weight is tied to a later layer's, which holds it (peft still adapts it)
    runs: bool = True         # False: the layer holds it but its forward never calls it (no activations, no gradient)

    @property
    def leaf(self) -> str:
        """The last name part, which peft target_modules match (as hpcmem.models.params `LinearModule.leaf`)."""
        return self.name.rsplit(".", 1)[-1]


@dataclass(frozen=True)
class LayerKind:
    params: int
    experts: int              # routed-expert parameters (3-D weights) of the layer
    experts_active: int       # of those, what one token passes through (top-k of E)
    linears: tuple[Linear, ...]
    # of `params`, those the traced full fine-tuning step left without a gradient (a module run under torch.no_grad:
    # a sparse-attention indexer) — no gradient, no optimizer state (torch/optim/adamw.py `_init_group` skips a
    # parameter whose grad is None); 0 in profiles learned before it was measured
    idle: int = 0
    # the linears (`Linear.name`) whose LoRA adapters the traced LoRA step left without a gradient, or, with no LoRA
    # cell, whose weight the full step did: they run without a graph, so their adapters neither save nor train
    idle_linears: tuple[str, ...] = ()


@dataclass(frozen=True, kw_only=True)
class ParamLayout:
    """A model's parameters by place, as the meta model holds them (hpcmem.trace.layer_map measures it)."""

    hidden_size: int
    vocab_size: int
    tie_word_embeddings: bool
    max_position_embeddings: int
    embed: int
    lm_head: int
    other: int                          # parameters outside embedding, head and decoder layers (final norm, …)
    kinds: tuple[LayerKind, ...]
    layer_kinds: tuple[int, ...]        # kind of each real decoder layer


@dataclass(frozen=True, kw_only=True)
class LearnedProfile(ParamLayout):
    model_type: str
    config_sha256: str
    layer_map: tuple[int, ...]          # traced layer whose terms each real layer takes
    peft_default_targets: tuple[str, ...] | None
    cells: dict[str, Cell] = field(compare=False, repr=False)
    config: dict[str, Any] = field(compare=False, repr=False)
    provenance: dict[str, Any] = field(compare=False, repr=False)
    # per traced layer: the highest bytes above the layer's input while a no-grad pass runs it (a reference model's,
    # a teacher's), output included (hpcmem/trace/learn.py `no_grad_terms`); empty in profiles learned before the
    # learner traced it for every type wherever a checkpointed cell stood in for it
    no_grad: tuple[Any, ...] = field(default=(), compare=False, repr=False)
    # with `no_grad`: what that pass holds from its start to its first layer's beyond the embeddings' output and the
    # boolean mask the estimate counts (model-level position biases, float masks), else None
    no_grad_entry: Any = field(default=None, compare=False, repr=False)

    @property
    def num_layers(self) -> int:
        return len(self.layer_kinds)

    @property
    def total(self) -> int:
        return self.embed + self.lm_head + self.other + sum(self.kinds[k].params for k in self.layer_kinds)

    def cell(self, precision: str, technique: str, gc: bool, one_row: bool = False) -> Cell | None:
        """The cell of a technique; `one_row`: its one-row variant where learned (`one_row_key`), else the cell."""
        key = cell_key(precision, technique, gc)
        return (self.cells.get(one_row_key(key)) if one_row else None) or self.cells.get(key)

    def cell_keys(self) -> list[str]:
        return sorted(self.cells)

    @property
    def held(self) -> dict[str, Any]:
        """Where the profile is held (hpcmem/trace/learn.py `held`): max_length, the longest row length every
        technique checked is held at (0: none); techniques, each one's; a format-2 profile: validate coverage's 1,024
        tokens, no technique named."""
        return self.provenance.get("held") or {"max_length": 0, "techniques": {}}

    @property
    def lora_reference(self) -> dict[str, Any]:
        return self.provenance.get("lora_reference") or REFERENCE_LORA


def cell_key(precision: str, technique: str, gc: bool) -> str:
    return f"{precision}/{technique}/{'gc' if gc else 'nogc'}"


def one_row_key(key: str) -> str:
    """The key of a cell's one-row variant: the same technique traced on one unpadded row per micro-batch, learned
    where the cells of ROWS padded rows do not scale down to one (hpcmem/trace/learn.py `one_row_cells`)."""
    return f"{key}/{ONE_ROW}"


# -- JSON ---------------------------------------------------------------------------------------------------------
def _poly(v: Any) -> Any:
    """[a, b, c] → Poly; {"max": [[a, b, c], …]} → Envelope (format 3)."""
    if isinstance(v, dict):
        return Envelope(tuple(_poly(x) for x in v["max"]))
    return Poly(float(v[0]), float(v[1]), float(v[2]))


def _cell(d: dict[str, Any]) -> Cell:
    return Cell(fwd=tuple(map(_poly, d["fwd"])), fpeak=tuple(map(_poly, d["fpeak"])), kept=tuple(map(_poly, d["kept"])),
                peak=tuple(map(_poly, d["peak"])), forward_entry=_poly(d["forward_entry"]),
                forward_other=_poly(d["forward_other"]), head_other=_poly(d["head_other"]),
                entry_other=_poly(d["entry_other"]), left=tuple(map(_poly, d.get("left", ()))),
                head_with_loss=bool(d.get("head_with_loss", False)), rows=int(d.get("rows", 0)))


def profile_from_dict(doc: dict[str, Any]) -> LearnedProfile:
    if doc.get("format") != FORMAT and doc.get("format") not in OLD_FORMATS:
        raise SpecError(f"learned profile: format {doc.get('format')!r} is not {FORMAT!r}; learn it again "
                        "(hpcmem models learn CONFIG)")
    provenance = dict(doc.get("provenance", {}))
    if doc["format"] in OLD_FORMATS:
        provenance.setdefault("held", {"max_length": OLD_FORMATS[doc["format"]], "techniques": {}, "rows": 2,
                                       "format": doc["format"]})
    m = doc["model"]
    kinds = tuple(LayerKind(params=k["params"], experts=k["experts"], experts_active=k["experts_active"],
                            linears=tuple(Linear(*row) for row in k["linears"]), idle=int(k.get("idle", 0)),
                            idle_linears=tuple(k.get("idle_linears", ()))) for k in doc["kinds"])
    targets = doc.get("peft_default_targets")
    return LearnedProfile(
        model_type=doc["model_type"], config_sha256=doc["config_sha256"], hidden_size=m["hidden_size"],
        vocab_size=m["vocab_size"], tie_word_embeddings=m["tie_word_embeddings"],
        max_position_embeddings=m["max_position_embeddings"], embed=m["embed"], lm_head=m["lm_head"],
        other=m["other"], kinds=kinds, layer_kinds=tuple(doc["layer_kinds"]), layer_map=tuple(doc["layer_map"]),
        peft_default_targets=tuple(targets) if targets is not None else None,
        cells={key: _cell(c) for key, c in doc["cells"].items()}, config=doc["config"],
        provenance=provenance, no_grad=tuple(map(_poly, doc.get("no_grad") or ())),
        no_grad_entry=_poly(doc["no_grad_entry"]) if doc.get("no_grad_entry") is not None else None)


def _p(p: Any) -> Any:
    if isinstance(p, Envelope):
        return {"max": [_p(x) for x in p.pieces]}
    return [round(p.a, 3), round(p.b, 6), round(p.c, 9)]


def profile_to_dict(p: LearnedProfile) -> dict[str, Any]:
    return {
        "format": FORMAT, "model_type": p.model_type, "config_sha256": p.config_sha256,
        "provenance": p.provenance,
        "model": {"hidden_size": p.hidden_size, "vocab_size": p.vocab_size,
                  "tie_word_embeddings": p.tie_word_embeddings, "max_position_embeddings": p.max_position_embeddings,
                  "embed": p.embed, "lm_head": p.lm_head, "other": p.other},
        "kinds": [{"params": k.params, "experts": k.experts, "experts_active": k.experts_active,
                   "linears": [[x.name, x.in_features, x.out_features, x.count, x.nn_linear, x.bias]
                               + ([x.held, x.runs] if not x.runs else [] if x.held else [False])
                               for x in k.linears],
                   **({"idle": k.idle} if k.idle else {}),
                   **({"idle_linears": list(k.idle_linears)} if k.idle_linears else {})} for k in p.kinds],
        "layer_kinds": list(p.layer_kinds), "layer_map": list(p.layer_map),
        "peft_default_targets": list(p.peft_default_targets) if p.peft_default_targets is not None else None,
        "cells": {key: {"fwd": [_p(x) for x in c.fwd], "fpeak": [_p(x) for x in c.fpeak],
                        "kept": [_p(x) for x in c.kept], "peak": [_p(x) for x in c.peak],
                        "forward_entry": _p(c.forward_entry), "forward_other": _p(c.forward_other),
                        "head_other": _p(c.head_other), "entry_other": _p(c.entry_other),
                        **({"left": [_p(x) for x in c.left]} if any(x.a or x.b or x.c for x in c.left) else {}),
                        **({"head_with_loss": True} if c.head_with_loss else {}),
                        **({"rows": c.rows} if c.rows else {})}
                  for key, c in sorted(p.cells.items())},
        **({"no_grad": [_p(x) for x in p.no_grad]} if p.no_grad else {}),
        **({"no_grad_entry": _p(p.no_grad_entry)} if p.no_grad_entry is not None else {}),
        "config": p.config,
    }


def profile_from_record(d: dict[str, Any]) -> LearnedProfile:
    """The profile a record's job carries: the file's form (`profile_to_dict`), or — records written before a job
    stored it so — `dataclasses.asdict` of the LearnedProfile (Poly as {a, b, c}, Envelope as {pieces})."""
    if "format" in d:
        return profile_from_dict(d)

    def term(v: Any) -> Any:
        return {"max": [term(x) for x in v["pieces"]]} if "pieces" in v else [v["a"], v["b"], v["c"]]

    def cell(c: dict[str, Any]) -> dict[str, Any]:
        return {k: ([term(x) for x in v] if isinstance(v, list) else term(v) if isinstance(v, dict) else v)
                for k, v in c.items()}

    linear = ("name", "in_features", "out_features", "count", "nn_linear", "bias", "held", "runs")
    return profile_from_dict({
        "format": FORMAT, "model_type": d["model_type"], "config_sha256": d["config_sha256"],
        "provenance": d.get("provenance") or {},
        "model": {k: d[k] for k in ("hidden_size", "vocab_size", "tie_word_embeddings", "max_position_embeddings",
                                    "embed", "lm_head", "other")},
        "kinds": [{**k, "linears": [[x[f] for f in linear] for x in k["linears"]]} for k in d["kinds"]],
        "layer_kinds": d["layer_kinds"], "layer_map": d["layer_map"],
        "peft_default_targets": d.get("peft_default_targets"),
        "cells": {key: cell(c) for key, c in d["cells"].items()}, "config": d.get("config") or {},
        "no_grad": [term(x) for x in d.get("no_grad") or ()],
        "no_grad_entry": term(d["no_grad_entry"]) if d.get("no_grad_entry") is not None else None})


# -- where profiles live ----------------------------------------------------------------------------------------------
def profile_filename(model_type: str, sha: str) -> str:
    return f"{model_type}-{sha}.json"


def find_profile(cfg: dict[str, Any]) -> Path | None:
    """The first profile file for this config in the search path (site, user, package), or None."""
    name = profile_filename(str(cfg.get("model_type", "")), config_hash(cfg))
    for folder in search_dirs(KIND):
        path = folder / name
        if path.is_file():
            return path
    return None


def load_profile(path: Path) -> LearnedProfile:
    """A learned profile file, read within hpcmem.inputs.files' limits and checked (hpcmem.models.profile_check)
    before any of it is used."""
    try:
        doc = load_json_file(path, "learned profile")
        check_profile_doc(doc, str(path))
        return profile_from_dict(doc)
    except SpecError as exc:
        raise SpecError(f"{'; '.join(exc.problems)}; learn it again (hpcmem models learn) or move it away") from None
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise SpecError(f"cannot read learned profile {path}: {exc}; learn it again (hpcmem models learn)") from exc


def save_profile(p: LearnedProfile, folder: Path | None = None) -> Path:
    """Write the profile (a new file, or atomically over an older one for the same config)."""
    folder = folder or write_dir(KIND)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / profile_filename(p.model_type, p.config_sha256)
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(profile_to_dict(p), indent=1) + "\n", encoding="utf-8")
    tmp.replace(path)
    return path


# -- the ModelSpec of a learned model ------------------------------------------------------------------------------
def _int(cfg: dict[str, Any], *keys: str, default: int = 0) -> int:
    for key in keys:
        value = cfg.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return default


def spec_from_profile(p: LearnedProfile, name: str):
    """A ModelSpec whose sizes come from the meta model (hidden, vocab, layers) and, where the decoder's config
    (`backbone_config`: a vision-language type's text_config) names them, the attention shape and MLP width. The
    layers' memory terms are the profile's; these shapes serve the planner's FLOP count and the allocator's largest
    layer block (hpcmem.estimate.allocator `largest_layer_block`)."""
    decoder = backbone_config(p.config)
    heads = _int(decoder, "num_attention_heads", "n_head", "num_heads", default=1)
    kv = _int(decoder, "num_key_value_heads", "num_kv_heads", default=heads)
    if heads % kv:
        kv = heads
    head_dim = _int(decoder, "head_dim", default=max(p.hidden_size // heads, 1))
    return ModelSpec(
        name=name, model_type=p.model_type, vocab_size=p.vocab_size, hidden_size=p.hidden_size,
        intermediate_size=_int(decoder, "intermediate_size", "ffn_hidden_size", "n_inner", default=4 * p.hidden_size),
        num_hidden_layers=p.num_layers, num_attention_heads=heads, num_key_value_heads=kv, head_dim=head_dim,
        tie_word_embeddings=p.tie_word_embeddings, max_position_embeddings=p.max_position_embeddings or 4096,
        sliding_window=sliding_window(decoder, str(decoder.get("model_type", p.model_type))),
        sliding_layers=sliding_layers(decoder, str(decoder.get("model_type", p.model_type)), p.num_layers), learned=p)


def backbone_config(cfg: dict[str, Any]) -> dict[str, Any]:
    """The decoder a text fine-tune trains: the `text_config` of a family hpcmem/models/coverage.json marks
    multimodal (its towers are not counted, as for the derived families), with the outer tie_word_embeddings when the
    inner one is absent; else the config itself (Emu3, Mllama: their causal-LM class takes the whole config)."""
    inner = cfg.get("text_config")
    if not isinstance(inner, dict) or "model_type" not in inner:
        return dict(cfg)
    table = classification()["types"]
    entry = table.get(str(cfg.get("model_type")))
    if entry is not None and entry["class"] != "multimodal" or entry is None and inner["model_type"] not in table:
        return dict(cfg)
    merged = dict(inner)
    if "tie_word_embeddings" not in merged and "tie_word_embeddings" in cfg:
        merged["tie_word_embeddings"] = cfg["tie_word_embeddings"]
    return merged
