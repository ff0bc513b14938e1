"""`hpcmem validate coverage`: every covered model type's estimate held to a trace of the same job.

What "the trace" is here (the sweep must fit a shared two-core machine): for each type of hpcmem/models/coverage.json
that is not refused or not applicable, its reference config — the catalog entry of that type if there is one, else the
transformers config class's defaults (the sizes of the checkpoint its docstring names), with `CONFIG_FIXES` where
those defaults do not build — at full width, cut to at most EVAL_LAYERS decoder layers (EVAL_LAYERS_FOR: fewer; every
per-layer list cut alike); TRL's SFTTrainer traced for two optimizer steps (`--kernels cuda`), bf16 weights, 2 padded
rows of 1,024 tokens, for three techniques: full fine-tuning + GC, LoRA + GC (peft's default targets, else
all-linear), full fine-tuning without GC — or, for a type whose real trainer refuses checkpointing
(hpcmem/models/coverage.json "requires" gradient_checkpointing false), the two it runs: full and LoRA without GC; a
type that trains only with another setting (router_aux_loss_coef 0) is traced and estimated with it. The estimate is `hpcmem estimate`'s allocated tensor peak (cuBLAS workspaces left out, as in
`validate trace`). A derived type is estimated from its family descriptor; a learned type from a profile
learned from the full config (hpcmem.trace.learn: 512, 2,048 and 8,192 tokens per row at the reduced depth D ≤ 12,
checked there at 8,192 and 32,768), laid over the traced depth: the comparison is out of sample in depth (unless the
type is no deeper than D) and in length (1,024 tokens is none of the three).

Records go to estimator/coverage.jsonl, one line per type and technique (or one error line per type), appended as
they finish; a run skips types that already have records unless --redo. Types the sweep does not trace (not
applicable, refused) are reported, never written: their rows in hpcmem/models/coverage.json say why.
"""

from __future__ import annotations

import copy
import json
import sys
import time
from pathlib import Path
from typing import Any

from hpcmem.datapath import estimator_dir
from hpcmem.errors import SpecError
from hpcmem.estimate import estimate
from hpcmem.estimate.verdict import pct
from hpcmem.estimate.learned_range import held_technique
from hpcmem.estimate.workspaces import tensor_bytes
from hpcmem.job.jobspec import JobSpec
from hpcmem.job.position_table import limited_by, model_positions
from hpcmem.job.spec import TrainSpec
from hpcmem.models import catalog
from hpcmem.models.config import model_spec_from_config
from hpcmem.models.coverage import (
    classification,
    coverage_rows,
    held_label,
    required_settings,
    settings_beside_checkpointing,
    sweep_summary,
    type_status,
)
from hpcmem.models.params import all_linear_targets, linear_modules, peft_default_targets
from hpcmem.models.profile import backbone_config, profile_from_dict, profile_to_dict, spec_from_profile
from hpcmem.trace import layer_map as lay
from hpcmem.trace import run_trace
from hpcmem.trace.layer_map import subsequence
from hpcmem.trace.learn import (added_held, complete, held_rows, learn, learning_probe, missing_cells,
                                missing_rows, rows_technique, stderr_progress)
from hpcmem.trace.learn import hold_longer as hold_profile_longer
from hpcmem.trace.threads import share_cpus

EVAL_LAYERS = 16
# Types traced at fewer layers, and why. RecurrentGemma's RG-LRU scan is a Python loop over the tokens on every device
# (modeling_recurrent_gemma.py RecurrentGemmaRglru._rnn_scan: no kernel; the GPU runs the same ops), so its trace
# costs ~1,024 dispatches per recurrent layer per pass and 16 layers ran past the sweep's 14-minute job: 7 layers
# (recurrent, recurrent, attention ×2, then recurrent like the real last layer) at the same 2 × 1,024 tokens.
# LongCat-Flash's experts are a Python loop over the experts the router hit (modeling_longcat_flash.py
# LongcatFlashExperts.forward): all 768 (512 routed + 256 identity) under the trace's balanced routing, ~20 dispatches
# each per pass; its learn took 843 s at 3 layers (two cores shared), so 16 layers × 3 techniques did not fit a
# session: 8 layers, all of one kind, at the same 2 × 1,024 tokens.
# Qwen4-Exp (512 experts per layer, hyper-connections, the QSA indexer) traced 16 layers past 25 minutes: 8 layers,
# two whole periods of its default layer_types (three linear_attention, then indexed_attention; the real 40 end on
# indexed_attention too).
EVAL_LAYERS_FOR = {"recurrent_gemma": 7, "longcat_flash": 8, "qwen4_exp_text": 8, "qwen4_exp": 8}
EVAL_ROWS, EVAL_SEQ = 2, 1024
TECHNIQUES = {"full+gc": ("full", True), "lora+gc": ("lora", True), "full gc off": ("full", False),
              "lora gc off": ("lora", False)}
