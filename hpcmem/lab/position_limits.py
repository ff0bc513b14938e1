"""Which model types stop on a row longer than their position table: TRL's real SFTTrainer, run on the CPU.

    python -m hpcmem.lab.position_limits                 # every learned and derived text type; writes the table
    python -m hpcmem.lab.position_limits --types gpt2,mpt --print

A RoPE model runs past `max_position_embeddings` (it only extrapolates); a model with a table of that size does not:
an absolute position embedding indexed by position id (GPT-2's `wpe`, an `IndexError`), a bias or causal-mask buffer
built once at that size and sliced by the row (MPT's ALiBi, `build_mpt_alibi_tensor(…, config.max_seq_len)`;
OpenAI GPT's `bias`), a fixed sinusoid table (CTRL). Which one a type has decides what a packed row may hold: TRL's
padding-free collation restarts the position ids at each packed sequence (trl/trainer/sft_trainer.py
`DataCollatorForLanguageModeling`, `padding_free`), so a table indexed by position id only bounds each sequence, a
table sliced by the row bounds the whole row.

Per type this shrinks the type's reference config (hpcmem.validate.shrink) with every position length its config
names set to POSITIONS, and runs one SFT step (hpcmem.validate.trl_run: TRL's trainer, transformers' model, no
checkpointing) three ways:

    control          2 rows of POSITIONS/2 tokens                      (must run: else the type is not probed)
    row              1 row of 2 × POSITIONS tokens                     (position ids up to 2 × POSITIONS)
    packed_control   packing, 2 sequences of POSITIONS/4 in one row   (must run: else packing is not probed)
    packed           packing, 4 sequences of 3/4 × POSITIONS in one row (position ids below POSITIONS, row 3 ×)

and writes hpcmem/job/position_limits.json: per type the config keys of its table and their config-class defaults and,
per run, null when the step ran or the exception it raised (`packed` is "not probed: …" when packing fails even
within the positions). hpcmem.job.position_limits refuses jobs from it.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from transformers import CONFIG_MAPPING

from hpcmem.models.coverage import classification, type_status
from hpcmem.trace.result import versions
from hpcmem.validate.coverage import reference_config
from hpcmem.validate.shrink import LENGTH_KEYS, shrink_config
from hpcmem.validate.trl_run import quiet, run_trl

POSITIONS = 32
RUNS = {
    "control": {"max_length": POSITIONS // 2, "per_device_train_batch_size": 2},
    "row": {"max_length": 2 * POSITIONS, "per_device_train_batch_size": 1},
    "packed_control": {"max_length": POSITIONS // 4, "packing": True, "per_device_train_batch_size": 2},
    "packed": {"max_length": 3 * POSITIONS // 4, "packing": True, "per_device_train_batch_size": 4},
}
COMMON = {"dtype": "float32", "bf16": False, "gradient_checkpointing": False}
TABLE = Path(__file__).resolve().parents[1] / "job" / "position_limits.json"


def length_keys(model_type: str, cfg: dict[str, Any]) -> list[str]:
    """The config keys that size a position table: the ones hpcmem.validate.shrink treats as lengths, as the config
    names them, plus the one the config class maps `max_position_embeddings` to (`attribute_map`)."""
    keys = [k for k in LENGTH_KEYS if k in cfg]
    mapped = getattr(CONFIG_MAPPING[model_type], "attribute_map", {}).get("max_position_embeddings")
    if mapped and mapped not in keys:
        keys.append(mapped)
    return keys


def class_defaults(model_type: str, keys: list[str]) -> dict[str, int]:
    """What the type's config class sets each key to when a config.json leaves it out (the model then has a table of
    that size)."""
    made = CONFIG_MAPPING[model_type]()
    return {k: v for k in keys if isinstance(v := getattr(made, k, None), int) and not isinstance(v, bool)}


def probe(model_type: str) -> dict[str, Any]:
    """The runs of one type (module docstring)."""
    cfg, source = reference_config(model_type)
    small = shrink_config(cfg, max_length=POSITIONS)
    keys = length_keys(model_type, small)
    for key in keys:
        small[key] = POSITIONS
    out: dict[str, Any] = {"keys": keys, "defaults": class_defaults(model_type, keys), "config": source}
    for name, settings in RUNS.items():
        with quiet():
            verdict = run_trl("sft", {**settings, **COMMON}, small, steps=1)
        out[name] = None if verdict.ran else (verdict.reason or "not run")[:300]
        if name == "control" and out[name] is not None:
            break           # the type does not train here at all: nothing to learn about its positions
        if name == "packed_control" and out[name] is not None:
            out["packed"] = "not probed: packing fails within the positions too"
            break           # packing itself fails (a CUDA-only package, say): says nothing about positions
    return out


def text_types() -> list[str]:
    types = classification()["types"]
    return sorted(t for t, c in types.items() if type_status(t, c)[0] in ("learned", "derived"))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m hpcmem.lab.position_limits", description=__doc__.split("\n")[0])
    ap.add_argument("--types", help="comma-separated model types (default: every learned and derived text type)")
    ap.add_argument("--print", action="store_true", help="print the rows; do not write the table")
    args = ap.parse_args(argv)
    known = text_types()
    types = args.types.split(",") if args.types else known
    unknown = [t for t in types if t not in known]
    if unknown:
        ap.error(f"--types {','.join(map(repr, unknown))}: not a learned or derived text type (the table holds "
                 f"{len(known)}: hpcmem models coverage lists them)")
    rows: dict[str, Any] = {}
    for i, t in enumerate(types, 1):
        try:
            rows[t] = probe(t)
        except Exception as exc:            # a config that does not shrink or build: recorded, not fatal
            rows[t] = {"keys": [], "control": f"{type(exc).__name__}: {exc}"[:300]}
        r = rows[t]
        runs = ", ".join(f"{name} {'ok' if r[name] is None else 'raises'}" for name in RUNS if name in r)
        print(f"[{i}/{len(types)}] {t}: keys {r['keys']}: {runs}", file=sys.stderr, flush=True)
    if args.print:
        print(json.dumps(rows, indent=1))
        return 0
    # --types probes some types again: the table's other rows stay
    kept = json.loads(TABLE.read_text())["types"] if args.types and TABLE.is_file() else {}
    doc = {"about": "python -m hpcmem.lab.position_limits (hpcmem/lab/position_limits.py says what each run is)",
           "positions": POSITIONS, "runs": RUNS, "versions": versions(), "types": {**kept, **rows}}
    TABLE.write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
    print(f"wrote {TABLE} ({len(rows)} of {len(doc['types'])} types probed now)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
