"""Branched openings (`rollouts.openings`): an instance's attempts start with distinct moves, most drawn first."""

from __future__ import annotations

import itertools

from agents.base import Decision
from agents.parsing import parse_response
from configs.loading import load_config
from envs.base import Observation
from flywheel.runtime.episode import EpisodeJob, EpisodeRun, Provenance
from flywheel.runtime.openings import decide, opening_move, pick_opening, ranked_openings


def _reply(label: str, x: int, y: int, kind: str = "span") -> str:
    return (
        f'Action: Click {kind} "{label}" @ ({x},{y})\n<tool_call>\n'
        f'{{"name": "computer_use", "arguments": {{"action": "click", "x": {x}, "y": {y}}}}}\n</tool_call>'
    )


def _decision(text: str) -> Decision:
    pr = parse_response(text)
    return Decision(response_text=text, action=pr.action, action_desc=pr.action_desc, parse_error=pr.error)


TAB2 = [_reply("Tab #2", 444, 333, "a#ui-id-2"), _reply("Tab #2", 445, 333, "a#ui-id-2")]
LINK = _reply("vel", 169, 523)
TAB3 = _reply("Tab #3", 719, 333, "a#ui-id-3")
BAD = "Action: Click span"


def test_moves_rank_by_count_and_ignore_coordinates():
    replies = [_decision(t) for t in [TAB2[0], LINK, TAB2[1], BAD, TAB3, TAB2[0], LINK, BAD, BAD]]
    assert opening_move(replies[0]) == opening_move(replies[2]) == 'Click a#ui-id-2 "Tab #2"'
    assert opening_move(replies[3]) is None
    ranked = [opening_move(d) for d in ranked_openings(replies)]
    assert ranked == ['Click a#ui-id-2 "Tab #2"', 'Click span "vel"', 'Click a#ui-id-3 "Tab #3"']
    assert ranked_openings(replies)[0] is replies[0]  # the first drawn reply stands for its move


def test_attempt_j_takes_the_jth_move_then_plain_samples():
    replies = [_decision(t) for t in [TAB2[0], TAB2[1], LINK, TAB2[0], BAD]]
    first_two = [opening_move(pick_opening(replies, j)) for j in range(2)]
    assert first_two == ['Click a#ui-id-2 "Tab #2"', 'Click span "vel"']
    assert pick_opening(replies, 2) is replies[2] and pick_opening(replies, 4) is replies[4]  # past the moves: as drawn
    assert pick_opening(replies, 7) is replies[2]


class _Rotating:
    """A policy whose replies cycle through a fixed list: every call and every row takes the next one."""

    name, version = "rotating", "0"

    def __init__(self, texts: list[str]):
        self._texts = itertools.cycle(texts)
        self.batches: list[int] = []
        self.temperatures: list[float | None] = []

    def act_batch(self, observations, histories, temperature=None):
        self.batches.append(len(observations))
        self.temperatures.append(temperature)
        return [_decision(next(self._texts)) for _ in observations]

    def act(self, obs, history):
        return self.act_batch([obs], [history])[0]


def _run(sample_idx: int, steps: int = 0, ui_text: str = "") -> EpisodeRun:
    job = EpisodeJob("rk", "click-tab-2", 7, group_id="g", sample_idx=sample_idx)
    run = EpisodeRun(
        None,  # type: ignore[arg-type] - decide only reads the observation, history and step count
        job,
        max_steps=8,
        timeout_s=60,
        prov=Provenance(),
        end_on_parse_error=False,
        policy_name="rotating",
        policy_version="0",
    )
    run.obs = Observation(screenshot_png=b"", width=160, height=210, instruction="click vel", ui_text=ui_text)
    run.steps = [{}] * steps
    return run


def test_first_steps_branch_in_one_call_and_later_steps_sample_once():
    policy = _Rotating([TAB2[0], TAB2[1], LINK, TAB3, TAB2[0], LINK])  # 6 draws: Tab #2 x3, vel x2, Tab #3 x1
    runs = [_run(0), _run(1), _run(2, steps=3), _run(2)]
    out = decide(policy, runs, openings=6)
    assert policy.batches == [6 + 6 + 1 + 6]  # one batched call
    moves = [opening_move(d) for d in out]
    assert moves[0] == 'Click a#ui-id-2 "Tab #2"' and moves[1] == 'Click span "vel"'
    assert moves[2] == 'Click a#ui-id-2 "Tab #2"'  # a later step: its one plain draw (the 13th reply)
    assert moves[3] == 'Click a#ui-id-3 "Tab #3"'
    assert decide(_Rotating([LINK]), [_run(1)], openings=0)[0].action_desc.startswith('Click span "vel"')


SCREEN = (
    'a#ui-id-1 "Tab #1" @ (27,70) [40x23] selected\na#ui-id-2 "Tab #2" @ (71,70) [40x23]\nspan "vel" @ (63,154) [13x11]'
)
MISSPELT = _reply("vek", 169, 523)


def test_moves_off_the_screen_rank_last_and_hot_draws_get_their_own_call():
    replies = [_decision(t) for t in [MISSPELT, MISSPELT, MISSPELT, TAB2[0], LINK]]
    on_screen = [opening_move(d) for d in ranked_openings(replies, SCREEN)]
    assert on_screen == ['Click a#ui-id-2 "Tab #2"', 'Click span "vel"', 'Click span "vek"']
    assert [opening_move(d) for d in ranked_openings(replies)][0] == 'Click span "vek"'  # no screen: by count
    policy = _Rotating([MISSPELT, MISSPELT, LINK, TAB2[0]])
    out = decide(policy, [_run(3, steps=1), _run(1, ui_text=SCREEN)], openings=4, temperature=1.2)
    assert policy.batches == [1, 4] and policy.temperatures == [None, 1.2]  # the later step samples as usual
    assert opening_move(out[0]) == 'Click span "vek"'  # the plain call's one draw
    assert opening_move(out[1]) == 'Click a#ui-id-2 "Tab #2"'  # draws vek vel Tab#2 vek: vel, Tab #2, then vek


def test_openings_change_the_rollouts_run_key_only_when_set(tmp_path):
    from flywheel.stages import rollouts_spec

    cfg = load_config("configs/tiny.yaml", overrides={"lake.root": str(tmp_path / "lake"), "curriculum.enabled": False})
    plain = rollouts_spec(cfg, 1, "student-model")
    branched_cfg = cfg.model_copy(update={"rollouts": cfg.rollouts.model_copy(update={"openings": 8})})
    branched = rollouts_spec(branched_cfg, 1, "student-model")
    assert plain.openings == 0 and branched.openings == 8
    assert branched.run_key != plain.run_key
    assert rollouts_spec(cfg, 1, "student-model").run_key == plain.run_key