DEFAULT_TECHNIQUES = ("full+gc", "lora+gc", "full gc off")
GC_REFUSED = "within 3 % (GC refused)"


def sweep_techniques(model_type: str) -> tuple[str, ...]:
    """The techniques a type is held to: full + GC, LoRA + GC, full without GC; where transformers refuses
    checkpointing for the type (its trainer raises), the two jobs that run: full and LoRA without GC."""
    if required_settings(model_type).get("gradient_checkpointing") is False:
        return ("full gc off", "lora gc off")
    return DEFAULT_TECHNIQUES
# Class defaults that do not build a model in transformers 5.24, and the smallest change that does (the values of the
# checkpoint the config class names where it has them).
CONFIG_FIXES: dict[str, dict[str, Any]] = {
    "hunyuan_v1_dense": {"head_dim": 128},
    "hunyuan_v1_moe": {"head_dim": 128},
    "ministral": {"head_dim": 128},
    "nemotron": {"num_key_value_heads": 8},
    # GPT-1 has 512 positions; the sweep's rows are 1,024 tokens (its position embedding grows by 512 × 768)
    "openai-gpt": {"n_positions": 1024},
    "deepseek_v2": {"num_experts_per_tok": 6, "moe_intermediate_size": 1408},   # 1407: grouped_mm needs 16-B rows
    "dots1": {"n_routed_experts": 128, "n_shared_experts": 2, "num_experts_per_tok": 6, "moe_intermediate_size": 1408,
              "first_k_dense_replace": 1},
    "dbrx": {"attn_config": {"kv_n_heads": 8, "rope_theta": 500000.0, "clip_qkv": 8}},
    "cohere_compass_text": {"rope_parameters": {"full_attention": {"rope_type": "default", "rope_theta": 10000.0}}},
    # LFM2's class default makes every layer attention: give it (and LFM2-MoE, whose default has no pattern) the
    # short-convolution layers LFM2 checkpoints have (full attention at layers 2, 5, 8, 10, 12, 14 of 16)
    "lfm2": {"num_hidden_layers": 16, "layer_types": [
        "full_attention" if i in (2, 5, 8, 10, 12, 14) else "conv" for i in range(16)]},
    "lfm2_moe": {"num_hidden_layers": 16, "layer_types": [
        "full_attention" if i in (2, 5, 8, 10, 12, 14) else "conv" for i in range(16)]},
    # Qwen4-Exp's default layer_types make every fourth layer "indexed_attention", whose QSA indexer the class
    # defaults leave unset (None // None). The values of the released indexer: 4 query heads and one key head of 128
    # (a 640-wide index_qk_proj), 4-token blocks, 2,048 selected tokens (TensorRT-Edge-LLM's QSA indexer kernel docs:
    # qNormed [B, S, 4, 128], kbar per 4-token block, outIdx [B, S, 2051] = 2,048 + a partial block's 3). The
    # attention's rotary part must fit that head (validate_architecture): Qwen3.5's partial_rotary_factor 0.25 (its
    # class default; 64 of 256).
    **{t: {"text_config": QSA} if t == "qwen4_exp" else QSA for t in ("qwen4_exp", "qwen4_exp_text") for QSA in [{
        "indexer_n_heads": 4, "indexer_kv_heads": 1, "indexer_head_dim": 128, "indexer_budget": 2048,
        "indexer_compress_ratio": 4, "rope_parameters": {"partial_rotary_factor": 0.25}}]},
}


def reference_config(model_type: str) -> tuple[dict[str, Any], str]:
    """(config dict, where it came from) for a type: its catalog entry, else the config class defaults (+ fix)."""
    for hub_id, doc in sorted(catalog().items()):
        if doc["config"].get("model_type") == model_type:
            # a deep copy: a caller that cuts or standardises a nested dict (text_config, rope_scaling) must not
            # change the cached catalog, which every later job of the process reads
            return copy.deepcopy(doc["config"]), f"catalog {hub_id}"
    from transformers import AutoConfig

    cfg = AutoConfig.for_model(model_type).to_dict()
    cfg = {k: v for k, v in cfg.items() if k not in ("transformers_version", "architectures", "_name_or_path",
                                                       "dtype", "torch_dtype")}
    fix = CONFIG_FIXES.get(model_type, {})
    return json.loads(json.dumps(_merged(cfg, fix), default=str)), "config class defaults" + (
        f" + {sorted(fix)}" if fix else "")


def _merged(cfg: dict[str, Any], fix: dict[str, Any]) -> dict[str, Any]:
    """cfg with fix laid over it; a dict merges into the config's dict (a multimodal config's text_config, a
    rope_parameters, keep their other fields)."""
    return {**cfg, **{k: _merged(cfg[k], v) if isinstance(v, dict) and isinstance(cfg.get(k), dict) else v
                      for k, v in fix.items()}}


