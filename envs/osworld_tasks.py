"""OSWorld task JSON files (`evaluation_examples/examples/<domain>/<id>.json`) -> the lake's `tasks` rows.

    scan = scan_tasks("~/OSWorld/evaluation_examples")    # .tasks, .skipped [(id, reason)], .rejected [(file, reason)]
    rows = task_rows(scan.tasks)                          # rows of the `tasks` table
    cfg = find_task("~/OSWorld/evaluation_examples", "bb5e4c0d-...")  # one task's JSON (the env server)

A task file (OSWorld's documented schema): {id, snapshot, instruction, source, config: [{type,
parameters}], trajectory, related_apps, evaluator: {func, result, expected?, options?, postconfig?,
conj?}, proxy?}. The domain is the folder name. What is optional follows OSWorld's own loader
(desktop_env.py `_set_task_info`): `config` defaults to []; `evaluator` must be an object naming a metric `func`.
Every file is loaded, skipped by policy or rejected with its reason; one bad file never stops the import:
- rejected (never loaded): not JSON, not an object, no id/instruction/evaluator, an empty id (the folder's
  template.json), an evaluator that is not an object (two upstream vlc tasks hold the README's placeholder
  string "evaluation_dir") or names no metric, a `config` that is not a list;
- skipped unless `--include-excluded` (`EXCLUDED`): Windows tasks (examples/Windows/<app>/, and '<id>-win.json'
  variants, whose id is the Ubuntu task's), tasks needing Google Drive, a Google login or an HTTP proxy.
Task ids are the files' ids, made unique where upstream repeats one (see `_keyed`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# Why a task is skipped by default, checked in this order (`--include-excluded` loads them).
EXCLUDED = {
    "windows": "a Windows task (examples/Windows/<app>/, or a '<id>-win.json' variant): needs OSWorld's Windows VM",
    "google_drive": "needs Google Drive credentials (a 'googledrive' config step or a Drive evaluator)",
    "login": "needs a Google account login (a 'login' config step)",
    "proxy": 'needs an HTTP proxy ("proxy": true)',
}
REQUIRED = ("id", "instruction", "evaluator")  # desktop_env's _set_task_info: `config` defaults to []


@dataclass(frozen=True)
class OSWorldTask:
    task_id: str  # the file's id; '<domain>/<id>' where several domain folders hold different tasks of one id
    domain: str
    instruction: str
    raw: dict[str, Any]  # the task file as read (what DesktopEnv.reset takes)
    path: str
    windows: bool = False


@dataclass
class TaskScan:
    tasks: list[OSWorldTask] = field(default_factory=list)
    skipped: list[tuple[str, str]] = field(default_factory=list)  # (task id, EXCLUDED reason): by policy
    rejected: list[tuple[str, str]] = field(default_factory=list)  # (file, reason): not a task desktop_env can run


class TaskFileError(ValueError):
    """A task file is not OSWorld task JSON; the message names the file and the problem."""


def exclusion(task: dict[str, Any], windows: bool = False) -> str | None:
    """The EXCLUDED key that applies to a task, or None."""
    if windows:
        return "windows"
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


def _check(raw: Any) -> str | None:
    """Why desktop_env could not run this task (its _set_task_info and evaluate read these fields), or None."""
    if not isinstance(raw, dict):
        return f"the top level must be an object, got {type(raw).__name__}"
    missing = [k for k in REQUIRED if k not in raw]
    if missing:
        return f"not an OSWorld task: missing {', '.join(missing)}"
    if not isinstance(raw["id"], str) or not raw["id"]:
        return "an empty id (the examples folder's template.json is a template, not a task)"
    if not isinstance(raw["instruction"], str) or not raw["instruction"].strip():
        return "an empty instruction"
    if not isinstance(raw.get("config", []), list):
        return f"'config' must be a list of setup steps, got {type(raw['config']).__name__}"
    ev = raw["evaluator"]
    if not isinstance(ev, dict):
        return (
            f"'evaluator' is {ev!r}, not an evaluator object (the README's placeholder; "
            "desktop_env reads evaluator['func'])"
            if isinstance(ev, str)
            else f"'evaluator' must be an object, got {type(ev).__name__}"
        )
    funcs = ev.get("func") if isinstance(ev.get("func"), list) else [ev.get("func")]
    if not funcs or not all(isinstance(f, str) and f for f in funcs):
        return "the evaluator names no metric function ('func' is empty): nothing can score the task"
    return None


def read_task(path: Path, domain: str | None = None) -> OSWorldTask:
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise TaskFileError(f"{path}: not readable JSON ({e})") from None
    why = _check(raw)
    if why:
        raise TaskFileError(f"{path}: {why}")
    windows = path.stem.endswith("-win") or "Windows" in path.parts[-3:-1]
    if raw["id"] != path.stem and not (windows and path.stem == f"{raw['id']}-win"):
        raise TaskFileError(f"{path}: id {raw['id']!r} differs from the file name")
    return OSWorldTask(str(raw["id"]), domain or path.parent.name, str(raw["instruction"]), raw, str(path), windows)


def _base(root: Path) -> Path:
    root = Path(root).expanduser()
    return root / "examples" if (root / "examples").is_dir() else root


def _task_files(root: Path) -> list[Path]:
    """Every JSON file below <root>/examples (or below root when it is the examples folder): <domain>/<id>.json,
    Windows/<app>/<id>.json, and the folder's own files (template.json)."""
    return sorted(p for p in _base(root).rglob("*.json") if p.is_file())


