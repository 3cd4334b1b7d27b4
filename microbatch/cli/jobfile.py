"""Loading job files: a Python file whose ``build(params)`` returns an unstarted writer.

A job file is what ``microbatch run JOB.py`` runs. It declares the
parameters it takes as a dataclass, the type of ``build``'s argument::

    from dataclasses import dataclass
    from typing import Annotated
    import polars as pl
    import microbatch as mb

    @dataclass(frozen=True)
    class Params:
        input: Annotated[str, "directory of JSON files"]            # no default: required
        output: Annotated[str, "Parquet output directory"] = "out"
        min_amount: Annotated[float, "smallest amount kept"] = 0.0

    def build(params: Params) -> mb.DataStreamWriter:
        return (
            mb.read_files(params.input, format="json")
            .filter(pl.col("amount") > params.min_amount)
            .write_parquet(params.output)      # no .start(): the CLI starts it
        )

``microbatch run JOB.py --help`` lists the declared parameters; the
``--param NAME=VALUE`` values are checked before ``build`` runs (an unknown
name, with "did you mean"; a missing required one; a value not of its type:
exit code 2). The types a field may have are in :mod:`microbatch.cli.params`.

A job whose ``build`` takes ``params: dict[str, str]`` (or no annotation)
declares nothing: it still runs, gets every ``--param`` as a string,
unchecked, and ``run`` prints a note saying so when ``--param`` is given.

Every way a job file can be wrong becomes a :class:`~microbatch.JobError`
whose message names the file (and the line, when there is one) and says what
to change; the CLI prints it without a traceback.

The job's directory is put on ``sys.path`` (as ``python JOB.py`` would), so a
job can import helper modules that sit next to it.
"""

from __future__ import annotations

import importlib.util
import inspect
import itertools
import os
import sys
import traceback
from collections.abc import Callable, Mapping
from pathlib import Path
from types import ModuleType
from typing import Any

from microbatch.api.writer import DataStreamWriter
from microbatch.cli import params as params_module
from microbatch.exceptions import JobError

_module_numbers = itertools.count()

_BUILD_SHAPE = "def build(params: dict[str, str]) -> mb.DataStreamWriter"


def load_job(path: str | os.PathLike[str]) -> ModuleType:
    """Import the job file at ``path`` as a fresh module and return it.

    Each call imports the file again under a unique module name, so two jobs
    with the same file name never collide. Raises :class:`JobError` when the
    file is missing, is not a ``.py`` file, has a syntax error, or raises
    while it is imported (an ``ImportError`` of a missing package, say).
    """
    file = Path(path).expanduser()
    if not file.exists():
        raise JobError(f"job file {file} does not exist")
    if file.is_dir():
        raise JobError(f"job file {file} is a directory; pass the path of a .py file")
    if file.suffix != ".py":
        raise JobError(
            f"job file {file} is not a Python file (.py); a job is a .py file defining "
            f"`{_BUILD_SHAPE}`"
        )
    file = file.resolve()
    name = f"_microbatch_job_{_identifier(file.stem)}_{next(_module_numbers)}"
    spec = importlib.util.spec_from_file_location(name, file)
    if spec is None or spec.loader is None:  # pragma: no cover - only for odd loaders
        raise JobError(f"cannot load job file {file} as a Python module")
    module = importlib.util.module_from_spec(spec)
    job_dir = str(file.parent)
    if job_dir not in sys.path:
        sys.path.insert(0, job_dir)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except SyntaxError as exc:
        sys.modules.pop(name, None)
        where = f"{exc.filename or file}:{exc.lineno}" if exc.lineno else str(file)
        raise JobError(f"syntax error in job file {where}: {exc.msg}") from None
    except ImportError as exc:
        sys.modules.pop(name, None)
        raise JobError(
            f"job file {file} failed to import{job_line(exc, file)}: "
            f"{type(exc).__name__}: {exc}. Install the missing package in this environment, "
            "or fix the import."
        ) from exc
    except Exception as exc:
        sys.modules.pop(name, None)
        raise JobError(
            f"job file {file} raised {type(exc).__name__} while being imported"
            f"{job_line(exc, file)}: {exc}"
        ) from exc
    return module


