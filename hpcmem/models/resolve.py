"""Find a model's config.json: a local path, the offline catalog, or (online only) the Hugging Face Hub."""

from __future__ import annotations

import json
import os
import re
from dataclasses import replace
from functools import lru_cache
from pathlib import Path
from typing import Any

from hpcmem.datapath import PACKAGE_DIR
from hpcmem.errors import SpecError
from hpcmem.inputs.files import exists, load_json_file, user_path
from hpcmem.models.checkpoint import checkpoint_load_dtype
from hpcmem.models.config import checkpoint_dtype, has_family, model_spec_from_config
from hpcmem.models.coverage import refusal
from hpcmem.models.spec import ModelSpec
from hpcmem.models.vlm_learned import learned_text, vlm_spec_from_learned

_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
# huggingface_hub/constants.py: HF_HUB_OFFLINE is on when its value is one of these (case-insensitive).
_TRUE = {"1", "ON", "YES", "TRUE"}


@lru_cache(maxsize=1)
def catalog() -> dict[str, dict[str, Any]]:
    """hub id → {"hub_id", "source", "config"} for every hpcmem/models/catalog/*.json (public config.json numbers)."""
    entries: dict[str, dict[str, Any]] = {}
    folder = PACKAGE_DIR / "models" / "catalog"
    for item in sorted(folder.iterdir(), key=lambda p: p.name):
        if item.name.endswith(".json"):
            doc = json.loads(item.read_text(encoding="utf-8"))
            entries[doc["hub_id"]] = doc
    return entries


def catalog_ids() -> list[str]:
    return sorted(catalog(), key=str.lower)


def catalog_entry(name: str) -> dict[str, Any] | None:
    """The catalog entry whose hub id equals `name`, ignoring case."""
    by_lower = {hub_id.lower(): doc for hub_id, doc in catalog().items()}
    return by_lower.get(name.strip().lower())


def hub_offline(environ: dict[str, str] | None = None) -> bool:
    env = os.environ if environ is None else environ
    return env.get("HF_HUB_OFFLINE", "").strip().upper() in _TRUE


def resolve_model(name_or_path: str, *, offline: bool | None = None) -> ModelSpec:
    """A `ModelSpec` for a config.json path, a folder holding one, a catalog hub id (any case), else the Hub.

    The Hub is asked only when HF_HUB_OFFLINE is unset (or `offline=False`) and huggingface_hub is importable; it
    downloads config.json alone, into the user's own HF cache.
    """
    if not name_or_path.strip():
        raise SpecError("model name is empty: pass a catalog id (hpcmem models list), a config.json or a folder "
                        "holding one")
    path = user_path(name_or_path)
    if exists(path):
        return _spec_from_path(path, name_or_path)
    entry = catalog_entry(name_or_path)
    if entry is not None:
        return spec_from_config(entry["config"], entry["hub_id"])
    offline = hub_offline() if offline is None else offline
    if not offline and _HUB_ID.match(name_or_path) and _hub_available():
        return spec_from_config(_hub_config(name_or_path), name_or_path)
    raise SpecError(
        f"unknown model {name_or_path}: not a path, not in the catalog (hpcmem models list), and offline / "
        "huggingface_hub not installed; pass a local config.json")


def _spec_from_path(path: Path, name: str) -> ModelSpec:
    file = path / "config.json" if path.is_dir() else path
    if exists(file) and not file.is_file():     # a FIFO, socket or device: never opened (reading one blocks)
        raise SpecError(f"model {name}: {file} is not a regular file; pass a config.json or a folder holding one")
    if not file.is_file():
        raise SpecError(f"model {name}: folder {path} holds no config.json; pass the config.json itself or its folder")
    spec = spec_from_config(_read_json(file), name)
    if path.is_dir() and spec.dtype is None:
        # from_pretrained(dtype="auto") on this folder reads the checkpoint's weights (hpcmem.models.checkpoint)
        dtype, source = checkpoint_load_dtype(path)
        spec = replace(spec, dtype=dtype, dtype_source=source)
    return spec


