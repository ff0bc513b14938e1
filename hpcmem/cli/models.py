"""`hpcmem models list|show`: the offline catalog and the parameter breakdown of one model."""

from __future__ import annotations

import json
from dataclasses import asdict
from typing import Any

import click

from hpcmem.errors import SpecError
from hpcmem.models import (
    all_linear_targets,
    catalog,
    catalog_ids,
    count_params,
    linear_modules,
    model_spec_from_config,
    peft_default_targets,
    peft_model_type,
    resolve_model,
)
from hpcmem.spec import ModelSpec


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


def catalog_row(hub_id: str) -> dict[str, Any]:
    spec = model_spec_from_config(catalog()[hub_id]["config"], hub_id)
    params = count_params(spec)
    return {"hub_id": hub_id, "model_type": spec.model_type, "num_params": params.total, "active_params": params.active,
            "num_hidden_layers": spec.num_hidden_layers, "hidden_size": spec.hidden_size,
            "num_attention_heads": spec.num_attention_heads, "num_key_value_heads": spec.num_key_value_heads,
            "num_experts": spec.num_experts, "num_experts_per_tok": spec.num_experts_per_tok,
            "tie_word_embeddings": spec.tie_word_embeddings, "source": catalog()[hub_id]["source"]}


def model_report(spec: ModelSpec) -> dict[str, Any]:
    params = count_params(spec)
    try:
        peft_default: list[str] | None = list(peft_default_targets(peft_model_type(spec)))
    except SpecError:
        peft_default = None
    return {"name": spec.name, "spec": asdict(spec), "params": params.as_dict(), "parts": params.parts(),
            "linear_modules": [{**m._asdict(), "params": m.params} for m in linear_modules(spec)],
            "peft_default_targets": peft_default, "all_linear_targets": list(all_linear_targets(spec)),
            "quirks": quirks(spec)}


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
    lines = [f"model {report['name']} ({s['model_type']}) · {p['total']:,} params ({_b(p['total'])})"
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