def eval_model(cfg: dict[str, Any], name: str, profile: Any, folder: Path,
               layers: int | None = None) -> tuple[Any, int, int]:
    """(ModelSpec of the config cut to ≤ EVAL_LAYERS layers — or `layers` —, traced layers, real layers), named by the
    cut config's file in `folder` (the trace builds from it). A learned profile is laid over the cut depth with its own
    terms (hpcmem.trace.layer_map.layer_map); the cut ends on a layer of the real last layer's kind."""
    from dataclasses import replace

    decoder = backbone_config(cfg)
    config = lay.hf_config(decoder)
    real = len(profile.layer_kinds) if profile is not None else int(getattr(config, "num_hidden_layers"))
    key = lay.layers_key(config, decoder, real)
    depth = min(real, layers or EVAL_LAYERS_FOR.get(str(cfg.get("model_type")), EVAL_LAYERS))
    # a profile learned from real layers that are not a prefix (layout.subsequence) is evaluated on such a cut too: the
    # same rule, grown to `depth` layers (each kind's next layers in turn), so every kind repeats
    keep = tuple(lay.subsequence(profile.layer_kinds, depth)) if (
        profile is not None and depth < real and profile.provenance.get("layers")) else None
    if keep is None and profile is not None and depth < real:
        kinds, floor = profile.layer_kinds, profile.provenance["depth"]
        depth = max((d for d in range(floor, depth + 1) if kinds[d - 1] == kinds[-1]), default=depth)
    if keep is not None:
        depth = len(keep)
    cut = lay.reduced_config(lay.written_out(decoder, key, real) if keep else decoder, key, depth, real, keep) \
        if depth < real else decoder
    if (isinstance(cfg.get("text_config"), dict) and "model_type" in cfg["text_config"] and depth < real
            and decoder.get("model_type") != cfg.get("model_type")):      # the backbone is the text_config
        cut = {**cfg, "text_config": {**cfg["text_config"], **{k: cut[k] for k in cut if k in cfg["text_config"]
                                                               or k == key}}}
    path = folder / f"{name}-{depth}.json"
    path.write_text(json.dumps(cut, indent=1, default=str))
    if profile is None:
        return model_spec_from_config(cut, str(path)), depth, real
    kinds = profile.layer_kinds[:depth] if keep is None else tuple(profile.layer_kinds[j] for j in keep)
    built = lay.layout(backbone_config(cut)) if depth < real else None       # the cut model as transformers builds it
    # a prefix cut's last layer takes the real last layer's terms when it is of that layer's kind, or the cut builds
    # it as one (GPT-NeoX-Japanese: `last_only`); a cut too shallow to end on that kind (a random job's 3 layers of
    # DeepSeek-V3, 3 dense + MoE: the cut's first_k_dense_replace 3 builds all three dense) keeps its own kind's terms:
    # the layer the trace runs
    ends_on_last = built is not None and (kinds[-1] == profile.layer_kinds[-1]
                                          or _built_as_last(built, decoder, profile))
    layer_map = (profile.layer_map if depth == real else tuple(profile.layer_map[j] for j in keep) if keep
                 else profile.layer_map[:depth - 1] + profile.layer_map[-1:] if ends_on_last
                 else profile.layer_map[:depth])
    # parameters outside the layers can grow with depth (Gemma-4's per-layer input embedding is [V, layers × 256]):
    # the cut model's own count, from its meta model
    other = built.other if built is not None else profile.other
    small = replace(profile, layer_kinds=kinds, layer_map=layer_map, config=cut, other=other)
    return spec_from_profile(small, str(path)), depth, real


def _built_as_last(built: Any, decoder: dict[str, Any], profile: Any) -> bool:
    """Whether a cut's last layer is built as the real last layer: the same parameters (its LayerKind), and — where
    those match — the same signature (hpcmem.trace.layer_map `_signature`: the layer's attributes and its
    `layer_types` entry, e.g. sliding vs full attention of one shape), read from the real model's meta layout."""
    if built.kinds[built.layer_kinds[-1]] != profile.kinds[profile.layer_kinds[-1]]:
        return False
    return bool(built.signatures[-1] == lay.layout(decoder).signatures[-1])


def profiles_dir() -> Path:
    return estimator_dir() / "coverage-profiles"


def save_sweep_profile(profile: Any, model_type: str) -> None:
    """Keep the sweep's learned profile (without its config: `reference_config` rebuilds it) so the records can be
    re-estimated after an estimator change without tracing again (`rescore`)."""
    doc = profile_to_dict(profile)
    doc["config"] = {"model_type": doc["config"].get("model_type"), "rebuilt_by": "reference_config"}
    folder = profiles_dir()
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{model_type}.json").write_text(json.dumps(doc, separators=(",", ":")) + "\n")


def learn_sweep_profile(model_type: str, cfg: dict[str, Any], *, long_checks: bool = True,
                        progress: Any = None) -> Any:
    """The sweep's profile of a learned type: bf16 weights, the techniques the sweep holds it to (DoRA beside LoRA),
    with its checks — the profile says where it is held (8,192 and 32,768 tokens per row, each technique; 8,192 only
    without `long_checks`)."""
    return learn(cfg, model_type, dtypes=("bfloat16",), workers=1, check=True, long_checks=long_checks,
                 cells=[TECHNIQUES[t] for t in sweep_techniques(model_type)], progress=progress)


