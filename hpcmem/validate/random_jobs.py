"""Random jobs over the input space a user can reach: `draw(seed, index)` is one job, the same job on every machine.

A job is what `hpcmem estimate` takes — a trainer and TRL settings — on a model of one of the types hpcmem covers
(derived or learned, hpcmem/models/coverage.json), MoE and hybrids included. The model is that type's reference config
(hpcmem.validate.coverage.reference_config: the catalog entry, else the config class's defaults with CONFIG_FIXES) at
**full width but at most RANDOM_LAYERS (3) decoder layers** — the first, one middle layer and the
last — (seeds from DEEP_FROM on draw 3, 6 or 12, seed 8 cuts at 16: `depth`; every per-layer list cut alike,
as the coverage sweep cuts: hpcmem.trace.layer_map.reduced_config / subsequence), so that one trace of it takes
seconds. A learned type whose layers need more than RANDOM_LAYERS to hold each kind once keeps the layers
`subsequence` keeps, and a cut that holds no layer of a kind the model has (a prefix of sliding or linear-attention
layers) grows a layer at a time until it does (hpcmem.validate.random_model.traced_model).

Two halves. `choices(seed, index)` draws every choice from its own `random.Random(f"{seed}:{index}")` and is pure
Python (no torch, no transformers): model type, trainer, technique, precision, lengths as fractions. `draw` then lays
those choices on the type's config (hpcmem.validate.random_model: the cut config, its positions and linear modules;
transformers' config classes and a meta-device model, no weights): max_length on a log scale from 128 to the model's
max_position_embeddings, explicit LoRA targets from the model's linear modules. Jobs hpcmem refuses are drawn and
kept (a field of another trainer, checkpointing a type refuses, a LoRA target peft has no default for): they are
half of refusal parity.

A seed's types are frozen at its first run: estimator/random/streams.json keeps, per seed, the types it draws from
(and the derived ones its distillation teachers come from), written by the first `hpcmem validate random --seed S` on
the project's records (hpcmem.validate.random_run; a `--records` file of one's own writes nothing there), so a type
that becomes usable later (a profile learned again in a readable format) does not re-draw every job of an existing
seed — it enters the next seed. Without a frozen list a seed follows the install (`model_types`). What a type's cut
depends on (its learned profile's layers) still moves its own jobs: a record holds the job it ran; one whose job is no
longer today's draw is stale, and `--redraw` runs it again.
"""

from __future__ import annotations

import json
import math
import random
from dataclasses import asdict, dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

from hpcmem.datapath import estimator_dir
from hpcmem.errors import SpecError
from hpcmem.models.coverage import classification, settings_beside_checkpointing, type_status
from hpcmem.models.profile import backbone_config, profile_from_dict
from hpcmem.validate.coverage import EVAL_LAYERS, EVAL_LAYERS_FOR, profiles_dir
from hpcmem.validate.random_model import explicit_targets, save_module, traced_model

RANDOM_LAYERS = 3
DEEP_FROM = 5                  # the first seed whose cuts draw their depth from DEPTHS (seeds 1–4: RANDOM_LAYERS)
DEPTHS = (3, 6, 12)
# seeds whose every cut is as deep as the coverage sweep's (EVAL_LAYERS, 16); the other seeds from DEEP_FROM on draw
# from DEPTHS, so a seed already drawn (seed 11: the properties test's) keeps its jobs
DEEPEST_SEEDS = frozenset({8})
MIN_LENGTH = 128

