"""The OSWorld backend at its boundary: our env around a stand-in for `desktop_env.DesktopEnv` (the VM is the
one thing these tests replace; no KVM here), the task loader on OSWorld-format JSON fixtures, and the env
server hosting it over HTTP."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from agents.actions import Click, Done, DoubleClick, Drag, Fail, Key, Scroll, Type, Wait
from agents.base import Decision, Policy
from envs import osworld as osworld_mod
from envs.base import EnvError
from envs.osworld import OSWorldEnv
from envs.osworld_tasks import find_task, load_tasks, task_rows
from flywheel.runtime.episode import EpisodeJob, run_episode

FIXTURES = Path(__file__).parent / "fixtures" / "osworld"
CALC = "357ef137-7eeb-4c80-a3bb-0951f26a8aff"
INFEASIBLE = "5ea617a3-0e86-4ba6-aab2-dac9aa2e8d57"


def _png(n: int) -> bytes:
    return b"\x89PNG\r\n\x1a\n" + n.to_bytes(4, "big")  # distinct bytes per frame; the env only compares them


class FakeDesktopEnv:
    """desktop-env 1.0.2's DesktopEnv contract (research/osworld_slime.md): step(action, pause) -> (obs, 0,
    done, info); WAIT/DONE/FAIL are strings it checks; evaluate() of an 'infeasible' task is 1 iff the last
    action was FAIL. Every executed action is recorded; the screen changes on every action."""

    instances: list["FakeDesktopEnv"] = []

    def __init__(self, **kwargs):
        self.kwargs, self.actions, self.frame, self.task, self.closed = kwargs, [], 0, None, False
        self.score = 1.0  # what the (non-infeasible) evaluator returns
        self.stable_after = 0  # reset: the screen keeps changing for this many observations
        FakeDesktopEnv.instances.append(self)

    def _obs(self):
        if self.stable_after > 0:
            self.stable_after -= 1
            self.frame += 1
        return {
            "screenshot": _png(self.frame),
            "accessibility_tree": "<desktop-frame name='x'/>" * 3,
            "terminal": None,
            "instruction": self.task["instruction"],
        }

    def reset(self, task_config=None, seed=None, options=None):
        self.task, self.actions, self.stable_after = task_config, [], 2
        return self._obs()

    def step(self, action, pause=2):
        self.actions.append((action, pause))
        if action not in ("WAIT", "DONE", "FAIL"):
            self.frame += 1
        return self._obs(), 0, action in ("DONE", "FAIL"), {"done": action == "DONE", "fail": action == "FAIL"}

    def evaluate(self):
        if self.task["evaluator"]["func"] == "infeasible":
            return 1.0 if self.actions and self.actions[-1][0] == "FAIL" else 0.0
        return 0.0 if self.actions and self.actions[-1][0] == "FAIL" else self.score

    def close(self):
        self.closed = True


@pytest.fixture
def sleeps(monkeypatch):
    """Record the env's sleeps instead of sleeping (what was slept is the assertion, not how long it took)."""
    got: list[float] = []
    monkeypatch.setattr(osworld_mod, "_sleep", got.append)
    return got


def _env(**kw) -> OSWorldEnv:
    return OSWorldEnv(
        desktop_env_cls=FakeDesktopEnv,
        tasks_dir=kw.pop("tasks_dir", str(FIXTURES)),
        screen_size=(1920, 1080),
        settle_timeout_s=kw.pop("settle_timeout_s", 1e9),
        **kw,
    )


def test_constructor_reaches_desktop_env_and_without_it_the_error_says_how_to_get_it():
    env = _env(provider_name="docker", require_a11y_tree=True)
    desk = FakeDesktopEnv.instances[-1]
    assert desk.kwargs["action_space"] == "pyautogui" and desk.kwargs["screen_size"] == (1920, 1080)
    assert desk.kwargs["provider_name"] == "docker" and desk.kwargs["require_a11y_tree"] is True
    env.close()
    assert desk.closed
    with pytest.raises(EnvError, match="setup_osworld.sh"):  # desktop-env is not in the flywheel's venv
        OSWorldEnv()


