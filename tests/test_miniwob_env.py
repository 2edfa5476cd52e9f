"""MiniWobEnv against real headless Chromium (marked `browser`), plus the task registry (no browser).

One env is shared by the module (starting Chromium takes ~1 s); each test resets it.
"""

from __future__ import annotations

import io
import re

import pytest
from PIL import Image

from agents.actions import Click, Done, Drag, Fail, Key, RightClick, Type, Wait
from envs import registry
from envs.base import EnvError

BOX_LINE = re.compile(r'^\S+( ".*")? @ \(-?\d+,-?\d+\) \[\d+x\d+\]( (checked|unchecked|selected|focused))*$')


def centre(obs, **match) -> tuple[float, float]:
    """Screen-space centre of the first DOM element whose fields equal `match`."""
    e = next(e for e in obs.extra["dom_elements"] if all(e[k] == v for k, v in match.items()))
    s = obs.extra["scale"]
    return (e["left"] + e["width"] / 2) * s, (e["top"] + e["height"] / 2) * s


@pytest.fixture(scope="module")
def env():
    from envs.miniwob import MiniWobEnv

    e = MiniWobEnv()
    yield e
    e.close()


# ------------------------------------------------------------------------------ browser
@pytest.mark.browser
@pytest.mark.parametrize("task", ["click-tab", "enter-text", "click-dialog"])
def test_reset_is_reproducible_per_seed(env, task):
    a = env.reset(task, 5)
    env.step(Click(x=80, y=120))  # another episode in between: focus, hover and refs must not leak
    env.reset(task, 6)
    env.step(Click(x=30, y=150))
    b = env.reset(task, 5)
    assert a.screenshot_png == b.screenshot_png
    assert (a.instruction, a.ui_text) == (b.instruction, b.ui_text)
    assert env.reset(task, 6).instruction != a.instruction or env.reset(task, 6).screenshot_png != a.screenshot_png


@pytest.mark.browser
def test_observation_shape_and_ui_text(env):
    obs = env.reset("enter-text", 3)
    assert (obs.width, obs.height) == (160, 210)
    assert Image.open(io.BytesIO(obs.screenshot_png)).size == (160, 210)
    assert obs.instruction.startswith("Enter ") and obs.extra["fields"][0][0] == "target"
    lines = obs.ui_text.splitlines()
    assert lines and all(BOX_LINE.match(line) for line in lines), obs.ui_text
    assert any(line.startswith('button#subbtn "Submit" @ (') for line in lines)
    assert any(line.startswith('input_text#tt "" @ (') for line in lines)


@pytest.mark.browser
def test_click_solves_click_test(env):
    obs = env.reset("click-test", 0)
    x, y = centre(obs, tag="button")
    res = env.step(Click(x=x, y=y))
    assert res.done and res.exec_error is None
    assert res.executed == {"miniwob": [{"action_type": "CLICK_COORDS", "coords": [x, y]}]}
    assert res.info["raw_reward"] > 0 and res.info["task_done"]
    assert env.evaluate() == 1.0
    # the screen after the last action is kept, and shows the task, not miniwob's dark START cover
    final = Image.open(io.BytesIO(res.observation.screenshot_png)).convert("RGB")
    assert final.getpixel((80, 10)) == Image.open(io.BytesIO(obs.screenshot_png)).convert("RGB").getpixel((80, 10))
    assert "button" in res.observation.ui_text


@pytest.mark.browser
def test_type_and_keys_solve_enter_text(env):
    obs = env.reset("enter-text", 1)
    target = dict(obs.extra["fields"])["target"]
    x, y = centre(obs, tag="input_text")
    assert not env.step(Click(x=x, y=y)).done
    res = env.step(Type(text=target))
    assert f'"{target}"' in res.observation.ui_text  # the typed value shows in the text view
    res = env.step(Key(keys=["ctrl", "a"]))
    assert res.exec_error is None
    x, y = centre(res.observation, tag="button")
    assert env.step(Click(x=x, y=y)).done and env.evaluate() == 1.0


