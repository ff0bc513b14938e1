"""`hpcmem probe <trainer> …`: run N real steps of the TRL trainer on random weights and record the peaks."""

from __future__ import annotations

import contextlib
import json
import sys
from typing import Any

import click

from hpcmem.cli.options import TRAINER_ARG, job_from_cli, job_options
from hpcmem.cli.outputs import RECORDS
from hpcmem.cli.trl_argv import TrlCommand
from hpcmem.errors import SpecError
from hpcmem.job.settings import check_settings
from hpcmem.models import resolve_model
from hpcmem.probe import record_file, run_probe
from hpcmem.probe.fixtures import hf_config
from hpcmem.probe.summary import summary
from hpcmem.trace.learn import provisional_spec


def probe_model(kwargs: dict) -> Any:
    """The model to probe: as `hpcmem estimate` resolves it, else — a type with no family descriptor and no learned
    profile, or a refused one (a GPU probe measures the real kernels) — its parameters from the meta model: the run
    is recorded, its estimate marked as missing."""
    name = kwargs.get("model_name_or_path")
    if not name:
        return None
    check_settings({"model_name_or_path": name}, "command line")      # as every flag is checked (hpcmem.inputs)
    try:
        return resolve_model(str(name))
    except SpecError as exc:
        click.echo(f"note: {exc.problems[0]}; probing it anyway (the record carries no estimate)", err=True)
        return provisional_spec(hf_config(str(name)), str(name))


@click.command(name="probe", cls=TrlCommand)
@TRAINER_ARG
@job_options
@click.option("--device", type=click.Choice(["cuda", "cpu"]), default="cuda", show_default=True,
              help="cuda: allocator + NVML peaks; cpu: tracked tensor bytes and RSS (tiny models, sharding checks)")
@click.option("--steps", type=click.IntRange(2), default=3, show_default=True,
              help="optimizer steps to run; the peak is taken after --warmup-steps")
@click.option("--warmup-steps", "--warmup_steps", "warmup_steps", type=click.IntRange(0), default=1,
              show_default=True, help="steps left out of the peak (optimizer states are born in step 1)")
@click.option("--capacity-bytes", "--capacity_bytes", "capacity_bytes", type=click.IntRange(1), default=None,
              help="pretend the device holds only this many bytes (an OOM is then recorded, not raised)")
@click.option("--out", type=RECORDS, default=None,
              help="records file to append to, .jsonl (default estimator/probes/<gpu>.jsonl, cpu.jsonl for --device cpu); "
                   "an existing file must hold records")
@click.option("--after", "after", multiple=True, type=click.Choice(["evaluation", "save"]),
              help="after training, run one evaluation / one checkpoint save and measure each (repeatable)")
@click.option("--no-record", "no_record", is_flag=True, help="measure and print, write nothing")
@click.option("--json", "as_json", is_flag=True, help="print the whole record as JSON")
def command(trainer: str, device: str, steps: int, warmup_steps: int, capacity_bytes: int | None, out: str | None,
            after: tuple[str, ...], no_record: bool, as_json: bool, **kwargs) -> None:
    """Measure a TRL job for real: the estimate is made first and stored with the measurement.

    Random weights are built from the model config (a catalog id or a config.json; a folder with weights loads
    them). Multi-process jobs (--num_processes 2 --accelerate_config zero3) start one worker per rank on this machine.
    Example: hpcmem probe sft --model_name_or_path Qwen/Qwen2.5-0.5B --max_length 2048 --device cuda
    """
    if warmup_steps >= steps:
        # hpcmem.probe.run_probe takes the peak over the steps after warm-up
        raise click.UsageError(f"--warmup-steps {warmup_steps} leaves nothing to measure with --steps {steps}: the "
                               "peak is taken over the steps after warm-up, so give more steps than warm-up steps")

    job, _ = job_from_cli(trainer, kwargs, model=probe_model(kwargs))
    phases = tuple({"evaluation": "evaluation", "save": "checkpoint save"}[a] for a in after)
    # what the libraries print while the job runs (DeepSpeed's logger writes its accelerator notice to stdout when
    # transformers imports it) goes to stderr: stdout holds the record or the summary only
    with contextlib.redirect_stdout(sys.stderr):
        record = run_probe(job, device=device, steps=steps, warmup_steps=warmup_steps, capacity_bytes=capacity_bytes,
                           out=out, write=not no_record, after=phases)
    path = None if no_record else record_file(record, out)
    click.echo(json.dumps(record.to_json(), indent=1, default=str) if as_json else summary(record, path))
