"""Random jobs a change of the estimate touches, drawn from a fresh seed: a check of the change on jobs nobody chose.

    python -m hpcmem.lab.random_touched default-nodrop --seed 21 --upto 20000 > ids
    hpcmem validate random --oracle trace --seed 21 --only "$(cat ids)" --records FILE
    python -m hpcmem.lab.random_touched default-nodrop --score FILE

The first form walks jobs s<seed>-0 … s<seed>-<upto − 1> of the random stream (hpcmem.validate.random_jobs `draw`)
and prints, comma-separated, the ids of those the named rule touches (RULES). The trace oracle then runs them into
their own records file — not estimator/random/trace.jsonl, whose jobs are an unselected sample. `--score` scores a
records file against today's estimate (hpcmem.validate.random_trace `score`) and prints one JSON row per job and the
counts.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path

from hpcmem.errors import HpcmemError, SpecError
from hpcmem.estimate.activations import checkpoint_inputs_offloaded
from hpcmem.estimate.learned import (
    DEFAULT_NODROP,
    default_cell,
    nearer_default_cell,
    nodrop_cell,
    one_row,
    precision_key,
    reentrant_cell,
    variant_cells_apply,
)
from hpcmem.estimate.lora import lora_dropout_active, lora_layout
from hpcmem.lab.random_variants import print_scored
from hpcmem.job.jobspec import JobSpec
from hpcmem.job.shape import micro_batch, precision
from hpcmem.validate.random_jobs import draw
from hpcmem.validate.random_model import job_spec
from hpcmem.validate.random_run import load
from hpcmem.validate.random_trace import score


def _nodrop_on_default(job: JobSpec) -> bool:
    """A learned type's LoRA job without dropout on peft's default targets, its profile holding both the `lora-nodrop`
    and a cell on the default targets."""
    if job.model.learned is None:
        return False
    prec, one = precision(job), one_row(job, micro_batch(job))
    return nodrop_cell(job, prec, one) is not None and default_cell(job, prec, lora_layout(job), one) is not None


def default_nodrop(job: JobSpec) -> bool:
    """`_nodrop_on_default`, checkpointing non-reentrantly: the jobs hpcmem.estimate.learned `nodrop_taken` moves from
    the `lora-nodrop` cell to the default targets' one."""
    return not job.reentrant_checkpointing and _nodrop_on_default(job)


def dora_default(job: JobSpec) -> bool:
    """A DoRA job on peft's default targets of a learned type whose profile has the `dora-default` cell,
    checkpointing non-reentrantly: the jobs hpcmem.estimate.learned `learned_cell` moves there from the `dora` cell
    with every other reference adapter taken away."""
    if job.model.learned is None or job.reentrant_checkpointing or not job.train.use_dora:
        return False
    taken = default_cell(job, precision(job), lora_layout(job), one_row(job, micro_batch(job)))
    return taken is not None and bool(taken[1].get("use_dora"))


def default_nodrop_reentrant(job: JobSpec) -> bool:
    """`_nodrop_on_default`, checkpointing reentrantly, where the profile has the reentrant variant of
    `lora-default-nodrop`: the jobs hpcmem.estimate.learned `nodrop_taken` moves there from the reentrant no-dropout
    cell with every other reference adapter taken away."""
    return (job.reentrant_checkpointing and _nodrop_on_default(job)
            and reentrant_cell(job, precision(job), DEFAULT_NODROP, one_row(job, micro_batch(job))) is not None)


def noamp(job: JobSpec) -> bool:
    """A full or plain LoRA job of a learned type on 16-bit weights with bf16 and fp16 off, checkpointing
    non-reentrantly or not at all: the jobs hpcmem.estimate.learned `noamp_taken` moves to the cells traced without
    autocast where the profile has them (whether it has them or not: the rule is the job's) — LoRA without dropout
    to the no-dropout one's (`lora-nodrop-noamp`), but on peft's default targets, where it keeps its no-dropout
    default cell (they stay in the set, unmoved)."""
    t, prec = job.train, precision(job)
    return (job.model.learned is not None and not prec.amp and precision_key(prec) == "w2a2" and not t.use_dora
            and not job.reentrant_checkpointing and variant_cells_apply(t))