def test_actions_compile_to_pyautogui_and_reach_the_vm(sleeps):
    env = _env(pause_s=0.5)
    obs = env.reset(CALC, seed=0)
    desk = FakeDesktopEnv.instances[-1]
    assert obs.instruction.startswith("Fill column C") and obs.width == 1920 and obs.ui_text is None
    assert sleeps == [1.0, 1.0]  # reset polled the screen until it stopped changing (no fixed sleep)
    desk.actions.clear()
    steps = [
        (Click(x=10.4, y=20.6), "pyautogui.click(x=10, y=21)"),
        (DoubleClick(x=5, y=6), "pyautogui.doubleClick(x=5, y=6)"),
        (Type(text='it\'s "quoted"\n'), "pyautogui.write('it\\'s \"quoted\"\\n')"),
        (Key(keys=["ctrl", "s"]), "pyautogui.hotkey('ctrl', 's')"),
        (Scroll(x=100, y=200, dy=3), "pyautogui.scroll(-3, x=100, y=200)"),
        (
            Drag(x1=1, y1=2, x2=300, y2=400),
            "pyautogui.moveTo(1, 2); pyautogui.dragTo(300, 400, duration=0.5, button='left')",
        ),
    ]
    for action, cmd in steps:
        res = env.step(action)
        assert res.executed == {"pyautogui": cmd} and not res.done and res.exec_error is None
        assert res.observation.screenshot_png == _png(desk.frame)  # the screen after the action
    assert desk.actions == [(cmd, 0.5) for _, cmd in steps]
    res = env.step(Click(x=1920, y=5))  # off the 1920x1080 screen: an exec error, nothing sent to the VM
    assert "off-screen" in res.exec_error and len(desk.actions) == len(steps)


def test_wait_sleeps_and_reobserves_and_done_fail_reach_the_env(sleeps):
    env = _env(max_wait_s=5)
    env.reset(INFEASIBLE, seed=0)
    desk = FakeDesktopEnv.instances[-1]
    sleeps.clear()
    desk.actions.clear()
    desk.frame += 1  # something changed on screen while the agent waited
    res = env.step(Wait(seconds=30))
    assert sleeps == [5] and res.executed["slept_s"] == 5  # capped by max_wait_s
    assert desk.actions == [("WAIT", 0)] and res.observation.screenshot_png == _png(desk.frame) and not res.done
    res = env.step(Fail())
    assert res.done and desk.actions[-1] == ("FAIL", 0) and res.executed == {"pyautogui": "FAIL"}
    assert env.evaluate() == 1.0  # infeasible task, ended by FAIL: OSWorld scores it 1
    assert env.step(Click(x=1, y=1)).exec_error.startswith("the episode has ended")
    env.reset(INFEASIBLE, seed=1)
    assert env.step(Done()).done and desk.actions[-1] == ("DONE", 0)
    assert env.evaluate() == 0.0


class _Fixed(Policy):
    name = "fixed"

    def __init__(self, actions):
        self.actions = list(actions)

    def act(self, obs, history):
        a = self.actions[len(history)]
        return Decision(response_text=a.model_dump_json(), action=a)


@pytest.mark.parametrize("score,success", [(1.0, True), (0.5, False), (0.0, False)])
def test_evaluator_score_is_task_reward_and_success_is_the_binary_score(sleeps, score, success):
    env = _env(require_a11y_tree=True, ui_text_chars=40)
    job = EpisodeJob("osw", CALC, 0)
    FakeDesktopEnv.instances[-1].score = score
    ep, steps = run_episode(env, _Fixed([Click(x=50, y=60), Done()]), job, max_steps=5, timeout_s=60)
    assert ep["task_reward"] == score and ep["success"] is success and ep["status"] == "ok"
    assert ep["env"] == "osworld" and ep["n_steps"] == 2
    assert json.loads(steps[0]["executed"]) == {"pyautogui": "pyautogui.click(x=50, y=60)"}
    assert len(steps[0]["ui_text"]) == 40  # the a11y tree, cut to ui_text_chars
    assert steps[-1]["is_final"]


def test_task_loader_keeps_domain_snapshot_config_evaluator_and_skips_drive_and_proxy_tasks(tmp_path):
    tasks, skipped = load_tasks(FIXTURES)
    assert {t.domain for t in tasks} == {"chrome", "os", "libreoffice_calc"}
    reasons = dict(skipped)
    assert "Google Drive" in reasons["897e3b53-5d4d-444b-85cb-2cdc8a97d903"]
    assert "proxy" in reasons["b52b40a5-ad70-4c53-b5b0-5650a8387052"]
    rows = {r["task_id"]: r for r in task_rows(tasks)}
    cfg = json.loads(rows[CALC]["config"])
    assert rows[CALC]["env"] == "osworld" and rows[CALC]["instruction"].startswith("Fill column C")
    assert cfg["domain"] == "libreoffice_calc" and cfg["snapshot"] == "libreoffice_calc"
    assert [s["type"] for s in cfg["config"]] == ["download", "open"] and cfg["evaluator"]["func"] == "compare_table"
    assert len(load_tasks(FIXTURES / "examples", include_excluded=True)[0]) == 5
    assert find_task(FIXTURES, INFEASIBLE)["evaluator"] == {"func": "infeasible"}
    bad = tmp_path / "examples" / "os"
    bad.mkdir(parents=True)
    (bad / "x.json").write_text(json.dumps({"id": "x", "instruction": "hi"}))
    assert load_tasks(tmp_path) == ([], [("os/x.json", "not an OSWorld task: missing evaluator")])
    (bad / "x.json").write_text("{not json")
    assert "not readable JSON" in load_tasks(tmp_path)[1][0][1]
    with pytest.raises(ValueError, match="no task files"):
        load_tasks(tmp_path / "nothing")


