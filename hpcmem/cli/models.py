"""`hpcmem models list|show`: the offline catalog and the parameter breakdown of one model."""

from __future__ import annotations

import json
from dataclasses import asdict
from typing import Any

import click

from hpcmem.cli.extras import require
from hpcmem.datapath import write_dir
from hpcmem.errors import SpecError
from hpcmem.estimate.loss import VOCAB_CHUNK_SIZE
from hpcmem.inputs.model_config import check_model_config
from hpcmem.inputs.values import row_lengths, text
from hpcmem.models import (
    all_linear_targets,
    catalog,
    catalog_entry,
    catalog_ids,
    count_params,
    linear_modules,
    peft_default_targets,
    resolve_model,
    spec_from_config,
)
from hpcmem.models.config import has_family
from hpcmem.models.coverage import (coverage_rows, installed_mapping, refusal, render_coverage, sweep_summary,
                                    vision_language_rows, vlm_summary)
from hpcmem.models.profile import (KIND, ONE_ROW, ONE_ROW_PACKED, config_hash, load_profile, profile_filename,
                                   save_profile)
from hpcmem.models.resolve import _read_json
from hpcmem.models.spec import ModelSpec
from hpcmem.models.vision import text_part
from hpcmem.trace.text_heads import TEXT_ONLY_TYPES
from hpcmem.models.vlm_learned import learned_text
from hpcmem.trace.learn import (added_held, complete, hold_longer, learn, missing_cells, missing_rows,
                                stderr_progress)


@click.group("models")
def command() -> None:
    """Model architectures hpcmem knows: the offline catalog and exact parameter counts."""


@command.command("list")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
def list_cmd(as_json: bool) -> None:
    """Catalog entries (public config.json numbers, usable offline by hub id, any case)."""
    rows = [catalog_row(hub_id) for hub_id in catalog_ids()]
    click.echo(json.dumps(rows, indent=2) if as_json else render_catalog(rows))


@command.command("show")
@click.argument("name")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of tables.")
def show_cmd(name: str, as_json: bool) -> None:
    """Spec, parameter breakdown and Linear layers of NAME: a catalog hub id, a config.json or its folder, or (online)
    a Hub id whose config.json is fetched alone."""
    report = model_report(resolve_model(name))
    click.echo(json.dumps(report, indent=2) if as_json else render_report(report))


@command.command("coverage")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
def coverage_cmd(as_json: bool) -> None:
    """Every model type of the installed transformers' causal-LM mapping: its class (decoder, multimodal, not
    applicable), how hpcmem covers it (derived, learned, refused) and why, and the measured error against the trace
    where the coverage sweep has one (estimator/coverage.jsonl); then every image-text-to-text (vision-language)
    type: estimated with its images (and at how many resolutions the stored image traces hold it within 3 %), as
    its text decoder, or refused."""
    rows = coverage_rows() + vision_language_rows()
    measured, images = sweep_summary(), vlm_summary()
    for row in rows:       # text rows: the coverage sweep; image-text rows: the stored image traces
        row["measured"] = (measured if row["task"] == "causal-lm" else images).get(row["model_type"])
    click.echo(json.dumps(rows, indent=2) if as_json else render_coverage(rows))


@command.command("learn")
@click.argument("name")
@click.option("--dtype", "dtypes", multiple=True, type=click.Choice(["float32", "bfloat16"]),
              help="Load dtype(s) to learn (float32: TRL's default, weights fp32 under bf16 autocast; bfloat16). "
                   "Default: both.")
@click.option("--out", "out_dir", type=click.Path(file_okay=False), default=None,
              help="Folder to write the profile to (default: the first $HPCMEM_DATA folder, else ~/.config/hpcmem; "
                   "under profiles/).")
@click.option("--workers", type=click.IntRange(1, 64), default=2, show_default=True,
              help="Processes tracing at once (each traces one job of the reduced model).")
@click.option("--force", is_flag=True, help="Learn again and replace the profile already learned for this config.")
@click.option("--add-missing", is_flag=True,
              help="Keep the profile already learned for this config and add the variant cells the learner traces "
                   "today that it lacks — LoRA without dropout (DPO/KTO/Reward LoRA jobs, lora_dropout 0, adapters "
                   "on fused experts; DoRA too), reentrant checkpointing (use_reentrant, PEFT under ZeRO-3), bf16 "
                   "and fp16 off on 16-bit weights (no autocast), the model's dropout off (DPO/KTO/Reward's "
                   "disable_dropout, types with dropout modules) — in its own "
                   "precisions, with their held checks, and run its rows check at the row counts it lacks (8 and 16 "
                   "rows per micro-batch); its other cells are not traced again.")
