"""OSWorld task JSON files (`evaluation_examples/examples/<domain>/<id>.json`) -> the lake's `tasks` rows.

    tasks, skipped = load_tasks("~/OSWorld/evaluation_examples")      # skipped: [(id, reason), ...]
    rows = task_rows(tasks)                                           # rows of the `tasks` table
    cfg = find_task("~/OSWorld/evaluation_examples", "bb5e4c0d-...")  # one task's JSON (the env server)

A task file (OSWorld's documented schema): {id, snapshot, instruction, source, config: [{type,
parameters}], trajectory, related_apps, evaluator: {func, result, expected?, options?, postconfig?,
conj?}, proxy?}. The domain is the folder name. Tasks that cannot run on a plain fleet are skipped
unless asked for (`EXCLUDED`): they need Google Drive credentials or an HTTP proxy.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# Why a task is skipped by default, checked in this order.
EXCLUDED = {
    "google_drive": "needs Google Drive credentials (a 'googledrive' config step or a Drive evaluator)",
    "login": "needs a Google account login (a 'login' config step)",
    "proxy": 'needs an HTTP proxy ("proxy": true)',
}
REQUIRED = ("id", "instruction", "config", "evaluator")


@dataclass(frozen=True)
class OSWorldTask:
    task_id: str
    domain: str
    instruction: str
    raw: dict[str, Any]  # the task file as read (what DesktopEnv.reset takes)
    path: str


class TaskFileError(ValueError):
    """A task file is not OSWorld task JSON; the message names the file and the problem."""


def exclusion(task: dict[str, Any]) -> str | None:
    """The EXCLUDED key that applies to a task, or None."""
    steps = [s.get("type", "") for s in task.get("config") or [] if isinstance(s, dict)]
    ev = task.get("evaluator") or {}
    funcs = ev.get("func") if isinstance(ev.get("func"), list) else [ev.get("func")]
    results = ev.get("result") if isinstance(ev.get("result"), list) else [ev.get("result")]
    kinds = [str(r.get("type", "")) for r in results if isinstance(r, dict)]
    if (
        "googledrive" in steps
        or any("drive" in str(f).lower() for f in funcs)
        or any("googledrive" in k for k in kinds)
    ):
        return "google_drive"
    if "login" in steps:
        return "login"
    if task.get("proxy"):
        return "proxy"
    return None


def read_task(path: Path, domain: str | None = None) -> OSWorldTask:
    try:
        raw = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise TaskFileError(f"{path}: not readable JSON ({e})") from None
    if not isinstance(raw, dict):
        raise TaskFileError(f"{path}: the top level must be an object, got {type(raw).__name__}")
    missing = [k for k in REQUIRED if k not in raw]
    if missing:
        raise TaskFileError(f"{path}: not an OSWorld task: missing {', '.join(missing)}")
    if not isinstance(raw["config"], list) or not isinstance(raw["evaluator"], dict):
        raise TaskFileError(f"{path}: 'config' must be a list of steps and 'evaluator' an object")
    if raw["id"] != path.stem:
        raise TaskFileError(f"{path}: id {raw['id']!r} differs from the file name")
    return OSWorldTask(str(raw["id"]), domain or path.parent.name, str(raw["instruction"]), raw, str(path))


def _task_files(root: Path) -> list[Path]:
    """<root>/examples/<domain>/<id>.json, or <root>/<domain>/<id>.json when root is the examples folder."""
    root = Path(root).expanduser()
    base = root / "examples" if (root / "examples").is_dir() else root
    return sorted(p for p in base.glob("*/*.json") if p.is_file())


def load_tasks(root: str | Path, include_excluded: bool = False) -> tuple[list[OSWorldTask], list[tuple[str, str]]]:
    """Every task under root (sorted by domain, id) and the (id, reason) of those skipped."""
    files = _task_files(Path(root))
    if not files:
        raise TaskFileError(f"{root}: no task files (expected examples/<domain>/<id>.json)")
    tasks, skipped = [], []
    for p in files:
        t = read_task(p)
        why = exclusion(t.raw)
        if why and not include_excluded:
            skipped.append((t.task_id, EXCLUDED[why]))
        else:
            tasks.append(t)
    return tasks, skipped


def find_task(root: str | Path, task_id: str) -> dict[str, Any]:
    """One task's JSON by id (the env server's tasks dir); ValueError naming the folder when absent."""
    for p in _task_files(Path(root)):
        if p.stem == task_id:
            return read_task(p).raw
    raise ValueError(f"OSWorld task {task_id!r} not found under {root}")


def task_rows(tasks: list[OSWorldTask]) -> list[dict[str, Any]]:
    """Rows of the `tasks` table: domain, snapshot, config steps and evaluator kept in `config` (JSON)."""
    rows = []
    for t in tasks:
        config = {
            "domain": t.domain,
            "snapshot": t.raw.get("snapshot"),
            "config": t.raw["config"],
            "evaluator": t.raw["evaluator"],
            "related_apps": t.raw.get("related_apps", []),
            "proxy": bool(t.raw.get("proxy", False)),
            "source_url": t.raw.get("source"),
        }
        rows.append(
            dict(
                task_id=t.task_id,
                env="osworld",
                instruction=t.instruction,
                config=json.dumps(config, sort_keys=True),
                split="both",
                teacher_supported=False,
                source="osworld",
            )
        )
    return rows
