"""The `hpcmem` command group. Subcommands load lazily so `hpcmem --help` and `hpcmem estimate` stay fast."""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys

import click

from hpcmem.cli.extras import EXTRAS, missing_extra
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
    "calibrate": "calibrate",
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


def _escaped(text: str) -> str:
    """A message as one line: control characters a user's value or file name brought in are shown escaped."""
    return "".join(c.encode("unicode_escape").decode("ascii") if ord(c) < 32 or 127 <= ord(c) < 160 else c
                   for c in text)


def _say(text: str) -> None:
    click.echo(f"hpcmem: error: {text}", err=True)


def run(argv: list[str] | None = None) -> int:
    """Run one command; returns the exit status. Every failure prints one line (or one line per gathered problem) to
    stderr, never a traceback: 2 for bad input, 130 for Ctrl-C, 70 (EX_SOFTWARE) for a bug in hpcmem itself."""
    args = sys.argv[1:] if argv is None else list(argv)
    if any("\x00" in a for a in args):        # no exec'd argv holds one; a caller's list could, and os.stat raises
        _say("an argument holds a NUL character")
        return 2
    try:
        # standalone_mode=False: click raises usage errors and *returns* the status of ctx.exit(n)
        status = cli.main(args=args, prog_name="hpcmem", standalone_mode=False)
    except click.exceptions.Abort:
        click.echo("aborted", err=True)
        return 130
    except click.exceptions.Exit as exc:
        return exc.exit_code
    except getattr(click.exceptions, "NoArgsIsHelpError", ()) as exc:   # a bare group: its help, as click shows it
        exc.show()
        return exc.exit_code
    except click.UsageError as exc:          # one line: the flag, the value and the rule, then where to look
        where = f" (see `{exc.ctx.command_path} --help`)" if exc.ctx is not None else ""
        _say(f"{_escaped(' '.join(exc.format_message().split()))}{where}")
        return exc.exit_code
    except click.ClickException as exc:
        _say(_escaped(" ".join(exc.format_message().split())))
        return exc.exit_code
    except HpcmemError as exc:
        if getattr(exc, "report", None) is not None:      # submit's refusal: the numbers, then one fix per line
            _say(str(exc))
            return 2
        problems = [_escaped(p) for p in (getattr(exc, "problems", None) or [str(exc)])]
        _say(problems[0] if len(problems) == 1 else "\n" + "\n".join(f"- {p}" for p in problems))
        return 2
    except KeyboardInterrupt:
        click.echo("aborted", err=True)
        return 130
    except ModuleNotFoundError as exc:
        if exc.name is None or exc.name.split(".")[0] not in EXTRAS:
            return _bug(exc)
        _say(missing_extra(exc.name.split(".")[0], args))
        return 2
    except Exception as exc:  # noqa: BLE001 - a bug: one line for the user, the traceback on request
        return _bug(exc)
    return status if isinstance(status, int) else 0


def _bug(exc: BaseException) -> int:
    if os.environ.get("HPCMEM_DEBUG"):
        raise exc
    first = (str(exc).splitlines() or [""])[0][:200]
    _say(f"internal error ({type(exc).__name__}: {first}); this is a bug in hpcmem — rerun with "
         "HPCMEM_DEBUG=1 for the traceback and report it")
    return 70


def main() -> None:
    sys.exit(run())
