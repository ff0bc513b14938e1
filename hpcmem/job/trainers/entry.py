"""What hpcmem knows about one TRL trainer, in one frozen record (stdlib only: the light core reads it).

A trainer is this record plus its own files. The record holds data — the TRL config class and the TrainSpec fields it
declares, its defaults, the traits the estimate reads (rows per example, generation, head, reference model) — and,
as "module:function" text, the hooks each layer calls: extra rules, extra estimate phases, the trace's builders, the
probe's dataset. Hooks are text so that reading the registry never imports torch (trace/probe hooks) or the estimate.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Callable, Literal, Mapping

Reference = Literal["none", "unless_precomputed", "when_beta"]
# TRL's dataset types (docs "Dataset formats and types"): what a trainer's `_prepare_dataset` reads
DatasetType = Literal["", "language_modeling", "preference", "prompt_only", "unpaired_preference"]
OldLogps = Literal["never", "always", "when_misaligned"]


@dataclass(frozen=True, kw_only=True)
class Hooks:
    """`module:function` of each layer's trainer-specific code; empty when the generic code covers the trainer.

    rules(job, problems) adds TRL's verdicts on this trainer's settings · estimate(job, parts, prec) returns a
    hpcmem.estimate.trainers.TrainerExtras joined to the generic one · loss(job, mb, prec, head_trains) returns the
    LossBytes of a loss other than the fused LM head or the score head · trace_design(job) the worst-case batch · trace_build(job, model, design, fake=,
    generation=) TRL's trainer around a model · trace_check(job) what keeps the trace from running · trace_notes(job,
    generation) what the trace does differently · probe_dataset(job, steps) the probe's rows · probe_kwargs(job) extra
    keyword arguments of the trainer class."""

    rules: str = ""
    estimate: str = ""
    loss: str = ""
    trace_design: str = ""
    trace_build: str = ""
    trace_check: str = ""
    trace_notes: str = ""
    probe_dataset: str = ""
    probe_kwargs: str = ""


@dataclass(frozen=True, kw_only=True)
class Lengths:
    """How `hpcmem lengths` profiles this trainer's data: its rows and TRL 1.16's max_length rules for them
    (hpcmem.data.batches cites the trainer code each follows)."""

    dataset: DatasetType = ""               # the dataset type its `_prepare_dataset` tokenizes ("": not profiled)
    measures_prompt: bool = True            # the prompt is tokenized apart (its length a part); Reward: not
    row_parts: tuple[str, ...] = ()         # per-example token counts that form its rows, in row order
    profile_as: str = ""                    # another trainer whose profile it reads (RLOO tokenizes prompts as GRPO)
    truncates: bool = True                  # max_length cuts its rows (GRPO's prompts are not cut)
    drops_long_prompt: bool = False         # an example whose prompt alone reaches max_length is dropped
    drops_overlong: bool = False            # an example with a row over max_length is dropped, not cut (Reward)
    kl_rows: bool = False                   # the batch's KL rows also run through the model (KTO)
    unprofiled: tuple[str, str] = ()        # why no profile describes its micro-batch; the flags to estimate it from

    @property
    def profiled(self) -> bool:
        """Its own data makes a profile (`hpcmem lengths --trainer` offers it)."""
        return bool(self.row_parts) and not self.profile_as


@dataclass(frozen=True, kw_only=True)
class TrainerEntry:
    """One TRL 1.16 trainer: `trl <name>` runs `trl.scripts.<name>` with `trl.<config_class>` + `trl.ModelConfig`."""

    name: str
    config_class: str
    trainer_class: str
    script_class: str = "ScriptArguments"   # the script's own arguments (trl/scripts/<name>.py make_parser)
    fields: tuple[str, ...]                 # TrainSpec fields its config class declares (ModelConfig's apart)
    defaults: Mapping[str, Any] = field(default_factory=dict)    # its config's defaults where TrainSpec's differ
    rows_per_example: int = 1               # rows one example puts through the model (chosen + rejected: 2)
    generates: bool = False                 # completions generated in every step and at evaluation
    head: Literal["lm", "score"] = "lm"     # fused LM head, or the 1-output score head of a reward model
    reference: Reference = "none"           # when a second (frozen) model is held
    old_logps: OldLogps = "never"           # the policy's no-grad log-prob pass after generating
    packs: bool = False                     # padding_free / packing change the batch (else padded rows)
    # the training forward runs under accelerate's autocast wrapper of model.forward (accelerator.py prepare_model);
    # False where the trainer calls its loss through trl.models.utils._ForwardRedirection, which swaps that forward
    # for its own and never enters the wrapper: 16-bit weights compute in 16-bit, fp32 ones (and LoRA's fp32
    # adapters) in fp32
    autocast: bool = True
    lengths: Lengths = field(default_factory=Lengths)
    hooks: Hooks = field(default_factory=Hooks)

    def __post_init__(self) -> None:
        object.__setattr__(self, "defaults", MappingProxyType(dict(self.defaults)))

    @property
    def script(self) -> str:
        """The module `trl <name>` runs (trl/cli/__init__.py)."""
        return f"trl.scripts.{self.name}"

    def declares(self, name: str) -> bool:
        return name in self.fields

    def hook(self, layer: str) -> Callable[..., Any] | None:
        """The hook function for `layer` (a Hooks field), imported on first use; None when the trainer has none."""
        target = getattr(self.hooks, layer)
        if not target:
            return None
        module, _, func = target.partition(":")
        return getattr(importlib.import_module(module), func)