@click.option("--hold-longer", "hold_longer", default=None,
              help="Keep the profile already learned for this config and hold it at these comma-separated longer "
                   "row lengths too (e.g. 65536,131072: a two-step trace of the reduced model per technique and "
                   "length, within its max_position_embeddings, and the rows check again at the new longest "
                   "length); nothing is learned again.")
@click.option("--json", "as_json", is_flag=True, help="Print the profile's summary as JSON.")
def learn_cmd(name: str, dtypes: tuple[str, ...], out_dir: str | None, workers: int, force: bool, add_missing: bool,
              hold_longer: str | None, as_json: bool) -> None:
    """Learn the per-layer memory terms of a model that no family descriptor covers, from traces of a reduced-depth
    copy of its own transformers code (needs torch; about a minute on two cores, no GPU). NAME: a config.json, its
    folder, or a catalog id. `hpcmem estimate` then finds the profile by the config's hash, without torch."""
    from pathlib import Path

    text("model", name, max_len=4096)    # one line in every message and in the profile's provenance
    cfg = model_config_dict(name)
    check_model_config(cfg, name)      # the estimate's own type and range checks, before torch is imported
    image_text = learned_text(cfg)
    if image_text:          # a vision-language type on a learned decoder: its text part is what is learned
        cfg = text_part(cfg)
    learnable(cfg, name)
    folder = Path(out_dir) / "profiles" if out_dir else None
    if hold_longer is not None:
        if force or dtypes or add_missing:
            raise SpecError("--hold-longer keeps the learned profile as it is; it does not go with --force, --dtype "
                            "or --add-missing (run --add-missing first)")
        hold_profile_longer(cfg, name, folder, row_lengths("--hold-longer", hold_longer), as_json=as_json)
        return
    if add_missing:
        if force or dtypes:
            raise SpecError("--add-missing keeps the learned profile and its precisions; it does not go with --force "
                            "or --dtype")
        add_missing_cells(cfg, name, folder, workers=workers, as_json=as_json)
        return
    require("models learn", "torch", "transformers", "trl", "peft")
    # every refusal comes before the traces: the file is checked and the folder written to first
    target = profile_target(cfg, folder, force=force)

    profile = learn(cfg, name, dtypes=dtypes or ("float32", "bfloat16"), workers=workers, progress=stderr_progress,
                    image_text=image_text)
    path = save_profile(profile, target.parent)
    summary = {"profile": str(path), "model_type": profile.model_type, "num_params": profile.total,
               "cells": profile.cell_keys(), **{k: profile.provenance[k] for k in (
                   "depth", "seconds", "check_err_pct", "not_learned", "summary", "held")}}
    if as_json:
        click.echo(json.dumps(summary, indent=2))
    else:
        click.echo(f"learned {name} ({profile.model_type}, {profile.total:,} params): {summary['summary']}, "
                   f"{summary['seconds']} s; cells {', '.join(summary['cells'])}")
        click.echo(f"check against a two-step trace of the traced model: {summary['check_err_pct']}")
        held = summary["held"]
        click.echo(f"held within {held['within_pct']} % at ≤ {held['max_length']:,} tokens per row: "
                   + (", ".join(f"{k} ≤ {v:,}" for k, v in held["techniques"].items()) or "no technique"))
        if held.get("rows_held"):
            lo, hi = held["rows_held"]
            line = f"held at {lo}–{hi} rows per micro-batch"
            if any(k.endswith(f"/{ONE_ROW}") for k in summary["cells"]):
                packed = ", a packed row too" if held.get(ONE_ROW_PACKED) else \
                    " (a packed row keeps the padded rows' cells)"
                line += "; one unpadded row by its one-row cells" + packed
            click.echo(line)
        for key, why in summary["not_learned"].items():
            click.echo(f"not learned: {key}: {why}")
        click.echo(f"wrote {path}")


def stored_profile(cfg: dict[str, Any], name: str, folder, option: str) -> tuple[Any, Any]:
    """(path, profile) learned for this config in `folder` (default: where `models learn` writes), or a one-line
    refusal naming `option`."""
    folder = folder or write_dir(KIND)
    path = folder / profile_filename(str(cfg["model_type"]), config_hash(cfg))
    if not path.is_file() or path.is_symlink():
        raise SpecError(f"model {name}: {option}: no profile learned for this config at {path}; learn it first "
                        "(hpcmem models learn, with the same --out)")
    stored = load_profile(path)
    if stored.config_sha256 != config_hash(cfg):
        raise SpecError(f"{path} is not the profile learned for this config; learn it again with --force")
    return path, stored