@pytest.mark.browser
def test_wrong_answer_scores_zero(env):
    obs = env.reset("click-test-2", 2)  # buttons ONE and TWO; the instruction names one
    target = dict(obs.extra["fields"])["target"]
    x, y = centre(obs, tag="button", text="TWO" if target == "ONE" else "ONE")
    res = env.step(Click(x=x, y=y))
    assert res.done and res.info["raw_reward"] < 0 and env.evaluate() == 0.0


@pytest.mark.browser
@pytest.mark.parametrize(
    "action, why",
    [
        (RightClick(x=10, y=60), "unsupported"),
        (Drag(x1=10, y1=60, x2=50, y2=60), "unsupported"),
        (Key(keys=["esc"]), "unsupported"),
        (Click(x=500, y=60), "off-screen"),
    ],
)
def test_exec_error_keeps_the_episode_going(env, action, why):
    obs = env.reset("click-test", 4)
    res = env.step(action)
    assert why in res.exec_error and not res.done
    x, y = centre(obs, tag="button")
    assert env.step(Click(x=x, y=y)).done and env.evaluate() == 1.0


@pytest.mark.browser
def test_done_and_fail_end_the_episode(env):
    env.reset("click-test", 5)
    res = env.step(Done())
    assert res.done and res.info["ended_by"] == "done" and env.evaluate() == 0.0
    again = env.step(Wait(seconds=0))
    assert again.done and "ended" in again.exec_error
    env.reset("click-test", 5)
    assert env.step(Fail()).done and env.evaluate() == 0.0


@pytest.mark.browser
def test_wait_and_step_cap():
    from envs.miniwob import MiniWobEnv

    with MiniWobEnv(max_steps=2, screenshot_scale=2) as e:
        obs = e.reset("click-test", 0)
        assert (obs.width, obs.height) == (320, 420)
        assert Image.open(io.BytesIO(obs.screenshot_png)).size == (320, 420)
        assert obs.ui_text.count("@ (") >= 1
        r1 = e.step(Wait(seconds=0.01))
        assert not r1.done and not r1.info["truncated"] and r1.executed["miniwob"] == [{"action_type": "NONE"}]
        r2 = e.step(Wait(seconds=0.01))
        assert not r2.done and r2.info["truncated"]  # the runner marks the episode truncated
        r3 = e.step(Wait(seconds=0.01))
        assert r3.done and "step cap" in r3.exec_error
        obs = e.reset("click-test", 0)  # screen space is scaled: the env maps back to CSS px
        x, y = centre(obs, tag="button")
        line = next(ln for ln in obs.ui_text.splitlines() if ln.startswith("button"))
        assert f"@ ({round(x)},{round(y)})" in line  # ui_text speaks screen px too
        assert e.step(Click(x=x, y=y)).done and e.evaluate() == 1.0


@pytest.mark.browser
def test_timer_is_extended_after_task_switch(env):
    env.reset("enter-password", 0)  # the page sets its own 15 s timer on load
    assert env.unwrapped.instance.driver.execute_script("return core.EPISODE_MAX_TIME;") == 3600 * 1000


@pytest.mark.browser
def test_unknown_task(env):
    with pytest.raises(ValueError, match="unknown MiniWoB task"):
        env.reset("no-such-task", 0)


@pytest.mark.browser
def test_browser_crash_raises_env_error_then_recovers():
    from envs.miniwob import MiniWobEnv

    e = MiniWobEnv()
    try:
        e.reset("click-test", 0)
        e.unwrapped.instance.driver.quit()  # the browser dies behind the env's back
        with pytest.raises(EnvError, match="browser failure"):
            e.step(Click(x=80, y=100))
        obs = e.reset("click-test", 0)  # a fresh browser
        assert obs.instruction == "Click the button."
    finally:
        e.close()


