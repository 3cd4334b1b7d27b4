"""Where in a SQL script something is, and the errors that say so.

Every error of a script names the file, line and column (1-based) of the
construct it refuses, as a :class:`~microbatch.SQLError` (the CLI prints it
as one paragraph, exit code 2).
"""

from __future__ import annotations

from microbatch.exceptions import SQLError
from microbatch.sql.parse import line_column

__all__ = ["DeclarationError", "ScriptError", "line_column", "script_error"]


class ScriptError(SQLError):
    """A :class:`~microbatch.SQLError` whose message already starts with
    ``FILE:LINE:COLUMN:`` of the script as written (``line`` and ``column``
    are those of the script; ``0`` when the problem has no place in it, such
    as an unused ``--param``)."""

    def __init__(self, problem: str, *, file: str, line: int, column: int, construct: str,
                 fix: str) -> None:
        super().__init__(problem, line=line, column=column, construct=construct, fix=fix)
        self.file = file
        where = f"{file}:{line}:{column}" if line else file
        self.args = (f"{where}: {problem} {fix}".rstrip(),)

    def __str__(self) -> str:
        return str(self.args[0])

    def __reduce__(self) -> tuple[object, ...]:
        """Pickle with the keyword fields."""
        return (_script_error, ((self.problem, self.file, self.line, self.column,
                                 self.construct, self.fix),))


def _script_error(fields: tuple[str, str, int, int, str, str]) -> ScriptError:
    problem, file, line, column, construct, fix = fields
    return ScriptError(problem, file=file, line=line, column=column, construct=construct,
                       fix=fix)


class DeclarationError(SQLError):
    """A :class:`~microbatch.SQLError` of a declaration (``CREATE TABLE``, its
    options): its message names the table and the option itself."""


def script_error(message: str, *, line: int | None, column: int | None,
                 construct: str, fix: str = "") -> SQLError:
    """A :class:`~microbatch.SQLError` about ``construct`` at ``line``:``column``
    of the text being compiled (``message`` may carry the fix)."""
    return DeclarationError(message, line=line or 1, column=column or 1, construct=construct,
                            fix=fix)