def require_learned(types: list[str]) -> None:
    """A one-line SpecError naming the --types that are not learned: only a learned type has a sweep profile."""
    other = [t for t in types if _classified(t)[0]["status"] != "learned"]
    if other:
        raise SpecError(f"--types {','.join(other)}: not a learned type (hpcmem models coverage says how each is "
                        "covered); only a learned type has a sweep profile to learn again or add cells to")


def relearn(types: list[str], *, long_checks: bool = True, progress: Any = stderr_progress) -> list[dict[str, Any]]:
    """Learn the sweep's profiles of learned types again (after the learner changed) and save each as it finishes,
    without tracing the sweep's records again (`rescore` re-estimates them); one summary per type."""
    require_learned(types)      # before any learning: each learn takes minutes
    out = []
    for model_type in types:
        start = time.perf_counter()
        try:
            profile = learn_sweep_profile(model_type, reference_config(model_type)[0], long_checks=long_checks,
                                          progress=progress)
        except Exception as exc:  # noqa: BLE001 — the type keeps the profile it had; the others go on
            out.append({"model_type": model_type, "error": f"{type(exc).__name__}: {exc}"[:600]})
            continue
        save_sweep_profile(profile, model_type)
        out.append({"model_type": model_type, "seconds": round(time.perf_counter() - start, 1),
                    "held": held_label(model_type), "not_learned": profile.provenance["not_learned"]})
    return out


def held_sweep_doc(model_type: str) -> dict[str, Any] | None:
    """A type's stored sweep profile as saved (estimator/coverage-profiles) where it is format 3 and held for some
    technique — what the checks and cells added to a stored profile build on —, else None (`not_held_error`)."""
    path = profiles_dir() / f"{model_type}.json"
    doc = json.loads(path.read_text()) if path.is_file() else {}
    held = doc.get("provenance", {}).get("held") or {}
    return doc if doc.get("format") == "hpcmem-learned-profile/3" and held.get("techniques") else None


def not_held_error(model_type: str) -> dict[str, Any]:
    return {"model_type": model_type, "error": "no format-3 sweep profile with held checks: learn it again first "
            f"(hpcmem validate coverage --relearn --types {model_type})"}


def add_missing(types: list[str], *, workers: int = 1, long_checks: bool = True, cells: tuple[str, ...] = (),
                progress: Any = stderr_progress) -> list[dict[str, Any]]:
    """Add the variant cells the learner traces today (hpcmem.trace.learn `missing_cells`: LoRA without dropout,
    reentrant checkpointing, no autocast) to the --types' stored sweep profiles that lack them, with their held checks
    as the sweep's own (`learn_cells`: the longest learned length and, `long_checks`, 4 × it), and run their rows
    check at the row counts it lacks (`missing_rows`, `add_rows`), each saved as it finishes; a profile that has them
    all is left as it is. `cells`: only the missing cells of these techniques, and no rows check. One summary per
    type."""
    def change(model_type: str, stored: Any, say: Any) -> Any:
        wanted, rows = missing_cells(stored), missing_rows(stored)
        if cells:
            wanted, rows = [c for c in wanted if c[0] in cells], ()
        if not (wanted or rows):
            return {"skipped": "it has each variant cell beside the cells it varies "
                    + ("of " + ", ".join(cells) if cells else "and its rows check at every row count")}
        profile = complete(reference_config(model_type)[0], stored, wanted, rows, workers=workers,
                           long_checks=long_checks, progress=say)
        return profile, {"added": sorted(set(profile.cells) - set(stored.cells)), **added_held(profile, wanted),
                         "rows_added": list(rows), "rows_held": profile.held.get("rows_held")}

    return each_held_profile(types, change, progress)


def hold_longer(types: list[str], lengths: tuple[int, ...], progress: Any = stderr_progress) -> list[dict[str, Any]]:
    """Hold the --types' stored sweep profiles at `lengths` too (hpcmem.trace.learn `hold_longer`: each technique held
    at the profile's longest check, traced again at each longer length within max_position_embeddings; the rows check
    again at the new longest length), each saved as it finishes; cells untouched. One summary per type."""
    def change(model_type: str, stored: Any, say: Any) -> Any:
        profile = hold_profile_longer(reference_config(model_type)[0], stored, lengths, progress=say)
        return profile, {"held": profile.held.get("techniques"), "max_length": profile.held.get("max_length"),
                         "rows_held": profile.held.get("rows_held")}

    return each_held_profile(types, change, progress)


