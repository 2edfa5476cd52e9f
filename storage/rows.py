"""Rows into the lake's tables, conformed to storage.schema."""

from __future__ import annotations

from typing import Sequence

import pyarrow as pa

from storage.errors import LakeError
from storage.schema import schema_for


def to_table(table: str, rows: Sequence[dict] | pa.Table) -> pa.Table:
    """Conform rows to the table's schema; unknown keys and missing required columns are errors."""
    schema = schema_for(table)
    if isinstance(rows, pa.Table):
        extra = set(rows.column_names) - set(schema.names)
        if extra:
            raise LakeError(f"{table}: unknown columns {sorted(extra)}")
        cols = {f.name: (rows[f.name] if f.name in rows.column_names else pa.nulls(len(rows), f.type)) for f in schema}
        try:
            return pa.Table.from_arrays([c.cast(schema.field(n).type) for n, c in cols.items()], schema=schema)
        except (pa.ArrowInvalid, pa.ArrowTypeError, ValueError) as e:
            raise LakeError(f"{table}: rows do not match the schema: {e}") from None
    names = set(schema.names)
    for i, r in enumerate(rows):
        extra = set(r) - names
        if extra:
            raise LakeError(f"{table} row {i}: unknown columns {sorted(extra)}")
    try:
        return pa.Table.from_pylist(list(rows), schema=schema)
    except (pa.ArrowInvalid, pa.ArrowTypeError, ValueError, TypeError) as e:
        raise LakeError(f"{table}: rows do not match the schema: {e}") from None
