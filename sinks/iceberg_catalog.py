"""Iceberg catalogs and tables, resolved the same way by the sink, the source and the CLI.

A *catalog* is given in one of three forms (what a PyIceberg user already has):

- a ``pyiceberg.catalog.Catalog`` object (a notebook that built its own);
- a mapping of PyIceberg catalog properties, e.g. ``{"type": "sql", "uri":
  "sqlite:///lake/iceberg.db", "warehouse": "file:///lake/warehouse"}``;
- a string: ``sqlite:///PATH.db`` (or another SQLAlchemy URL: a SQL catalog whose
  warehouse defaults to ``warehouse/`` beside the database file), ``http(s)://HOST``
  (a REST catalog), or the name of a catalog configured for PyIceberg
  (``~/.pyiceberg.yaml`` or ``PYICEBERG_CATALOG__<NAME>__*`` variables).

``storage_options`` accepts the delta-rs keys the Delta sink takes
(``AWS_ENDPOINT_URL``, ``AWS_ACCESS_KEY_ID``, ...), so one set of options serves
both formats, as well as PyIceberg's own ``s3.*`` properties; they become the
catalog's FileIO properties.

This module never imports ``microbatch`` (the sinks layer sits below it).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sinks.exceptions import SinkConfigError

if TYPE_CHECKING:
    from pyiceberg.catalog import Catalog
    from pyiceberg.table import Table

__all__ = [
    "CatalogSpec",
    "IcebergUnavailableError",
    "catalog_label",
    "fileio_properties",
    "load_iceberg_table",
    "require_pyiceberg",
    "resolve_catalog",
    "table_identifier",
]

CatalogSpec = Any
"""A ``pyiceberg.catalog.Catalog``, a mapping of catalog properties, or a string
(``sqlite:///PATH.db``, ``http(s)://...``, or a configured catalog's name)."""

INSTALL_HINT = "install the Iceberg extra: pip install 'microbatch[iceberg]'"

_DELTA_TO_PYICEBERG = {
    "AWS_ENDPOINT_URL": "s3.endpoint",
    "AWS_ENDPOINT": "s3.endpoint",
    "AWS_ACCESS_KEY_ID": "s3.access-key-id",
    "AWS_SECRET_ACCESS_KEY": "s3.secret-access-key",
    "AWS_SESSION_TOKEN": "s3.session-token",
    "AWS_REGION": "s3.region",
    "AWS_DEFAULT_REGION": "s3.region",
}
"""delta-rs storage option -> PyIceberg FileIO property. Options without an
Iceberg meaning (``AWS_ALLOW_HTTP``: the endpoint's scheme says it;
``AWS_S3_ALLOW_UNSAFE_RENAME``: Iceberg never renames) are dropped."""
_DELTA_ONLY = {"AWS_ALLOW_HTTP", "AWS_S3_ALLOW_UNSAFE_RENAME", "AWS_CONDITIONAL_PUT"}


class IcebergUnavailableError(SinkConfigError):
    """PyIceberg is not installed; the message says how to install it."""


def require_pyiceberg() -> None:
    """Raise :class:`IcebergUnavailableError` (naming the install command) without PyIceberg."""
    try:
        import pyiceberg  # noqa: F401
    except ImportError as exc:  # pragma: no cover - the test install has it
        raise IcebergUnavailableError(f"Iceberg tables need PyIceberg: {INSTALL_HINT}") from exc


def fileio_properties(storage_options: Mapping[str, str] | None) -> dict[str, str]:
    """PyIceberg FileIO properties for ``storage_options`` (delta-rs or ``s3.*`` keys).

    Unknown upper-case keys are refused, naming the key, rather than silently
    ignored (a misspelt endpoint would write to real AWS)."""
    props: dict[str, str] = {}
    for key, value in (storage_options or {}).items():
        if key in _DELTA_TO_PYICEBERG:
            props[_DELTA_TO_PYICEBERG[key]] = str(value)
        elif key.upper() in _DELTA_ONLY:
            continue
        elif key.isupper():
            raise SinkConfigError(
                f"storage option {key!r} has no Iceberg equivalent; use one of "
                f"{sorted(_DELTA_TO_PYICEBERG)} or a PyIceberg FileIO property (s3.endpoint, ...)"
            )
        else:
            props[key] = str(value)
    return props


def resolve_catalog(
    catalog: CatalogSpec, *, storage_options: Mapping[str, str] | None = None
) -> Catalog:
    """The PyIceberg catalog that ``catalog`` names (see the module docstring).

    A SQL catalog on a new SQLite file is created, with its tables; its
    warehouse directory is created on first write. Raises
    :class:`~sinks.exceptions.SinkConfigError` naming the catalog and the fix."""
    require_pyiceberg()
    from pyiceberg.catalog import Catalog as CatalogBase
    from pyiceberg.catalog import load_catalog

    extra = fileio_properties(storage_options)
    if isinstance(catalog, CatalogBase):
        if extra:
            catalog.properties.update(extra)
        return catalog
    try:
        if isinstance(catalog, Mapping):
            props = {str(k): str(v) for k, v in catalog.items()}
            name = props.pop("name", "default")
            return load_catalog(name, **{**props, **extra})
        if not isinstance(catalog, str) or not catalog:
            raise SinkConfigError(
                f"catalog={catalog!r}: give a pyiceberg Catalog, a mapping of catalog "
                "properties, or a string (sqlite:///PATH.db, http(s)://HOST, or a "
                "configured catalog's name)"
            )
        if catalog.startswith(("http://", "https://")):
            return _rest_catalog(catalog, extra)
        if "://" in catalog or catalog.startswith("sqlite:"):
            return load_catalog("sql", **{"type": "sql", "uri": catalog,
                                          "warehouse": _default_warehouse(catalog), **extra})
        return load_catalog(catalog, **extra)
    except SinkConfigError:
        raise
    except Exception as exc:
        raise SinkConfigError(
            f"cannot open Iceberg catalog {catalog_label(catalog)}: {_first_line(exc)} "
            "(check the catalog's URI, that its server runs, and its properties)"
        ) from exc


def _rest_catalog(uri: str, props: dict[str, str]) -> Catalog:
    """The REST catalog at ``uri``; opening it asks the server for its config, so a
    server that does not answer is named here, not at the first write."""
    import requests
    from pyiceberg.catalog import load_catalog

    try:
        return load_catalog("rest", **{"type": "rest", "uri": uri, **props})
    except requests.ConnectionError as exc:
        found = re.search(r"\[Errno -?\d+\] ([^'\")]+)", str(exc))
        reason = found.group(1).strip() if found else _first_line(exc)
        raise SinkConfigError(
            f"no Iceberg REST catalog answers at {uri} ({reason}): start the catalog's "
            "server, or fix the URL (scheme, host and port)"
        ) from exc


def _default_warehouse(uri: str) -> str:
    """``file://<dir of the SQLite file>/warehouse`` for a SQLite URL; other SQL
    databases have no directory, so they must say ``warehouse`` in a mapping."""
    if uri.startswith("sqlite:///"):
        db = Path(uri.removeprefix("sqlite:///")).expanduser()
        if not db.is_absolute():
            db = Path.cwd() / db
        db.parent.mkdir(parents=True, exist_ok=True)
        return (db.parent / "warehouse").as_uri()
    raise SinkConfigError(
        f"catalog {uri!r}: a SQL catalog other than SQLite needs its warehouse; pass "
        "catalog={'type': 'sql', 'uri': ..., 'warehouse': 's3://bucket/path'}"
    )


def table_identifier(table: str | tuple[str, ...]) -> tuple[str, ...]:
    """``"db.alerts"`` or ``("db", "alerts")`` as a namespace-qualified identifier."""
    parts = tuple(table.split(".")) if isinstance(table, str) else tuple(table)
    if len(parts) < 2 or not all(parts):
        raise SinkConfigError(
            f"Iceberg table {table!r} needs a namespace: write it as 'namespace.table' "
            "(e.g. 'lake.fraud_alerts')"
        )
    return parts


def load_iceberg_table(catalog: Catalog, table: str | tuple[str, ...]) -> Table | None:
    """The table, or None when the catalog has no such table (its namespace may
    be missing too). Other catalog failures raise :class:`SinkConfigError`."""
    from pyiceberg.exceptions import NoSuchNamespaceError, NoSuchTableError

    ident = table_identifier(table)
    try:
        return catalog.load_table(ident)
    except (NoSuchTableError, NoSuchNamespaceError):
        return None
    except Exception as exc:
        raise SinkConfigError(
            f"cannot load Iceberg table {'.'.join(ident)} from catalog {catalog.name!r}: "
            f"{_first_line(exc)}"
        ) from exc


def catalog_label(catalog: CatalogSpec) -> str:
    """A short, credential-free name of a catalog spec for messages and progress."""
    if isinstance(catalog, str):
        return catalog
    if isinstance(catalog, Mapping):
        return str(catalog.get("uri") or catalog.get("name") or "<catalog properties>")
    props = getattr(catalog, "properties", {}) or {}
    return str(props.get("uri") or getattr(catalog, "name", "<catalog>"))


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
