"""MiniWoB++ tasks in Debian's headless Chromium, behind the `GuiEnv` interface.

    env = MiniWobEnv(screenshot_scale=2)
    obs = env.reset("click-test", seed=3)       # same seed -> same task, same pixels
    res = env.step(Click(x=160, y=250))          # screen px = pixels of obs.screenshot_png
    env.evaluate()                               # 1.0 if the task said success (raw_reward > 0)
    env.close()

One Chromium serves every task: switching task navigates the page (~70-150 ms) instead of
starting a browser (~1 s per `gym.make`). A reset, and each step, reads the task state, the
utterance and the DOM in ONE WebDriver round trip and takes ONE screenshot (miniwob's own
loop makes 3-8 round trips), and Chromium runs without its 60 Hz frame-rate limit (a
screenshot waits ~18 ms instead of ~39 ms). Measured against a bare miniwob gym loop doing
the same actions: 1.15-1.3x (click-test) to 1.6-1.8x (enter-text) the episodes per second, the
final screenshot included.

The screen the policy sees is the task's 160x210 area (the reward/timer panel beside it is
cropped away: it would leak the reward and make frames depend on the clock), upscaled by
`screenshot_scale`; actions come back in that pixel space and are divided by the scale
into CSS px before they reach the page. The same seed gives byte-identical first frames
whatever ran before (focus, hover, element refs and partial-raster jitter are all reset).
"""

from __future__ import annotations

import importlib.util
import io
import os
import time
import weakref
from functools import lru_cache
from pathlib import Path
from typing import Any

from agents.actions import Action, ActionType
from envs.base import EnvError, GuiEnv, Observation, StepResult, offscreen_error
from envs.procs import BROWSER_MARK, kill_marked, new_mark

DEFAULT_CHROME_BINARY = "/usr/bin/chromium"
DEFAULT_CHROMEDRIVER = "/usr/bin/chromedriver"
TASK_W, TASK_H = 160, 210  # CSS px of every (non-flight) MiniWoB task

# Reset = miniwob's force_stop + begin_task in one round trip; the in-page timer is
# re-applied on every reset, so a page reload (task switch, crash recovery) cannot undo it.
# The episode-id bump matters because we read the DOM after an episode ends (the final
# observation), which tags elements with the *next* id; without it the next episode would
# reuse those stale refs next to fresh ones (duplicate refs, parent cycles).
_RESET_JS = """
core.endEpisode(0);
if (document.activeElement) document.activeElement.blur();  // focus must not carry into the next episode
WOB_EPISODE_ID++;  // elements tagged by a DOM read after the last episode ended must get fresh refs
Math.seedrandom(arguments[0]);
core.setDataMode(arguments[1]);
core.EPISODE_MAX_TIME = arguments[2];
core.startEpisodeReal();
"""
# When the task has ended, miniwob covers it with its "START" screen; lift that cover so the
# final observation shows the task as the last action left it (SDPO and the viewer need that).
_OBS_JS = """
if (WOB_DONE_GLOBAL && core.cover_div) core.cover_div.style.display = 'none';
return {done: WOB_DONE_GLOBAL, raw_reward: WOB_RAW_REWARD_GLOBAL, reason: WOB_REWARD_REASON,
        utterance: core.getUtterance(), dom: core.getDOMInfo()};
"""
_READY_JS = "if (!WOB_TASK_READY) return null;" + _OBS_JS
_RESET_JS += _READY_JS  # reset and first observation in one round trip when the task is ready at once


