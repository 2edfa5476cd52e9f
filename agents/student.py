"""The student policy: prompt (agents.prompts) -> backend (hf | openai) -> strict parse -> Decision.

    policy = StudentPolicy(HFBackend("models/small-qwen3vl"), arch="qwen3-vl")
    decision = policy.act(obs, history)           # one episode
    decisions = policy.act_batch(obs_list, hists) # several episodes in one generate call

Unparseable output never raises: the Decision has `action=None` and the parse error, and
the rollout records it (the episode continues or ends per config).
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, replace
from typing import Any

from agents.actions import ActionType
from agents.backends.base import Backend, Generation, Sampling
from agents.base import Decision, Policy, StepRecord
from agents.parsing import parse_response
from agents.prompts import PromptOptions, build_prompt, transform_for
from envs.base import Observation


@dataclass(frozen=True)
class StudentOptions:
    arch: str = "qwen3-vl"  # coordinate convention of the model family
    prompt: PromptOptions = PromptOptions()
    sampling: Sampling = Sampling()
    snap_to_cited: bool = False  # StudentConfig.snap_to_cited: a click that misses the UI line it cites goes to it


_CLICKS = frozenset({ActionType.CLICK, ActionType.DOUBLE_CLICK, ActionType.RIGHT_CLICK})
# a UI text line (an observation's, screen pixels): the element up to its centre, the centre, the box if shown
_UI_LINE = re.compile(
    r"^(?:\[\d+\] )?(?P<cite>.+?) @ \((?P<x>-?\d+(?:\.\d+)?),(?P<y>-?\d+(?:\.\d+)?)\)"
    r"(?: \[(?P<w>\d+(?:\.\d+)?)x(?P<h>\d+(?:\.\d+)?)\])?",
    re.M,
)
_CITED = re.compile(r"^\S+ (?:\[\d+\] )?(?P<cite>.+?) @ (?P<point>\(-?\d+(?:\.\d+)?,-?\d+(?:\.\d+)?\))$")


def _inside(x: float, y: float, ln: re.Match) -> bool:
    """Whether the point (screen pixels) is inside the UI line's box (its centre, for a line without a size)."""
    cx, cy = float(ln["x"]), float(ln["y"])
    if ln["w"] is None:
        return (x, y) == (cx, cy)
    return abs(x - cx) <= float(ln["w"]) / 2 and abs(y - cy) <= float(ln["h"]) / 2


def _cited_lines(decision: Decision, ui_text: str | None) -> list[re.Match] | None:
    """The UI text lines (screen pixels) with the role and label a click's Action line cites; None when that cannot
    be told (not a click, no Action line in the cited form, no UI text)."""
    a = decision.action
    if a is None or a.action not in _CLICKS or not ui_text or not decision.action_desc:
        return None
    m = _CITED.match(decision.action_desc.strip())
    if m is None:
        return None
    return [ln for ln in _UI_LINE.finditer(ui_text) if ln["cite"] == m["cite"]]


def cites_screen(decision: Decision, ui_text: str | None) -> bool | None:
    """Whether the element a click's Action line cites (role and label) is a line of the screen's UI text; None when
    that cannot be told."""
    lines = _cited_lines(decision, ui_text)
    return None if lines is None else bool(lines)


def snap_to_cited(decision: Decision, ui_text: str | None, transform: Any = None) -> Decision:
    """The decision with its click moved to the centre of the UI line its Action line cites, when the point misses
    that element's box; unchanged otherwise (not a click, no UI text, no cited line, the cited role and label name
    no line, or the point is inside one they name). When several lines share the cited role and label (MiniWoB's
    click-button draws duplicates, and any of them is right), the model's own point chooses: the nearest centre, and
    a tie is left alone; `snapped.of` then says among how many. The reply text and the raw call stay as the model
    wrote them; the decision's Action line cites the line's own point (in the model's space, through `transform`),
    so the step's record, a later step's history and an SFT target built from it name what was clicked;
    prompt_context records the snap (`snapped`: the line, the model's point in screen pixels and its Action line as
    written) for SQL.

    A policy that acts on the element it names, as accessibility-tree and set-of-marks agents do: the reply chooses
    the element and the observation's UI text places it. What it leaves to the model is the choice itself."""
    a, lines = decision.action, _cited_lines(decision, ui_text)
    if a is None or not lines or any(_inside(a.x, a.y, ln) for ln in lines):
        return decision
    m = _CITED.match(decision.action_desc.strip())  # type: ignore[union-attr] - _cited_lines matched it
    # a role and label that several lines share: the model's own point chooses, by the nearest centre; a tie is left
    d2 = [(a.x - float(ln["x"])) ** 2 + (a.y - float(ln["y"])) ** 2 for ln in lines]
    if d2.count(min(d2)) > 1:
        return decision
    ln = lines[d2.index(min(d2))]
    cx, cy = float(ln["x"]), float(ln["y"])
    ctx = dict(decision.extra.get("prompt_context") or {})
    ctx["snapped"] = {"line": ln.group(0), "from": [a.x, a.y], "action_desc": decision.action_desc}
    if len(lines) > 1:
        ctx["snapped"]["of"] = len(lines)  # the nearest of this many lines with the cited role and label
    desc = decision.action_desc
    if transform is not None:
        mx, my = transform.to_model(cx, cy)
        line = decision.action_desc.strip()
        desc = f"{line[: m.start('point')]}({round(mx)},{round(my)})"
    return replace(
        decision,
        action=a.model_copy(update={"x": cx, "y": cy}),
        action_desc=desc,
        extra={**decision.extra, "prompt_context": ctx},
    )