def spec_from_config(cfg: Any, name: str) -> ModelSpec:
    """A config.json dict → ModelSpec: by its family descriptor (derived), else by a learned profile of this very
    config (hpcmem.models.profile), else a SpecError that says why (refused, not applicable) or what to run."""
    if isinstance(cfg, dict) and learned_text(cfg):
        return _placeable(vlm_spec_from_learned(cfg, name), name)
    if not isinstance(cfg, dict) or has_family(cfg) or "model_type" not in cfg:
        return _placeable(model_spec_from_config(cfg, name), name)
    from hpcmem.models.profile import find_profile, load_profile, spec_from_profile  # deferred: only learned types

    path = find_profile(cfg)
    if path is not None:
        return replace(spec_from_profile(load_profile(path), name), dtype=checkpoint_dtype(cfg))
    model_type = str(cfg["model_type"])
    why = refusal(model_type)
    if why is not None:
        raise SpecError(f"model {name}: model_type {model_type!r} is {why}")
    raise SpecError(f"model {name}: model_type {model_type!r} has no family descriptor and no learned profile of this "
                    f"config; learn one with `hpcmem models learn {name}` (needs torch; about a minute on a login node), "
                    "then estimate again (`hpcmem models coverage` lists every type)")


def _placeable(spec: ModelSpec, name: str) -> ModelSpec:
    """A vision-language spec whose projector hands the language model image features of another width than its
    embeddings is refused: transformers places them into the embeddings (`get_placeholder_mask`: "Image features and
    image tokens do not match", the numels differ) before any training step, and TRL 1.16's SFTTrainer reports that as
    a too-short max_length (sft_trainer.py `compute_loss`; traced on GLM-OCR's class defaults, text 1,024 wide under a
    1,536-wide merger)."""
    v = spec.vision
    # out_hidden_size, or the width of HyperCLOVAX Vision V2's projector after the merger (TowerBase.feature_width)
    width = getattr(v, "feature_width", None)
    if v is not None and width and width != spec.hidden_size:
        raise SpecError(f"model {name}: vision_config.out_hidden_size {width} is not the language model's hidden_size "
                        f"{spec.hidden_size}: the {v.model_type} projector's image features cannot be placed into its "
                        "token embeddings (transformers raises 'Image features and image tokens do not match'); "
                        "make them equal")
    return spec


def _read_json(file: Path) -> Any:
    """A config.json within hpcmem.inputs.files' limits (regular file, size, UTF-8, nesting)."""
    return load_json_file(file, "model config")


def _hub_available() -> bool:
    import importlib.util

    return importlib.util.find_spec("huggingface_hub") is not None


def _hub_reachable(timeout_s: float = 3.0) -> bool:
    """One quick TCP connect before asking the Hub: huggingface_hub retries an unreachable host for ~20 s."""
    import socket
    from urllib.parse import urlparse

    url = urlparse(os.environ.get("HF_ENDPOINT", "https://huggingface.co"))
    try:
        with socket.create_connection((url.hostname or "huggingface.co", url.port or 443), timeout=timeout_s):
            return True
    except OSError:
        return False


def _hub_config(repo_id: str) -> Any:
    """Download config.json only (huggingface_hub.hf_hub_download caches it in the user's HF cache)."""
    from huggingface_hub import hf_hub_download

    if not _hub_reachable():
        raise SpecError(f"unknown model {repo_id}: not a path, not in the catalog (hpcmem models list), and the Hub "
                        "is not reachable from here. Pass a local config.json or a folder holding one.")
    try:
        return _read_json(Path(hf_hub_download(repo_id, "config.json")))
    except SpecError:
        raise
    except Exception as exc:  # gated repo, unknown repo, no network: all end the same way for the user
        raise SpecError(
            f"unknown model {repo_id}: not a path, not in the catalog (hpcmem models list), and the Hub said "
            f"{type(exc).__name__}: {exc}. Pass a local config.json (or `huggingface-cli login` for a gated model)."
        ) from exc