def hold_profile_longer(cfg: dict[str, Any], name: str, folder, lengths: tuple[int, ...], *, as_json: bool) -> None:
    """`models learn NAME --hold-longer L1,L2`: the profile learned for this config held at longer rows
    (hpcmem.trace.learn `hold_longer`), written over it atomically once every check is done."""
    path, stored = stored_profile(cfg, name, folder, "--hold-longer")
    require("models learn", "torch", "transformers", "trl", "peft")
    writable(path.parent)
    profile = hold_longer(cfg, stored, lengths, progress=stderr_progress)
    save_profile(profile, path.parent)
    held = profile.held
    summary = {"profile": str(path), "model_type": profile.model_type, "max_length": held.get("max_length"),
               "techniques": held.get("techniques"), "rows_held": held.get("rows_held")}
    if as_json:
        click.echo(json.dumps(summary, indent=2))
        return
    click.echo(f"held within {held.get('within_pct')} % at ≤ {held['max_length']:,} tokens per row: "
               + ", ".join(f"{k} ≤ {v:,}" for k, v in held["techniques"].items()))
    if held.get("rows_held"):
        click.echo(f"held at {held['rows_held'][0]}–{held['rows_held'][1]} rows per micro-batch")
    click.echo(f"wrote {path}")


def add_missing_cells(cfg: dict[str, Any], name: str, folder, *, workers: int, as_json: bool) -> None:
    """`models learn NAME --add-missing`: the profile learned for this config in `folder` (default: where `models
    learn` writes), with the variant cells it lacks added (hpcmem.trace.learn `missing_cells`, `learn_cells`) and its
    rows check run at the row counts it lacks (`missing_rows`, `add_rows`), written over it atomically once every
    trace and check is done; a profile that has them all is left untouched."""
    path, stored = stored_profile(cfg, name, folder, "--add-missing")
    folder = path.parent
    wanted, rows = missing_cells(stored), missing_rows(stored)
    summary: dict[str, Any] = {"profile": str(path), "model_type": stored.model_type, "added": [], "rows_added": []}
    if wanted or rows:
        require("models learn", "torch", "transformers", "trl", "peft")
        writable(folder)
        profile = complete(cfg, stored, wanted, rows, workers=workers, progress=stderr_progress)
        if wanted:
            summary |= {"added": sorted(set(profile.cells) - set(stored.cells)),
                        "within_pct": profile.held.get("within_pct"), **added_held(profile, wanted)}
        if rows:
            summary |= {"rows_added": list(rows), "rows_held": profile.held["rows_held"]}
        save_profile(profile, folder)
    if as_json:
        click.echo(json.dumps(summary, indent=2))
    elif not (wanted or rows):
        click.echo(f"{path}: nothing to add (it has each variant cell the learner traces beside the cells it varies, "
                   "and its rows check at every row count the learner checks)")
    else:
        if wanted:
            click.echo(f"added {', '.join(summary['added'])} to {path}")
            held = ", ".join(f"{k} {v:,}" for k, v in summary["held"].items())
            click.echo(f"held within {summary['within_pct']} % at ≤ {held}" if held else
                       "not held for any added technique (the estimate warns)")
        if rows:
            lo, hi = summary["rows_held"]
            click.echo(f"rows check run at {', '.join(map(str, rows))} rows per micro-batch in {path}: held at "
                       f"{lo}–{hi} rows")


def writable(folder) -> None:
    """Refuse in one line a folder the profile cannot be written into (before the traces)."""
    import tempfile

    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".hpcmem-write-check-"):
            pass
    except OSError as exc:
        raise SpecError(f"cannot write the profile into {folder}: {exc.strerror or exc}; choose --out") from None


def profile_target(cfg: dict[str, Any], folder, *, force: bool):
    """The file `save_profile` will write for this config, checked before the minute of tracing: a profile learned
    before is replaced only with --force, anything else at that name never; the folder must take a file."""
    import os

    folder = folder or write_dir(KIND)
    path = folder / profile_filename(str(cfg["model_type"]), config_hash(cfg))
    if os.path.lexists(path):
        if not path.is_file() or path.is_symlink():
            raise SpecError(f"{path} exists and is not a regular file; move it away, hpcmem writes its profile there")
        try:
            mine = load_profile(path).config_sha256 == config_hash(cfg)
        except SpecError:
            mine = False
        if not mine:
            raise SpecError(f"{path} exists and is not a profile hpcmem learned for this config; move it away, "
                            "hpcmem writes its profile there")
        if not force:
            raise SpecError(f"{path} already holds the profile learned for this config; pass --force to learn it "
                            "again and replace it")
    writable(folder)
    return path