def _keyed(tasks: list[OSWorldTask], base: Path) -> list[OSWorldTask]:
    """Task ids unique in the `tasks` table: a Windows task is '<its path below examples>' (its id repeats an
    Ubuntu task's); an id that several Ubuntu domain folders use for different tasks (upstream's chrome/ and
    thunderbird/ share 15) is '<domain>/<id>' in each, as run.py tells them apart by (domain, id)."""
    seen: dict[str, set[str]] = {}
    for t in tasks:
        if not t.windows:
            seen.setdefault(t.task_id, set()).add(json.dumps(t.raw, sort_keys=True))
    out = []
    for t in tasks:
        rel = Path(t.path).relative_to(base).with_suffix("").as_posix()
        if t.windows:
            key = rel
        elif len(seen[t.task_id]) > 1:
            key = f"{t.domain}/{t.task_id}"
        else:
            key = t.task_id
        out.append(OSWorldTask(key, t.domain, t.instruction, t.raw, t.path, t.windows))
    return out


def scan_tasks(root: str | Path, include_excluded: bool = False) -> TaskScan:
    """Every file under root's examples folder: loaded (sorted by path), skipped by policy (EXCLUDED) or rejected
    with the reason; one bad file never stops the others. TaskFileError only when there are no task files."""
    files = _task_files(Path(root))
    if not files:
        raise TaskFileError(f"{root}: no task files (expected examples/<domain>/<id>.json)")
    base, scan, read = _base(Path(root)), TaskScan(), []
    for p in files:
        rel = p.relative_to(base).as_posix()
        try:
            read.append(read_task(p, p.parent.name if p.parent != base else None))
        except TaskFileError as e:
            scan.rejected.append((rel, str(e).removeprefix(f"{p}: ")))
    seen_ids: set[str] = set()
    for t in _keyed(read, base):
        if t.task_id in seen_ids:  # the same task in two folders, word for word: loaded once
            scan.rejected.append((Path(t.path).relative_to(base).as_posix(), f"a copy of task {t.task_id!r}"))
            continue
        seen_ids.add(t.task_id)
        why = exclusion(t.raw, t.windows)
        if why and not include_excluded:
            scan.skipped.append((t.task_id, EXCLUDED[why]))
        else:
            scan.tasks.append(t)
    return scan


def load_tasks(root: str | Path, include_excluded: bool = False) -> tuple[list[OSWorldTask], list[tuple[str, str]]]:
    """Every task under root and the (id or file, reason) of those skipped or rejected (see scan_tasks)."""
    scan = scan_tasks(root, include_excluded)
    return scan.tasks, scan.skipped + scan.rejected


def find_task(root: str | Path, task_id: str) -> dict[str, Any]:
    """One task's JSON by its task id (the `tasks` table's; the env server's tasks dir); ValueError naming the
    folder when absent."""
    for t in scan_tasks(root, include_excluded=True).tasks:
        if t.task_id == task_id:
            return t.raw
    raise ValueError(f"OSWorld task {task_id!r} not found under {root}")


def same_task(task_id: str, task_config: dict[str, Any]) -> bool:
    """Whether a task JSON is the one a task id names: its id, or '<domain>/<id>' / '<path>' ending in it."""
    tid = str(task_config.get("id", task_id))
    name = task_id.rsplit("/", 1)[-1]
    return tid == task_id or tid == name or f"{tid}-win" == name


def task_rows(tasks: list[OSWorldTask]) -> list[dict[str, Any]]:
    """Rows of the `tasks` table: domain, snapshot, config steps and evaluator kept in `config` (JSON)."""
    rows = []
    for t in tasks:
        config = {
            "domain": t.domain,
            "snapshot": t.raw.get("snapshot"),
            "config": t.raw.get("config", []),
            "evaluator": t.raw["evaluator"],
            "related_apps": t.raw.get("related_apps", []),
            "proxy": bool(t.raw.get("proxy", False)),
            "source_url": t.raw.get("source"),
            "file": Path(t.path).name,
            "task_json": t.raw,  # what DesktopEnv.reset takes, as the file has it
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
