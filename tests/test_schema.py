"""Schema invariants: documented columns, committed reference in sync, evolution rules."""

from pathlib import Path

from storage.schema import PARTITION_COLUMNS, TABLES, duckdb_type, schema_markdown

ROOT = Path(__file__).resolve().parents[1]


def test_every_column_is_documented_and_typed():
    for name, schema in TABLES.items():
        assert "run_key" in schema.names, name  # every row traces to the run that wrote it
        for f in schema:
            assert (f.metadata or {}).get(b"doc"), f"{name}.{f.name} has no doc"
            assert duckdb_type(f.type)
        assert not set(schema.names) & set(PARTITION_COLUMNS), "partition columns live in the path only"


def test_committed_schema_doc_is_current():
    # docs/SCHEMA.md's "Tables" section is `python -m storage.schema`'s output (the prose above it is written by hand)
    doc = (ROOT / "docs" / "SCHEMA.md").read_text()
    assert doc.index("## Tables") > 0
    assert doc[doc.index("## Tables") :].strip() == schema_markdown().strip()