def each_held_profile(types: list[str], change: Any, progress: Any) -> list[dict[str, Any]]:
    """`change(model_type, stored profile, say)` on each type's held sweep profile: (the profile to save, its summary),
    or a summary alone where nothing changes; a type without a held profile, or whose change raises, keeps its profile
    and says why. One summary per type, each profile saved as it finishes."""
    require_learned(types)
    out = []
    for model_type in types:
        doc = held_sweep_doc(model_type)
        if doc is None:
            out.append(not_held_error(model_type))
            continue
        start = time.perf_counter()
        try:
            got = change(model_type, profile_from_dict(doc), lambda line, t=model_type: progress(f"{t}: {line}"))
        except Exception as exc:  # noqa: BLE001 — the profile stays as it was; the others go on
            out.append({"model_type": model_type, "error": f"{type(exc).__name__}: {exc}"[:600]})
            continue
        if isinstance(got, dict):
            out.append({"model_type": model_type, **got})
            continue
        profile, summary = got
        save_sweep_profile(profile, model_type)
        out.append({"model_type": model_type, "seconds": round(time.perf_counter() - start, 1), **summary})
    return out


def check_rows(types: list[str], progress: Any = stderr_progress) -> list[dict[str, Any]]:
    """Hold stored sweep profiles at the learner's other row counts (hpcmem.trace.learn `held_rows`: 1, 4, 8 and 16
    rows per micro-batch, one held technique at its longest held length) without learning them again; each profile's
    `held` gains "rows_held" and "rows_err_pct" and is saved as it finishes. One summary per type."""
    out = []
    for model_type in types:
        doc = held_sweep_doc(model_type)
        if doc is None:
            out.append(not_held_error(model_type))
            continue
        held = doc["provenance"]["held"]
        start = time.perf_counter()
        name = rows_technique(held)
        technique, gc = held_technique(name)
        try:
            probe = learning_probe(reference_config(model_type)[0],
                                   [TECHNIQUES[t] for t in sweep_techniques(model_type)])[0]
            got = held_rows(probe, profile_from_dict(doc).cells, spec_from_profile(probe, probe.model_type),
                            "bfloat16", technique, gc, held["techniques"][name],
                            progress=lambda line, t=model_type: progress(f"{t}: {line}"))
        except Exception as exc:  # noqa: BLE001 — the profile stays as it was; the others go on
            out.append({"model_type": model_type, "error": f"{type(exc).__name__}: {exc}"[:600]})
            continue
        held |= got
        (profiles_dir() / f"{model_type}.json").write_text(json.dumps(doc, separators=(",", ":")) + "\n")
        out.append({"model_type": model_type, "seconds": round(time.perf_counter() - start, 1), **got})
    return out


def eval_job(spec: Any, technique: str, targets: tuple[str, ...] | None = None) -> Any:
    """The sweep's job for a technique. LoRA goes on peft's default targets; where peft has none, on the targets a
    user can run: the profile's (learned types), else all-linear — or, for fused experts (which peft wraps as
    ParamWrappers that refuse TRL's dropout), the attention projections. `targets` (a record's) overrides."""
    kind, gc = TECHNIQUES[technique]
    if kind == "lora" and targets is None:
        targets = ()
        try:
            peft_default_targets(spec)
        except Exception:  # noqa: BLE001 — peft has no default: what a user would set
            mods = linear_modules(spec)
            if spec.learned is not None:
                targets = tuple(spec.learned.lora_reference["lora_target_modules"])
            elif any(m.kind == "expert" for m in mods):
                targets = tuple(dict.fromkeys(m.leaf for m in mods if m.kind == "attention" and m.nn_linear))
            elif all_linear_targets(spec):
                targets = ("all-linear",)
            else:
                raise ValueError("no nn.Linear in the decoder layers for LoRA")
    needs = settings_beside_checkpointing(spec.model_type)
    # a type whose position table ends before EVAL_SEQ (CTRL: 256) runs no longer rows (hpcmem.job.position_limits)
    seq = min(EVAL_SEQ, model_positions(spec)[1]) if limited_by(spec.model_type) else EVAL_SEQ
    return JobSpec(model=spec, train=TrainSpec(
        trainer="sft", dtype="bfloat16", use_peft=kind == "lora", lora_target_modules=tuple(targets or ()),
        gradient_checkpointing=gc, max_length=seq, per_device_train_batch_size=EVAL_ROWS, **needs))


def _classified(model_type: str) -> tuple[dict[str, Any], str | None]:
    """(a record's first fields: type, class, status; the status's reason). Torch-free."""
    entry = classification()["types"].get(model_type)
    status, reason = type_status(model_type, entry)
    return {"model_type": model_type, "class": entry["class"] if entry else None, "status": status}, reason


def not_swept(model_type: str) -> dict[str, Any] | None:
    """The report of a type the sweep does not trace — not applicable or refused (hpcmem/models/coverage.json says
    why) — or None for a covered (derived or learned) type. Torch-free."""
    base, reason = _classified(model_type)
    return None if base["status"] in ("derived", "learned") else {**base, "skipped": reason}


