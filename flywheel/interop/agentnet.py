"""`flywheel import agentnet PATH`: OpenCUA AgentNet records into the lake as episodes and steps.

    res = import_agentnet(Path("agentnet.jsonl"), lake, images=Path("images/"))

The format (xlang-ai/OpenCUA ``data/cot-generate/README.md``; docs/IMPORTS.md) is one JSON record per task,
in a JSON Lines file (or a JSON list): ``task_id``, ``instruction`` (also ``natural_language_task`` /
``actual_task``), ``task_completed``, ``traj`` = a list of steps ``{index, image, value: {code, observation,
thought, action, last_step_correct, last_step_redundant, reflection}}``. ``image`` names the screenshot the
step saw (a file under `images`, default: the record file's folder); ``code`` is pyautogui with coordinates
normalised to 0..1 of the screen, or ``computer.wait()`` / ``computer.terminate(status=...)``.

Also read: AgentNetBench records (OpenCUA ``evaluation/agentnetbench/sample_data/*.json``: one pretty-printed
object with ``steps`` of ``{step_num, image, action, inner_monologue: {observation, thought,
low_level_instruction}}``), mapped onto the same fields (``action`` is the code, ``low_level_instruction`` the
"Action:" line; their PNGs sit in ``images/`` beside the records, which is searched too). A file is read as JSON
Lines, or as one JSON document (a record or a list of them) when it is not.

Code is read by agents.pyautogui_parse (never run) on the unit square, and every point goes to screen pixels
through ``CoordTransform.for_unit`` with the screen size taken from the step's PNG. ``thought`` becomes the
step's thought (else a string statement in the code) and ``action`` its "Action:" line; the other annotations
(``observation``, ``reflection``, ``last_step_correct``, ``last_step_redundant``) and the record's judge scores
(``alignment_score``, ``efficiency_score``, ``task_difficulty``, ``reason``, ``actual_task``) are kept in each
step's ``prompt_context``. ``task_completed`` is the reward (there is no evaluator run in AgentNet, so it is the
annotators' verdict; AgentNetBench has none, so its reward is NULL). AgentNet keeps no screen after the last
action, so these episodes have no final row. Idempotent like the OSWorld import; a malformed record is rejected
with a line naming the file and record number.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from agents.actions import action_from_dict
from agents.coords import CoordTransform
from agents.pyautogui_parse import Pointer, read_pyautogui
from flywheel.interop.common import ImportError_, ImportResult, import_records, imported_episode, png_size, step_verdict
from storage.lake import Lake

RUN_KEY = "import-agentnet"
POLICY = "agentnet-import"


def _to_screen(actions: list, w: int, h: int) -> list:
    """Unit-square actions (parsed on a 1x1 'screen') -> screen pixels through the one coordinate transform."""
    t = CoordTransform.for_unit(w, h)
    return [action_from_dict(t.action_to_screen(a.model_dump())) for a in actions]


def _bench_to_traj(rec: dict[str, Any]) -> dict[str, Any]:
    """An AgentNetBench record (OpenCUA ``evaluation/agentnetbench/sample_data``: ``steps`` of ``{step_num, image,
    action, inner_monologue: {observation, thought, low_level_instruction}}``) in AgentNet's ``traj`` shape."""
    traj = []
    for st in rec["steps"]:
        if not isinstance(st, dict):
            traj.append(st)  # rejected below, with its index
            continue
        mono = st.get("inner_monologue") if isinstance(st.get("inner_monologue"), dict) else {}
        value = {
            "code": st.get("action"),
            "observation": mono.get("observation"),
            "thought": mono.get("thought"),
            "action": mono.get("low_level_instruction"),
        }
        traj.append({"index": st.get("step_num"), "image": st.get("image"), "value": value})
    return {
        "task_id": rec.get("task_id"),
        "instruction": rec.get("user_task_description") or rec.get("high_level_task_description"),
        "traj": traj,
        "_shape": "agentnetbench",
    }


# the per-step annotations AgentNet's CoT pipeline adds (data/cot-generate/README.md), kept with each step
STEP_NOTES = ("last_step_correct", "last_step_redundant", "reflection", "observation")
# the per-record verdicts of AgentNet's judge (same README), kept in every step's prompt_context under 'record'
RECORD_NOTES = ("alignment_score", "efficiency_score", "task_difficulty", "reason", "actual_task", "domain")


