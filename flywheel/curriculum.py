"""The failure-driven curriculum: per iteration, where the teacher, rollout and RL budgets go.

    plan = plan_for(cfg, lake, iteration=2)           # the iteration's plan: read from the lake, else made and written
    plan.bootstrap_tasks -> {task: n_demos}           # teacher demos to collect this iteration
    plan.rollout_seeds   -> {task: seeds}             # student rollout seeds per task
    plan.rl_tasks        -> [task, ...]               # tasks RL samples
    plan.run_sft         -> bool                      # entropulse: whether SFT runs before RL

Evidence for a task is the newest held-out evaluation of an earlier iteration (per-task `evals`
row), else the newest student rollouts of an earlier iteration, else none. With it:
  - no evidence yet (iteration 0): teacher demos up to the budget; full rollouts; RL;
  - success == 0: teacher demos while the task's budget lasts (`top_up_demos` per iteration),
    then the task is parked (no rollouts, no RL) until it shows a success. A held-out 0 whose task the student's
    own rollouts of that iteration did solve (sampled, k attempts an instance: greedy held-out misses what sampling
    reaches) is a frontier task at the rollouts' rate instead (`curriculum.rollout_evidence`);
  - 0 < success < solved_threshold: full rollouts and RL (the only groups with a signal); with
    `target_successes`, a task's rollout seeds are sized to that many expected successes at its success rate
    (`frontier_seeds`, at most `max_rollout_seeds`), so a rarely solved task gets many tries;
  - success >= solved_threshold: a small check (`check_seeds` rollout seeds), no demos, no RL.
The teacher is a budget, not a default: `teacher_budget.max_episodes_per_task` (or its older name
`bootstrap.max_demos_per_task`) caps the teacher episodes a task ever gets, counted from the lake over every stage
that ran the teacher (bootstraps, top-ups, rl.guide, rl.clone_fresh: flywheel/teacher_budget.py); the lake-wide
`teacher_budget.max_episodes` and `usd` bound the top-ups of all tasks together.

Entropulse (ComputerRL): with `curriculum.sft_every_iteration: false`, iterations after the
first skip SFT and go on with RL from the last checkpoint, unless RL's policy entropy fell below
`entropy_floor` or held-out success moved less than `plateau_points` since the iteration
before; then SFT on the accumulated successes runs before RL. Logged as task '__sft__'.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from typing import Any

from configs.models import FlywheelConfig
from storage.lake import Lake

SFT_ROW = "__sft__"


@dataclass
class Evidence:
    success_rate: float
    n: int
    source: str  # 'evaluate' | 'rollouts'
    iteration: int


@dataclass
class Decision:
    task_id: str
    decision: str  # 'bootstrap' | 'train' | 'teacher' | 'park' | 'check' | 'sft' | 'skip_sft'
    reason: str
    success_rate: float | None = None
    evidence: str | None = None
    n_evidence: int | None = None
    demos_spent: int = 0
    teacher_demos: int = 0
    rollout_seeds: int = 0
    rl: bool = False


@dataclass
class Plan:
    iteration: int
    decisions: list[Decision] = field(default_factory=list)

    @property
    def bootstrap_tasks(self) -> dict[str, int]:
        return {d.task_id: d.teacher_demos for d in self.decisions if d.teacher_demos > 0}

    @property
    def rollout_seeds(self) -> dict[str, int]:
        return {d.task_id: d.rollout_seeds for d in self.decisions if d.rollout_seeds > 0}

    @property
    def rl_tasks(self) -> list[str]:
        return [d.task_id for d in self.decisions if d.rl]

    @property
    def run_sft(self) -> bool:
        return not any(d.task_id == SFT_ROW and d.decision == "skip_sft" for d in self.decisions)


def _evidence(con, iteration: int, tasks: list[str], rollouts: dict[str, Evidence]) -> dict[str, Evidence]:
    """Per task: the newest held-out evaluation of an earlier iteration, else the rollouts' (`_rollout_evidence`)."""
    out: dict[str, Evidence] = {}
    rows = con.execute(
        """
        SELECT task_id, success_rate, n_episodes, iteration FROM evals
        WHERE stage = 'evaluate' AND iteration < ? AND list_contains(?, task_id)
        QUALIFY row_number() OVER (PARTITION BY task_id ORDER BY iteration DESC, created_at DESC NULLS LAST) = 1""",
        [iteration, tasks],
    ).fetchall()
    for task, sr, n, it in rows:
        out[task] = Evidence(float(sr), int(n), "evaluate", int(it))
    for task, ev in rollouts.items():
        out.setdefault(task, ev)
    return out


