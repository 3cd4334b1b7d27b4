"""The PyIceberg names the Iceberg sink uses that are not PyIceberg's public API.

NOTE: update mode rewrites data files itself (:mod:`sinks.iceberg_upsert`)
instead of calling ``Transaction.delete``, which binds the batch's key filter
again for every candidate file. Writing the rewritten rows as data files of the
table (its partition spec, file names, metrics) has no public API: PyIceberg's
own ``Transaction.append`` and ``delete`` call ``_dataframe_to_data_files``.
pyproject.toml pins ``pyiceberg<0.13``; when that pin moves, check these two
functions first.
"""

from __future__ import annotations

import itertools
import uuid
from collections.abc import Iterator
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import pyarrow as pa
    from pyiceberg.io import FileIO
    from pyiceberg.manifest import DataFile
    from pyiceberg.table.metadata import TableMetadata

__all__ = ["check_arrow_schema", "write_data_files"]


def check_arrow_schema(metadata: TableMetadata, schema: pa.Schema) -> None:
    """Raise PyIceberg's ``ValueError`` when rows of ``schema`` cannot be written
    to a table with ``metadata``'s current schema (the check ``append`` makes)."""
    from pyiceberg.io.pyarrow import _check_pyarrow_schema_compatible
    from pyiceberg.table import DOWNCAST_NS_TIMESTAMP_TO_US_ON_WRITE
    from pyiceberg.utils.config import Config

    downcast = Config().get_bool(DOWNCAST_NS_TIMESTAMP_TO_US_ON_WRITE) or False
    _check_pyarrow_schema_compatible(
        metadata.schema(), provided_schema=schema, downcast_ns_timestamp_to_us=downcast,
        format_version=metadata.format_version)


def write_data_files(
    metadata: TableMetadata, io: FileIO, rows: pa.Table, write_uuid: uuid.UUID,
    counter: itertools.count[int],
) -> Iterator[DataFile]:
    """Write ``rows`` as data files of the table (split by its partition spec,
    target-sized) through ``io``; the files, not yet in any snapshot. Calls
    sharing ``write_uuid`` must share ``counter`` (it numbers the file names)."""
    from pyiceberg.io.pyarrow import _dataframe_to_data_files

    yield from _dataframe_to_data_files(
        table_metadata=metadata, df=rows, io=io, write_uuid=write_uuid, counter=counter)