def configure_browser(chrome_binary: str | None = None, chromedriver: str | None = None) -> tuple[str, str]:
    """Point miniwob at Debian's chromium (argument > $MINIWOB_* > /usr/bin default), or raise EnvError.

    Both paths set means Selenium never runs Selenium Manager (which would go to the network).
    """
    chrome = chrome_binary or os.environ.get("MINIWOB_CHROME_BINARY") or DEFAULT_CHROME_BINARY
    driver = chromedriver or os.environ.get("MINIWOB_CHROMEDRIVER") or DEFAULT_CHROMEDRIVER
    for what, path in (("chromium", chrome), ("chromedriver", driver)):
        if not (os.path.isfile(path) and os.access(path, os.X_OK)):
            raise EnvError(
                f"{what} not found at {path}; run scripts/setup.sh (or set env.chrome_binary / env.chromedriver)"
            )
    os.environ["MINIWOB_CHROME_BINARY"] = chrome
    os.environ["MINIWOB_CHROMEDRIVER"] = driver
    os.environ.setdefault("SE_AVOID_STATS", "true")  # belt and braces: no Selenium Manager telemetry
    return chrome, driver


def _quit_driver(holder: dict) -> None:
    """Quit chromedriver (and so Chromium); a Chromium whose chromedriver was killed is ended by its mark."""
    env = holder.pop("env", None)
    if env is not None:
        try:
            env.instance.driver.quit()
        except Exception:  # noqa: BLE001 - best effort at exit; the process group kill is the backstop
            pass
        mark = getattr(env.instance, "proc_mark", None)
        if mark:
            kill_marked(BROWSER_MARK, mark)


@lru_cache(maxsize=1)
def miniwob_task_ids() -> frozenset[str]:
    """Every task page the miniwob wheel ships (found without importing miniwob)."""
    spec = importlib.util.find_spec("miniwob")
    if spec is None or not spec.submodule_search_locations:
        return frozenset()
    html = Path(list(spec.submodule_search_locations)[0]) / "html" / "miniwob"
    return frozenset(p.stem for p in html.glob("*.html"))