# the largest vocabulary `models learn` traces: 32 of the fused LM head's tiles (4 × Gemma 3's 262,144)
LEARN_MAX_VOCAB = 32 * VOCAB_CHUNK_SIZE


def learnable(cfg: dict[str, Any], name: str) -> None:
    """Refuse before any trace what no trace can learn: a type the coverage table refuses or finds not applicable
    (with its reason, as `hpcmem estimate` says it), a type a family descriptor derives (the estimate never reads a
    profile for it: hpcmem.models.resolve.spec_from_config), or a model_type the installed transformers cannot
    build; and a vocabulary too large to trace in reasonable time (LEARN_MAX_VOCAB)."""
    model_type = cfg["model_type"]
    if has_family(cfg):
        raise SpecError(f"model {name}: model_type {model_type!r} is derived from its family descriptor "
                        "(hpcmem/models/config.py); `hpcmem estimate` never reads a learned profile for it, so there "
                        "is nothing to learn")
    why = refusal(model_type)
    if why is not None:
        raise SpecError(f"model {name}: model_type {model_type!r} is {why}")
    inner = cfg.get("text_config") if isinstance(cfg.get("text_config"), dict) else {}
    vocab = cfg.get("vocab_size", inner.get("vocab_size"))
    if isinstance(vocab, int) and vocab > LEARN_MAX_VOCAB:
        raise SpecError(f"model {name}: vocab_size must be at most {LEARN_MAX_VOCAB:,} to learn a profile (each "
                        f"trace runs TRL's fused LM head one {VOCAB_CHUNK_SIZE:,}-column tile at a time, so its time "
                        f"grows with the vocabulary; the largest public ones are under 300,000); got {vocab:,}")
    mapping = installed_mapping()
    if mapping is not None and model_type not in mapping and model_type not in TEXT_ONLY_TYPES:
        # (TEXT_ONLY_TYPES: an image-text type's text config the trace gives a causal-LM class, hpcmem.trace.text_heads)
        from importlib.metadata import version

        raise SpecError(f"model {name}: model_type {model_type!r} is not a causal-LM type of the installed "
                        f"transformers {version('transformers')} (`hpcmem models coverage` lists them)")


def model_config_dict(name: str) -> dict[str, Any]:
    """The config.json dict NAME stands for: a file, a folder holding one, or a catalog entry."""
    from pathlib import Path

    path = Path(name).expanduser()
    if path.exists():
        file = path / "config.json" if path.is_dir() else path
        if not file.is_file():
            raise SpecError(f"model {name}: folder {path} holds no config.json" if path.is_dir() else
                            f"model {name}: {path} is not a regular file; pass a config.json or its folder")
        cfg = _read_json(file)
    else:
        entry = catalog_entry(name)
        if entry is None:
            raise SpecError(f"model {name}: not a config.json, a folder holding one, or a catalog id "
                            "(hpcmem models list)")
        cfg = entry["config"]
    if not isinstance(cfg, dict) or not isinstance(cfg.get("model_type"), str):
        raise SpecError(f"model {name}: config.json must be an object with a model_type string")
    return cfg


def catalog_row(hub_id: str) -> dict[str, Any]:
    spec = spec_from_config(catalog()[hub_id]["config"], hub_id)
    params = count_params(spec)
    vision = spec.vision.num_params if spec.vision is not None else 0     # a vision-language model's tower and merger
    return {"hub_id": hub_id, "model_type": spec.model_type, "made": "learned" if spec.learned else "derived",
            "num_params": params.total + vision, "active_params": params.active + vision, "vision_params": vision,
            "num_hidden_layers": spec.num_hidden_layers, "hidden_size": spec.hidden_size,
            "num_attention_heads": spec.num_attention_heads, "num_key_value_heads": spec.num_key_value_heads,
            "num_experts": spec.num_experts, "num_experts_per_tok": spec.num_experts_per_tok,
            "tie_word_embeddings": spec.tie_word_embeddings, "source": catalog()[hub_id]["source"]}


