"""Declared job parameters: a job's ``Params`` dataclass, checked against ``--param``.

A job declares the parameters it takes as a dataclass, the type of
``build``'s one argument; each field is a parameter, its type the value's
type, its default the default (no default: required), and an
``Annotated[..., "help"]`` string its help::

    @dataclass(frozen=True)
    class Params:
        input: Annotated[str, "directory of Parquet files"]
        max_files_per_batch: Annotated[int | None, "files per batch (none: no cap)"] = None

    def build(params: Params) -> mb.DataStreamWriter: ...

Types: ``str``, ``int``, ``float``, ``bool`` (true/false, yes/no, 1/0),
``Path``, ``Literal["a", "b"]``, any of them ``| None`` (the value ``none`` or
an empty value is ``None``), and ``dict[str, str]``, which collects every
``--param NAME.KEY=VALUE`` into ``{KEY: VALUE}``.

``--param`` values are checked before ``build`` runs: an unknown name (with
the closest declared names), a missing required one, or a value of the wrong
type is a :class:`~microbatch.exceptions.JobError` naming the parameter and
what it expects; the CLI prints it and exits with code 2.
"""

from __future__ import annotations

import dataclasses
import difflib
import inspect
import types
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from microbatch.exceptions import JobError

_TRUE = {"true", "yes", "1", "on"}
_FALSE = {"false", "no", "0", "off"}
_NONE = {"", "none"}


@dataclass(frozen=True)
class ParamSpec:
    """One declared parameter: its name, what it accepts and its help."""

    name: str
    kind: Any
    """The value's type with ``None`` removed (``int``, ``Literal[...]``, ``dict``)."""
    optional: bool
    """``None`` is a valid value (the type is ``X | None``)."""
    required: bool
    default: Any
    help: str

    @property
    def type_name(self) -> str:
        """The accepted values as the help shows them: ``INT``, ``a|b``, ``KEY=VALUE``."""
        if typing.get_origin(self.kind) is Literal:
            return "|".join(map(str, typing.get_args(self.kind)))
        if self.kind is dict:
            return "KEY=VALUE"
        name = {str: "TEXT", int: "INT", float: "FLOAT", bool: "BOOL", Path: "PATH"}[self.kind]
        return f"{name}|none" if self.optional else name

    @property
    def usage(self) -> str:
        """How the parameter is given: ``--param NAME=INT`` (``NAME.KEY=VALUE`` for a dict)."""
        return f"{self.name}.{self.type_name}" if self.kind is dict else (
            f"{self.name}={self.type_name}")

    def convert(self, text: str) -> Any:
        """``text`` as this parameter's type; raises ``ValueError`` saying what it expects."""
        if self.optional and text.strip().lower() in _NONE:
            return None
        kind = self.kind
        if typing.get_origin(kind) is Literal:
            choices = typing.get_args(kind)
            if text not in choices:
                raise ValueError(f"one of {', '.join(map(repr, choices))}")
            return text
        if kind is bool:
            word = text.strip().lower()
            if word not in _TRUE | _FALSE:
                raise ValueError("true or false")
            return word in _TRUE
        if kind in (int, float):
            try:
                return kind(text)
            except ValueError:
                raise ValueError("an integer" if kind is int else "a number") from None
        return Path(text) if kind is Path else text


def declared(build: Callable[..., Any]) -> type | None:
    """The ``Params`` dataclass ``build`` takes, or ``None`` for ``build(params: dict)``."""
    try:
        parameters = list(inspect.signature(build).parameters.values())
        hints = typing.get_type_hints(build)
    except (TypeError, ValueError, NameError):
        return None
    if not parameters:
        return None
    hint = hints.get(parameters[0].name)
    return hint if isinstance(hint, type) and dataclasses.is_dataclass(hint) else None