class MiniWobEnv(GuiEnv):
    """MiniWoB++ through miniwob 1.1.0's Selenium instance, one Chromium reused across tasks.

    Args:
        screenshot_scale: integer upscale of the 160x210 task area; screen space = scaled pixels.
        render_scale: render at `screenshot_scale` device pixels (crisp text, ~20 ms more per
            screenshot) instead of nearest-neighbour upscaling the 1x render.
        max_steps: step cap; at the cap `info["truncated"]` is set and further steps are refused.
        episode_max_time_s: the in-page episode timer (miniwob's is 10-30 s, too short for models).
        max_wait_s: upper bound on the sleep of a `wait` action.
        final_screenshot: capture the screen after the episode-ending action (the lake keeps it).
        data_mode: miniwob's data mode ("train"/"test"); a few tasks draw from different pools.
        task_id: the page loaded at start (the first reset switches if it differs); a synthetic `synth/<kind>`
            id (envs/synth) starts on click-test and switches to its materialized page.
    """

    name = "miniwob"

    def __init__(
        self,
        *,
        screenshot_scale: int = 1,
        render_scale: bool = False,
        max_steps: int | None = None,
        chrome_binary: str | None = None,
        chromedriver: str | None = None,
        episode_max_time_s: float = 3600.0,
        max_wait_s: float = 5.0,
        final_screenshot: bool = True,
        data_mode: str = "train",
        task_id: str = "click-test",
    ):
        if int(screenshot_scale) != screenshot_scale or not 1 <= screenshot_scale <= 8:
            raise ValueError(f"screenshot_scale must be an integer in 1..8, got {screenshot_scale!r}")
        self.scale = int(screenshot_scale)
        self.render_scale = bool(render_scale) and self.scale > 1
        self.max_steps = max_steps
        self.episode_max_ms = int(episode_max_time_s * 1000)
        self.max_wait_s = max_wait_s
        self.final_screenshot = final_screenshot
        self.data_mode = data_mode
        self.width, self.height = TASK_W * self.scale, TASK_H * self.scale
        configure_browser(chrome_binary, chromedriver)
        self._holder: dict[str, Any] = {}
        self._finalizer = weakref.finalize(self, _quit_driver, self._holder)
        self._env = None
        self._task: str | None = None
        self._closed = False
        self._pointer_used = False  # a pointer action happened since the last reset
        self._new_episode_state()
        self._start(task_id)

    # ------------------------------------------------------------------ browser
    def _start(self, task_id: str) -> None:
        from selenium.common.exceptions import WebDriverException

        from envs.synth import is_synth

        first = "click-test" if is_synth(task_id) else task_id  # miniwob starts on one of its own pages
        try:
            self._env = _miniwob_env_class()(subdomain=first)
        except WebDriverException as e:
            raise EnvError(f"cannot start chromium for miniwob: {_first_line(e)}") from e
        self._holder["env"] = self._env
        self._env.instance.record_screenshots = False  # we take our own (one per observation)
        self._task = first
        if self.render_scale:
            self._cdp(
                "Emulation.setDeviceMetricsOverride",
                {"width": 0, "height": 0, "deviceScaleFactor": self.scale, "mobile": False},
            )
        if first != task_id:
            try:
                self._switch_task(task_id)
            except WebDriverException as e:
                raise EnvError(f"cannot open {task_id} in chromium: {_first_line(e)}") from e

    @property
    def unwrapped(self):
        """The miniwob `MiniWoBEnvironment` (what `agents.compile.to_miniwob` builds actions for)."""
        return self._env

    @property
    def _driver(self):
        return self._env.instance.driver

    def _cdp(self, cmd: str, params: dict) -> Any:
        return self._driver.execute_cdp_cmd(cmd, params)

    def _switch_task(self, task_id: str) -> None:
        from miniwob.fields import get_field_extractor
        from selenium.webdriver.common.by import By
        from selenium.webdriver.support import expected_conditions as EC
        from selenium.webdriver.support.wait import WebDriverWait

        from envs import synth

        inst = self._env.instance
        if synth.is_synth(task_id):  # our own page; its utterance carries the fields (see envs/synth)
            url, extractor = synth.page_url(task_id), _no_fields
        else:
            url, extractor = f"{_miniwob_html_url()}/{task_id}.html", get_field_extractor(task_id)
        self._driver.get(url)
        WebDriverWait(self._driver, 10).until(EC.element_to_be_clickable((By.ID, inst.SYNC_SCREEN_ID)))
        inst.url, inst.field_extractor = url, extractor
        self._env.subdomain = inst.subdomain = task_id
        self._task = task_id
        # Warm-up episode: images a task creates per episode (e.g. email-inbox's CSS icons) load
        # asynchronously the first time; once cached, every seed's first frame is the same.
        self._driver.execute_script(_RESET_JS, 0, self.data_mode, self.episode_max_ms)
        time.sleep(0.1)

    def _restart(self) -> None:
        """After a crash: quit what is left of the browser and start a fresh one."""
        _quit_driver(self._holder)
        self._env = None
        self._start(self._task or "click-test")

    # ------------------------------------------------------------------ episode
    def _new_episode_state(self) -> None:
        self._steps = 0
        self._ended: str | None = None  # "task" | "done" | "fail" once the episode is over
        self._raw_reward = 0.0
        self._reason = None
        self._fields: list[tuple[str, str]] = []
        self._last_obs: Observation | None = None

    def reset(self, task_id: str, seed: int) -> Observation:
        from envs.synth import is_synth

        if self._closed:
            raise EnvError("reset() on a closed MiniWobEnv")
        if task_id not in miniwob_task_ids() and not is_synth(task_id):
            raise ValueError(
                f"unknown MiniWoB task {task_id!r} (miniwob 1.1.0 has {len(miniwob_task_ids())} tasks; "
                f"synthetic ones are synth/<kind>)"
            )
        if self._env is None:
            self._restart()
        self._new_episode_state()
        try:
            if task_id != self._task:
                self._switch_task(task_id)
            if self._pointer_used:  # park the pointer off the task so no stale :hover shows in the first frame
                self._move_pointer(TASK_W + 300, TASK_H + 100)
                self._pointer_used = False
            state = self._driver.execute_script(_RESET_JS, int(seed), self.data_mode, self.episode_max_ms)
            for _ in range(40):  # tasks that build asynchronously flag WOB_TASK_READY (up to 2 s)
                if state is not None:
                    break
                time.sleep(0.05)
                state = self._driver.execute_script(_READY_JS)
            else:
                raise EnvError(f"task {task_id} did not become ready after reset")
            self._fields = self._extract_fields(state["utterance"])
            obs = self._make_obs(state)
        except _browser_errors() as e:
            self._env_broken(e)
        self._last_obs = obs
        return obs

    def _extract_fields(self, utterance: Any) -> list[tuple[str, str]]:
        if isinstance(utterance, dict):
            return [(str(k), str(v)) for k, v in utterance["fields"].items()]
        return [(str(k), str(v)) for k, v in self._env.instance.field_extractor(utterance)]

    def step(self, action: Action) -> StepResult:
        if self._last_obs is None:
            raise EnvError("step() before reset()")
        if self._ended:
            return StepResult(
                self._last_obs, done=True, exec_error="the episode has ended; call reset()", info=self._info()
            )
        if self.max_steps is not None and self._steps >= self.max_steps:
            return StepResult(
                self._last_obs, done=True, exec_error=f"step cap of {self.max_steps} reached", info=self._info()
            )
        self._steps += 1
        t0 = time.monotonic()
        exec_error, executed = None, None
        try:
            kind = action.type
            if kind in (ActionType.DONE, ActionType.FAIL):
                self._ended = kind.value
                executed = {"miniwob": [], "ended_by": kind.value}
            elif kind == ActionType.WAIT:
                slept = min(float(action.seconds), self.max_wait_s)
                time.sleep(slept)
                executed = {"miniwob": [{"action_type": "NONE"}], "slept_s": slept}
            else:
                exec_error, executed = self._execute(action)
            state = self._driver.execute_script(_OBS_JS)
            if state["done"] and not self._ended:
                self._ended = "task"
            if state["done"]:
                self._raw_reward, self._reason = float(state["raw_reward"] or 0.0), state["reason"]
            obs = self._make_obs(state, screenshot=not self._ended or self.final_screenshot)
        except _browser_errors() as e:
            self._env_broken(e)
        self._last_obs = obs
        info = self._info()
        info["env_ms"] = (time.monotonic() - t0) * 1000
        return StepResult(obs, done=bool(self._ended), exec_error=exec_error, info=info, executed=executed)

    def _execute(self, action: Action) -> tuple[str | None, dict | None]:
        """Compile to miniwob actions (in CSS px) and run them; (exec_error, executed)."""
        from miniwob.selenium_actions import execute_action_on_chromedriver
        from selenium.common.exceptions import (
            InvalidArgumentException,
            JavascriptException,
            MoveTargetOutOfBoundsException,
            WebDriverException,
        )

        from agents.compile import UnsupportedAction, to_miniwob

        off = self._offscreen(action)
        if off:
            return off, None
        try:
            mw_actions = to_miniwob(self._to_css(action), self._env)
        except UnsupportedAction as e:
            return f"unsupported action: {e}", None
        executed = {"miniwob": [_jsonable_mw(a, self._env) for a in mw_actions]}
        cfg, inst = self._env.action_space_config, self._env.instance
        if action.type not in (ActionType.TYPE, ActionType.KEY):
            self._pointer_used = True
        try:
            for a in mw_actions:
                execute_action_on_chromedriver(a, inst.cached_fields, cfg, self._driver)
        except (MoveTargetOutOfBoundsException, InvalidArgumentException, JavascriptException) as e:
            return f"{type(e).__name__}: {_first_line(e)}", executed
        except WebDriverException as e:  # the action failed; the browser may or may not be alive
            self._driver.execute_script("return 1;")  # raises (-> EnvError in step) if it is gone
            return f"{type(e).__name__}: {_first_line(e)}", executed
        return None, executed

    def _offscreen(self, action: Action) -> str | None:
        return offscreen_error(action, self.width, self.height)

    def _to_css(self, action: Action) -> Action:
        if self.scale == 1:
            return action
        upd = {k: getattr(action, k) / self.scale for k in ("x", "y", "x1", "y1", "x2", "y2") if hasattr(action, k)}
        return action.model_copy(update=upd) if upd else action

    def _move_pointer(self, x: float, y: float) -> None:
        from miniwob.selenium_actions import execute_move_coords

        execute_move_coords(x, y, self._driver)

    def _env_broken(self, e: Exception):
        """A WebDriver failure outside an action's own errors: the browser is gone or wedged."""
        self._last_obs = None
        _quit_driver(self._holder)
        self._env = None  # the next reset() starts a fresh browser
        raise EnvError(f"browser failure in miniwob ({self._task}): {_first_line(e)}") from e

    def _info(self) -> dict[str, Any]:
        info: dict[str, Any] = {
            "task_done": self._ended == "task",
            "ended_by": self._ended,
            "raw_reward": self._raw_reward,
            "reason": self._reason,
            "steps": self._steps,
            "reward": self.evaluate() if self._ended else 0.0,
            "truncated": bool(not self._ended and self.max_steps is not None and self._steps >= self.max_steps),
        }
        if self._ended == "task":  # a one-line outcome for the lake (SDPO's failure feedback)
            outcome = "success" if self._raw_reward > 0 else "failure"
            why = f": {self._reason}" if self._reason else ""
            info["feedback"] = f"the task ended in {outcome} (raw reward {self._raw_reward:g}){why}"
        return info

    def evaluate(self) -> float:
        """Binary: 1.0 when the task itself ended with raw_reward > 0, else 0.0 (also after `fail`)."""
        return 1.0 if self._ended == "task" and self._raw_reward > 0 else 0.0

    # ------------------------------------------------------------------ observation
    def _make_obs(self, state: dict, screenshot: bool = True) -> Observation:
        from envs.miniwob_dom import dom_elements, ui_text

        utterance = state["utterance"]
        if isinstance(utterance, dict):
            utterance = utterance["utterance"]
        elems = dom_elements(state["dom"]) if state.get("dom") else []
        png = self._screenshot() if screenshot else (self._last_obs.screenshot_png if self._last_obs else b"")
        return Observation(
            screenshot_png=png,
            width=self.width,
            height=self.height,
            instruction=str(utterance),
            ui_text=ui_text(elems, self.scale, TASK_W, TASK_H),
            extra={"dom_elements": elems, "fields": list(self._fields), "scale": self.scale, "task_id": self._task},
        )

    def _screenshot(self) -> bytes:
        from PIL import Image

        img = Image.open(io.BytesIO(self._driver.get_screenshot_as_png()))
        k = self.scale if self.render_scale else 1
        img = img.convert("RGB").crop((0, 0, TASK_W * k, TASK_H * k))
        if self.scale > 1 and not self.render_scale:
            img = img.resize((self.width, self.height), Image.NEAREST)
        out = io.BytesIO()
        img.save(out, format="PNG", compress_level=1)  # level 1: ~3x faster than 6, a few % larger
        return out.getvalue()

    def healthy(self) -> bool:
        """The browser answers a trivial script (no browser yet counts as healthy: reset starts one)."""
        if self._env is None:
            return not self._closed
        try:
            return self._driver.execute_script("return 1;") == 1
        except _browser_errors():
            return False

    # ------------------------------------------------------------------ teardown
    def close(self) -> None:
        """Quit chromedriver and Chromium; safe to call twice."""
        self._closed = True
        self._last_obs = None
        _quit_driver(self._holder)
        self._env = None


