"""The task registry: which tasks exist, which the scripted teacher solves, and the seed splits.

    from envs import registry
    registry.seeds("train", 20)          # [0, 1, ..., 19]
    registry.seeds("eval", 5)            # [100000, ..., 100004]
    registry.split_of(100003)            # "eval"
    registry.tasks_table_rows()          # rows of the lake's `tasks` table
    registry.is_synth("synth/click")     # True: a synthetic task (envs/synth), not a MiniWoB page
    env = registry.make_env("miniwob", screenshot_scale=2)

Splits are by seed range, so one seed can never be in both: train seeds come from
[0, 10000), eval seeds from [100000, 101000). On top of that a few tasks are held out
(`HELD_OUT`): they are evaluated but never used for teacher demos or training.
Every listed task has a binary MiniWoB reward (+1 / -1), so `raw_reward > 0` is success.

`SYNTH_TASKS` are the synthetic `synth/<kind>` pages (envs/synth: random layouts and generated labels,
run by the same MiniWobEnv, source "synth" in the tasks table). They are in `TASKS` (so stages resolve,
cap and register them), but `teacher_tasks()`/`train_tasks()`, and so a selection of 'all', leave
them out unless asked (`include_synth=True`): list them by id to use them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

SPLITS: dict[str, tuple[int, int]] = {"train": (0, 10_000), "eval": (100_000, 101_000)}  # [start, stop)


@dataclass(frozen=True)
class Task:
    task_id: str
    instruction: str  # a short human description (the env's utterance varies per seed)
    teacher_supported: bool = True
    max_steps: int = 8  # enough for the scripted teacher with room for a few misses
    held_out: bool = False  # eval only: never in teacher demos or training sets
    env: str = "miniwob"
    source: str = "miniwob"  # the tasks table's source: "miniwob", or "synth" (envs/synth)

    @property
    def split(self) -> str:
        return "eval" if self.held_out else "both"


def _t(task_id: str, instruction: str, max_steps: int = 6, **kw) -> Task:
    return Task(task_id, instruction, max_steps=max_steps, **kw)


TASKS: list[Task] = [
    # one click on the right thing
    _t("click-test", "Click the button."),
    _t("click-test-2", "Click button ONE (or TWO).", held_out=True),
    _t("click-button", "Click the button labelled <target>."),
    _t("unicode-test", "Click the button with the given unicode label."),
    _t("click-link", "Click the link with the given text."),
    _t("click-dialog", "Close the dialog box by clicking the X."),
    _t("click-dialog-2", "Click the named button in the dialog.", held_out=True),
    _t("click-tab", "Click the numbered tab."),
    _t("click-color", "Click the swatch of the named colour."),
    _t("click-widget", "Click the widget of the named kind."),
    _t("grid-coordinate", "Click the grid point at the given (x,y)."),
    _t("identify-shape", "Click the button naming the displayed shape."),
    _t("focus-text", "Focus the text field."),
    _t("focus-text-2", "Focus the n-th text field.", held_out=True),
    # a few clicks
    _t("click-button-sequence", "Click button ONE, then button TWO."),
    _t("click-tab-2", "Switch tabs to find and click the named link.", max_steps=8),
    _t("click-tab-2-hard", "Switch tabs to find and click the named link.", max_steps=8),
    _t("click-collapsible", "Expand the section, then click Submit.", max_steps=8),
    _t("navigate-tree", "Expand folders to find and click the named file.", max_steps=10),
    _t("odd-or-even", "Mark each number odd or even, then submit.", max_steps=10),
    _t("click-option", "Select the named radio option and submit."),
    _t("click-checkboxes", "Check the listed boxes and submit.", max_steps=10),
    _t("click-checkboxes-large", "Check the listed boxes (many) and submit.", max_steps=16),
    _t("click-checkboxes-transfer", "Check the listed boxes and submit.", max_steps=10, held_out=True),
    # typing
    _t("enter-text", "Type the given text into the field and submit."),
    _t("enter-text-dynamic", "Type the given text into the field and submit."),
    _t("enter-text-2", "Type the given text (case changed) and submit.", held_out=True),
    _t("enter-password", "Type the password twice and submit.", max_steps=8),
    _t("login-user", "Log in with the given username and password.", max_steps=8),
    _t("find-word", "Type the n-th word of the paragraph and submit."),
    _t("read-table", "Type the table value for the given key and submit."),
    _t("simple-arithmetic", "Solve the arithmetic problem and submit."),
    _t("simple-algebra", "Solve for x and submit."),
    _t("enter-date", "Enter the given date and submit."),
    _t("enter-time", "Enter the given time and submit."),
    _t("choose-list", "Pick the named item from the list and submit."),
    _t("use-autocomplete", "Type a prefix, pick the autocomplete match, submit.", max_steps=10),
    _t("multi-orderings", "Fill the form fields (any order) and submit.", max_steps=12),
    _t("multi-layouts", "Fill the form fields (any layout) and submit.", max_steps=12),
    _t("guess-number", "Guess the number using the higher/lower hints.", max_steps=15),
    # no teacher: for student rollouts / RL and evaluation only
    _t("click-shades", "Click all squares of the named shade and submit.", 10, teacher_supported=False),
    _t("click-menu-2", "Open the menu and click the named item.", teacher_supported=False),
    _t("email-inbox", "Do the asked action on the named email.", 10, teacher_supported=False),
    _t("copy-paste", "Copy the text into the field and submit.", teacher_supported=False),
    _t("tic-tac-toe", "Win the game of tic-tac-toe.", 10, teacher_supported=False),
]
# Synthetic pages (envs/synth); max_steps = the teacher's steps + 2-3.
SYNTH_TASKS: list[Task] = [
    _t("synth/click", "Click the button or link with the quoted text (synthetic page).", 3, source="synth"),
    _t("synth/type", "Type the quoted text into the named field, then press the named button.", 5, source="synth"),
    _t("synth/form", "Fill two named fields with the quoted texts, then press the named button.", 8, source="synth"),
    _t(
        "synth/read", "Type the text of the marked item into the named field, then press the button.", 6, source="synth"
    ),
    _t("synth/option", "Select the named radio/checkbox options, then press the named button.", 6, source="synth"),
    _t("synth/tabs", "Open the named tab, then click the named link on it.", 5, source="synth"),
    _t("synth/search", "Find the named link on whichever tab holds it, then click it.", 6, source="synth"),
]
TASKS += SYNTH_TASKS
TASKS_BY_ID: dict[str, Task] = {t.task_id: t for t in TASKS}
HELD_OUT: list[str] = [t.task_id for t in TASKS if t.held_out]


class _KnownTasks:
    """`task_id in KNOWN_MINIWOB_TASKS` without touching the disk at import time."""

    def __contains__(self, task_id: object) -> bool:
        from envs.miniwob import miniwob_task_ids

        return task_id in miniwob_task_ids()

    def __len__(self) -> int:
        from envs.miniwob import miniwob_task_ids

        return len(miniwob_task_ids())


KNOWN_MINIWOB_TASKS = _KnownTasks()


def get_task(task_id: str) -> Task:
    try:
        return TASKS_BY_ID[task_id]
    except KeyError:
        raise KeyError(f"task {task_id!r} is not in the registry; known: {', '.join(TASKS_BY_ID)}") from None


def is_synth(task_id: object) -> bool:
    """A synthetic `synth/<kind>` task (envs/synth), not a MiniWoB page."""
    from envs.synth import is_synth as _is_synth

    return _is_synth(task_id)


def synth_tasks() -> list[str]:
    return [t.task_id for t in SYNTH_TASKS]


def teacher_tasks(include_held_out: bool = False, include_synth: bool = False) -> list[str]:
    """Tasks the scripted teacher solves; held-out tasks only when asked (they are eval-only), synthetic
    ones only when asked."""
    return [
        t.task_id
        for t in TASKS
        if t.teacher_supported and (include_held_out or not t.held_out) and (include_synth or t.source != "synth")
    ]


def train_tasks(include_synth: bool = False) -> list[str]:
    """Tasks that may appear in training data (every task that is not held out; synthetic ones when asked)."""
    return [t.task_id for t in TASKS if not t.held_out and (include_synth or t.source != "synth")]


def split_of(seed: int) -> str:
    """'train' or 'eval'; a seed outside both ranges is an error (it would belong to neither)."""
    for name, (lo, hi) in SPLITS.items():
        if lo <= seed < hi:
            return name
    raise ValueError(
        f"seed {seed} is in no split; " + ", ".join(f"{k}: [{lo}, {hi})" for k, (lo, hi) in SPLITS.items())
    )


def seeds(split: str, n: int, offset: int = 0) -> list[int]:
    """The n seeds of `split` starting `offset` into its range (deterministic, never crossing splits)."""
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; use one of {sorted(SPLITS)}")
    lo, hi = SPLITS[split]
    if n < 0 or offset < 0 or lo + offset + n > hi:
        raise ValueError(f"{split} split has {hi - lo} seeds; cannot take {n} from offset {offset}")
    return list(range(lo + offset, lo + offset + n))


def max_steps_for(task_id: str, default: int = 8) -> int:
    t = TASKS_BY_ID.get(task_id)
    return t.max_steps if t else default


def tasks_table_rows() -> list[dict[str, Any]]:
    """Rows of the lake's `tasks` table: task_id, env, instruction, config (JSON), split, source."""
    rows = []
    for t in TASKS:
        config = {
            "seed_ranges": {k: list(v) for k, v in SPLITS.items()},
            "max_steps": t.max_steps,
            "teacher_supported": t.teacher_supported,
            "held_out": t.held_out,
        }
        if t.source == "synth":
            from envs import synth

            config["generator"] = synth.version()  # the same seed draws another page after a generator change
        rows.append(
            dict(
                task_id=t.task_id,
                env=t.env,
                instruction=t.instruction,
                config=json.dumps(config, sort_keys=True),
                split=t.split,
                source=t.source,
            )
        )
    return rows


def make_env(name: str, **kwargs):
    """Build a GuiEnv by family name ("miniwob", "osworld", "remote"); kwargs go to its constructor."""
    if name == "miniwob":
        from envs.miniwob import MiniWobEnv

        return MiniWobEnv(**kwargs)
    if name == "osworld":
        from envs.osworld import OSWorldEnv

        return OSWorldEnv(**kwargs)
    if name == "remote":
        from envs.remote import RemoteEnv

        return RemoteEnv(**kwargs)
    raise ValueError(f"unknown env {name!r}; available: 'miniwob', 'osworld', 'remote'")
