"""Column names as a query spells them: a string or ``pl.col(name)``.

A leaf module (it imports no plan module) so that windows and schemas can
both use it without an import cycle.
"""

from __future__ import annotations

import polars as pl

from microbatch.exceptions import PlanError

__all__ = ["column_name"]


def column_name(key: str | pl.Expr, where: str) -> str:
    """A column name given as a string or as ``pl.col(name)`` (a Polars habit);
    any other expression is refused with the fix (add it as a column first)."""
    if isinstance(key, str):
        return key
    if isinstance(key, pl.Expr) and key.meta.is_column():
        return key.meta.output_name()
    raise PlanError(
        f"{where} takes a column name or pl.col(name), not the expression {key}; "
        f"add it as a column first, e.g. .with_columns(k={key}) and then {where}(\"k\")"
    )