SHAPES = Path(__file__).parent / "fixtures" / "osworld_shapes"  # the shapes upstream's examples folder holds


def test_task_loader_takes_every_real_shape_and_names_what_it_leaves():
    from envs.osworld_tasks import scan_tasks

    scan = scan_tasks(SHAPES)
    calc, noconf, shared = (f"a0000000-0000-4000-8000-00000000000{i}" for i in (1, 2, 5))
    # `config` is optional (desktop_env defaults it to []); one id in chrome/ and thunderbird/ names two tasks
    assert sorted(t.task_id for t in scan.tasks) == sorted([calc, noconf, f"chrome/{shared}", f"thunderbird/{shared}"])
    assert json.loads(task_rows([t for t in scan.tasks if t.task_id == noconf])[0]["config"])["config"] == []
    skipped = dict(scan.skipped)  # the Windows variants: a -win file whose id is the Ubuntu task's, Windows/<app>/
    assert set(skipped) == {f"libreoffice_calc/{calc}-win", f"Windows/excel/{calc}"}
    assert all("Windows VM" in why for why in skipped.values())
    rejected = dict(scan.rejected)
    assert set(rejected) == {
        "template.json",
        "gimp/broken.json",
        "vlc/a0000000-0000-4000-8000-000000000003.json",
        "vlc/a0000000-0000-4000-8000-000000000004.json",
    }
    assert "'evaluation_dir', not an evaluator object" in rejected["vlc/a0000000-0000-4000-8000-000000000003.json"]
    assert "names no metric" in rejected["vlc/a0000000-0000-4000-8000-000000000004.json"]
    assert "template" in rejected["template.json"] and "not readable JSON" in rejected["gimp/broken.json"]
    with_windows = scan_tasks(SHAPES, include_excluded=True)
    assert len(with_windows.tasks) == 6 and with_windows.skipped == []
    assert find_task(SHAPES, f"thunderbird/{shared}")["snapshot"] == "thunderbird"
    assert find_task(SHAPES, f"libreoffice_calc/{calc}-win")["config"][0]["parameters"]["path"].startswith("C:")


def test_a_domain_qualified_task_resets_with_its_own_json(sleeps):
    shared = "a0000000-0000-4000-8000-000000000005"
    env = _env(tasks_dir=str(SHAPES))
    env.reset(f"thunderbird/{shared}", 0)
    assert FakeDesktopEnv.instances[-1].task["snapshot"] == "thunderbird"
    env.reset(f"chrome/{shared}", 0, task_config=find_task(SHAPES, f"chrome/{shared}"))
    with pytest.raises(ValueError, match="not 'chrome/other'"):
        env.reset("chrome/other", 0, task_config=find_task(SHAPES, f"chrome/{shared}"))


def test_env_server_hosts_osworld_over_http(sleeps):
    from starlette.testclient import TestClient

    from envs.server import SlotPool
    from envs.server_http import ServerSettings, create_app

    settings = ServerSettings(env="osworld", slots=1, token="t0k")
    pool = SlotPool(lambda: _env(), 1)
    with TestClient(create_app(settings, pool), headers={"Authorization": "Bearer t0k"}) as http:
        for _ in range(100):  # the slot boots in a background thread: poll until it is ready
            if http.get("/v1/health").json()["free"] == 1:
                break
        sid = http.post("/v1/sessions").json()["session_id"]
        task = find_task(FIXTURES, CALC)
        obs = http.post(f"/v1/sessions/{sid}/reset", json={"task_id": CALC, "task_config": task}).json()
        assert obs["width"] == 1920
        r = http.post(f"/v1/sessions/{sid}/step", json={"action": {"action": "type", "text": "=A1+B1"}}).json()
        assert r["executed"] == {"pyautogui": "pyautogui.write('=A1+B1')"}
        r = http.post(f"/v1/sessions/{sid}/step", json={"action": {"action": "fail"}}).json()
        assert r["done"] and http.post(f"/v1/sessions/{sid}/evaluate").json() == {"reward": 0.0}
        r = http.post(f"/v1/sessions/{sid}/reset", json={"task_id": "other", "task_config": task})
        assert r.status_code == 400 and "not 'other'" in r.json()["error"]


