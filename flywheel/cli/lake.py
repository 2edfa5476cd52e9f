"""`flywheel query` and `flywheel lake ...`: SQL over the lake, and inspecting and repairing it.

flywheel query "SELECT task_id, avg(success::INT) FROM episodes GROUP BY 1" [--format csv --out f.csv]
flywheel query --at 12 "SELECT count(*) FROM episodes"      # the lake as of snapshot 12 (or a dataset id)
flywheel lake stats | verify | compact | snapshots | schema | grounding | migrate OLD NEW
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
    at: Optional[str] = typer.Option(
        None, "--at", help="Query the lake as it was: a snapshot id, or a dataset/checkpoint/eval id (its snapshot)."
    ),
    lake: Optional[str] = LAKE_OPT,
    config: Optional[Path] = CONFIG_OPT,
):
    """Run SQL against the lake with DuckDB and print or export the result."""
    from flywheel.query import export_query, run_query
    from storage.catalog import connect

    lk = open_lake(lake, config)
    con = connect(lk, at=_snapshot_of(lk, at))
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


def _snapshot_of(lk, at: Optional[str]) -> Optional[int]:
    """--at: a snapshot id as is; a dataset, checkpoint or eval id: the snapshot its row recorded."""
    if at is None or at.strip().isdigit():
        return None if at is None else int(at)
    from storage.duck import quote

    for table, key in (("datasets", "dataset_id"), ("checkpoints", "checkpoint_id"), ("evals", "eval_id")):
        rows = lk.rows(table, f"{key} = {quote(at)} AND lake_snapshot IS NOT NULL", "lake_snapshot")
        if rows:
            return int(rows[0]["lake_snapshot"])
    raise UserError(f"--at {at!r}: not a snapshot id, nor a dataset, checkpoint or eval id with a recorded snapshot")


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


@lake_app.command("grounding")
def lake_grounding_cmd(
    stage: Optional[str] = typer.Option(None, "--stage", help="Only episodes of this stage (evaluate, rollouts, ...)."),
    iteration: Optional[int] = typer.Option(None, "--iteration", "-i", help="Only this iteration's episodes."),
    run_key: Optional[str] = typer.Option(None, "--run-key", help="Only this run's episodes."),
    policy: Optional[str] = typer.Option(None, "--policy", help="Only this policy's episodes (student, scripted)."),
    at: Optional[str] = typer.Option(None, "--at", help="The lake as of a snapshot, dataset, checkpoint or eval id."),
    lake: Optional[str] = LAKE_OPT,
    config: Optional[Path] = CONFIG_OPT,
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of a table."),
):
    """Why clicks miss, per task: hit, absent (the cited element is not on the screen), off_target (it is, the
    click is elsewhere), uncited; in all episodes and in the failed ones (flywheel/grounding.py)."""
    from flywheel.grounding import CATEGORIES, grounding_table
    from storage.catalog import connect

    lk = open_lake(lake, config)
    con = connect(lk, at=_snapshot_of(lk, at))
    rows = grounding_table(con, stage=stage, iteration=iteration, run_key=run_key, policy=policy)
    if as_json:
        print(json.dumps(rows, indent=1))
        return
    if not rows:
        err_console.print("no click steps match")
        return
    table = Table(title="clicks: all episodes (failed episodes)", header_style="bold cyan")
    table.add_column("task")
    for c in ("clicks", *CATEGORIES):
        table.add_column(c, justify="right")
    for r in rows:
        cells = [f"{r[c]} ({r['failed_' + c]})" for c in ("clicks", *CATEGORIES)]
        table.add_row(r["task_id"], *cells)
    console.print(table)


@lake_app.command("verify")
def lake_verify_cmd(
    lake: Optional[str] = LAKE_OPT,
    config: Optional[Path] = CONFIG_OPT,
    quick: bool = typer.Option(False, "--quick", help="Check footers only, not every data page."),
):
    """Read back every data file and scan every table; name what fails, exit 1 if anything does."""
    from storage.inspect import verify_lake

    lk = open_lake(lake, config)
    rep = verify_lake(lk, full=not quick)
    for b in rep.bad:
        err_console.print(f"[red]BAD[/red] {b.table}: {b.path}: {b.problem}")
    console.print(f"checked {rep.checked} data file(s): {len(rep.bad)} bad")
    if rep.bad:
        raise typer.Exit(1)


@lake_app.command("compact")
def lake_compact_cmd(lake: Optional[str] = LAKE_OPT, config: Optional[Path] = CONFIG_OPT):
    """Flush rows inlined in the catalog to Parquet and merge small files (every stage does it when it ends)."""
    lk = open_lake(lake, config)
    got = lk.compact()
    console.print(f"compacted {lk.location}: {got['files_before']} -> {got['files_after']} data file(s)")


@lake_app.command("snapshots")
def lake_snapshots_cmd(
    lake: Optional[str] = LAKE_OPT, config: Optional[Path] = CONFIG_OPT, last: int = typer.Option(20, "--last")
):
    """The lake's latest snapshots (every commit is one): id, time, what changed."""
    lk = open_lake(lake, config)
    cur = lk.cursor()
    try:
        rows = cur.execute(
            f"SELECT snapshot_id, snapshot_time, changes FROM {lk.alias}.snapshots() ORDER BY 1 DESC LIMIT ?",
            [int(last)],
        ).fetchall()
    finally:
        cur.close()
    table = Table(title=f"snapshots of {lk.location}", header_style="bold cyan")
    for c in ("snapshot", "time", "changes"):
        table.add_column(c)
    for sid, when, changes in rows:
        table.add_row(str(sid), str(when)[:19], cell_text(json.dumps(changes, default=str))[:120])
    console.print(table)


@lake_app.command("migrate")
def lake_migrate_cmd(
    old: Path = typer.Argument(..., help="A lake in the old one-Parquet-file-per-write layout."),
    new: str = typer.Argument(..., help="The new lake's root (a folder, or s3://...)."),
    config: Optional[Path] = CONFIG_OPT,
):
    """Copy an old-layout lake into a new DuckLake lake; row counts must match per table."""
    from storage.migrate import migrate

    lk = open_lake(new, config, create=True)
    got = migrate(old, lk, log=lambda s: err_console.print(s))
    for t, n in got.items():
        console.print(f"{t}: {n['old']:,} -> {n['new']:,} rows")
    if any(n["old"] != n["new"] for n in got.values()):
        err_console.print("[red]row counts differ[/red]")
        raise typer.Exit(1)


@lake_app.command("schema")
def lake_schema_cmd():
    """Print the lake's table schemas (markdown, one row per column; docs/SCHEMA.md ends with it)."""
    from storage.schema import schema_markdown

    print(schema_markdown())
