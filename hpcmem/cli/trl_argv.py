"""A `trl <trainer>` command line read as TRL's parser reads it, so that a user can paste one after `hpcmem estimate`.

hpcmem's own flags (the fields it models, `--config`, `--gpu` …) are click options. Every other word is read here the
way `trl <trainer>`'s HfArgumentParser would (hpcmem.job.trainers.flags): a TRL field hpcmem has no flag for
(`--dataset_name`, `--output_dir`, `--learning_rate`) is collected as a setting — refused, accepted or listed as
ignored by the field table like a YAML key — and a list flag takes every word up to the next flag, the last
occurrence winning (`--lora_target_modules q_proj v_proj`). A flag no class of `trl <trainer>` declares is refused
in one line naming the nearest field.
"""

from __future__ import annotations

import re
from typing import Any

import click

from hpcmem.job.trainers import entry, names
from hpcmem.job.trainers.defaults import shown, trl_defaults
from hpcmem.job.trainers.fields import SCRIPT_CLASSES, declared, unknown_field
from hpcmem.job.trainers.flags import flag_kind, negated

# argparse reads "-1" or "-2.5e-5" as a value, not a flag, when the parser has no option that looks like a number
_NUMBER = re.compile(r"-\d|-\.\d")


def _is_flag(word: str) -> bool:
    return word.startswith("-") and not _NUMBER.match(word)


def trainer_fields(trainer: str) -> set[str]:
    """Every field `trl <trainer>` parses: TrainingArguments, ModelConfig, its config and its script's classes."""
    e, table = entry(trainer), declared()
    classes = ("TrainingArguments", "ModelConfig", e.config_class, e.script_class, *SCRIPT_CLASSES)
    return {name for cls in classes for name in table.get(cls, ())}


def split_argv(args: list[str], own: dict[str, click.Parameter]) -> tuple[list[str], dict[str, Any]]:
    """(the words click parses, the TRL settings read here). `own`: the command's option strings → its params."""
    trainer = next((w for w in args if w in names()), None)
    if trainer is None:
        return args, {}                 # click says what is missing
    known = trainer_fields(trainer)
    out: list[str] = []
    settings: dict[str, Any] = {}
    lists: dict[str, list[str]] = {}    # a click list option's last occurrence (argparse's "+" keeps the last)
    i = 0
    while i < len(args):
        word = args[i]
        if word == "--":
            out += args[i:]
            break
        if not word.startswith("--") or word == "--help":
            out.append(word)
            i += 1
            continue
        flag, eq, inline = word.partition("=")
        name = flag[2:].replace("-", "_")
        i += 1
        following: list[str] = []
        if not eq:
            while i < len(args) and not _is_flag(args[i]):
                following.append(args[i])
                i += 1
        param = own.get(flag) or own.get(f"--{name}")
        values = [inline] if eq else following
        if param is not None:
            if getattr(param, "multiple", False) and param.name in known and flag_kind(trainer, param.name) == "list":
                if not values:
                    raise click.UsageError(f"{flag} needs at least one value (trl reads a list)")
                lists[param.opts[0]] = values       # re-emitted below, once per word
            else:
                out += [word, *following]           # click reads its own option as before
            continue
        off = negated(trainer, name)
        if off is not None and not eq and not values:
            settings[off] = False
            continue
        if name not in known:
            raise click.UsageError(unknown_field(entry(trainer).config_class, name, known | _option_names(own),
                                                 entry(trainer).script_class))
        kind = flag_kind(trainer, name)
        if kind == "list":
            if not values:
                raise click.UsageError(f"--{name} needs at least one value (trl {trainer} reads a list)")
            settings[name] = values
        elif kind == "bool":
            settings[name] = values[0] if values else "true"
            out += values[1:]
        else:
            if not values:
                raise click.UsageError(f"--{name} needs a value")
            settings[name] = values[0]
            out += values[1:]
    for opt, values in lists.items():
        for value in values:
            out += [opt, value]
    return out, settings


def _option_names(own: dict[str, click.Parameter]) -> set[str]:
    return {opt[2:].replace("-", "_") for opt in own if opt.startswith("--")}


class TrlCommand(click.Command):
    """A click command that first reads its words as `split_argv` does; the TRL settings it collects reach the
    callback as `trl_flags` (hpcmem.cli.options.collect merges them with the flags)."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        own = {opt: p for p in self.params if isinstance(p, click.Option) for opt in p.opts}
        ctx.meta["trl_trainer"] = next((w for w in args if w in names()), None)
        words, settings = split_argv(list(args), own)
        rest = super().parse_args(ctx, words)
        ctx.params["trl_flags"] = settings
        return rest

    def format_epilog(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """Below the options: the TRL fields the trainer's classes add as flags (`hpcmem estimate sft --help`)."""
        super().format_epilog(ctx, formatter)
        trainer = ctx.meta.get("trl_trainer")
        own = {opt[2:].replace("-", "_") for p in self.params if isinstance(p, click.Option) for opt in p.opts}
        with formatter.section("TRL fields"):
            if trainer is None:
                formatter.write_text("Every field of the trainer's TRL classes is also a flag, read as `trl <trainer>` "
                                     "reads it; `hpcmem estimate sft --help` lists SFT's.")
                return
            e = entry(trainer)
            extra = sorted(trainer_fields(trainer) - own)
            formatter.write_text(f"Also flags, as `trl {trainer}` reads them ({e.config_class}, ModelConfig, "
                                 f"TrainingArguments, {e.script_class}, DatasetMixtureConfig), with TRL's defaults: "
                                 "listed back as ignored when they have no memory effect, refused when hpcmem cannot "
                                 "model a value other than TRL's default.")
            defaults = trl_defaults(trainer)
            formatter.write_dl([(f"--{name}", f"(default {shown(defaults[name])})" if name in defaults else "")
                                for name in extra])
