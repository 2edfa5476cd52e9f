"""The scripted teacher on real MiniWoB pages (marked `browser`): success, pixel-only actions, text format."""

from __future__ import annotations

import pytest
from teacher_episode import run_teacher

from agents.actions import ActionType
from agents.parsing import parse_response
from agents.teacher import ScriptedTeacher, UnknownTask, supported_tasks
from envs import registry

# Diverse on purpose: one click, text matching, several clicks, typing, animation waits,
# tree expansion, keyboard chords, layout variants. 8 tasks x 5 seeds keeps this under ~1 min.
TASKS = [
    "click-button",
    "click-checkboxes",
    "enter-text",
    "click-collapsible",
    "navigate-tree",
    "use-autocomplete",
    "multi-layouts",
    "guess-number",
]
SEEDS = registry.seeds("train", 5, offset=500)  # not the seeds the recipes were developed on
PIXEL_ACTIONS = {ActionType.CLICK, ActionType.TYPE, ActionType.KEY, ActionType.WAIT, ActionType.DONE}


@pytest.fixture(scope="module")
def env():
    from envs.miniwob import MiniWobEnv

    e = MiniWobEnv()
    yield e
    e.close()


def run(env, teacher, task: str, seed: int) -> tuple[float, list]:
    reward, decisions, _ = run_teacher(env, teacher, task, seed)
    return reward, decisions


@pytest.mark.browser
def test_teacher_success_on_diverse_tasks(env):
    teacher = ScriptedTeacher()
    results = {(t, s): run(env, teacher, t, s) for t in TASKS for s in SEEDS}
    rate = sum(r for r, _ in results.values()) / len(results)
    failed = [k for k, (r, _) in results.items() if r < 1]
    assert rate >= 0.95, f"teacher success {rate:.2f}; failed {failed}"
    for (task, seed), (_, decisions) in results.items():
        for d in decisions:
            assert d.action.type in PIXEL_ACTIONS  # demonstrations are learnable from pixels
            assert d.thought and d.action_desc
            parsed = parse_response(d.response_text)  # the text round-trips to the executed action
            assert parsed.action == d.action, (task, seed, d.response_text)


@pytest.mark.browser
def test_teacher_speaks_model_coordinates(env):
    from agents.coords import CoordTransform

    obs = env.reset("click-test", 3)
    t = CoordTransform.for_qwen3(obs.width, obs.height)
    d = ScriptedTeacher(transform=t).act(obs, [])
    x, y = (round(v) for v in t.to_model(d.action.x, d.action.y))
    assert f"at ({x},{y})" in d.thought and f'"x": {x}, "y": {y}' in d.response_text
    assert parse_response(d.response_text, t).action.x == pytest.approx(d.action.x, abs=1)


@pytest.mark.browser
def test_click_cites_the_ui_line_of_its_element(env):
    """A click's Action line quotes the clicked element's UI-text line (up to its centre), in the space the
    prompt's UI text uses, so a student can ground the click by copying the matching line."""
    import re

    from agents.coords import CoordTransform
    from agents.prompts import ui_text_in_model_space

    for seed in SEEDS:
        obs = env.reset("click-button", seed)
        label = re.search(r'"(.+)"', obs.instruction).group(1)
        for t in (None, CoordTransform.for_qwen3(obs.width, obs.height)):
            d = ScriptedTeacher(transform=t).act(obs, [])
            ui = obs.ui_text if t is None else ui_text_in_model_space(obs.ui_text, t)
            cited = d.action_desc.removeprefix("Click ")
            assert cited.startswith(f'button "{label}" @ (') and cited != d.action_desc, d.action_desc
            assert any(line.startswith(cited + " [") for line in ui.splitlines()), (cited, ui)
            assert f"Action: {d.action_desc}" in d.response_text


def test_supported_tasks_and_unknown_task():
    assert len(supported_tasks()) >= 30
    assert set(registry.teacher_tasks(include_held_out=True)) <= set(supported_tasks())
    with pytest.raises(UnknownTask, match="no recipe for task 'drag-box'"):
        ScriptedTeacher().reset("drag-box", 0)
    with pytest.raises(UnknownTask):
        ScriptedTeacher(tasks=["click-test", "drag-box"])
