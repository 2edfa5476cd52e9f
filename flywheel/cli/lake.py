"""`flywheel query` and `flywheel lake ...`: SQL over the lake, and inspecting and repairing it.

flywheel query "SELECT task_id, avg(success::INT) FROM episodes GROUP BY 1" [--format csv --out f.csv]
flywheel lake stats | flywheel lake verify [--quarantine] | flywheel lake schema
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Optional

import typer
from rich.table import Table

from flywheel.cli.common import CONFIG_OPT, LAKE_OPT, cell_text, console, err_console, open_lake, print_arrow_table
from flywheel.errors import UserError

lake_app = typer.Typer(help="Inspect and repair the trajectory lake.", no_args_is_help=True)


def query(
    sql: str = typer.Argument(..., help="SQL over the views tasks, episodes, steps, checkpoints, datasets, evals."),
    fmt: str = typer.Option("table", "--format", "-f", help="table | csv | json | parquet"),
    out: Optional[Path] = typer.Option(
        None, "--out", "-o", help="Write the result to this file (required for parquet)."
    ),
    max_rows: int = typer.Option(50, "--max-rows", help="Rows shown in table format."),
    lake: Optional[str] = LAKE_OPT,
    config: Optional[Path] = CONFIG_OPT,
):
    """Run SQL against the lake with DuckDB and print or export the result."""
    from storage.catalog import connect, export_query, run_query

    lk = open_lake(lake, config)
    con = connect(lk)
    if fmt not in ("table", "csv", "json", "parquet"):
        raise UserError(f"unknown --format {fmt!r}; use table, csv, json or parquet")
    if out is not None:
        if fmt == "table":
            raise UserError("--out needs --format csv, json or parquet")
        export_query(con, sql, out, fmt, lk)
        err_console.print(f"wrote {out}")
        return
    if fmt == "parquet":
        raise UserError("--format parquet needs --out FILE")
    t = run_query(con, sql, lk)
    if fmt == "table":
        print_arrow_table(t, max_rows=max_rows)
    elif fmt == "csv":
        import pyarrow.csv as pacsv

        buf = __import__("io").BytesIO()
        pacsv.write_csv(_csv_ready(t), buf)
        sys.stdout.write(buf.getvalue().decode())
    else:
        rows = [
            {k: (cell_text(v) if isinstance(v, (bytes, bytearray)) else v) for k, v in r.items()} for r in t.to_pylist()
        ]
        sys.stdout.write(json.dumps(rows, default=str, indent=1) + "\n")


def _csv_ready(t):
    """CSV holds no nested values: list/struct/map columns become JSON text (as --format json writes them);
    binary columns (screenshots) are left out."""
    import pyarrow as pa

    t = t.drop_columns([c for c in t.column_names if pa.types.is_binary(t.schema.field(c).type)])
    for i, f in enumerate(t.schema):
        if pa.types.is_nested(f.type):
            t = t.set_column(
                i,
                f.name,
                pa.array(
                    [None if v is None else json.dumps(v, default=str) for v in t.column(i).to_pylist()], pa.string()
                ),
            )
    return t


# ---------------------------------------------------------------------------- lake
def _human(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if n < 1024 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


@lake_app.command("stats")
def lake_stats_cmd(
    lake: Optional[str] = LAKE_OPT,
    config: Optional[Path] = CONFIG_OPT,
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of a table."),
):
    """Rows, bytes, files and partitions per table (reads Parquet footers only)."""
    from storage.inspect import lake_stats

    lk = open_lake(lake, config)
    stats = lake_stats(lk)
    if as_json:
        print(
            json.dumps(
                {
                    t: {
                        "rows": s.rows,
                        "bytes": s.bytes,
                        "files": s.files,
                        "partitions": len(s.partitions),
                        "unreadable": s.unreadable,
                    }
                    for t, s in stats.items()
                },
                indent=1,
            )
        )
        return
    table = Table(title=f"lake {lk.location}", header_style="bold cyan")
    for c in ("table", "rows", "size", "files", "partitions", "unreadable"):
        table.add_column(c, justify="left" if c == "table" else "right")
    for t, s in stats.items():
        table.add_row(
            t,
            f"{s.rows:,}",
            _human(s.bytes),
            str(s.files),
            str(len(s.partitions)),
            f"[red]{s.unreadable}[/red]" if s.unreadable else "0",
        )
    console.print(table)


@lake_app.command("verify")
def lake_verify_cmd(
    lake: Optional[str] = LAKE_OPT,
    config: Optional[Path] = CONFIG_OPT,
    quarantine: bool = typer.Option(
        False, "--quarantine", help="Move bad files to <lake>/_quarantine (kept, not deleted)."
    ),
    quick: bool = typer.Option(False, "--quick", help="Check footers and schemas only, not every data page."),
):
    """Find unreadable or schema-mismatched files and name them; exit 1 if any."""
    from storage.inspect import verify_lake

    lk = open_lake(lake, config)
    rep = verify_lake(lk, full=not quick)
    for b in rep.bad:
        rel = b.path if lk.remote else lk.key(b.path)  # an object by its full s3:// URI
        moved = ""
        if quarantine:
            dest = lk.quarantine(b.path)
            moved = f" -> moved to {dest if lk.remote else lk.key(dest)}"
        err_console.print(f"[red]BAD[/red] {rel}: {b.problem}{moved}")
    older = f", {rep.older_version} from an older schema version (readable)" if rep.older_version else ""
    console.print(f"checked {rep.checked} file(s): {len(rep.bad)} bad{older}")
    if rep.bad:
        raise typer.Exit(1)


@lake_app.command("schema")
def lake_schema_cmd():
    """Print the lake's table schemas (markdown, one row per column)."""
    from storage.schema import schema_markdown

    print(schema_markdown())