def _rollout_evidence(con, iteration: int, tasks: list[str]) -> dict[str, Evidence]:
    """Per task: the student's rollouts of the newest earlier iteration that had rollouts (a task without rollouts
    there, e.g. parked, has none: older rollouts are not evidence for today's student)."""
    rows = con.execute(
        """
        SELECT task_id, avg(success::INT), count(*), max(iteration) FROM episodes
        WHERE stage = 'rollouts' AND policy = 'student' AND list_contains(?, task_id)
          AND iteration = (SELECT max(iteration) FROM episodes WHERE stage = 'rollouts' AND iteration < ?)
        GROUP BY task_id""",
        [tasks, iteration],
    ).fetchall()
    return {task: Evidence(float(sr), int(n), "rollouts", int(it)) for task, sr, n, it in rows}


def demos_spent(con, tasks: list[str]) -> dict[str, int]:
    """Bootstrap demos per task in the lake: where a task's new demos' seeds start (the budget counts more:
    flywheel.teacher_budget.episodes_by_task)."""
    rows = con.execute(
        """SELECT task_id, count(*) FROM episodes
                          WHERE stage = 'bootstrap' AND policy <> 'student' AND list_contains(?, task_id)
                          GROUP BY task_id""",
        [tasks],
    ).fetchall()
    return {t: int(n) for t, n in rows}


def frontier_seeds(cfg: FlywheelConfig, success_rate: float) -> int:
    """Rollout seeds for a frontier task: rollouts.selection.seeds_per_task, or with curriculum.target_successes
    as many as that many successes need at this success rate (k attempts a seed), within [seeds_per_task,
    max_rollout_seeds]. A rare success gets many tries; a task the student nearly solves gets few."""
    cc, full = cfg.curriculum, cfg.rollouts.selection.seeds_per_task
    if not cc.target_successes:
        return full
    need = math.ceil(cc.target_successes / (max(success_rate, 1e-6) * cfg.rollout_attempts()))
    return max(min(full, cc.max_rollout_seeds), min(need, cc.max_rollout_seeds))


def _bootstrap(d: Decision, cfg: FlywheelConfig, iteration: int, left: int | None) -> None:
    """No student evidence yet: the bootstrap's demos (once: iteration 0, or a task with none spent)."""
    want = cfg.bootstrap.selection.seeds_per_task if iteration == 0 or d.demos_spent == 0 else 0
    d.teacher_demos = want if left is None else min(want, left)
    d.decision, d.rollout_seeds, d.rl = "bootstrap", cfg.rollouts.selection.seeds_per_task, True
    d.reason = "no student evidence yet" + (
        f"; {d.teacher_demos} teacher demos" if d.teacher_demos else "; demos already in the lake"
    )


def _never_solved(
    d: Decision, ev: Evidence, cfg: FlywheelConfig, budget: int | None, left: int | None, spent_teacher: int
) -> None:
    """Success 0: teacher top-up demos while the budget lasts, else the task is parked."""
    top_up = cfg.curriculum.top_up_demos
    want = top_up if left is None else min(top_up, left)
    if want > 0:
        of = f"its budget of {budget}" if budget is not None else "the lake's teacher budget"
        d.decision, d.teacher_demos, d.rollout_seeds = "teacher", want, cfg.rollouts.selection.seeds_per_task
        d.reason = f"student never solved it ({ev.n} episodes, {d.evidence}): {want} teacher demos" + (
            "" if left is None else f", {left - want} left in {of}"
        )
        return
    spent_out = budget is not None and budget - spent_teacher <= 0
    d.decision = "park"
    d.reason = (
        f"student never solved it ({ev.n} episodes, {d.evidence}) and "
        + (f"its teacher budget of {budget} demos" if spent_out else "the lake's teacher budget")
        + " is spent: no rollouts or RL until it shows a success"
    )