def sweep_type(model_type: str) -> list[dict[str, Any]]:
    """Every record of one type (a worker's task; imports torch)."""
    base, reason = _classified(model_type)
    if base["status"] not in ("derived", "learned"):
        return [{**base, "skipped": reason}]
    start = time.perf_counter()
    stage = "config"
    try:
        cfg, source = reference_config(model_type)
        base["config"] = source
        profile = None
        if base["status"] == "learned":
            stage = "learn"
            profile = learn_sweep_profile(model_type, cfg)
            base |= {"learned_depth": profile.provenance["depth"], "learn_seconds": profile.provenance["seconds"],
                     "not_learned": profile.provenance["not_learned"]}
            save_sweep_profile(profile, model_type)
        stage = "eval model"
        import tempfile

        spec, depth, real, keep = eval_cut(cfg, model_type, profile,
                                           Path(tempfile.mkdtemp(prefix="hpcmem-coverage-")))
        base |= {"made": "learned" if profile else "derived", "layers": depth, "layers_real": real,
                 "num_params_traced": spec.num_params}
        if keep is not None:     # learned from real layers not a prefix
            base |= {"learned_layers": profile.provenance["layers"], "eval_layers": keep}
    except Exception as exc:  # noqa: BLE001 — recorded with the stage it failed in
        return [{**base, "error": f"{stage}: {type(exc).__name__}: {exc}"[:600],
                 "seconds": round(time.perf_counter() - start, 1)}]
    return [_case(base, spec, technique) for technique in sweep_techniques(model_type)]


def _case(base: dict[str, Any], spec: Any, technique: str) -> dict[str, Any]:
    start = time.perf_counter()
    rec = {**base, "technique": technique}
    try:
        job = eval_job(spec, technique)
        est = estimate(job)
        estimated = max(tensor_bytes(p) for p in est.phases)
        traced = run_trace(job)
    except Exception as exc:  # noqa: BLE001 — one technique that cannot run is recorded, the others go on
        return {**rec, "error": f"{type(exc).__name__}: {exc}"[:600], "seconds": round(time.perf_counter() - start, 1)}
    peak = traced.peak_allocated_bytes
    return {**rec, "estimated": estimated, "traced": peak, "err_pct": round(100.0 * (estimated - peak) / peak, 3),
            "estimated_phase": est.peak_phase.name, "traced_phase": traced.phase,
            "lora_targets": list(job.train.lora_target_modules) or None,
            "versions": traced.versions, "seconds": round(time.perf_counter() - start, 1)}


def run(types: list[str] | None, *, redo: bool = False, workers: int = 1, records: Path | None = None,
        progress: Any = None) -> list[dict[str, Any]]:
    """Sweep the types (default: every classified type), appending records as each traced type finishes; the ones
    not traced (`not_swept`) come back in the list without being written."""
    import multiprocessing as mp

    path = records or estimator_dir() / "coverage.jsonl"
    done = set() if redo or not path.is_file() else {
        json.loads(line)["model_type"] for line in path.read_text().splitlines() if line.strip()}
    if redo and path.is_file() and types:
        keep = [line for line in path.read_text().splitlines() if line.strip()
                and json.loads(line)["model_type"] not in types]
        path.write_text("".join(line + "\n" for line in keep))
    todo = [t for t in (types or list(classification()["types"])) if t not in done]
    # a type the sweep does not trace is reported, not recorded: its row in hpcmem/models/coverage.json already says
    # why, and a validation run adds to the committed records only what it measured
    out = [rec for rec in map(not_swept, todo) if rec is not None]
    todo = [t for t in todo if t not in {r["model_type"] for r in out}]
    n_skipped, n = len(out), len(out) + len(todo)
    for i, rec in enumerate(out, 1):
        if progress:
            progress(i, n, [rec])
    if not todo:
        return out
    procs = max(1, workers)
    with mp.get_context("spawn").Pool(processes=procs, maxtasksperchild=1, initializer=share_cpus,
                                      initargs=(procs,)) as pool:
        for i, recs in enumerate(pool.imap_unordered(sweep_type, todo), 1):
            with path.open("a") as fh:
                for rec in recs:
                    fh.write(json.dumps(rec, sort_keys=True) + "\n")
            out += recs
            if progress:
                progress(n_skipped + i, n, recs)
    return out


def print_progress(i: int, n: int, recs: list[dict[str, Any]]) -> None:
    first = recs[0]
    what = first.get("skipped") or first.get("error") or ", ".join(
        f"{r['technique']} {r['err_pct']:+.2f} %" if "err_pct" in r else f"{r['technique']} error" for r in recs)
    print(f"[{i}/{n}] {first['model_type']} ({first.get('status')}): {str(what)[:160]}", file=sys.stderr, flush=True)


