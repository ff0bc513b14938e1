"""The `hpcmem` command group. Subcommands load lazily so `hpcmem --help` and `hpcmem estimate` stay fast."""

from __future__ import annotations

import importlib
import importlib.util
import sys

import click

from hpcmem.errors import HpcmemError

# name -> module under hpcmem.cli holding a click command called `command`
COMMANDS = {
    "estimate": "estimate",
    "trace": "trace",
    "probe": "probe",
    "validate": "validate",
    "plan": "plan",
    "lengths": "lengths",
    "submit": "submit",
    "presets": "presets",
    "status": "status",
    "logs": "logs",
    "gpus": "gpus",
    "models": "models",
}


class LazyGroup(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(name for name, mod in COMMANDS.items() if importlib.util.find_spec(f"hpcmem.cli.{mod}"))

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        mod = COMMANDS.get(name)
        if mod is None or importlib.util.find_spec(f"hpcmem.cli.{mod}") is None:
            return None
        return importlib.import_module(f"hpcmem.cli.{mod}").command


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 110})
@click.version_option(package_name="hpcmem")
def cli() -> None:
    """GPU memory for TRL fine-tuning: estimate, trace, probe, validate, plan and launch on SLURM."""


def main() -> None:
    try:
        cli.main(standalone_mode=False)
    except click.exceptions.Abort:
        click.echo("aborted", err=True)
        sys.exit(130)
    except click.ClickException as exc:
        exc.show()
        sys.exit(exc.exit_code)
    except HpcmemError as exc:
        problems = getattr(exc, "problems", None) or [str(exc)]
        text = problems[0] if len(problems) == 1 else "\n" + "\n".join(f"- {p}" for p in problems)
        click.echo(f"hpcmem: error: {text}", err=True)
        sys.exit(2)
    except click.exceptions.Exit as exc:
        sys.exit(exc.exit_code)