def _frontier(d: Decision, ev: Evidence, cfg: FlywheelConfig) -> None:
    """0 < success < solved: rollouts (sized by curriculum.target_successes) and RL go here."""
    cc = cfg.curriculum
    d.decision, d.rollout_seeds, d.rl = "train", frontier_seeds(cfg, ev.success_rate), True
    d.reason = (
        f"0 < success {ev.success_rate:.0%} < {cc.solved_threshold:.0%} ({d.evidence}): "
        "its groups carry a signal, so rollouts and RL go here"
    )
    if cc.target_successes:
        d.reason += (
            f"; {d.rollout_seeds} seeds x {cfg.rollout_attempts()} attempts for ~{cc.target_successes} successes"
        )


def _sampled_success(ev: Evidence, rollouts: Evidence | None, cfg: FlywheelConfig) -> Evidence | None:
    """The rollouts' evidence where it should stand in for a held-out 0: they ran in that evaluation's iteration or
    later and succeeded (curriculum.rollout_evidence); else None."""
    if not cfg.curriculum.rollout_evidence or ev.success_rate > 0.0 or rollouts is None:
        return None
    return rollouts if rollouts.success_rate > 0.0 and rollouts.iteration >= ev.iteration else None


def _solved(d: Decision, ev: Evidence, cfg: FlywheelConfig) -> None:
    """Solved: a small check that it stays solved; no demos, no RL."""
    cc = cfg.curriculum
    d.decision, d.rollout_seeds = "check", min(cc.check_seeds, cfg.rollouts.selection.seeds_per_task)
    d.reason = (
        f"solved: success {ev.success_rate:.0%} >= {cc.solved_threshold:.0%} ({d.evidence}); "
        f"a {d.rollout_seeds}-seed check, no demos, no RL"
    )


def decide(
    tasks: list[str],
    evidence: dict[str, Evidence],
    spent: dict[str, int],
    cfg: FlywheelConfig,
    iteration: int,
    teacher: dict[str, int] | None = None,
    pool: int | None = None,
    rollouts: dict[str, Evidence] | None = None,
) -> list[Decision]:
    """The per-task decisions (pure: the evidence and spent demos come from the lake). `spent`: bootstrap demos per
    task; `teacher`: teacher episodes per task over every stage, what the per-task budget counts (default: spent);
    `pool`: teacher episodes the lake-wide budget still allows over all tasks (None: no such limit), handed out
    in task order; `rollouts`: the student's newest rollouts per task (`_rollout_evidence`), which keep a task
    with a held-out 0 on the frontier where they succeeded (curriculum.rollout_evidence)."""
    from flywheel.teacher_budget import limits

    budget = limits(cfg).per_task
    teacher = spent if teacher is None else teacher
    out = []
    for task in tasks:
        ev = evidence.get(task)
        left = None if budget is None else max(0, budget - teacher.get(task, 0))
        if pool is not None:
            left = pool if left is None else min(left, pool)
        d = Decision(task, "", "", demos_spent=spent.get(task, 0))
        if ev is None:
            _bootstrap(d, cfg, iteration, left)
        else:
            sampled = _sampled_success(ev, (rollouts or {}).get(task), cfg)
            shown = sampled or ev  # the evidence the decision rests on
            d.success_rate, d.evidence, d.n_evidence = (
                shown.success_rate,
                f"{shown.source} it{shown.iteration}",
                shown.n,
            )
            if sampled is not None:
                _frontier(d, sampled, cfg)
                d.reason = f"held-out 0 of {ev.n} ({ev.source} it{ev.iteration}) but {d.reason}"
            elif ev.success_rate <= 0.0:
                _never_solved(d, ev, cfg, budget, left, teacher.get(task, 0))
            elif ev.success_rate < cfg.curriculum.solved_threshold:
                _frontier(d, ev, cfg)
            else:
                _solved(d, ev, cfg)
        if pool is not None:
            pool -= d.teacher_demos
        out.append(d)
    return out