def rescore(path: Path | None = None, types: list[str] | None = None) -> list[dict[str, Any]]:
    """Re-estimate stored records against their stored traces (no tracing: the estimator changed, the traces did not).
    Learned types take their profile from estimator/coverage-profiles/ (a record without one is left as it was)."""
    import tempfile

    path = path or estimator_dir() / "coverage.jsonl"
    records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    folder = Path(tempfile.mkdtemp(prefix="hpcmem-coverage-"))
    specs: dict[str, Any] = {}
    out = []
    for rec in records:
        name = rec["model_type"]
        if "err_pct" not in rec or (types and name not in types):
            out.append(rec)
            continue
        if name not in specs:
            cfg, _ = reference_config(name)
            profile = None
            if rec.get("made") == "learned":
                profile = sweep_profile(name, cfg)
            specs[name] = eval_cut(cfg, name, profile, folder) if profile or rec.get("made") == "derived" else None
        if specs[name] is None:
            out.append(rec)
            continue
        spec, depth, _, keep = specs[name]
        if (rec.get("layers"), rec.get("eval_layers")) != (depth, keep):
            out.append(stale(rec, (depth, keep)))
            continue
        targets = rec.get("lora_targets")
        est = estimate(eval_job(spec, rec["technique"], tuple(targets) if targets else None))
        estimated = max(tensor_bytes(p) for p in est.phases)
        out.append({**rec, "estimated": estimated, "estimated_phase": est.peak_phase.name,
                    "err_pct": round(100.0 * (estimated - rec["traced"]) / rec["traced"], 3)})
    return out


def eval_cut(cfg: dict[str, Any], name: str, profile: Any, folder: Path) -> tuple[Any, int, int, list[int] | None]:
    """`eval_model`'s (model, traced layers, real layers) and, for a profile learned from real layers that are not
    a prefix, which real layers the cut keeps (else None): a record's "layers" and "eval_layers", written by
    `sweep_type` and compared by `rescore`."""
    spec, depth, real = eval_model(cfg, name, profile, folder)
    keep = list(subsequence(profile.layer_kinds, depth)) if profile is not None and profile.provenance.get("layers") \
        else None
    return spec, depth, real, keep


def stale(rec: dict[str, Any], cut: tuple[int, Any]) -> dict[str, Any]:
    """A record whose trace ran on another cut than the one the sweep builds today (its profile was learned again
    from other real layers, or the depth rule changed): re-estimating it would hold a model of one depth to the trace
    of another, so it loses its score and says what to run."""
    old = {k: v for k, v in rec.items() if k not in ("err_pct", "estimated", "estimated_phase")}

    def where(layers: Any, keep: Any) -> str:
        return f"{layers} layers ({f'real layers {keep}' if keep else 'a prefix'})"

    return {**old, "stale": f"traced on {where(rec.get('layers'), rec.get('eval_layers'))}; the sweep now cuts "
                            f"{where(*cut)}: trace it again (hpcmem validate coverage --types {rec['model_type']} "
                            "--redo)"}


def sweep_profile(name: str, cfg: dict[str, Any]) -> Any:
    """The profile the sweep learned for a type, with its reference config put back; None when absent or of an older
    format (the type is swept again then)."""
    import dataclasses

    file = profiles_dir() / f"{name}.json"
    try:
        return dataclasses.replace(profile_from_dict(json.loads(file.read_text())), config=cfg)
    except (OSError, ValueError, SpecError):
        return None


def write_records(records: list[dict[str, Any]], path: Path | None = None) -> None:
    path = path or estimator_dir() / "coverage.jsonl"
    tmp = path.with_suffix(".jsonl.tmp")
    tmp.write_text("".join(json.dumps(r, sort_keys=True) + "\n" for r in records))
    tmp.replace(path)


OUTCOMES = ("within 3 %", GC_REFUSED, "over 3 %", "failed", "not measured", "refused")


def outcomes(rows: list[dict[str, Any]], records: list[dict[str, Any]]) -> dict[str, list[str]]:
    """Each decoder-only text type (rows of hpcmem.models.coverage.coverage_rows, not-applicable ones left out) by
    what the sweep found: all its techniques within 3 % of the trace — counted apart (GC_REFUSED) where those are
    only the jobs without checkpointing because the real trainer refuses checkpointing for the type —, one over, a
    learn/trace failure (a type- or technique-level error record), no record yet, or refused (the reason is its
    row's)."""
    measured = sweep_summary(records)
    failed = {r["model_type"] for r in records if "error" in r}
    out: dict[str, list[str]] = {k: [] for k in OUTCOMES}
    for r in rows:
        name, m = r["model_type"], measured.get(r["model_type"])
        if r["class"] == "not_applicable":
            continue
        if r["status"] not in ("derived", "learned"):
            key = "refused"
        elif m and m["max_abs_err_pct"] > 3.0:
            key = "over 3 %"
        elif name in failed:
            key = "failed"
        elif m and m["techniques"] == len(sweep_techniques(name)):
            key = "within 3 %" if sweep_techniques(name) == DEFAULT_TECHNIQUES else GC_REFUSED
        else:
            key = "not measured"
        out[key].append(name)
    return out