# The distribution, in one table. Why these weights:
# - trainer: SFT is what most users run; the preference/RL/distillation trainers each get enough draws (≥ 5 %) that a
#   700-job run holds ~35 of each. Distillation needs a teacher hpcmem can resolve from a config file: a derived type.
# - technique: LoRA is the common fine-tune on one GPU, full fine-tuning the other half; DoRA, modules_to_save and
#   explicit target lists are rarer user choices, drawn often enough to appear every ~50 jobs.
# - dtype / precision: TRL loads float32 unless told (its default), most users set bfloat16; fp16 is rare on current
#   GPUs (and not traceable on CPU: its jobs are kept but only the properties oracle scores them).
# - sft-only fields (packing, padding_free, activation_offloading) drawn for other trainers now and then: TRL has no
#   such field there, so hpcmem must refuse them (refusal parity).
WEIGHTS: dict[str, dict[Any, float]] = {
    "trainer": {"sft": 0.50, "dpo": 0.12, "reward": 0.08, "kto": 0.08, "grpo": 0.08, "rloo": 0.07,
                "distillation": 0.07},
    "peft": {"full": 0.45, "lora": 0.55},
    "lora_targets": {"default": 0.30, "all-linear": 0.50, "explicit": 0.20},
    "lora_dropout": {0.0: 0.3, 0.05: 0.5, 0.1: 0.2},
    "use_dora": {False: 0.85, True: 0.15},
    "modules_to_save": {False: 0.9, True: 0.1},
    "dtype": {"float32": 0.3, "bfloat16": 0.7},
    "precision": {"bf16": 0.85, "fp16": 0.05, "none": 0.10},
    "gradient_checkpointing": {True: 0.7, False: 0.3},
    "use_reentrant": {None: 0.6, False: 0.25, True: 0.15},
    "packing": {"off": 0.7, "bfd": 0.2, "wrapped": 0.1},
    "padding_free": {False: 0.92, True: 0.08},
    "activation_offloading": {False: 0.9, True: 0.1},
    "foreign_sft_field": {False: 0.95, True: 0.05},       # non-SFT trainers: one SFT-only field set (refused)
    "required_settings": {True: 0.9, False: 0.1},         # a type's required non-GC setting (router_aux_loss_coef 0)
    # GRPO/RLOO: num_generations must divide the generation batch (batch × accumulation; TRL raises otherwise), so
    # it is mostly drawn among the divisors, sometimes freely (a refusal)
    "num_generations_free": {False: 0.85, True: 0.15},
    "num_generations": {2: 0.4, 4: 0.4, 8: 0.2},
}
BATCH = (1, 8)
ACCUMULATION = (1, 4)
LORA_RANK = (4, 128)           # log-uniform, integer
COMPLETION = (64, 1024)        # GRPO/RLOO/distillation max_completion_length, log-uniform
GENERATES = ("grpo", "rloo", "distillation")     # no max_length: max_prompt_length + max_completion_length
# Where the trace is slow for a reason no cap of depth removes, the longest max_length drawn, and where the cost grows
# with each layer, fewer layers (each trace stays under ~60 s on two shared cores): RecurrentGemma's RG-LRU scan is a
# Python loop over the tokens (modeling_recurrent_gemma.py RecurrentGemmaRglru._rnn_scan); LongCat-Flash loops over
# every expert the router hits, all 768 under the trace's balanced routing (modeling_longcat_flash.py
# LongcatFlashExperts.forward).
MAX_LENGTH_FOR = {"recurrent_gemma": 512}
LAYERS_FOR = {"longcat_flash": 2, "recurrent_gemma": RANDOM_LAYERS}
MAX_LENGTH = 131072            # the longest max_length drawn for any type (its positions permitting)


@dataclass(frozen=True, kw_only=True)
class RandomJob:
    """One drawn job: `settings` is exactly what hpcmem.job.trl_config.build_job(trainer, settings, model=...) takes
    (TRL field → value, JSON types); `config` is the HF config.json dict the job's model is built from (full width,
    `layers` decoder layers)."""

    id: str
    seed: int
    index: int
    trainer: str
    model_type: str
    config: dict[str, Any] = field(repr=False)
    settings: dict[str, Any]
    layers: int

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> RandomJob:
        return cls(**{k: d[k] for k in ("id", "seed", "index", "trainer", "model_type", "config", "settings",
                                         "layers")})


def _pick(rng: random.Random, name: str) -> Any:
    table = WEIGHTS[name]
    return rng.choices(list(table), weights=list(table.values()))[0]


def _log_uniform(rng: random.Random, lo: float, hi: float) -> float:
    return math.exp(rng.uniform(math.log(lo), math.log(hi))) if hi > lo else lo


