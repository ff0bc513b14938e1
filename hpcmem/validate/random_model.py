"""The model of a random job (hpcmem.validate.random_jobs): a type's reference config cut to a few layers, its
ModelSpec, and the job as hpcmem builds it.

The cut is the coverage sweep's (hpcmem.validate.coverage.eval_model, with the random jobs' depth): a derived type's
spec is read from the cut config, a learned type's is the profile `hpcmem validate coverage` learned from the full
config (estimator/coverage-profiles/) laid over the cut depth. The cut config is written to a file in a folder of this
process (the trace builds the model from it; a distillation teacher is resolved from it).
"""

from __future__ import annotations

import json
import tempfile
from functools import lru_cache
from pathlib import Path
from typing import Any

from hpcmem.errors import SpecError
from hpcmem.job.trl_config import build_job
from hpcmem.models.coverage import classification, type_status
from hpcmem.models.params import linear_modules
from hpcmem.validate.coverage import EVAL_LAYERS, eval_model, reference_config, sweep_profile


@lru_cache(maxsize=1)
def _folder() -> Path:
    return Path(tempfile.mkdtemp(prefix="hpcmem-random-"))


@lru_cache(maxsize=None)
def traced_model(model_type: str, layers: int) -> tuple[Any, dict[str, Any], int]:
    """(ModelSpec, the cut config.json dict, traced layers) of a type at ≤ `layers` decoder layers (a learned type
    whose profile holds kinds beyond a prefix keeps the layers hpcmem.trace.layer_map.subsequence keeps)."""
    cfg, _ = reference_config(model_type)
    status = type_status(model_type, classification()["types"].get(model_type))[0]
    profile = None
    if status == "learned":
        profile = sweep_profile(model_type, cfg)
        if profile is None:
            raise SpecError(f"model_type {model_type!r}: no learned profile in estimator/coverage-profiles/ "
                            "(`hpcmem validate coverage --types` learns one)")
    # a cut transformers refuses (OLMo-Hybrid's first layers are all linear attention: configuration_olmo_hybrid.py
    # validate_architecture wants one attention layer), or one without a kind of layer the model has (the first three
    # of Qwen3.5's are linear attention: a model of those alone is no model a user trains, and its generation fails
    # on a cache without an attention layer), grows a layer at a time to the sweep's depth
    kinds = _layer_kinds(cfg)
    for depth in range(layers, EVAL_LAYERS + 1):
        try:
            spec, depth, _ = eval_model(cfg, model_type, profile, _folder(), depth)
        except Exception:  # noqa: BLE001 — transformers' config validation: try one layer deeper
            if depth == EVAL_LAYERS:
                raise
            continue
        cut = json.loads(Path(spec.name).read_text())
        if _layer_kinds(cut) != kinds and depth < EVAL_LAYERS:
            continue
        return spec, cut, depth
    raise SpecError(f"model_type {model_type!r}: no cut of {layers}–{EVAL_LAYERS} layers builds")


def _layer_kinds(cfg: dict[str, Any]) -> set[str]:
    """The kinds of layer a config's `layer_types` names (its text config's where it has one); empty without a list."""
    inner = cfg.get("text_config") if isinstance(cfg.get("text_config"), dict) else cfg
    types = inner.get("layer_types", cfg.get("layer_types"))
    return {str(t) for t in types} if isinstance(types, list) else set()


def explicit_targets(spec: Any, us: list[float]) -> list[str]:
    """1–4 leaf names of the model's nn.Linear modules (a user's explicit lora_target_modules), chosen by the
    fractions `us` (the draw's): the first picks how many, the rest which."""
    names = sorted(dict.fromkeys(m.leaf for m in linear_modules(spec) if m.nn_linear))
    if not names:
        return ["q_proj"]          # no nn.Linear: a Llama name the model does not have (peft refuses it)
    k = 1 + int(us[0] * min(4, len(names)))
    pool = list(names)
    out = []
    for u in us[1:] + us[:1]:
        if len(out) == k or not pool:
            break
        out.append(pool.pop(int(u * len(pool))))
    return sorted(out)


def save_module(spec: Any, trainer: str) -> str:
    """The module a user trains beside the adapters: the head (RewardTrainer's is `score`: its
    AutoModelForSequenceClassification head)."""
    return "score" if trainer == "reward" else "lm_head"


def job_spec(job: Any) -> Any:
    """The JobSpec hpcmem builds for a random job (hpcmem.job.trl_config.build_job, as `hpcmem estimate` does); a
    distillation job's teacher is the student's own cut config. Raises hpcmem's SpecError where hpcmem refuses it."""
    spec, _, _ = traced_model(job.model_type, job.layers)      # the depth a draw got: the same cut again
    settings = dict(job.settings)
    if job.trainer == "distillation":
        settings["teacher_model_name_or_path"] = spec.name
    return build_job(job.trainer, settings, model=spec)[0]

