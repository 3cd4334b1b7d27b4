"""``${NAME}`` in a SQL script, replaced by ``--param NAME=VALUE`` values.

The substitution is textual and happens before the script is parsed, so a
parameter may stand for a path, a number, a duration or a whole identifier::

    CREATE TABLE tx (...) WITH ('connector' = 'files', 'path' = '${input}');

Guarantees:

- every ``${NAME}`` must have a value, and every value given must be used: a
  missing name and an unknown one are both refused (an unknown one is almost
  always a typo), the first with the line and column of its ``${``;
- ``NAME`` is an identifier (letters, digits, ``_``, ``.`` and ``-``); a ``${``
  without its ``}`` or with anything else inside is refused where it starts;
- ``$${`` stands for a literal ``${`` (nothing is substituted there);
- positions in the substituted text map back to the script as written
  (:meth:`Substituted.position`), so every later error (a parse error, an
  unknown option, a refused query) names the line and column the user sees in
  their file, not in the expanded text.
"""

from __future__ import annotations

import bisect
import difflib
import re
from collections.abc import Mapping
from dataclasses import dataclass

from microbatch.sql.positions import ScriptError, line_column

__all__ = ["Substituted", "substitute"]

_REFERENCE = re.compile(r"\$\$\{|\$\{([A-Za-z_][A-Za-z0-9_.\-]*)\}|\$\{")


@dataclass(frozen=True)
class Substituted:
    """A script after substitution: ``text`` and the map back to ``original``."""

    original: str
    text: str
    _new_starts: tuple[int, ...] = ()
    """Start offset in ``text`` of each replaced span, ascending."""
    _spans: tuple[tuple[int, int, int], ...] = ()
    """``(new_start, new_end, original_start)`` of each replaced span."""

    def original_offset(self, offset: int) -> int:
        """The offset in ``original`` of character ``offset`` of ``text``.

        Inside a substituted value it is the ``${`` of the reference.
        """
        i = bisect.bisect_right(self._new_starts, offset) - 1
        if i < 0:
            return offset
        _, new_end, original_start = self._spans[i]
        if offset < new_end:
            return original_start
        original_end = self._original_end(i)
        return original_end + (offset - new_end)

    def _original_end(self, i: int) -> int:
        original_start = self._spans[i][2]
        # the original span's length: the reference text (found again by the regex)
        match = _REFERENCE.match(self.original, original_start)
        assert match is not None
        return match.end()

    def position(self, offset: int) -> tuple[int, int]:
        """``(line, column)`` in the script as written of ``offset`` in ``text``."""
        return line_column(self.original, self.original_offset(offset))


def substitute(text: str, params: Mapping[str, str], *, file: str = "<script>") -> Substituted:
    """Replace every ``${NAME}`` of ``text`` with ``params[NAME]``.

    Raises :class:`~microbatch.SQLError` for a reference without a value, a
    malformed ``${``, or a parameter in ``params`` the script never uses.
    """
    pieces: list[str] = []
    spans: list[tuple[int, int, int]] = []
    used: set[str] = set()
    length = 0
    cursor = 0
    for match in _REFERENCE.finditer(text):
        before = text[cursor:match.start()]
        pieces.append(before)
        length += len(before)
        token = match.group(0)
        if token == "$${":
            value = "${"
        elif match.group(1) is None:
            line, column = line_column(text, match.start())
            end = text.find("}", match.start())
            inside = text[match.start():end + 1] if end != -1 else "${"
            raise ScriptError(
                f"{inside!r} is not a parameter reference.", file=file, line=line,
                column=column, construct=inside,
                fix="Write ${NAME} with NAME made of letters, digits, '_', '.' or '-' (and a "
                    "closing '}'), or $${ for a literal ${.",
            )
        else:
            name = match.group(1)
            if name not in params:
                line, column = line_column(text, match.start())
                close = difflib.get_close_matches(name, list(params), n=1, cutoff=0.6)
                hint = f" (given: {close[0]!r}, a typo?)" if close else ""
                raise ScriptError(
                    f"${{{name}}} has no value{hint}.", file=file, line=line, column=column,
                    construct=token, fix=f"Pass --param {name}=VALUE.",
                )
            used.add(name)
            value = params[name]
        spans.append((length, length + len(value), match.start()))
        pieces.append(value)
        length += len(value)
        cursor = match.end()
    pieces.append(text[cursor:])
    unused = sorted(set(params) - used)
    if unused:
        names = sorted({m.group(1) for m in _REFERENCE.finditer(text) if m.group(1)})
        close = difflib.get_close_matches(unused[0], names, n=1, cutoff=0.6)
        hint = f"Did you mean {close[0]!r}? " if close else ""
        raise ScriptError(
            f"unknown --param {unused[0]!r}: the script has no ${{{unused[0]}}}.", file=file,
            line=0, column=0, construct=f"--param {unused[0]}",
            fix=f"{hint}It uses {', '.join(names) or 'no parameters'}; pass only those.",
        )
    return Substituted(
        original=text,
        text="".join(pieces),
        _new_starts=tuple(s[0] for s in spans),
        _spans=tuple(spans),
    )