# Chromium flags on top of miniwob's (headless, disable-gpu, no-sandbox). Without the frame-rate
# limit a screenshot waits for one frame, not the next 60 Hz tick (39 -> 18 ms; idle CPU
# unchanged at 2-3%). Without partial raster a frame does not depend on what was painted
# before (otherwise rounded corners differ by 1 intensity level after other episodes).
# First frames stay pixel-identical to stock miniwob's.
CHROME_EXTRA_ARGS = ("disable-frame-rate-limit", "disable-partial-raster")


def _miniwob_env_class():
    """miniwob's env with our driver start-up: explicit binaries (no Selenium Manager) and extra flags."""
    from miniwob.environment import MiniWoBEnvironment  # imported after configure_browser set the env vars
    from miniwob.selenium_instance import SeleniumInstance
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as EC
    from selenium.webdriver.support.wait import WebDriverWait

    class Instance(SeleniumInstance):
        def create_driver(self):  # miniwob's create_driver, headless only, plus CHROME_EXTRA_ARGS
            options = webdriver.ChromeOptions()
            for arg in ("headless", "disable-gpu", "no-sandbox", *CHROME_EXTRA_ARGS):
                options.add_argument(arg)
            options.binary_location = os.environ["MINIWOB_CHROME_BINARY"]
            self.proc_mark = new_mark()  # chromedriver and Chromium carry it: _quit_driver finds them
            service = Service(
                executable_path=os.environ["MINIWOB_CHROMEDRIVER"], env={**os.environ, BROWSER_MARK: self.proc_mark}
            )
            self.driver = webdriver.Chrome(service=service, options=options)
            self.driver.get(self.url)
            WebDriverWait(self.driver, 10).until(EC.element_to_be_clickable((By.ID, self.SYNC_SCREEN_ID)))
            self.inner_width, self.inner_height = self.driver.execute_script(
                "return [window.innerWidth, window.innerHeight];"
            )

    class Env(MiniWoBEnvironment):
        def _hard_reset_instance(self):
            if getattr(self, "instance", None):
                self.instance.close()
            self.instance = Instance(index=0, **self.instance_kwargs)
            self.instance.start()

    return Env


