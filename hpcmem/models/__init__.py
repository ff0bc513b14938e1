"""Models: HF config.json → `ModelSpec`, exact parameter counts, an offline catalog of popular configs (stdlib)."""

from __future__ import annotations

from hpcmem.models.config import SUPPORTED_MODEL_TYPES, model_spec_from_config
from hpcmem.models.params import (
    LinearModule,
    ParamBreakdown,
    all_linear_targets,
    count_params,
    linear_modules,
    peft_default_targets,
    peft_model_type,
)
from hpcmem.models.resolve import catalog, catalog_entry, catalog_ids, resolve_model, spec_from_config

__all__ = [
    "SUPPORTED_MODEL_TYPES", "LinearModule", "ParamBreakdown", "all_linear_targets", "catalog", "catalog_entry",
    "catalog_ids", "count_params", "linear_modules", "model_spec_from_config", "peft_default_targets",
    "peft_model_type", "resolve_model", "spec_from_config",
]