def test_import_osworld_tasks_command_fills_the_tasks_table(tmp_path):
    import subprocess
    import sys

    from storage.catalog import connect

    run = [sys.executable, "-m", "flywheel", "import", "osworld-tasks"]
    root = Path(__file__).resolve().parents[1]
    out = subprocess.run(
        [*run, str(FIXTURES), "--lake", str(tmp_path / "lake")], capture_output=True, text=True, cwd=root, timeout=120
    )
    assert out.returncode == 0, out.stderr
    assert "3 OSWorld tasks" in out.stdout and "Google Drive" in out.stdout
    got = connect(tmp_path / "lake").execute("SELECT count(*), min(env), min(source) FROM tasks").fetchone()
    assert got == (3, "osworld", "osworld")
    bad = subprocess.run(
        [*run, str(tmp_path / "nothing"), "--lake", str(tmp_path / "lake")],
        capture_output=True,
        text=True,
        cwd=root,
        timeout=120,
    )
    assert bad.returncode == 2 and "no task files" in bad.stderr and "Traceback" not in bad.stderr


class _InProcess:
    """RemoteEnv's HTTP client, answered by a TestClient (which takes no per-request timeout)."""

    def __init__(self, http):
        import httpx

        self.http, self.timeout = http, httpx.Timeout(5.0)

    def request(self, method, url, timeout=None, **kw):
        return self.http.request(method, url, **kw)

    def get(self, url, timeout=None, **kw):
        return self.http.get(url, **kw)

    def delete(self, url, timeout=None, **kw):
        return self.http.delete(url, **kw)

    def close(self):
        pass


def test_a_task_imported_by_osworld_tasks_is_selected_from_the_lake_and_reset_without_a_tasks_dir(tmp_path, sleeps):
    """`flywheel import osworld-tasks` -> the lake's `tasks` table -> a stage on a remote env selects the task by
    id and every reset sends its task JSON, so the env server (here OSWorld over HTTP on the desktop-env stand-in,
    no tasks dir) runs it; without env.name remote the id is unknown, with a hint."""
    from starlette.testclient import TestClient

    from configs.loading import load_config
    from envs.remote import RemoteEnv
    from envs.server import SlotPool
    from envs.server_http import ServerSettings, create_app
    from flywheel.errors import UserError
    from flywheel.runtime.spec import PolicySpec
    from flywheel.specs import resolve_tasks, rollout_spec

    root = Path(__file__).resolve().parents[1]
    lake = tmp_path / "lake"
    out = subprocess.run(
        [sys.executable, "-m", "flywheel", "import", "osworld-tasks", str(FIXTURES), "--lake", str(lake)],
        capture_output=True,
        text=True,
        cwd=root,
        timeout=120,
        env={**os.environ, "FLYWHEEL_LAKE": ""},
    )
    assert out.returncode == 0, out.stderr
    over = {"lake.root": str(lake), "env.name": "remote", "env.servers": ["http://testserver"]}
    cfg = load_config(root / "configs" / "tiny.yaml", over)
    assert resolve_tasks([CALC], for_training=True, cfg=cfg) == [CALC]
    with pytest.raises(UserError, match="need env.name: remote"):
        resolve_tasks(
            [CALC], for_training=True, cfg=load_config(root / "configs" / "tiny.yaml", {"lake.root": str(lake)})
        )
    spec = rollout_spec(
        cfg, iteration=0, stage="bootstrap", policy=PolicySpec("scripted"), tasks=[CALC], seeds=[0], split="train"
    )
    task_json = spec.env["task_configs"][CALC]
    assert task_json == json.loads((FIXTURES / "examples" / "libreoffice_calc" / f"{CALC}.json").read_text())
    again = rollout_spec(
        cfg, iteration=0, stage="bootstrap", policy=PolicySpec("scripted"), tasks=[CALC], seeds=[0], split="train"
    )
    assert again.run_key == spec.run_key  # the task JSON rides along, outside the run key

    pool = SlotPool(lambda: _env(tasks_dir=None), 1)
    with TestClient(create_app(ServerSettings(env="osworld", slots=1, token=None), pool)) as http:
        for _ in range(100):
            if http.get("/v1/health").json()["free"] == 1:
                break
        env_kwargs = {k: v for k, v in spec.env.items() if k != "name"}
        remote = RemoteEnv(**{**env_kwargs, "probe": False})
        remote._http = _InProcess(http)  # the server in-process: its HTTP API, no socket
        obs = remote.reset(CALC, 0)
        assert obs.width == 1920 and FakeDesktopEnv.instances[-1].task["evaluator"]["func"] == "compare_table"
        remote.close()
