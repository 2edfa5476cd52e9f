"""`flywheel import osworld-results DIR`: OSWorld result folders into the lake as episodes and steps.

    res = import_osworld(Path("results"), lake)   # {"episodes": 12, "steps": 80, "skipped": 0, "rejected": [...]}

The format (OSWorld's run.py / lib_run_single.py; docs/IMPORTS.md cites the files) is one folder per task run,
``<action_space>/<observation_type>/<model>/<domain>/<example_id>/``, holding

- ``traj.jsonl``: one JSON object per executed action: ``step_num``, ``action_timestamp``, ``action`` (a
  pyautogui code string or WAIT/DONE/FAIL), ``response`` (the model's text; newer forks merge the agent's
  response dict into the line instead), ``reward``, ``done``, ``info``, ``screenshot_file`` (the screen *after*
  the action);
- ``step_<n>_<timestamp>.png`` for those screenshots, and in newer runs ``step_0.png`` (the first screen) and
  ``instruction.txt``;
- ``result.txt``: the evaluator's score (absent when the run did not finish).

Each traj line becomes one step per action its code holds (parsed by agents.pyautogui_parse, never run; a line
with code we cannot read is kept with parse_ok false and the reason). A step whose action is in the schema but is
no SFT target is kept with parse_ok true, ``fallback_parse`` true (curate's exclusion) and the reason in
``parse_error`` (common.step_verdict): a scroll before any pointer position is known; a point off the screen, kept
at the screen edge where the pointer went (the code ran through pyautogui); the first step of a run without
``step_0.png`` (no screen before it; its ``screen_w/h`` are still the run's, the space of its action); and a click
at x = 1 whose response is GUIAgentAdapter's ``click:<target>@(1,<y>)`` (``v3yu/osworld-eval``: that agent takes
the first two numbers of its grounding reply, so x = 1 is not the model's). The screen a step saw is the previous
line's screenshot (``step_0.png`` for the first step); the last screenshot is the episode's final row. Lines that
share a ``step_num`` and a ``response`` are the actions of one model response (lib_run_single.py runs
``for action in actions`` under one step index; Qwen3-VL's agent even writes each of them to the same
``step_<n>.png``): they all get the screen the model saw, before the first of them, as the parts of one code
string do. A numbered folder below the task folder (``<example_id>/0/``, one per trial) is a trial of that task:
the task id is its parent, the trial number the episode's ``sample_idx``. A traj.jsonl that begins with a Git
LFS pointer (the file was never fetched, and a later run appended its lines to the pointer) keeps the lines
after the pointer, each step noting it; a pointer alone rejects the run with that reason. The
reward is ``result.txt``; success means a score of 1. A final ``{"Error": ...}`` line (run.py appends
``Time limit exceeded in <domain>/<id>`` on a timeout) ends the run: its steps are kept and the episode's status is
``error`` with that line as the error; a run whose only line is an Error holds no step and is passed over, named.
A leading string in the code (UI-TARS's "Observation ... Thought ...") is the step's thought. Episode ids hash the
folder path below DIR, and every episode is one lake file named by its id, so importing the same folder again adds
nothing. A malformed line rejects its whole episode with a message naming the file and line.
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path
from typing import Any

from agents.pyautogui_parse import Pointer, read_pyautogui
from flywheel.interop.common import (  # noqa: F401
    STAGE,
    ImportError_,
    ImportResult,
    PassOver,
    import_one,
    imported_episode,
    png_size,
    step_verdict,
    write_episode,
)
from storage.lake import Lake

RUN_KEY = "import-osworld"
POLICY = "osworld-import"
# The response v3yu/osworld-eval's GUIAgentAdapter writes for a click: "click:<target>@(<x>,<y>)". Its point is the
# first two numbers of its grounding model's reply, so a reply with a digit before the point gives x = 1 (a digit
# of the reply's text) and y = the model's x: 105 of its 158 clicks in the real runs have x = 1 (docs/IMPORTS.md).
_GROUNDED_CLICK = re.compile(r"click:.*@\(1,(-?\d+)\)", re.S)
_TASK_ID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}", re.I)  # OSWorld's task ids


def task_dirs(root: Path) -> list[Path]:
    """Every folder below `root` that holds a traj.jsonl (the task-run folders), sorted."""
    return sorted(p.parent for p in root.rglob("traj.jsonl"))


def _read_lines(path: Path) -> tuple[list[dict[str, Any]], str | None, list[dict[str, str]]]:
    """The action lines of a traj.jsonl, and the run's error: run.py / lib_run_single.py append
    ``{"Error": "Time limit exceeded in <domain>/<id>"}`` (or the exception) when a run is cut off; that line ends
    the run, and the steps before it are kept. The third value: notes for every step (a Git LFS pointer skipped)."""
    rows, error = [], None
    lines = path.read_text(encoding="utf-8").splitlines()
    start, notes = _lfs_pointer(lines), []
    if start:
        if not any(line.strip() for line in lines[start:]):
            raise ImportError_(
                f"{path}:1: a Git LFS pointer, not the trajectory: the file was never fetched (run `git lfs pull`)"
            )
        notes.append(
            {
                "note": f"traj.jsonl lines 1-{start} are a Git LFS pointer (the file was never fetched); "
                "the lines after it (a later run appended them to the pointer file) are imported"
            }
        )
    for i, line in enumerate(lines, 1):
        if i <= start or not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise ImportError_(f"{path}:{i}: not JSON ({e.msg})") from None
        if isinstance(row, dict) and "action" not in row and set(row) <= {"Error", "error"}:
            error = f"{path.name}:{i}: {str(row.get('Error') or row.get('error'))[:300]}"
            continue
        if not isinstance(row, dict) or "action" not in row:
            raise ImportError_(
                f"{path}:{i}: no 'action' field (an OSWorld traj.jsonl line has step_num, action, "
                "response, reward, done, info, screenshot_file)"
            )
        if error is not None:
            raise ImportError_(f"{path}:{i}: an action line after the run's Error line ({error})")
        if row.get("screenshot_file") is not None and not isinstance(row["screenshot_file"], str):
            raise ImportError_(f"{path}:{i}: screenshot_file must be a file name")
        row["_line"] = i
        rows.append(row)
    if not rows:
        if error is not None:
            raise PassOver(f"{path}: no steps to import: the run stopped before its first action ({error})")
        raise ImportError_(f"{path}:1: empty trajectory")
    return rows, error, notes


def _lfs_pointer(lines: list[str]) -> int:
    """How many leading lines are a Git LFS pointer (its spec: ``version https://git-lfs.github.com/spec/v1``, then
    ``key value`` lines such as ``oid sha256:...`` and ``size N``); 0 when the file does not begin with one."""
    if not lines or not lines[0].strip().startswith("version https://git-lfs.github.com/spec/"):
        return 0
    n = 1
    while n < len(lines) and re.fullmatch(r"(oid|size|ext-[0-9]-\w+) \S+", lines[n].strip()):
        n += 1
    return n


def _image(folder: Path, name: str | None, where: str) -> bytes | None:
    if not name:
        return None
    p = folder / Path(name).name  # a bare file name inside the task folder, whatever the line says
    if not p.is_file():
        raise ImportError_(f"{where}: screenshot {name!r} is missing")
    return p.read_bytes()


def _score(folder: Path) -> float | None:
    p = folder / "result.txt"
    if not p.is_file():
        return None
    text = p.read_text(encoding="utf-8").strip()
    try:
        return float(text)
    except ValueError:
        raise ImportError_(f"{p}:1: not a score: {text[:40]!r}") from None


def _response_text(row: dict[str, Any]) -> str | None:
    resp = row.get("response")
    if resp is None:  # newer forks merge the agent's response dict into the line
        extra = {
            k: v
            for k, v in row.items()
            if k not in ("step_num", "action_timestamp", "action", "reward", "done", "info", "screenshot_file", "_line")
        }
        return json.dumps(extra, ensure_ascii=False) if extra else None
    return resp if isinstance(resp, str) else json.dumps(resp, ensure_ascii=False)


def _misread_point(row: dict[str, Any], actions: list) -> list[str]:
    """A flag for a click at x = 1 whose response is GUIAgentAdapter's "click:<target>@(1,<y>)": that x is not a
    point the model gave (see _GROUNDED_CLICK), so the click is kept as it ran but is no SFT target."""
    m = _GROUNDED_CLICK.fullmatch(row.get("response") or "") if isinstance(row.get("response"), str) else None
    if not m or not any(getattr(a, "x", None) == 1 for a in actions):
        return []
    return [
        f"x = 1 is not the model's: this agent's response 'click:<target>@(1,{m.group(1)})' takes the first two "
        "numbers of its grounding reply (x = a digit of the reply's text, y = the model's x); not fit for SFT"
    ]


def episode_rows(root: Path, folder: Path, git_sha: str | None = None) -> tuple[dict, list[dict]]:
    """One task-run folder -> (episode row, step rows). Raises ImportError_ naming the file and line."""
    rel = folder.relative_to(root).as_posix()
    parts = rel.split("/")
    trial = 0
    if len(parts) >= 2 and parts[-1].isdigit() and _TASK_ID.match(parts[-2]):  # <example_id>/<trial>/
        trial, parts = int(parts[-1]), parts[:-1]
    example_id = parts[-1]
    model = parts[-3] if len(parts) >= 3 else "unknown"
    eid = hashlib.sha1(f"osworld|{rel}".encode()).hexdigest()[:16]
    traj = folder / "traj.jsonl"
    lines, run_error, file_notes = _read_lines(traj)
    before = _image(folder, "step_0.png", f"{traj}:1") if (folder / "step_0.png").is_file() else None
    size = png_size(before) if before else None
    instr_p = folder / "instruction.txt"
    instruction = instr_p.read_text(encoding="utf-8").strip() if instr_p.is_file() else None
    score = _score(folder)
    ptr, steps, n_unparsed = Pointer(), [], 0
    common = dict(episode_id=eid, run_key=RUN_KEY, git_sha=git_sha, config_hash=None, ui_text=None)
    # seen: the screen the model saw for the current response (its step_num and response text)
    step_num, response, seen, nth = None, None, before, 0
    for row in lines:
        where = f"{traj}:{row['_line']}"
        sn = row.get("step_num")
        same = isinstance(sn, int) and not isinstance(sn, bool) and sn == step_num and row.get("response") == response
        if same:  # another action of the same model response: it saw the same screen as the first
            nth += 1
        else:
            step_num, response, seen, nth = sn, row.get("response"), before, 1
        after = _image(folder, row.get("screenshot_file"), where)
        if size is None and after is not None:
            size = png_size(after)
        w, h = size or (1920, 1080)  # OSWorld's default screen when no screenshot says otherwise
        # the code ran through pyautogui on the VM: a point off the screen went to the screen's edge (flagged)
        parsed = read_pyautogui(row["action"], w, h, ptr, off_screen="clamp")
        actions, err, flags = parsed.actions, parsed.error, [parsed.flag] if parsed.flag else []
        if seen is None:
            flags.append(
                "no screenshot of the screen before this step (the run saved no step_0.png): "
                "the action is kept, not fit for SFT"
            )
        flags += _misread_point(row, actions)
        verdict = step_verdict(err, flags)
        notes = file_notes + parsed.notes
        code = row["action"] if isinstance(row["action"], str) else json.dumps(row["action"])
        text = _response_text(row)
        for k, act in enumerate(actions or [None]):
            desc = f"{code.strip().splitlines()[0][:100] if code.strip() else '(empty)'}"
            if len(actions) > 1:
                desc += f" [part {k + 1} of {len(actions)}]"
            steps.append(
                dict(
                    common,
                    step_idx=len(steps),
                    is_final=False,
                    screenshot=seen,
                    # the screen space of the action, also without a screenshot (curate needs it for the history)
                    screen_w=w,
                    screen_h=h,
                    prompt_context=json.dumps(
                        {
                            "source": "osworld",
                            "traj_line": row["_line"],
                            "part": k + 1,
                            "parts": len(actions) or 1,
                            **({"step_num": sn, "action_of_step": nth} if isinstance(sn, int) else {}),
                            **({"notes": notes} if notes else {}),
                        }
                    ),
                    response_text=text,
                    thought=parsed.thought,
                    action_desc=desc,
                    raw_action=json.dumps({"code": code}),
                    action=act.model_dump_json() if act is not None else None,
                    **verdict,
                    exec_error=None,
                    reward=row.get("reward") if isinstance(row.get("reward"), (int, float)) else None,
                )
            )
            n_unparsed += err is not None
        if after is not None:
            before = after
    final_size = png_size(before) if before else (None, None)
    steps.append(
        dict(
            common,
            step_idx=len(steps),
            is_final=True,
            screenshot=before,
            screen_w=final_size[0],
            screen_h=final_size[1],
        )
    )
    ep = imported_episode(
        episode_id=eid,
        task_id=example_id,
        seed=0,
        instruction=instruction,
        env="osworld",
        env_version=f"osworld {parts[0]}/{parts[1]}" if len(parts) >= 5 else "osworld",
        policy=POLICY,
        policy_version=model,
        sample_idx=trial,
        task_reward=score,
        success=score is not None and score >= 1.0,
        n_steps=len(steps) - 1,
        n_parse_errors=n_unparsed,
        status="ok" if score is not None and run_error is None else "error",
        error=run_error
        if run_error is not None
        else None
        if score is not None
        else "no result.txt: the run did not finish",
        run_key=RUN_KEY,
        git_sha=git_sha,
    )
    return ep, steps


def import_osworld(root: Path, lake: Lake, *, iteration: int = 0, git_sha: str | None = None) -> ImportResult:
    """Every task-run folder below `root` into the lake (stage 'import'); already imported ones are skipped."""
    root = Path(root)
    if not root.is_dir():
        raise ImportError_(f"{root}: not a folder of OSWorld results")
    folders = task_dirs(root)
    if not folders:
        raise ImportError_(f"{root}: no traj.jsonl below it (expected <action_space>/<obs>/<model>/<domain>/<id>/)")
    res = ImportResult()
    for folder in folders:
        import_one(
            lake,
            res,
            str(folder),
            lambda folder=folder: episode_rows(root, folder, git_sha),
            iteration=iteration,
            run_key=RUN_KEY,
        )
    return res
