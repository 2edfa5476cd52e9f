"""OSWorld through `desktop_env.DesktopEnv`, behind the `GuiEnv` interface; the env server hosts it.

    env = OSWorldEnv(provider_name="docker", screen_size=(1920, 1080), tasks_dir="~/OSWorld/evaluation_examples")
    obs = env.reset("bb5e4c0d-f964-439c-97b6-bdb9747de3f4", seed=0)   # the VM reverts and runs the task's config
    res = env.step(Click(x=960, y=540))       # compiled to "pyautogui.click(x=960, y=540)" and run in the VM
    env.step(Fail())                          # reaches the VM as "FAIL": infeasible tasks are scored on it
    env.evaluate()                            # the task's evaluator score in [0, 1]

desktop-env pins torch 2.5 / transformers 4.35, so it lives in its own venv (scripts/setup_osworld.sh)
and is imported only when an OSWorldEnv is built. Actions are our closed schema compiled by
`agents.compile.to_pyautogui` (numbers and repr-quoted strings only), never model text. `done`/`fail`
reach the env (OSWorld scores infeasible tasks by a final FAIL); `wait` sleeps here and re-observes.
Instead of OSWorld's fixed sleep(60) after a reset, the screen is polled until two observations in a
row are the same (`settle_timeout_s`).
"""

from __future__ import annotations

import io
import time
from typing import Any

from agents.actions import Action, ActionType
from envs.base import EnvError, GuiEnv, Observation, StepResult, offscreen_error

_sleep = time.sleep  # one name for every sleep here (tests record the sleeps instead of waiting)


def _desktop_env_class():
    try:
        from desktop_env.desktop_env import DesktopEnv
    except ImportError as e:
        raise EnvError(
            f"desktop-env is not importable here ({e}); run the osworld env server from the venv "
            "that scripts/setup_osworld.sh creates"
        ) from e
    return DesktopEnv