def _notes(records: list[dict[str, Any]]) -> dict[str, str]:
    """model_type → the first error the sweep recorded for it (type-level first, else a technique's), or why a record
    is stale (`stale`)."""
    notes: dict[str, str] = {}
    for r in sorted((r for r in records if "error" in r or "stale" in r), key=lambda r: "technique" in r):
        notes.setdefault(r["model_type"], (f"{r['technique']}: " if "technique" in r else "")
                         + r.get("error", r.get("stale", "")))
    return notes


def report_markdown(records: list[dict[str, Any]]) -> str:
    """estimator/COVERAGE.md: the status of every type, the measured error of every covered one, the worst ten."""
    rows = coverage_rows()
    measured = sweep_summary(records)
    errors = _notes(records)
    counts: dict[str, int] = {}
    for r in rows:
        counts[r["status"]] = counts.get(r["status"], 0) + 1
    text = [r for r in rows if r["class"] != "not_applicable"]
    got = outcomes(rows, records)
    lines = ["# Coverage: every causal-LM type of the installed transformers, held to the trace", "",
             "Produced by `hpcmem validate coverage` (hpcmem/validate/coverage.py says what the trace is: "
             f"the type's reference config at full width, ≤ {EVAL_LAYERS} layers, SFT, bf16, 2 × {EVAL_SEQ} tokens; "
             "full + GC, LoRA + GC, full without GC). err % = 100·(estimate − trace)/trace; a type counts as within "
             "3 % when all three techniques are. A type whose real trainer refuses gradient checkpointing "
             "(transformers raises; the row's reason names the function) is held to the jobs that run, full and LoRA "
             f"without GC, and counted apart as \"{GC_REFUSED}\".", "",
             "| status | types |", "|---|---|"]
    lines += [f"| {s} | {n} |" for s, n in sorted(counts.items())]
    within, refused_gc = len(got["within 3 %"]), len(got[GC_REFUSED])

    def share(n: int, of: int) -> str:
        """n/of in %, floored to 0.1 (hpcmem.estimate.verdict.pct): never rounded up to a goal it misses."""
        return pct(100 * n / max(of, 1))

    lines += ["", f"Decoder-only text types (decoder + multimodal backbones): {len(text)}; within 3 % of the trace: "
              f"{within} ({share(within, len(text))} %); within 3 % of the techniques the real code runs, GC refused "
              f"as transformers refuses it: {refused_gc} (with them {within + refused_gc}, "
              f"{share(within + refused_gc, len(text))} %).", "",
              "| outcome | types | which |", "|---|---|---|"]
    lines += [f"| {k} | {len(v)} | {', '.join(v) if k != 'within 3 %' else '(rows below)'} |" for k, v in got.items()]
    covered = len(text) - len(got["refused"])
    with_records = covered - len(got["not measured"])
    lines += ["", f"Refused types count against the share above (their reasons are in the rows). Of the {covered} "
              f"covered types (derived or learned), {with_records} have records and {len(got['within 3 %'])} of "
              f"those are within 3 % ({share(within, with_records)} %), "
              f"{refused_gc} more within 3 % of the jobs that run (GC refused). Not measured: no record "
              "yet — `hpcmem validate coverage` resumes where a sweep stopped (`--types` for some)."]
    lines += ["", "Held at: the row lengths (tokens, 2 rows) and techniques at which a learned type's profile "
              "(estimator/coverage-profiles) was held within 3 % of a trace of the same job by `hpcmem models learn` "
              "(at the learned depth, 8,192 and 32,768 tokens per row); a format-2 profile (learned at ≤ 768 tokens "
              "per row) only at the 1,024 tokens this sweep checks. An estimate outside that range says so.", "",
              "| model type | class | status | made | max \\|err\\| % | held at (tokens per row) | note |",
              "|---|---|---|---|---|---|---|"]
    for r in text:
        m = measured.get(r["model_type"])
        note = errors.get(r["model_type"], "") or ("" if r["status"] in ("derived", "learned") else r["reason"])
        n = len(sweep_techniques(r["model_type"]))
        err = f"{m['max_abs_err_pct']:.2f}" + ("" if m["techniques"] == n == 3 else f" ({m['techniques']}/{n})") \
            if m else "not measured"
        held = held_label(r["model_type"]) if r["status"] == "learned" else ""
        lines.append(f"| {r['model_type']} | {r['class']} | {r['status']} | {(m or {}).get('made') or ''} | {err} "
                     f"| {held} | {note[:160].replace('|', '/')} |")
    worst = sorted((rec for rec in records if "err_pct" in rec), key=lambda rec: -abs(rec["err_pct"]))[:10]
    lines += ["", "Worst ten cases:", ""] + [
        f"- {w['model_type']} {w['technique']}: {w['err_pct']:+.2f} % (estimate phase {w['estimated_phase']}; "
        f"trace phase {w['traced_phase']})" for w in worst]
    return "\n".join(lines) + "\n"


def load_records(path: Path | None = None) -> list[dict[str, Any]]:
    path = path or estimator_dir() / "coverage.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.is_file() else []