def model_report(spec: ModelSpec) -> dict[str, Any]:
    params = count_params(spec)
    try:
        peft_default: list[str] | None = list(peft_default_targets(spec))
    except SpecError:
        peft_default = None
    fields = {k: v for k, v in asdict(spec).items() if k != "learned"}
    return {"name": spec.name, "made": made(spec), "spec": fields, "params": params.as_dict(), "parts": params.parts(),
            "linear_modules": [{**m._asdict(), "params": m.params} for m in linear_modules(spec)],
            "peft_default_targets": peft_default, "all_linear_targets": list(all_linear_targets(spec)),
            "quirks": quirks(spec)}


def made(spec: ModelSpec) -> str:
    """How the numbers for this model are made: a family's derived formulas, or a learned profile (and from what)."""
    if spec.learned is None:
        return "derived (family descriptor)"
    prov = spec.learned.provenance
    return (f"learned ({prov.get('summary', 'traced')}; cells {', '.join(spec.learned.cell_keys())}; "
            f"transformers {prov.get('versions', {}).get('transformers', '?')})")


def quirks(spec: ModelSpec) -> list[str]:
    """What about this architecture changes memory beyond the parameter count (transformers 5.24 modeling files)."""
    notes = []
    if spec.wrapper_model_type:
        notes.append(f"text decoder of a {spec.wrapper_model_type} config: vision/audio towers are not counted")
    if spec.attn_logit_softcapping:
        notes.append(f"attention softcapping {spec.attn_logit_softcapping:g}: no sdpa, eager attention")
    if spec.final_logit_softcapping:
        notes.append(f"final logit softcapping {spec.final_logit_softcapping:g}: extra logits-sized tensors")
    if spec.fused_qkv or spec.fused_gate_up:
        notes.append("fused qkv_proj / gate_up_proj Linears: LoRA names differ from Llama's")
    if spec.is_moe:
        notes.append("experts are fused 3D nn.Parameters, not nn.Linear: LoRA target_modules/all-linear skip them")
    return notes


def _b(n: int) -> str:
    return f"{n / 1e9:.2f} B" if n >= 1e8 else f"{n / 1e6:.1f} M"


def render_catalog(rows: list[dict[str, Any]]) -> str:
    head = f"{'hub id':36} {'type':12} {'params':>10} {'active':>10} {'layers':>6} {'hidden':>6} {'q/kv':>7}  moe"
    lines = [head]
    for r in rows:
        moe = f"{r['num_experts']}×top{r['num_experts_per_tok']}" if r["num_experts"] else "-"
        lines.append(f"{r['hub_id']:36} {r['model_type']:12} {_b(r['num_params']):>10} {_b(r['active_params']):>10} "
                     f"{r['num_hidden_layers']:>6} {r['hidden_size']:>6} "
                     f"{str(r['num_attention_heads']) + '/' + str(r['num_key_value_heads']):>7}  {moe}")
    lines.append(f"{len(rows)} models; `hpcmem models show NAME` for the breakdown; any other model: its config.json")
    return "\n".join(lines)


def render_report(report: dict[str, Any]) -> str:
    s, p = report["spec"], report["params"]
    lines = [f"model {report['name']} ({s['model_type']}, {report['made']}) · {p['total']:,} params ({_b(p['total'])})"
             + (f" · {_b(p['active'])} active per token" if p["active"] != p["total"] else ""),
             f"layers {s['num_hidden_layers']} · hidden {s['hidden_size']} · heads {s['num_attention_heads']}/"
             f"{s['num_key_value_heads']} × {s['head_dim']} · intermediate {s['intermediate_size']} · vocab "
             f"{s['vocab_size']} · tied {s['tie_word_embeddings']}", "",
             f"{'component':16} {'params':>16} {'share':>7}"]
    for name, count in report["parts"].items():
        if count:
            lines.append(f"{name:16} {count:>16,} {100 * count / p['total']:>6.1f}%")
    lines += ["", f"{'per-layer weight':30} {'in':>6} {'out':>6} {'×n':>4} {'layers':>6}  linear"]
    for m in report["linear_modules"]:
        lines.append(f"{m['name']:30} {m['in_features']:>6} {m['out_features']:>6} {m['count_per_layer']:>4} "
                     f"{m['num_layers']:>6}  {'nn.Linear' if m['nn_linear'] else 'nn.Parameter'}")
    default = ", ".join(report["peft_default_targets"]) if report["peft_default_targets"] else "none (set targets)"
    lines += ["", f"peft default LoRA targets: {default}", f"all-linear: {', '.join(report['all_linear_targets'])}"]
    lines += [f"note: {q}" for q in report["quirks"]]
    return "\n".join(lines)
