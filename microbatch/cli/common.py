"""What the commands share: the Typer app and its global options, the user-error
type and how it is printed (one red paragraph, exit code 2), ``--param`` parsing."""

from __future__ import annotations

import logging
import sys
from typing import Annotated, Any

import typer
from rich.markup import escape
from typer.core import TyperCommand

from microbatch._deprecation import issue_deprecation_warning
from microbatch.cli.display import (
    err,
    out,
)
from microbatch.exceptions import USER_ERRORS, MicrobatchError

app = typer.Typer(
    name="microbatch",
    help="Micro-batch stream processing on Arrow and Polars.",
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)




class CliError(MicrobatchError):
    """A problem the user can fix; printed as one paragraph, exit code ``code``."""

    def __init__(self, message: str, code: int = 2) -> None:
        super().__init__(message)
        self.code = code


def fail(message: str, code: int) -> typer.Exit:
    err.print(f"[bold red]error:[/] [red]{escape(message)}[/]", soft_wrap=True)
    return typer.Exit(code)


def user_errors() -> tuple[type[BaseException], ...]:
    """Deprecated: use :data:`microbatch.exceptions.USER_ERRORS`."""
    issue_deprecation_warning(
        "microbatch.cli.common.user_errors() is renamed microbatch.exceptions.USER_ERRORS; "
        "the old name will be removed in microbatch 0.3",
        version="0.2.0",
    )
    return USER_ERRORS


# ------------------------------------------------------------------ globals


def _show_version(value: bool) -> None:
    if value:
        from microbatch import __version__

        out.print(f"microbatch {__version__}")
        raise typer.Exit(0)


def _setup_logging(verbose: int) -> None:
    level = logging.WARNING if verbose == 0 else logging.INFO if verbose == 1 else logging.DEBUG
    logging.basicConfig(
        level=level,
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        force=True,
    )
    if verbose == 0:
        # The query thread logs a failure with its traceback; the CLI reports
        # the failure itself in one paragraph, and shows the traceback with -v.
        logging.getLogger("microbatch.api.query").setLevel(logging.CRITICAL)


@app.callback()
def _main(
    version: Annotated[
        bool,
        typer.Option("--version", callback=_show_version, is_eager=True,
                     help="Print the version and exit."),
    ] = False,
    verbose: Annotated[
        int,
        typer.Option("--verbose", "-v", count=True,
                     help="More logging: -v info, -vv debug (and tracebacks of failed queries)."),
    ] = 0,
) -> None:
    """Micro-batch stream processing on Arrow and Polars."""
    _setup_logging(verbose)


# ------------------------------------------------------------------ job help


class JobCommand(TyperCommand):
    """A command taking ``JOB.py`` and ``--param``: its ``--help`` ends with the
    parameters the job declares (``microbatch run JOB.py --help``)."""

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        """Note the raw arguments: ``--help`` is handled before JOB is parsed."""
        ctx.meta["microbatch.raw_args"] = list(args)
        return super().parse_args(ctx, args)

    def format_help(self, ctx: Any, formatter: Any) -> None:
        """The command's help, then the job's parameters when a job file is given."""
        super().format_help(ctx, formatter)
        raw = ctx.meta.get("microbatch.raw_args", [])
        job = next((a for a in raw if a.endswith(".py") and not a.startswith("-")), None)
        if job is not None:
            out.print(job_params_help(job), soft_wrap=True)


def job_params_help(job: str) -> str:
    """The parameters ``job`` declares, as ``--help`` lists them (Rich markup)."""
    from microbatch.cli.jobfile import declared_params
    from microbatch.cli.params import help_rows

    try:
        cls = declared_params(job)
    except MicrobatchError as exc:
        return f"\n[red]cannot list the parameters of {escape(job)}: {escape(str(exc))}[/]"
    if cls is None:
        return (f"\n{escape(job)} declares no parameters (build takes a dict): every "
                "--param KEY=VALUE is passed to build() as a string, unchecked.")
    rows = help_rows(cls)
    if not rows:
        return f"\n{escape(job)} takes no parameters."
    width = max(len(usage) for usage, _, _ in rows)
    lines = [f"\n[bold]Parameters of {escape(job)}[/] (--param NAME=VALUE):"]
    for usage, default, text in rows:
        tail = "; ".join(part for part in (text, default) if part)
        lines.append(f"  [cyan]{escape(usage.ljust(width))}[/]  {escape(tail)}")
    return "\n".join(lines)


# ------------------------------------------------------------------ helpers


def parse_params(items: list[str]) -> dict[str, str]:
    """``["k=v", ...]`` as a dict; a later value for the same key wins."""
    params: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise CliError(
                f"--param {item!r} is not of the form KEY=VALUE (e.g. --param output=out/dir)"
            )
        params[key.strip()] = value
    return params




__all__ = ["CliError", "JobCommand", "app", "fail", "job_params_help", "parse_params",
           "user_errors"]
