"""The teacher budget: one budget of teacher episodes and dollars per lake, whichever stage spends it.

    spend = teacher_spend(con)                     # from the lake's `episodes` rows
    spend.by_task()["click-button"]                # Spent(episodes=620, successes=620, usd=0.0)
    spend.by_stage()["rl"]                         # what rl.guide / rl.clone_fresh spent
    spec, cap = cap_teacher_spec(cfg, spec)        # a teacher run's jobs, cut to what the budget has left

The budget (configs: `teacher_budget`, see `limits`):
  - max_episodes_per_task: teacher episodes a task may ever get in this lake (null: the older
    `bootstrap.max_demos_per_task`, which now means the same thing);
  - max_episodes: teacher episodes over all tasks;
  - usd: dollars (the episodes' `cost`) over every stage.
What counts is flywheel.reports.TEACHER_SPEND: every teacher-policy episode the flywheel ran (bootstrap, curriculum
top-ups, rl.guide, rl.clone_fresh, ...), not imports, evaluations, the mid-training corpus or the free oracle's
episodes on synthetic tasks (synth/<kind>; a paid teacher's there count).

Where the cap applies: the curriculum plans top-ups within it (flywheel/curriculum.py), the bootstrap's seeds stay
within the per-task budget (flywheel/stages.py `_demo_seeds`), and every teacher run -- the bootstrap and the RL
stage's teacher runs (flywheel/rl_stage.py `_teach`) -- goes through `cap_teacher_spec` just before it runs: its
new jobs are cut to the episodes left (per task, then over all tasks, spread round-robin over its tasks) and its
`budget_usd` to the dollars left, so the rollout runner stops handing out episodes once they are spent. A spent
budget is not an error: the run gets no new teacher episodes and says so in the log.

Nothing counts twice: spend is read from the lake's rows (a rerun replaces a run key's rows), and a run's cap
counts the episodes its own run key already holds once -- they stay in its job list (done ones are skipped by
the runner, errored ones retried), and only the jobs beyond them are new spend. A resumed run therefore gets the
same jobs it had, and a finished one is a no-op.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from typing import Any

from flywheel.reports import SYNTH_PREFIX, TEACHER_SPEND, teacher_spend_rows

PAID_POLICIES = ("claude",)  # policy kinds whose episodes cost dollars: on synth tasks too they are spend

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Spent:
    episodes: int = 0
    successes: int = 0
    usd: float = 0.0

    def __add__(self, o: "Spent") -> "Spent":
        return Spent(self.episodes + o.episodes, self.successes + o.successes, round(self.usd + o.usd, 6))


@dataclass
class TeacherSpend:
    """Teacher spend rows per (iteration, stage, task): episodes, successes, usd."""

    rows: list[dict[str, Any]]

    def _by(self, key: str) -> dict[Any, Spent]:
        out: dict[Any, Spent] = {}
        for r in self.rows:
            out[r[key]] = out.get(r[key], Spent()) + Spent(int(r["episodes"]), int(r["successes"]), float(r["usd"]))
        return out

    def by_task(self) -> dict[str, Spent]:
        return self._by("task_id")

    def by_stage(self) -> dict[str, Spent]:
        return self._by("stage")

    def by_iteration(self) -> dict[int, Spent]:
        return self._by("iteration")

    @property
    def total(self) -> Spent:
        return sum((Spent(int(r["episodes"]), int(r["successes"]), float(r["usd"])) for r in self.rows), Spent())


def teacher_spend(con, *, iteration: int | None = None) -> TeacherSpend:
    """Where the teacher budget went, from the lake's `episodes` (a connection with the lake's views)."""
    return TeacherSpend(teacher_spend_rows(con, iteration=iteration))


@dataclass(frozen=True)
class Limits:
    per_task: int | None = None
    total: int | None = None
    usd: float | None = None

    @property
    def any(self) -> bool:
        return self.per_task is not None or self.total is not None or self.usd is not None

    def describe(self) -> str:
        parts = [
            f"{self.per_task} per task" if self.per_task is not None else "",
            f"{self.total} in all" if self.total is not None else "",
            f"${self.usd:g}" if self.usd is not None else "",
        ]
        return ", ".join(p for p in parts if p) or "no limit"


def limits(cfg) -> Limits:
    """The configured budget: teacher_budget.*, with bootstrap.max_demos_per_task as the per-task budget's
    older name."""
    tb = cfg.teacher_budget
    per_task = tb.max_episodes_per_task if tb.max_episodes_per_task is not None else cfg.bootstrap.max_demos_per_task
    return Limits(per_task, tb.max_episodes, tb.usd)


def episodes_by_task(con, tasks: list[str] | None = None) -> dict[str, int]:
    """Teacher episodes per task in the lake, every stage counted (the per-task budget's count)."""
    sql = f"SELECT task_id, count(*) FROM episodes WHERE {TEACHER_SPEND}"
    if tasks is None:
        rows = con.execute(sql + " GROUP BY task_id").fetchall()
    else:
        rows = con.execute(sql + " AND list_contains(?, task_id) GROUP BY task_id", [list(tasks)]).fetchall()
    return {t: int(n) for t, n in rows}


def pool_left(con, lim: Limits) -> int | None:
    """Teacher episodes the lake-wide budget (max_episodes, usd) still allows: None = no such limit, 0 = spent."""
    if lim.total is None and lim.usd is None:
        return None
    n, usd = con.execute(f"SELECT count(*), coalesce(sum(cost), 0) FROM episodes WHERE {TEACHER_SPEND}").fetchone()
    if lim.usd is not None and float(usd) >= lim.usd:
        return 0
    return None if lim.total is None else max(0, lim.total - int(n))


@dataclass
class Cap:
    """What a teacher run's budget cut: `dropped` jobs of `jobs` (None = no budget configured)."""

    jobs: int
    dropped: int = 0
    budget_usd: float | None = None
    reason: str = ""


def cap_jobs(
    jobs: list, done: set[str], *, per_task_left: dict[str, int] | None, total_left: int | None, no_new: bool = False
) -> list:
    """The jobs a teacher run may run: every job in `done` (episode ids its run key already holds, and free ones),
    then new jobs in order, at most per_task_left[task] per task and total_left in all (taken round-robin over the
    tasks, so a cut run keeps every task). Pure; `no_new`: only the done ones (the dollars are spent)."""
    kept_ids = {j.episode_id for j in jobs if j.episode_id in done}
    if not no_new:
        queues: dict[str, list] = {}
        for j in jobs:
            if j.episode_id not in done:
                queues.setdefault(j.task_id, []).append(j)
        if per_task_left is not None:
            queues = {t: q[: max(0, per_task_left.get(t, 0))] for t, q in queues.items()}
        if total_left is None:
            kept_ids.update(j.episode_id for q in queues.values() for j in q)
        else:
            left, depth = max(0, total_left), 0
            while left > 0 and any(depth < len(q) for q in queues.values()):
                for q in queues.values():
                    if depth < len(q) and left > 0:
                        kept_ids.add(q[depth].episode_id)
                        left -= 1
                depth += 1
    return [j for j in jobs if j.episode_id in kept_ids]


def spend_index(lake):
    """The lake's teacher-spend rows (task_id, run_key, cost), read through storage.catalog.FilteredRows: a stage
    that runs the teacher again and again (the RL stage: rl.guide and rl.clone_fresh every round) keeps one and
    passes it to cap_teacher_spec."""
    from storage.catalog import FilteredRows

    return FilteredRows(lake, "episodes", "task_id, run_key, cost", TEACHER_SPEND)


def cap_teacher_spec(cfg, spec, *, run_usd: float | None = None, what: str = "teacher", index=None):
    """`spec` (a teacher run: bootstrap, rl.guide, rl.clone_fresh) with its jobs cut to the teacher budget left and
    its budget_usd set to the dollars left (and to `run_usd`, a per-run cap such as bootstrap.budget_usd, when
    lower). Spend is read from the lake (`index`: a spend_index kept by the caller, else a fresh one): other run
    keys' episodes, plus the ones this run key already holds (kept, counted once). Returns (spec, Cap); with no
    budget configured, the spec unchanged but for run_usd, and the lake is not read."""
    from flywheel.runtime.rollout import existing_episodes
    from storage.catalog import connect

    lim = limits(cfg)
    if not lim.any:
        return (spec if run_usd is None else replace(spec, budget_usd=run_usd)), Cap(len(spec.jobs), 0, run_usd)
    lake = spec.lake()
    con = connect(lake)
    try:
        rows = (index or spend_index(lake)).rows(con)
    finally:
        con.close()
    by_task: dict[str, int] = {}
    other_usd = 0.0
    for r in rows:
        by_task[r["task_id"]] = by_task.get(r["task_id"], 0) + 1
        if r["run_key"] != spec.run_key:
            other_usd += float(r["cost"] or 0.0)
    mine_usd: dict[str, float] = {}
    done = set(existing_episodes(lake, spec, mine_usd))
    if spec.policy.kind not in PAID_POLICIES:  # the oracle on synthetic tasks is free: never cut
        done |= {j.episode_id for j in spec.jobs if j.task_id.startswith(SYNTH_PREFIX)}
    spent_total = sum(by_task.values())
    per_task_left = (
        None if lim.per_task is None else {t: lim.per_task - by_task.get(t, 0) for t in {j.task_id for j in spec.jobs}}
    )
    total_left = None if lim.total is None else lim.total - spent_total
    budget = run_usd
    if lim.usd is not None:  # the runner counts this run key's own dollars itself: give it what the others left
        budget = lim.usd - other_usd if budget is None else min(budget, lim.usd - other_usd)
    no_new = lim.usd is not None and sum(mine_usd.values()) >= lim.usd - other_usd
    jobs = cap_jobs(spec.jobs, done, per_task_left=per_task_left, total_left=total_left, no_new=no_new)
    cap = Cap(len(spec.jobs), len(spec.jobs) - len(jobs), budget)
    if cap.dropped:
        spent_usd = other_usd + sum(mine_usd.values())
        cap.reason = (
            f"teacher budget ({lim.describe()}; spent {spent_total} episodes, ${spent_usd:.4g}): {what} gets "
            f"{len(jobs) - len(done & {j.episode_id for j in jobs})} new teacher episode(s), "
            f"{cap.dropped} of its {len(spec.jobs)} not run"
        )
        log.warning("%s: %s", spec.run_key, cap.reason)
    return replace(spec, jobs=jobs, budget_usd=budget), cap
