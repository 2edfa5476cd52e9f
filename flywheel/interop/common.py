"""What the `flywheel import ...` readers share: the result counts, the row-level error, reading a JSON Lines (or
JSON list) file record by record, and writing one episode as one lake file named by its id (so a rerun skips it).

    res = import_records(path, lake, rows_fn, run_key="import-agentnet")   # rows_fn(path, n, rec) -> (ep, steps)
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from storage.duck import quote
from storage.lake import Lake

STAGE = "import"


class ImportError_(ValueError):
    """One malformed input row: the message names the file and the row."""


@dataclass
class ImportResult:
    episodes: int = 0
    steps: int = 0
    skipped: int = 0  # already in the lake (a rerun)
    unparsed_steps: int = 0  # kept, with parse_ok false and the reason
    rejected: list[str] = field(default_factory=list)  # "file:line: reason"


def png_size(data: bytes) -> tuple[int, int]:
    if data[:8] != b"\x89PNG\r\n\x1a\n" or data[12:16] != b"IHDR":
        raise ValueError("not a PNG file")
    return struct.unpack(">II", data[16:24])  # type: ignore[return-value]


def read_records(path: Path) -> list[tuple[int, Any]]:
    """(line number, record) for a JSON Lines file, or (index, record) for a JSON list; a line that is not JSON
    comes back as an ImportError_ in its slot, so one bad line rejects only itself."""
    text = path.read_text(encoding="utf-8")
    if text.lstrip().startswith("["):
        try:
            return list(enumerate(json.loads(text), 1))
        except json.JSONDecodeError as e:
            raise ImportError_(f"{path}:{e.lineno}: not JSON ({e.msg})") from None
    out: list[tuple[int, Any]] = []
    for i, line in enumerate(text.splitlines(), 1):
        if line.strip():
            try:
                out.append((i, json.loads(line)))
            except json.JSONDecodeError as e:
                out.append((i, ImportError_(f"{path}:{i}: not JSON ({e.msg})")))
    return out


def write_episode(lake: Lake, res: ImportResult, ep: dict, steps: list[dict], *, iteration: int, run_key: str) -> None:
    """One episode and its steps into the lake, in one transaction (part: the episode id); counted as skipped when
    the lake already has that episode of this run."""
    where = f"run_key = {quote(run_key)} AND episode_id = {quote(ep['episode_id'])}"
    if lake.rows("episodes", where, "1 AS x"):
        res.skipped += 1
        return
    lake.write_many(
        [("steps", steps), ("episodes", [ep])], iteration=iteration, stage=STAGE, run_key=run_key, part=ep["episode_id"]
    )
    res.episodes += 1
    res.steps += ep["n_steps"]
    res.unparsed_steps += ep["n_parse_errors"]


def import_records(
    path: Path,
    lake: Lake,
    rows_fn: Callable[[Path, int, Any], tuple[dict, list[dict]]],
    *,
    run_key: str,
    iteration: int = 0,
) -> ImportResult:
    """Every record of a JSON Lines file through `rows_fn` into the lake; malformed records are rejected with
    "file:row: reason" and the others still land."""
    res = ImportResult()
    for n, rec in read_records(path):

        def rows(rec=rec, n=n):
            if isinstance(rec, ImportError_):
                raise rec
            return rows_fn(path, n, rec)

        import_one(lake, res, f"{path}:{n}", rows, iteration=iteration, run_key=run_key)
    return res


def import_one(
    lake: Lake,
    res: ImportResult,
    where: str,
    rows: Callable[[], tuple[dict, list[dict]]],
    *,
    iteration: int,
    run_key: str,
) -> None:
    """Build one episode's rows and write them; a bad input becomes one rejected line naming `where`."""
    try:
        ep, steps = rows()
    except ImportError_ as e:
        res.rejected.append(str(e))
        return
    except (OSError, ValueError) as e:
        res.rejected.append(f"{where}: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
        return
    write_episode(lake, res, ep, steps, iteration=iteration, run_key=run_key)