def _image(images: Path, name: str, where: str) -> Path:
    for folder in (images, images / "images"):  # AgentNetBench keeps its PNGs in images/ beside the records
        p = folder / Path(name).name
        if p.is_file():
            return p
    raise ImportError_(f"{where} image {name!r} not found in {images}")


def record_rows(path: Path, n: int, rec: Any, images: Path, git_sha: str | None) -> tuple[dict, list[dict]]:
    where = f"{path}:{n}"
    if isinstance(rec, dict) and "traj" not in rec and isinstance(rec.get("steps"), list):
        rec = _bench_to_traj(rec)
    if not isinstance(rec, dict) or not isinstance(rec.get("traj"), list) or not rec["traj"]:
        raise ImportError_(
            f"{where}: not an AgentNet record (needs a non-empty 'traj' list, or AgentNetBench's 'steps')"
        )
    task_id = rec.get("task_id")
    if not isinstance(task_id, str) or not task_id:
        raise ImportError_(f"{where}: 'task_id' missing")
    eid = hashlib.sha1(f"agentnet|{task_id}".encode()).hexdigest()[:16]
    shape = rec.get("_shape", "agentnet")
    verdicts = {k: rec[k] for k in RECORD_NOTES if rec.get(k) is not None}
    ptr, steps, n_bad = Pointer(), [], 0
    for k, st in enumerate(rec["traj"]):
        val = st.get("value") if isinstance(st, dict) else None
        if not isinstance(val, dict) or not isinstance(st.get("image"), str):
            raise ImportError_(f"{where}: traj[{k}] needs 'image' and a 'value' object")
        png = _image(images, st["image"], f"{where}: traj[{k}]").read_bytes()
        w, h = png_size(png)
        # parsed on the unit square (a point must lie in [0, 1]; pixel coordinates would be rejected)
        parsed = read_pyautogui(val.get("code"), 1.0000001, 1.0000001, ptr)
        actions, err = parsed.actions, parsed.error
        verdict = step_verdict(err, [parsed.flag] if parsed.flag else [])
        if actions:
            actions = _to_screen(actions, w, h)
        thought = val.get("thought") if isinstance(val.get("thought"), str) else parsed.thought
        context = {"source": shape, "traj_index": st.get("index", k)}
        context.update({key: val[key] for key in STEP_NOTES if val.get(key) is not None})
        if parsed.notes:
            context["notes"] = parsed.notes
        if verdicts:
            context["record"] = verdicts
        for j, act in enumerate(actions or [None]):
            desc = str(val.get("action") or "")[:200] + (
                f" [part {j + 1} of {len(actions)}]" if len(actions) > 1 else ""
            )
            steps.append(
                dict(
                    episode_id=eid,
                    step_idx=len(steps),
                    is_final=False,
                    screenshot=png,
                    screen_w=w,
                    screen_h=h,
                    ui_text=None,
                    prompt_context=json.dumps(context, ensure_ascii=False),
                    response_text=json.dumps(val, ensure_ascii=False),
                    thought=thought,
                    action_desc=desc,
                    raw_action=json.dumps({"code": val.get("code")}),
                    action=act.model_dump_json() if act is not None else None,
                    **verdict,
                    exec_error=None,
                    run_key=RUN_KEY,
                    git_sha=git_sha,
                    config_hash=None,
                )
            )
            n_bad += err is not None
    done = rec.get("task_completed")
    reward = 1.0 if done is True else 0.0 if done is False else None
    ep = imported_episode(
        episode_id=eid,
        task_id=task_id,
        seed=0,
        instruction=rec.get("instruction") or rec.get("natural_language_task") or rec.get("actual_task"),
        env="agentnet",
        env_version=shape,
        policy=POLICY,
        policy_version="human",
        task_reward=reward,
        success=reward == 1.0,
        n_steps=len(steps),
        n_parse_errors=n_bad,
        run_key=RUN_KEY,
        git_sha=git_sha,
    )
    return ep, steps


def import_agentnet(
    path: Path, lake: Lake, *, images: Path | None = None, iteration: int = 0, git_sha: str | None = None
) -> ImportResult:
    path = Path(path)
    if not path.is_file():
        raise ImportError_(f"{path}: not an AgentNet file (JSON Lines of task records)")
    images = Path(images) if images else path.parent
    return import_records(
        path, lake, lambda p, n, rec: record_rows(p, n, rec, images, git_sha), run_key=RUN_KEY, iteration=iteration
    )
