"""One scripted-teacher episode in a real env, shared by the teacher tests (MiniWoB and synthetic pages)."""

from __future__ import annotations

from agents.base import StepRecord
from envs import registry


def run_teacher(env, teacher, task: str, seed: int) -> tuple[float, list, dict]:
    """(reward, the teacher's decisions, the last step's info); every action must execute."""
    obs = env.reset(task, seed)
    teacher.reset(task, seed)
    history, decisions, res = [], [], None
    for i in range(registry.max_steps_for(task)):
        d = teacher.act(obs, history)
        decisions.append(d)
        res = env.step(d.action)
        assert res.exec_error is None, (task, seed, i, res.exec_error)
        history.append(StepRecord(i, d.thought, d.action_desc, d.action, "ok", obs.screenshot_png))
        obs = res.observation
        if res.done:
            break
    return env.evaluate(), decisions, res.info if res else {}