@lru_cache(maxsize=1)
def model_types() -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(every derived or learned type the random jobs draw from, the derived ones), sorted: the types of
    hpcmem/models/coverage.json hpcmem estimates, less learned types without a sweep profile this hpcmem reads (a
    random job is estimated from the profile `hpcmem validate coverage` learned: estimator/coverage-profiles/; one of
    an older format is learned again by the next sweep)."""
    derived, usable = [], []
    for name, entry in sorted(classification()["types"].items()):
        status = type_status(name, entry)[0]
        if status == "derived":
            derived.append(name)
            usable.append(name)
        elif status == "learned" and _readable_profile(profiles_dir() / f"{name}.json"):
            usable.append(name)
    return tuple(usable), tuple(derived)


def _readable_profile(path: Path) -> bool:
    try:
        profile_from_dict(json.loads(path.read_text()))
    except (OSError, ValueError, KeyError, TypeError, SpecError):
        return False
    return True


def _teacher_type(seed: int, index: int, derived: tuple[str, ...]) -> str:
    """A distillation job's type (its teacher must be derived), by highest random weight (rendezvous hashing: each type
    draws its own weight for this job, the heaviest wins): a type that turns derived, or a new one, takes only the jobs
    it outweighs; every other distillation job stays as it was drawn (a plain choice from the list re-drew them all)."""
    return max(derived, key=lambda name: random.Random(f"{seed}:{index}:teacher:{name}").random())


def streams_path() -> Path:
    return estimator_dir() / "random" / "streams.json"


@lru_cache(maxsize=1)
def frozen_streams() -> dict[str, dict[str, list[str]]]:
    """Seed → {"usable": types, "derived": types} as each seed's first run froze them (module docstring)."""
    path = streams_path()
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}


def stream_types(seed: int) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(the types seed `seed` draws from, the derived ones): its frozen lists, else this install's `model_types`."""
    frozen = frozen_streams().get(str(seed))
    if frozen is None:
        return model_types()
    return tuple(frozen["usable"]), tuple(frozen["derived"])


def depth(seed: int, index: int, model_type: str) -> int:
    """Decoder layers of the job's cut: RANDOM_LAYERS up to seed DEEP_FROM − 1; from there one of DEPTHS, drawn from its
    own stream (`random.Random(f"{seed}:{index}:depth")`, so no other choice of a job moves). At 3 layers one layer's
    transients are most of the peak, and the allocator's slack a larger share than at a real model's depth
    (estimator/LOG.md). A seed of DEEPEST_SEEDS cuts every job at the coverage sweep's depth (EVAL_LAYERS, or the type's
    EVAL_LAYERS_FOR), the deepest the random jobs reach. LAYERS_FOR caps the types whose trace grows too slow with
    depth."""
    if seed < DEEP_FROM:
        return LAYERS_FOR.get(model_type, RANDOM_LAYERS)
    if seed in DEEPEST_SEEDS:
        return LAYERS_FOR.get(model_type, EVAL_LAYERS_FOR.get(model_type, EVAL_LAYERS))
    drawn = random.Random(f"{seed}:{index}:depth").choice(DEPTHS)
    return min(drawn, LAYERS_FOR.get(model_type, drawn))


def choices(seed: int, index: int) -> dict[str, Any]:
    """The pure half of a draw: every random choice, with lengths as fractions of their range (0..1, log scale) and
    LoRA targets as a kind ("default", "all-linear", or explicit with a draw of which)."""
    rng = random.Random(f"{seed}:{index}")
    usable, derived = stream_types(seed)
    trainer = _pick(rng, "trainer")
    model_type = _teacher_type(seed, index, derived) if trainer == "distillation" else rng.choice(usable)
    c: dict[str, Any] = {"trainer": trainer, "model_type": model_type, "layers": depth(seed, index, model_type)}
    s: dict[str, Any] = {"dtype": _pick(rng, "dtype")}
    precision = _pick(rng, "precision")
    s["bf16"], s["fp16"] = precision == "bf16", precision == "fp16"
    s["per_device_train_batch_size"] = rng.randint(*BATCH)
    s["gradient_accumulation_steps"] = rng.randint(*ACCUMULATION)
    c["length_u"] = rng.random()
    gc = _pick(rng, "gradient_checkpointing")
    s["gradient_checkpointing"] = gc
    reentrant = _pick(rng, "use_reentrant")
    if gc and reentrant is not None:
        s["gradient_checkpointing_kwargs"] = {"use_reentrant": reentrant}
    if _pick(rng, "peft") == "lora":
        s["use_peft"] = True
        s["lora_r"] = int(round(_log_uniform(rng, *LORA_RANK)))
        s["lora_alpha"] = 2 * s["lora_r"]
        s["lora_dropout"] = _pick(rng, "lora_dropout")
        s["use_dora"] = _pick(rng, "use_dora")
        c["targets"] = _pick(rng, "lora_targets")
        c["targets_u"] = [rng.random() for _ in range(4)]
        c["modules_to_save"] = _pick(rng, "modules_to_save")
    sft_fields = {"packing": _pick(rng, "packing"), "padding_free": _pick(rng, "padding_free"),
                  "activation_offloading": _pick(rng, "activation_offloading")}
    if trainer == "sft":
        if sft_fields["packing"] != "off":
            s["packing"], s["packing_strategy"] = True, sft_fields["packing"]
        if sft_fields["padding_free"]:
            s["padding_free"] = True
        if sft_fields["activation_offloading"]:
            s["activation_offloading"] = True
    elif _pick(rng, "foreign_sft_field"):
        name = rng.choice(("packing", "padding_free", "activation_offloading"))
        s[name] = True
    if trainer in ("grpo", "rloo"):
        free, n = _pick(rng, "num_generations_free"), _pick(rng, "num_generations")
        rows = s["per_device_train_batch_size"] * s["gradient_accumulation_steps"]
        divisors = [d for d in (2, 4, 8) if rows % d == 0]
        s["num_generations"] = n if free or not divisors else rng.choice(divisors)
    if trainer in GENERATES:
        s["max_completion_length"] = int(round(_log_uniform(rng, *COMPLETION)))
    c["required"] = _pick(rng, "required_settings")
    c["settings"] = s
    return c