def sft_decision(con, iteration: int, cfg: FlywheelConfig) -> Decision:
    cc = cfg.curriculum
    if cc.sft_every_iteration or iteration == 0:
        return Decision(
            SFT_ROW,
            "sft",
            "SFT runs every iteration (curriculum.sft_every_iteration)"
            if iteration
            else "the first iteration trains on the teacher's demos",
        )
    ent = con.execute(
        """SELECT avg(entropy) FROM rl_metrics WHERE iteration = ? AND
                         round = (SELECT max(round) FROM rl_metrics WHERE iteration = ?)""",
        [iteration - 1, iteration - 1],
    ).fetchone()[0]
    overall = [
        r[0]
        for r in con.execute(
            """SELECT success_rate FROM evals WHERE stage = 'evaluate' AND task_id = '__all__'
                                             AND iteration < ? ORDER BY iteration DESC, created_at DESC LIMIT 2""",
            [iteration],
        ).fetchall()
    ]
    if ent is not None and ent < cc.entropy_floor:
        return Decision(
            SFT_ROW,
            "sft",
            f"entropulse: RL's policy entropy {ent:.3f} < floor {cc.entropy_floor} in iteration {iteration - 1}",
        )
    if len(overall) == 2 and abs(overall[0] - overall[1]) * 100 < cc.plateau_points:
        return Decision(
            SFT_ROW,
            "sft",
            f"entropulse: held-out success plateaued ({overall[1]:.0%} -> {overall[0]:.0%}, "
            f"< {cc.plateau_points} points)",
        )
    return Decision(
        SFT_ROW,
        "skip_sft",
        "RL continues from the last checkpoint: entropy "
        f"{'n/a' if ent is None else f'{ent:.3f}'} >= floor {cc.entropy_floor}, success still moving",
    )


def plan_iteration(cfg: FlywheelConfig, lake: Lake, iteration: int, tasks: list[str]) -> Plan:
    from flywheel.teacher_budget import episodes_by_task, limits, pool_left
    from storage.catalog import connect

    con = connect(lake)
    try:
        rollouts = _rollout_evidence(con, iteration, tasks)
        plan = Plan(
            iteration,
            decide(
                tasks,
                _evidence(con, iteration, tasks, rollouts),
                demos_spent(con, tasks),
                cfg,
                iteration,
                teacher=episodes_by_task(con, tasks),
                pool=pool_left(con, limits(cfg)),
                rollouts=rollouts,
            ),
        )
        plan.decisions.append(sft_decision(con, iteration, cfg))
    finally:
        con.close()
    return plan


def plan_rows(plan: Plan, run_key: str) -> list[dict[str, Any]]:
    at = datetime.now(timezone.utc)
    return [dict(asdict(d), created_at=at, run_key=run_key) for d in plan.decisions]


def write_plan(lake: Lake, plan: Plan, run_key: str) -> None:
    """The curriculum table's rows for this iteration (a rerun replaces them: same run key)."""
    lake.replace_run(
        "curriculum", [plan_rows(plan, run_key)], iteration=plan.iteration, stage="curriculum", run_key=run_key
    )


def train_tasks(cfg: FlywheelConfig) -> list[str]:
    """The tasks a curriculum plans for: the bootstrap's and the student rollouts' train tasks."""
    from flywheel.specs import resolve_tasks

    out = resolve_tasks(cfg.bootstrap.selection.tasks, for_training=True)
    return out + [t for t in resolve_tasks(cfg.rollouts.selection.tasks, for_training=True) if t not in out]


def load_plan(lake: Lake, iteration: int) -> Plan | None:
    if not lake.has_data("curriculum"):
        return None
    from storage.catalog import connect

    con = connect(lake)
    try:
        cur = con.execute(
            "SELECT * EXCLUDE (created_at, run_key, git_sha, config_hash, iteration, stage) "
            "FROM curriculum WHERE iteration = ? ORDER BY task_id = '__sft__', task_id",
            [iteration],
        )
        names = [d[0] for d in cur.description]
        rows = [dict(zip(names, r)) for r in cur.fetchall()]
    finally:
        con.close()
    return Plan(iteration, [Decision(**r) for r in rows]) if rows else None


def plan_for(cfg: FlywheelConfig, lake: Lake, iteration: int) -> Plan:
    """The iteration's plan: the one in the lake (so every stage of the iteration follows the same decisions,
    also after a resume), else a new one, written with its reasons."""
    plan = load_plan(lake, iteration)
    if plan is None:
        plan = plan_iteration(cfg, lake, iteration, train_tasks(cfg))
        write_plan(lake, plan, f"curriculum-it{iteration}")
    return plan
