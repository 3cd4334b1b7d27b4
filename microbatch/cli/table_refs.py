"""Table references on the command line: Delta and Iceberg tables named one way.

A ``TABLE`` argument is, in this order:

1. ``NAMESPACE.TABLE`` when ``--catalog SPEC`` is given and the text is not an
   existing path (no ``/``, no ``://``): an Iceberg table of that catalog.
   ``SPEC`` is what ``read_iceberg(catalog=...)`` takes as a string:
   ``sqlite:///PATH.db``, ``http(s)://HOST`` (REST) or a configured catalog's
   name;
2. a path or URI ending in ``.metadata.json``: the Iceberg table as that
   metadata file describes it (no catalog needed);
3. a local directory holding ``metadata/*.metadata.json`` and no
   ``_delta_log/``: an Iceberg table, read from its newest metadata file
   (``metadata/version-hint.text`` when present, else the highest version
   number in the file names);
4. anything else: a Delta table path or URI (``s3://...``), as before.

``--storage-option KEY=VALUE`` options (delta-rs keys) serve both formats.
Every failure is a :class:`CliError` that says how to name the table.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from microbatch.cli.common import CliError

if TYPE_CHECKING:
    import polars as pl
    from pyiceberg.table import Table

_VERSIONED = re.compile(r"^(?:v)?(\d+)(?:-[^.]*)?\.metadata\.json$")


@dataclass(frozen=True)
class TableRef:
    """A parsed ``TABLE`` argument (see the module docstring)."""

    kind: Literal["delta", "iceberg-catalog", "iceberg-metadata"]
    location: str
    """The Delta path/URI, the Iceberg ``namespace.table``, or a metadata file."""
    catalog: str | None = None

    @property
    def label(self) -> str:
        """How messages name the table."""
        if self.kind == "delta":
            return f"Delta table {self.location}"
        if self.kind == "iceberg-catalog":
            return f"Iceberg table {self.location} (catalog {self.catalog})"
        return f"Iceberg table {self.location}"

    def read(self, storage_options: Mapping[str, str] | None = None) -> pl.DataFrame:
        """The table's current rows; :class:`CliError` naming the table when it
        cannot be read."""
        import polars as pl

        try:
            if self.kind == "delta":
                return pl.read_delta(self.location,
                                     storage_options=dict(storage_options or {}) or None)
            frame = pl.from_arrow(self._iceberg(storage_options).scan().to_arrow())
        except CliError:
            raise
        except Exception as exc:
            raise CliError(f"cannot read {self.label}: {_first_line(exc)}") from exc
        assert isinstance(frame, pl.DataFrame)
        return frame

    def _iceberg(self, storage_options: Mapping[str, str] | None) -> Table:
        from pyiceberg.table import StaticTable

        from sinks.iceberg_catalog import fileio_properties, load_iceberg_table, resolve_catalog

        if self.kind == "iceberg-metadata":
            return StaticTable.from_metadata(self.location, fileio_properties(storage_options))
        catalog = resolve_catalog(self.catalog, storage_options=storage_options)
        table = load_iceberg_table(catalog, self.location)
        if table is None:
            raise CliError(f"catalog {self.catalog} has no Iceberg table {self.location}; "
                           "check the name (namespace.table) and --catalog")
        return table


def parse_table_ref(text: str, *, catalog: str | None = None) -> TableRef:
    """The table that ``text`` names on the command line (see the module docstring)."""
    path = Path(text).expanduser()
    is_path = "/" in text or "://" in text or path.exists()
    if catalog and not is_path:
        if "." not in text.strip("."):
            raise CliError(f"Iceberg table {text!r} needs a namespace: write it as "
                           "namespace.table (e.g. lake.events)")
        return TableRef("iceberg-catalog", text, catalog)
    if text.endswith(".metadata.json"):
        return TableRef("iceberg-metadata", text if "://" in text else str(path.resolve()))
    if "://" not in text and path.is_dir() and not (path / "_delta_log").is_dir():
        metadata = latest_metadata_file(path)
        if metadata is not None:
            return TableRef("iceberg-metadata", str(metadata))
    if not is_path and "." in text and not catalog:
        raise CliError(
            f"{text} is not a table directory; to name a table of an Iceberg catalog, pass "
            "--catalog (sqlite:///PATH.db, http(s)://HOST or a configured catalog's name)"
        )
    return TableRef("delta", text)


def latest_metadata_file(table_dir: Path) -> Path | None:
    """The newest ``metadata/*.metadata.json`` of a local Iceberg table directory
    (``version-hint.text`` first), or ``None`` when it has none."""
    meta = table_dir / "metadata"
    hint = meta / "version-hint.text"
    if hint.is_file():
        candidate = meta / f"v{hint.read_text().strip()}.metadata.json"
        if candidate.is_file():
            return candidate
    versions: list[tuple[int, str, Path]] = []
    for file in meta.glob("*.metadata.json") if meta.is_dir() else ():
        match = _VERSIONED.match(file.name)
        if match:
            versions.append((int(match.group(1)), file.name, file))
    return max(versions)[2] if versions else None


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