class StudentPolicy(Policy):
    name = "student"

    def __init__(self, backend: Backend, options: StudentOptions | None = None, version: str | None = None):
        self.backend = backend
        self.opts = options or StudentOptions(arch=getattr(backend, "arch", "qwen3-vl"))
        self.version = version or backend.model_id
        self._step = 0
        self._prompt_s = 0.0

    @property
    def timings(self) -> dict[str, float]:
        """Seconds spent building prompts, plus the backend's own split (encode / generate / ...)."""
        return {"prompt": self._prompt_s, **getattr(self.backend, "timings", {})}

    def reset(self, task_id: str, seed: int) -> None:
        self._step = 0

    def _sampling(self, k: int) -> Sampling:
        s = self.opts.sampling
        if s.seed is None:
            return s
        # a distinct but reproducible seed per step, so a seeded episode is deterministic end to end
        return Sampling(s.temperature, s.top_p, s.max_new_tokens, s.seed + 1000 * k + self._step, s.stop)

    def act_batch(
        self, observations: list[Observation], histories: list[list[StepRecord]], temperature: float | None = None
    ) -> list[Decision]:
        """One decision per observation, in one generate call; `temperature` overrides the sampling's for this
        call (branched openings draw their candidates hotter than the episode samples)."""
        t0 = time.perf_counter()
        space = self.opts.prompt.coord_space
        transforms = [transform_for(self.opts.arch, o.width, o.height, space=space) for o in observations]
        prompts = [
            build_prompt(o.instruction, o.screenshot_png, o.ui_text, h, self.opts.prompt, t)
            for o, h, t in zip(observations, histories, transforms)
        ]
        self._prompt_s += time.perf_counter() - t0
        sampling = self._sampling(len(prompts))
        if temperature is not None:
            sampling = replace(sampling, temperature=temperature)
        gens = self.backend.generate(prompts, sampling)
        self._step += 1
        out = [self._decision(g, t, p.context) for g, t, p in zip(gens, transforms, prompts)]
        if self.opts.snap_to_cited:
            out = [snap_to_cited(d, o.ui_text, t) for d, o, t in zip(out, observations, transforms)]
        return out

    def act(self, obs: Observation, history: list[StepRecord]) -> Decision:
        return self.act_batch([obs], [history])[0]

    @staticmethod
    def _decision(g: Generation, transform, context: dict[str, Any]) -> Decision:
        pr = parse_response(g.text, transform)
        return Decision(
            response_text=g.text,
            action=pr.action,
            thought=pr.thought,
            action_desc=pr.action_desc,
            raw_action=pr.raw_args,
            parse_error=pr.error,
            fallback_parse=pr.fallback,
            prompt_tokens=g.prompt_tokens,
            completion_tokens=g.completion_tokens,
            token_ids=g.token_ids,
            logprobs=g.logprobs,
            latency_ms=g.latency_ms,
            extra={"prompt_context": {**context, "finish_reason": g.finish_reason}},
        )

    def reload(self, model_path: str) -> None:
        """New weights in place (RL rounds); backends that cannot (a remote server) say so in one line."""
        reload = getattr(self.backend, "reload", None)
        if reload is None:
            from agents.backends.base import BackendError

            raise BackendError(
                f"the {self.backend.name} backend cannot load new weights in place; "
                "serve each round's checkpoint and point student.base_url at it"
            )
        reload(model_path)
        self.version = str(model_path)

    def close(self) -> None:
        self.backend.close()


def build_student_policy(model: str, config: dict[str, Any] | None = None, seed: int | None = None) -> StudentPolicy:
    """Build from a StudentConfig dict (configs.models.StudentConfig): picks the backend and options."""
    from configs.models import StudentConfig

    cfg = StudentConfig.model_validate(config or {"model": model})
    prompt = PromptOptions.from_student(cfg)
    sampling = Sampling(temperature=cfg.temperature, top_p=cfg.top_p, max_new_tokens=cfg.max_new_tokens, seed=seed)
    if cfg.backend == "openai":
        from agents.backends.openai import OpenAIBackend

        backend: Backend = OpenAIBackend(cfg.base_url, model)  # type: ignore[arg-type]
        arch = cfg.arch
    else:
        from agents.backends.hf import HFBackend

        backend = HFBackend(model, lean=cfg.lean_decode)
        arch = backend.arch  # type: ignore[attr-defined]
    opts = StudentOptions(arch=arch, prompt=prompt, sampling=sampling, snap_to_cited=cfg.snap_to_cited)
    return StudentPolicy(backend, opts, version=str(model))