def dora_nodrop(job: JobSpec) -> bool:
    """A DoRA job of a learned type without LoRA dropout (lora_dropout 0, or DPO / KTO / Reward's disable_dropout),
    not on peft's default targets where the profile has their DoRA cell: the jobs hpcmem.estimate.learned
    `dora_nodrop_cell` moves from the `dora` cell with the dropout's difference (whether the profile has it or not:
    the rule is the job's)."""
    t, prec = job.train, precision(job)
    if job.model.learned is None or not (t.use_peft and t.use_dora) or lora_dropout_active(t):
        return False
    one = one_row(job, micro_batch(job))
    on_default = not job.reentrant_checkpointing and default_cell(job, prec, lora_layout(job), one) is not None
    return precision_key(prec) is not None and variant_cells_apply(t) and not on_default


def nearer_default(job: JobSpec) -> bool:
    """A plain LoRA job of a learned type whose adapted linears are nearer peft's default targets than the
    reference's, where the profile has the default targets' cell for its dropout: the jobs hpcmem.estimate.learned
    `nearer_default_cell` moves there from the reference's cell."""
    if job.model.learned is None or not job.train.use_peft:
        return False
    one = one_row(job, micro_batch(job))
    return nearer_default_cell(job, precision(job), lora_layout(job), one) is not None


def dora_reentrant(job: JobSpec) -> bool:
    """A DoRA job of a learned type checkpointing reentrantly, where the profile has a DoRA cell for its dropout: the
    jobs hpcmem.estimate.learned `learned_cell` moves to the DoRA cells' reentrant variants where learned (whether the
    profile has them or not: the rule is the job's)."""
    t, prec = job.train, precision(job)
    if job.model.learned is None or not (t.use_peft and t.use_dora) or not job.reentrant_checkpointing:
        return False
    key = precision_key(prec)
    one = one_row(job, micro_batch(job))
    return key is not None and variant_cells_apply(t) and job.model.learned.cell(key, "dora", True, one) is not None


def final_norm_offload(job: JobSpec) -> bool:
    """A job offloading activations under full non-reentrant checkpointing: the jobs whose last layer's backward
    hpcmem.estimate counts the final norm's brought-back input in (hpcmem.models.final_norm)."""
    return checkpoint_inputs_offloaded(job.train) and not job.reentrant_checkpointing


RULES: dict[str, Callable[[JobSpec], bool]] = {"default-nodrop": default_nodrop, "dora-default": dora_default,
                                               "default-nodrop-reentrant": default_nodrop_reentrant,
                                               "noamp": noamp, "dora-nodrop": dora_nodrop,
                                               "nearer-default": nearer_default, "dora-reentrant": dora_reentrant,
                                               "final-norm-offload": final_norm_offload}


def touched(rule: Callable[[JobSpec], bool], seed: int, upto: int) -> list[str]:
    out = []
    for i in range(upto):
        try:
            hit = rule(job_spec(draw(seed, i)))
        except (SpecError, ValueError):         # a draw hpcmem refuses is no job the rule changes
            continue
        if hit:
            out.append(f"s{seed}-{i}")
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m hpcmem.lab.random_touched", description=__doc__.split("\n")[0])
    ap.add_argument("rule", choices=sorted(RULES))
    ap.add_argument("--seed", type=int, default=21)
    ap.add_argument("--upto", type=int, default=20000, help="jobs of the stream to walk")
    ap.add_argument("--score", type=Path, metavar="FILE", help="score this records file instead of drawing")
    args = ap.parse_args(argv)
    if args.upto < 1:
        ap.error(f"--upto {args.upto}: at least 1 job")
    if args.score is None:
        print(",".join(touched(RULES[args.rule], args.seed, args.upto)))
        return 0
    if not args.score.is_file():
        ap.error(f"--score {args.score}: no such records file")
    try:
        records = load(args.score)
        missing = next((r["id"] for r in records if not isinstance(r.get("job"), dict)), None)
    except HpcmemError as exc:
        ap.error(str(exc).replace("--records", "--score", 1))
    if missing is not None:
        ap.error(f"--score {args.score}: record {missing!r} holds no job (a records file of hpcmem validate random)")
    print_scored((rec["job"] | {"id": rec["id"]}, score(rec)) for rec in records)
    return 0


if __name__ == "__main__":
    sys.exit(main())