class OSWorldEnv(GuiEnv):
    """One DesktopEnv (one VM). Coordinates are screen pixels of the VM (`screen_size`).

    Args:
        provider_name: desktop-env provider (docker on KVM hosts; vmware, virtualbox, aws, ...).
        path_to_vm: the provider's VM path/image (None: the provider's default download).
        screen_size: the VM's screen (width, height); actions outside it are exec errors.
        require_a11y_tree: ask for the accessibility tree; it becomes `ui_text` (cut to ui_text_chars).
        tasks_dir: evaluation_examples folder: `reset(task_id)` finds the task JSON there.
        pause_s: desktop-env's pause after each executed action before it observes.
        max_wait_s: upper bound on the sleep of a `wait` action.
        settle_timeout_s: after reset, poll until the screen stops changing, at most this long (0: off).
        desktop_env_cls: the DesktopEnv class (tests inject a stand-in for the VM here).
    """

    name = "osworld"
    accepts_task_config = True

    def __init__(
        self,
        *,
        provider_name: str = "docker",
        path_to_vm: str | None = None,
        snapshot_name: str = "init_state",
        screen_size: tuple[int, int] = (1920, 1080),
        require_a11y_tree: bool = False,
        headless: bool = True,
        os_type: str = "Ubuntu",
        tasks_dir: str | None = None,
        pause_s: float = 0.5,
        max_wait_s: float = 30.0,
        settle_timeout_s: float = 60.0,
        ui_text_chars: int = 16000,
        desktop_env_cls: Any = None,
    ):
        self.width, self.height = int(screen_size[0]), int(screen_size[1])
        self.require_a11y_tree, self.tasks_dir = require_a11y_tree, tasks_dir
        self.pause_s, self.max_wait_s, self.settle_timeout_s = pause_s, max_wait_s, settle_timeout_s
        self.ui_text_chars = ui_text_chars
        cls = desktop_env_cls or _desktop_env_class()
        try:  # the VM boots here: the env server builds slots in background threads and polls readiness
            self._desk = cls(
                provider_name=provider_name,
                path_to_vm=path_to_vm,
                snapshot_name=snapshot_name,
                action_space="pyautogui",
                screen_size=(self.width, self.height),
                headless=headless,
                require_a11y_tree=require_a11y_tree,
                os_type=os_type,
            )
        except Exception as e:  # noqa: BLE001
            raise EnvError(f"DesktopEnv did not start ({provider_name}): {type(e).__name__}: {e}") from e
        self._task: dict[str, Any] | None = None
        self._last: Observation | None = None
        self._ended: str | None = None

    # ------------------------------------------------------------------ episode
    def reset(self, task_id: str, seed: int, task_config: dict[str, Any] | None = None) -> Observation:
        if task_config is None:
            if not self.tasks_dir:
                raise ValueError("no task_config sent and the server has no --tasks-dir to find it in")
            from envs.osworld_tasks import find_task

            task_config = find_task(self.tasks_dir, task_id)
        else:
            from envs.osworld_tasks import same_task

            if not same_task(task_id, task_config):
                raise ValueError(f"task_config is for {task_config.get('id')!r}, not {task_id!r}")
        self._task, self._ended = task_config, None
        raw = self._call("reset", lambda: self._desk.reset(task_config=task_config, seed=seed))
        obs = self._settle(self._obs(raw))
        self._last = obs
        return obs

    def _settle(self, obs: Observation) -> Observation:
        """Re-observe every second until the screenshot repeats (apps launched by the config have drawn)."""
        deadline = time.monotonic() + self.settle_timeout_s
        while time.monotonic() < deadline:
            _sleep(1.0)
            nxt = self._observe()
            if nxt.screenshot_png == obs.screenshot_png:
                return nxt
            obs = nxt
        return obs

    def _observe(self) -> Observation:
        """A fresh observation without acting: OSWorld's own WAIT with no pause."""
        raw, _, _, _ = self._call("observe", lambda: self._desk.step("WAIT", pause=0))
        return self._obs(raw)

    def step(self, action: Action) -> StepResult:
        if self._last is None:
            raise EnvError("step() before reset()")
        if self._ended:
            return StepResult(
                self._last, done=True, exec_error="the episode has ended; call reset()", info={"ended_by": self._ended}
            )
        kind, exec_error = action.type, None
        if kind in (ActionType.DONE, ActionType.FAIL):
            cmd = kind.value.upper()  # "DONE" / "FAIL": the strings DesktopEnv.step checks for
            raw, _, done, info = self._call("step", lambda: self._desk.step(cmd, pause=0))
            self._ended, executed = kind.value, {"pyautogui": cmd}
        elif kind == ActionType.WAIT:
            slept = min(float(action.seconds), self.max_wait_s)
            _sleep(slept)
            obs = self._observe()
            self._last = obs
            return StepResult(
                obs, done=False, info={"slept_s": slept}, executed={"pyautogui": "WAIT", "slept_s": slept}
            )
        else:
            from agents.compile import UnsupportedAction, to_pyautogui

            off = self._offscreen(action)
            try:
                cmd = None if off else to_pyautogui(action)
            except UnsupportedAction as e:
                off = f"unsupported action: {e}"
            if off:
                return StepResult(self._last, done=False, exec_error=off, info={})
            raw, _, done, info = self._call("step", lambda: self._desk.step(cmd, pause=self.pause_s))
            executed = {"pyautogui": cmd}
            if done and not self._ended:
                self._ended = "env"
        obs = self._obs(raw)
        self._last = obs
        return StepResult(
            obs,
            done=bool(done),
            exec_error=exec_error,
            executed=executed,
            info={"ended_by": self._ended, **_jsonable_info(info)},
        )

    def _offscreen(self, action: Action) -> str | None:
        return offscreen_error(action, self.width, self.height)

    def evaluate(self) -> float:
        """The task evaluator's score, clipped to [0, 1] (success = a score of 1)."""
        if self._task is None:
            raise EnvError("evaluate() before reset()")
        score = float(self._call("evaluate", self._desk.evaluate))
        return min(1.0, max(0.0, score))

    def close(self) -> None:
        desk, self._desk = getattr(self, "_desk", None), None
        if desk is not None:
            desk.close()

    # ------------------------------------------------------------------ helpers
    def _call(self, what: str, fn):
        if self._desk is None:
            raise EnvError(f"{what}() on a closed OSWorldEnv")
        try:
            return fn()
        except (ValueError, EnvError):
            raise
        except Exception as e:  # noqa: BLE001 - the VM or its server broke: the env server restarts the slot
            raise EnvError(f"DesktopEnv {what} failed: {type(e).__name__}: {e}") from e

    def _obs(self, raw: dict[str, Any]) -> Observation:
        png = raw.get("screenshot") or b""
        if png and not png.startswith(b"\x89PNG"):  # some providers hand back another encoding
            png = _to_png(png)
        tree = raw.get("accessibility_tree") if self.require_a11y_tree else None
        instruction = raw.get("instruction") or (self._task or {}).get("instruction", "")
        return Observation(
            screenshot_png=png,
            width=self.width,
            height=self.height,
            instruction=str(instruction),
            ui_text=tree[: self.ui_text_chars] if tree else None,
            extra={"task_id": (self._task or {}).get("id"), "terminal": raw.get("terminal")},
        )


def _to_png(data: bytes) -> bytes:
    from PIL import Image

    out = io.BytesIO()
    Image.open(io.BytesIO(data)).save(out, format="PNG")
    return out.getvalue()


def _jsonable_info(info: Any) -> dict[str, Any]:
    return {str(k): v for k, v in (info or {}).items() if isinstance(v, (str, int, float, bool, type(None)))}
