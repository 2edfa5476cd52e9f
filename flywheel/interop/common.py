"""What the `flywheel import ...` readers share: the result counts, the row-level error, reading a JSON Lines (or
JSON list) file record by record, and writing one episode as one lake file named by its id (so a rerun skips it).

    res = import_records(path, lake, rows_fn, run_key="import-agentnet")   # rows_fn(path, n, rec) -> (ep, steps)
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable

from storage.duck import quote
from storage.lake import Lake

STAGE = "import"


class ImportError_(ValueError):
    """One malformed input row: the message names the file and the row."""


class PassOver(ImportError_):
    """An input that holds no episode to import (e.g. an OSWorld run that crashed before its first step): named in
    the summary with the reason, not an error."""


@dataclass
class ImportResult:
    episodes: int = 0
    steps: int = 0
    skipped: int = 0  # already in the lake (a rerun)
    unparsed_steps: int = 0  # kept, with parse_ok false and the reason
    flagged_steps: int = 0  # parsed into the schema but not fit for SFT (fallback_parse), with the reason
    rejected: list[str] = field(default_factory=list)  # "file:line: reason"
    passed_over: list[str] = field(default_factory=list)  # "file:line: reason": not an episode, named, not an error


def step_verdict(error: str | None, flags: list[str]) -> dict[str, Any]:
    """The parse columns of an imported step. `error`: its code did not parse (no action; parse_ok false).
    `flags`: it parsed into the schema but is not fit to be an SFT target (a scroll at a guessed point, a click
    kept at the screen edge, no screen before it): parse_ok true and fallback_parse true, which curate excludes
    (training/queries.py FIT_STEP). Either way `parse_error` says why."""
    if error is not None:
        return dict(parse_ok=False, parse_error=error, fallback_parse=False)
    flag = "; ".join(f for f in flags if f) or None
    return dict(parse_ok=True, parse_error=flag, fallback_parse=flag is not None)


def imported_episode(*, run_key: str, git_sha: str | None, status: str = "ok", error: str | None = None, **cols: Any):
    """An imported episode's row: the columns the reader knows (ids, task, instruction, reward, step counts, ...)
    plus what every import shares: a train-split episode of no rollout group, imported now (no duration, no cost,
    no config)."""
    now = datetime.now(timezone.utc)
    row = dict(split="train", group_id=None, sample_idx=0, started_at=now, ended_at=now, duration_s=None, cost=0.0)
    return row | cols | dict(status=status, error=error, run_key=run_key, git_sha=git_sha, config_hash=None)


def png_size(data: bytes) -> tuple[int, int]:
    if data[:8] != b"\x89PNG\r\n\x1a\n" or data[12:16] != b"IHDR":
        raise ValueError("not a PNG file")
    return struct.unpack(">II", data[16:24])  # type: ignore[return-value]


def read_records(path: Path) -> list[tuple[int, Any]]:
    """(line number, record) for a JSON Lines file, or (index, record) for a JSON document (a list of records, or
    one record, pretty-printed or not); a line that is not JSON comes back as an ImportError_ in its slot, so one
    bad line rejects only itself. A file that is neither raises one ImportError_ naming it."""
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise ImportError_(f"{path}: not UTF-8 text ({e.reason} at byte {e.start})") from None
    lines = [(i, line) for i, line in enumerate(text.splitlines(), 1) if line.strip()]
    if not lines:
        raise ImportError_(f"{path}: empty file")
    stripped = text.lstrip()
    if stripped.startswith("[") or (stripped.startswith("{") and not _is_json(lines[0][1])):
        try:
            doc = json.loads(text)
        except json.JSONDecodeError as e:
            # JSON Lines whose first line is broken still reads line by line; anything else is one error
            if stripped.startswith("[") or not any(_is_json(line) for _, line in lines[1:]):
                raise ImportError_(
                    f"{path}:{e.lineno}: neither JSON Lines (one record per line) nor one JSON document ({e.msg})"
                ) from None
        else:
            return list(enumerate(doc, 1)) if isinstance(doc, list) else [(1, doc)]
    out: list[tuple[int, Any]] = []
    for i, line in lines:
        try:
            out.append((i, json.loads(line)))
        except json.JSONDecodeError as e:
            out.append((i, ImportError_(f"{path}:{i}: not JSON ({e.msg})")))
    return out


def _is_json(line: str) -> bool:
    try:
        json.loads(line)
    except json.JSONDecodeError:
        return False
    return True


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
    res.flagged_steps += sum(
        1 for s in steps if not s.get("is_final") and s.get("parse_ok") and s.get("fallback_parse")
    )


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
    """Build one episode's rows and write them; a bad input becomes one rejected line naming `where`, an input
    that holds no episode (PassOver) one named line in `passed_over`."""
    try:
        ep, steps = rows()
    except PassOver as e:
        res.passed_over.append(str(e))
        return
    except ImportError_ as e:
        res.rejected.append(str(e))
        return
    except (OSError, ValueError) as e:
        res.rejected.append(f"{where}: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
        return
    write_episode(lake, res, ep, steps, iteration=iteration, run_key=run_key)