def build_writer(path: str | os.PathLike[str], params: dict[str, str], *,
                 note: Callable[[str], None] | None = None) -> DataStreamWriter:
    """Load the job at ``path``, call its ``build(params)`` and check the result.

    A job that declares a ``Params`` dataclass gets one built from ``params``
    (checked first); an undeclared job gets the dict, and ``note`` is called
    with a sentence saying so when ``params`` is not empty and build succeeded.
    Returns the unstarted :class:`~microbatch.DataStreamWriter`. Raises
    :class:`JobError` when the job has no callable ``build`` taking one
    argument, when ``build`` raises (naming the exception and the job's
    line), or when it returns anything but an unstarted writer.
    """
    module = load_job(path)
    file = Path(module.__file__ or str(path))
    build = getattr(module, "build", None)
    if build is None:
        raise JobError(f"job file {file} has no `build` function; define `{_BUILD_SHAPE}`")
    if not callable(build):
        raise JobError(
            f"`build` in job file {file} is of type {type(build).__name__}, not a function; "
            f"define `{_BUILD_SHAPE}`"
        )
    _check_signature(build, file)
    declared = job_params(build, file)
    arguments: Any = dict(params) if declared is None else job_params_parse(
        declared, params, file)
    try:
        result = build(arguments)
    except JobError as exc:  # the job's own message for a bad parameter: keep it as is
        raise JobError(f"job {file}: {exc}") from exc
    except Exception as exc:
        raise JobError(_build_failed_message(exc, file, params)) from exc
    if isinstance(result, DataStreamWriter):
        if declared is None and params and note is not None:  # after errors: one message
            note(f"job {_shown(file)} declares no Params dataclass: its --param values "
                 f"({', '.join(sorted(params))}) are passed to build() unchecked")
        return result
    raise JobError(_wrong_result_message(result, file))


def job_params(build: Any, file: Path) -> type | None:
    """The ``Params`` dataclass ``build`` declares, or ``None`` for an undeclared job.

    Raises :class:`JobError` when it declares a parameter ``--param`` cannot give.
    """
    cls = params_module.declared(build)
    if cls is not None:
        try:
            params_module.specs(cls)
        except JobError as exc:
            raise JobError(f"job file {file}: {exc}") from None
    return cls


def job_params_parse(cls: type, params: Mapping[str, str], file: Path) -> Any:
    """``cls`` built from the ``--param`` values; :class:`JobError` names a wrong one."""
    return params_module.parse(cls, params, job=_shown(file))


def declared_params(path: str | os.PathLike[str]) -> type | None:
    """The ``Params`` dataclass the job file at ``path`` declares (``None``: none)."""
    module = load_job(path)
    build = getattr(module, "build", None)
    return job_params(build, Path(module.__file__ or str(path))) if callable(build) else None


def _shown(file: Path) -> str:
    """``file`` relative to the working directory when it is under it (for messages)."""
    try:
        return str(file.relative_to(Path.cwd()))
    except ValueError:
        return str(file)


def _identifier(text: str) -> str:
    return "".join(ch if ch.isalnum() else "_" for ch in text)


def _check_signature(build: Any, file: Path) -> None:
    try:
        signature = inspect.signature(build)
    except (TypeError, ValueError):  # builtins and odd callables: just call them
        return
    try:
        signature.bind({})
    except TypeError:
        raise JobError(
            f"`build{signature}` in job file {file} must accept exactly one argument, the "
            f"parameters given with --param; define `{_BUILD_SHAPE}`"
        ) from None


def job_line(exc: BaseException, file: Path) -> str:
    """`` at FILE:LINE (`code`)`` for the innermost frame of ``exc`` in the job file."""
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if Path(f.filename) == file]
    if not frames:
        return ""
    frame = frames[-1]
    code = f" `{frame.line.strip()}`" if frame.line else ""
    return f" at {file}:{frame.lineno}{code}"


def _build_failed_message(exc: Exception, file: Path, params: dict[str, str]) -> str:
    message = f"build() in job file {file} raised {type(exc).__name__}{job_line(exc, file)}: {exc}"
    if isinstance(exc, KeyError) and exc.args and isinstance(exc.args[0], str):
        given = ", ".join(sorted(params)) or "none"
        message += (
            f". Is a parameter missing? Pass it with --param {exc.args[0]}=VALUE "
            f"(parameters given: {given})"
        )
    return message


def _wrong_result_message(result: object, file: Path) -> str:
    from microbatch.api.query import StreamingQuery
    from microbatch.api.stream import Stream

    if isinstance(result, StreamingQuery):
        result.stop()
        return (
            f"build() in job file {file} returned a started StreamingQuery; return the "
            "writer without calling .start(), e.g. `return stream.write_parquet(path)`: "
            "`microbatch run` starts it with --checkpoint and --trigger"
        )
    if isinstance(result, Stream):
        return (
            f"build() in job file {file} returned a Stream with no sink; attach one and "
            "return the unstarted writer, e.g. `return stream.write_parquet(params['output'])` "
            "(without .start())"
        )
    return (
        f"build() in job file {file} returned {type(result).__name__} ({_short_repr(result)}); "
        "it must return an unstarted DataStreamWriter, e.g. "
        "`return stream.write_parquet(params['output'])` (without .start())"
    )


def _short_repr(value: object, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