def specs(cls: type) -> list[ParamSpec]:
    """The parameters the dataclass ``cls`` declares, in field order.

    Raises :class:`JobError` for a field of a type ``--param`` cannot give.
    """
    hints = typing.get_type_hints(cls, include_extras=True)
    result = []
    for field in dataclasses.fields(cls):
        hint, help_text = hints[field.name], ""
        if typing.get_origin(hint) is typing.Annotated:
            hint, *extras = typing.get_args(hint)
            help_text = next((e for e in extras if isinstance(e, str)), "")
        args = typing.get_args(hint)
        optional = typing.get_origin(hint) in (typing.Union, types.UnionType) and type(None) in args
        kind = next(a for a in args if a is not type(None)) if optional else hint
        if typing.get_origin(kind) is dict:
            kind = dict
        if not (kind in (str, int, float, bool, Path, dict) or typing.get_origin(kind) is Literal):
            raise JobError(
                f"parameter {field.name!r} of {cls.__qualname__} is of type {hint}, which "
                "--param cannot give; use str, int, float, bool, Path, Literal[...], "
                "dict[str, str], or one of them | None"
            )
        factory = field.default_factory
        has_default = field.default is not dataclasses.MISSING or callable(factory)
        default = (field.default if field.default is not dataclasses.MISSING
                   else factory() if callable(factory) else None)
        result.append(ParamSpec(field.name, kind, optional, not has_default, default, help_text))
    return result


def parse(cls: type, given: Mapping[str, str], *, job: str) -> Any:
    """An instance of ``cls`` from the ``--param`` values ``given``.

    Raises :class:`JobError` naming the parameter for an unknown name (with
    the closest declared ones), a missing required one or a value that is
    not of its type.
    """
    declared_specs = {spec.name: spec for spec in specs(cls)}
    values: dict[str, Any] = {}
    for key, text in given.items():
        name, _, sub = key.partition(".")
        spec = declared_specs.get(key)
        group = declared_specs.get(name)
        if spec is None and sub and group is not None and group.kind is dict:
            spec = group
        if spec is not None and spec.kind is dict and spec.name == key:
            raise JobError(f"--param {key}={text!r} for job {job}: {key} takes one "
                           f"--param {key}.KEY=VALUE per key ({spec.help})")
        if spec is None:
            raise JobError(_unknown(key, declared_specs, job))
        if spec.kind is dict:
            values.setdefault(spec.name, {})[sub] = text
            continue
        try:
            values[spec.name] = spec.convert(text)
        except ValueError as exc:
            about = f" ({key}: {spec.help})" if spec.help else ""
            raise JobError(
                f"--param {key}={text!r} for job {job}: expected {exc}"
                f"{' or none' if spec.optional else ''}, got {text!r}{about}"
            ) from None
    missing = [s for s in declared_specs.values() if s.required and s.name not in values]
    if missing:
        raise JobError(
            f"job {job} needs " + " and ".join(f"--param {s.usage}" for s in missing)
            + f"; `microbatch run {job} --help` lists its parameters"
        )
    return cls(**values)


def _unknown(key: str, declared_specs: Mapping[str, ParamSpec], job: str) -> str:
    names = [s.name if s.kind is not dict else f"{s.name}.KEY" for s in declared_specs.values()]
    close = difflib.get_close_matches(key, list(declared_specs), n=3, cutoff=0.6)
    hint = f"did you mean {' or '.join(repr(c) for c in close)}? " if close else ""
    return (
        f"unknown --param {key!r} for job {job}: {hint}it takes "
        f"{', '.join(names) or 'no parameters'} (`microbatch run {job} --help` lists them)"
    )


def help_rows(cls: type) -> list[tuple[str, str, str]]:
    """``(usage, default, help)`` per parameter, for ``microbatch run JOB --help``."""
    rows = []
    for spec in specs(cls):
        default = ("required" if spec.required else "" if spec.kind is dict
                   else f"default: {'none' if spec.default is None else spec.default}")
        rows.append((f"--param {spec.usage}", default, spec.help))
    return rows


__all__ = ["ParamSpec", "declared", "help_rows", "parse", "specs"]