def max_positions(config: dict[str, Any]) -> int | None:
    """The longest sequence a config's positions allow, where it names one (the text backbone's)."""
    cfg = backbone_config(config)
    for key in ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length", "n_ctx",
                "max_seq_len"):
        if isinstance(cfg.get(key), int) and cfg[key] > 0:
            return int(cfg[key])
    return None


def _learned_cell(profile: Any, s: dict[str, Any]) -> None:
    """A learned type is estimated from the profile the coverage sweep learned, which holds only the sweep's cells
    (bf16 weights under bf16 compute; full + GC, LoRA + GC, full without GC: hpcmem.validate.coverage.TECHNIQUES) —
    a user's own `hpcmem models learn` learns every cell. A drawn cell the sweep did not learn moves to one it did:
    bfloat16 weights, then checkpointing as learned. fp32 compute and fp16 stay as drawn (hpcmem refuses fp32
    compute for every learned profile: a user-facing limit, not the sweep's)."""
    keys = set(profile.cell_keys())
    if not any(k.startswith("w4") for k in keys):
        s["dtype"] = "bfloat16"
    tech = "lora" if s.get("use_peft") else "full"
    for gc in (s["gradient_checkpointing"], not s["gradient_checkpointing"]):
        if any(k.endswith(f"/{tech}/{'gc' if gc else 'nogc'}") for k in keys):
            if gc != s["gradient_checkpointing"]:
                s["gradient_checkpointing"] = gc
                s.pop("gradient_checkpointing_kwargs", None)
            return


def draw(seed: int, index: int) -> RandomJob:
    """Job `index` of the random stream `seed` (see the module docstring): deterministic for one install of hpcmem
    and transformers."""
    c = choices(seed, index)
    model_type, trainer = c["model_type"], c["trainer"]
    spec, config, depth = traced_model(model_type, c["layers"])
    s = dict(c["settings"])
    top = max(min(max_positions(config) or 2048, MAX_LENGTH_FOR.get(model_type, MAX_LENGTH)), MIN_LENGTH)
    lo, hi = math.log(MIN_LENGTH), math.log(top)
    length = min(int(round(math.exp(lo + c["length_u"] * (hi - lo)))), top)
    if trainer in GENERATES:
        # TRL's generating trainers have no max_length: the prompt (hpcmem's max_prompt_length) and the completion
        # (max_completion_length) share the positions
        s["max_prompt_length"] = max(16, min(length, top // 2))
        s["max_completion_length"] = max(16, min(s["max_completion_length"], top - s["max_prompt_length"]))
    else:
        s["max_length"] = length
    if spec.learned is not None:
        _learned_cell(spec.learned, s)
    if s.get("use_peft"):
        if c["targets"] == "all-linear":
            s["lora_target_modules"] = ["all-linear"]
        elif c["targets"] == "explicit":
            s["lora_target_modules"] = explicit_targets(spec, c["targets_u"])
        if c["modules_to_save"]:
            s["lora_modules_to_save"] = [save_module(spec, trainer)]
    if c["required"]:
        s.update(settings_beside_checkpointing(model_type))
    return RandomJob(id=f"s{seed}-{index}", seed=seed, index=index, trainer=trainer, model_type=model_type,
                     config=config, settings=s, layers=depth)
