"""Branched openings for pass@k collection (`rollouts.openings`).

    decisions = decide(policy, runs, openings=8)   # what the rollout worker calls each tick

The k attempts of an instance start from the same screen. Sampled one by one, they mostly open with the policy's
favourite move: collecting at temperature 0.3, the mini student opened click-tab-2 with "Tab #2" in 47 of 48
attempts on pages whose link sat on the open tab, so no group there held the success that SFT or RL needs (at 0.7,
20 of 45 such attempts at seed 1's third iteration; docs/LOG.md, session 48). With openings = n, an attempt's first
step draws n replies to its screen, ranks their distinct moves by how often they were drawn and takes the one of its
attempt index: attempt 0 the most drawn move, attempt 1 the next, and so on; once the distinct moves run out,
attempt j keeps the j-th reply, a plain sample. Every later step samples as usual. A move is the element the
reply's Action line cites (`Click span "vel"`), not its coordinates, so two clicks on one element are one move. A
click that cites an element the screen's UI text does not hold (a misspelt copy, `Click span "selit"` for "velit")
ranks after every move that does, and unparseable replies are left out. The draws may sample hotter than the
episode (`rollouts.openings_temperature`): at 0.7 the mini student drew the on-screen link on 1 of 5 such pages in
8 draws, at 1.0 on 2 of 5 in 24 (session 48).

Each attempt's worker draws its own n replies, so two attempts can still open alike when their draws rank the moves
differently; with n a few times k the favourite moves rank the same. The kept reply is a sample of the policy
(its tokens' logprobs are the policy's own), chosen among samples: RL that reuses these groups treats the first
step as off-policy data, as it does any stored collection.
"""

from __future__ import annotations

import json
import time
from typing import TYPE_CHECKING

from agents.base import Decision, Policy
from agents.student import cites_screen

if TYPE_CHECKING:
    from flywheel.runtime.episode import EpisodeRun


def opening_move(d: Decision) -> str | None:
    """The move a reply makes: its Action line up to the coordinates (the cited element), else its parsed action;
    None when it did not parse."""
    if d.action is None:
        return None
    if d.action_desc:
        return d.action_desc.split(" @ ")[0].strip()
    return json.dumps(d.action.model_dump(mode="json"), sort_keys=True)


def ranked_openings(replies: list[Decision], ui_text: str | None = None) -> list[Decision]:
    """One reply per distinct move: moves on the screen (`ui_text`) before clicks on an element it does not hold,
    then the most drawn first (ties: the first drawn); unparseable replies are left out."""
    counts: dict[str, int] = {}
    first: dict[str, Decision] = {}
    for d in replies:
        m = opening_move(d)
        if m is None:
            continue
        counts[m] = counts.get(m, 0) + 1
        first.setdefault(m, d)
    off = {m for m, d in first.items() if cites_screen(d, ui_text) is False}
    order = sorted(counts, key=lambda m: (m in off, -counts[m]))  # stable: ties keep the order first drawn
    return [first[m] for m in order]


def pick_opening(replies: list[Decision], attempt: int, ui_text: str | None = None) -> Decision:
    """Attempt `attempt`'s first step from `replies` (n draws on one screen): the attempt-th distinct move, else
    the attempt-th reply as drawn."""
    ranked = ranked_openings(replies, ui_text)
    if attempt < len(ranked):
        return ranked[attempt]
    return replies[attempt % len(replies)]


def decide(
    policy: Policy, runs: list[EpisodeRun], openings: int = 0, temperature: float | None = None
) -> list[Decision]:
    """One decision per run (one batched call when the policy batches). With `openings` > 1, a run at its first
    step gets `openings` draws and keeps the one of its attempt index (pick_opening); the draws sample at
    `temperature` when given (a policy that batches and takes a temperature: the student), in a call of their own."""
    from flywheel.runtime.episode import timed_decisions

    branch = {i for i, r in enumerate(runs) if openings > 1 and not r.steps}
    if not branch:
        return timed_decisions(policy, runs)
    t0 = time.monotonic()
    counts = [openings if i in branch else 1 for i in range(len(runs))]
    if temperature is not None and hasattr(policy, "act_batch"):  # the hot draws in a call of their own
        cold = iter(timed_decisions(policy, [r for i, r in enumerate(runs) if i not in branch]))
        hot_runs = [runs[i] for i in sorted(branch) for _ in range(openings)]
        act = policy.act_batch  # type: ignore[attr-defined]
        hot = iter(act([r.obs for r in hot_runs], [r.history for r in hot_runs], temperature=temperature))
        drawn = [[next(hot if i in branch else cold) for _ in range(n)] for i, n in enumerate(counts)]
    else:
        flat = iter(timed_decisions(policy, [r for r, n in zip(runs, counts) for _ in range(n)]))
        drawn = [[next(flat) for _ in range(n)] for n in counts]
    out = [
        pick_opening(mine, r.job.sample_idx, r.obs.ui_text if r.obs else None) if i in branch else mine[0]
        for i, (r, mine) in enumerate(zip(runs, drawn))
    ]
    per = (time.monotonic() - t0) * 1000 / len(runs)
    for d in out:
        d.latency_ms = per  # the whole draw is this step's cost
    return out