@pytest.mark.browser
def test_killed_chromedriver_leaves_no_browser_behind():
    """A SIGKILLed chromedriver left its Chromium running, re-parented out of the worker's tree: a rollout worker
    that then exited with its parent (the chaos run killed chromedriver, then the run) left 11 Chromium processes.
    The restart after the crash, and close(), now end that browser."""
    import os
    import signal
    import time
    from pathlib import Path

    from envs.miniwob import MiniWobEnv
    from envs.slot_process import _descendants

    def alive(pids) -> list[int]:
        out = []
        for p in pids:
            try:
                if Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z":
                    out.append(p)
            except OSError:
                pass
        return out

    e = MiniWobEnv()
    browsers = []
    try:
        for restart in (True, False):  # the crash found by the next episode's reset, then by close()
            e.reset("click-test", 0)
            driver = e.unwrapped.instance.driver.service.process.pid
            browsers = _descendants(driver)  # Chromium and its helpers
            assert len(browsers) >= 2
            os.kill(driver, signal.SIGKILL)
            with pytest.raises(EnvError, match="browser failure"):
                e.step(Click(x=80, y=100))
            if restart:
                assert e.reset("click-test", 1).instruction == "Click the button."  # a fresh browser
            else:
                e.close()
            deadline = time.monotonic() + 10
            while alive(browsers) and time.monotonic() < deadline:  # helpers exit once the browser is gone
                time.sleep(0.1)
            assert alive(browsers) == []
    finally:
        e.close()
        for p in alive(browsers):  # ours: what the failing version leaves behind
            os.kill(p, signal.SIGKILL)


@pytest.mark.browser
def test_close_is_idempotent_and_quits_the_driver():
    from envs.miniwob import MiniWobEnv

    e = MiniWobEnv()
    proc = e.unwrapped.instance.driver.service.process
    e.close()
    e.close()
    assert proc.wait(timeout=10) is not None
    with pytest.raises(EnvError):
        e.reset("click-test", 0)


# ------------------------------------------------------------------------------ no browser
def test_missing_chromium_is_a_clear_error(tmp_path):
    from envs.miniwob import MiniWobEnv

    with pytest.raises(EnvError, match="chromium not found at .*run scripts/setup.sh"):
        MiniWobEnv(chrome_binary=str(tmp_path / "chromium"))


def test_seed_splits_are_disjoint():
    train, ev = registry.seeds("train", 10_000), registry.seeds("eval", 1000)
    assert not set(train) & set(ev)
    assert registry.split_of(train[-1]) == "train" and registry.split_of(ev[0]) == "eval"
    assert registry.seeds("eval", 3, offset=2) == [100_002, 100_003, 100_004]
    with pytest.raises(ValueError):
        registry.split_of(50_000)
    with pytest.raises(ValueError):
        registry.seeds("train", 2, offset=9_999)


def test_tasks_table_and_factory():
    rows = registry.tasks_table_rows()
    assert {tuple(sorted(r)) for r in rows} == {("config", "env", "instruction", "source", "split", "task_id")}
    by_id = {r["task_id"]: r for r in rows}
    assert by_id["click-test"]["split"] == "both" and by_id[registry.HELD_OUT[0]]["split"] == "eval"
    assert len(registry.teacher_tasks()) >= 30
    assert not set(registry.HELD_OUT) & set(registry.teacher_tasks())
    assert all(t in registry.KNOWN_MINIWOB_TASKS or registry.is_synth(t) for t in by_id)
    with pytest.raises(ValueError, match="unknown env"):
        registry.make_env("nosuch")


@pytest.mark.browser
def test_selenium_manager_never_runs(monkeypatch):
    """Both binaries are explicit, so Selenium never calls Selenium Manager (which goes to the network)."""
    from selenium.webdriver.common.selenium_manager import SeleniumManager

    from envs.miniwob import MiniWobEnv

    def boom(*a, **k):
        raise AssertionError("Selenium Manager ran")

    monkeypatch.setattr(SeleniumManager, "binary_paths", boom)
    MiniWobEnv().close()