def _no_fields(utterance: Any) -> list:
    """Field extractor of pages whose utterance is a {utterance, fields} dict (never called on a string)."""
    return []


def _miniwob_html_url() -> str:
    """file:// URL of miniwob's task folder (html/miniwob), what miniwob's own instance loads."""
    from miniwob.selenium_instance import DEFAULT_BASE_URL

    return DEFAULT_BASE_URL.rstrip("/")


def _browser_errors() -> tuple[type[BaseException], ...]:
    """What a dead or wedged browser raises: WebDriver errors, and connection errors once chromedriver is gone."""
    from selenium.common.exceptions import WebDriverException
    from urllib3.exceptions import HTTPError

    return WebDriverException, HTTPError, ConnectionError


def _first_line(e: BaseException) -> str:
    s = (getattr(e, "msg", None) or str(e)).strip().splitlines()
    return s[0][:300] if s else type(e).__name__


def _jsonable_mw(a: dict, env) -> dict:
    """A miniwob action dict as JSON (action type by name; only the fields that type uses)."""
    from miniwob.action import COORDS_ACTIONS, ELEMENT_ACTIONS, FIELD_ACTIONS, TEXT_ACTIONS, ActionTypes

    cfg = env.action_space_config
    t = cfg.action_types[int(a["action_type"])]
    d: dict[str, Any] = {"action_type": t.value}
    if t in COORDS_ACTIONS:
        d["coords"] = [round(float(c), 2) for c in a["coords"]]
    if t == ActionTypes.PRESS_KEY:
        d["key"] = cfg.allowed_keys[int(a["key"])]
    if t in TEXT_ACTIONS:
        d["text"] = str(a["text"])
    if t in ELEMENT_ACTIONS:
        d["ref"] = int(a["ref"])
    if t in FIELD_ACTIONS:
        d["field"] = int(a["field"])
    return d
