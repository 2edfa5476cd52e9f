"""The teacher budget across stages (flywheel/teacher_budget.py) and the per-task iteration report
(flywheel/reports.py), on real lakes written through the lake API.

Every teacher episode counts, whichever stage ran it: the bootstrap (and curriculum top-ups) and the RL stage's
teacher runs (rl.guide, rl.clone_fresh) are cut to what is left, per task, in all, and in dollars; a rerun of a
run key neither double counts nor loses its own episodes. The iteration report's rows come from one query
module that the Prefect artifact and the viewer both render.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from configs.loading import load_config
from configs.models import ConfigError
from flywheel.runtime.rollout import PolicySpec, RolloutSummary
from flywheel.teacher_budget import Spent, cap_teacher_spec, limits, spend_index, teacher_spend
from storage.catalog import connect
from storage.lake import Lake

ROOT = Path(__file__).resolve().parents[1]
TASKS = ["click-test", "focus-text"]


def cfg_with(tmp_path: Path, **overrides):
    return load_config(ROOT / "configs" / "tiny.yaml", {"lake.root": str(tmp_path / "lake"), **overrides})


@pytest.fixture
def lake_env(tmp_path, monkeypatch):
    monkeypatch.setenv("FLYWHEEL_LAKE", str(tmp_path / "lake"))  # what lake_for (and the specs) use
    return Lake(tmp_path / "lake")


def episodes(
    lake: Lake,
    *,
    iteration: int,
    stage: str,
    run_key: str,
    task: str,
    n: int,
    policy: str = "scripted",
    cost: float = 0.0,
    success: bool = True,
    seed0: int = 0,
    ids: list[str] | None = None,
) -> list[str]:
    ids = ids or [f"{run_key}-{task}-{seed0 + i}" for i in range(n)]
    lake.replace_run(
        "episodes",
        [
            [
                dict(
                    episode_id=e,
                    task_id=task,
                    seed=seed0 + i,
                    policy=policy,
                    status="ok",
                    success=success,
                    task_reward=float(success),
                    cost=cost,
                    n_steps=1,
                    split="train",
                    run_key=run_key,
                )
                for i, e in enumerate(ids)
            ]
        ],
        iteration=iteration,
        stage=stage,
        run_key=run_key,
    )
    return ids


# ------------------------------------------------------------------------------------------ spend
def test_spend_per_stage_and_task_is_what_the_rows_say(tmp_path):
    lake = Lake(tmp_path / "lake")
    episodes(lake, iteration=0, stage="bootstrap", run_key="boot0", task="click-test", n=3, policy="claude", cost=0.5)
    episodes(lake, iteration=0, stage="bootstrap", run_key="boot0b", task="focus-text", n=2, policy="claude", cost=0.25)
    episodes(lake, iteration=1, stage="bootstrap", run_key="boot1", task="click-test", n=1, policy="claude", cost=0.5)
    episodes(lake, iteration=0, stage="rl", run_key="guide0", task="click-test", n=4, policy="claude", cost=1.0)
    episodes(
        lake,
        iteration=0,
        stage="rl",
        run_key="fresh0",
        task="click-test",
        n=2,
        policy="claude",
        cost=1.0,
        success=False,
    )
    # not teacher spend: the student's own episodes, imports, evaluations of the teacher, the mid-training corpus
    episodes(lake, iteration=0, stage="rl", run_key="round0", task="click-test", n=8, policy="student")
    episodes(lake, iteration=0, stage="rollouts", run_key="ro0", task="focus-text", n=5, policy="student")
    episodes(lake, iteration=0, stage="import", run_key="imp", task="click-test", n=7, policy="osworld", cost=9.0)
    episodes(lake, iteration=0, stage="evaluate", run_key="ev", task="click-test", n=6, policy="scripted")
    episodes(lake, iteration=0, stage="midtrain", run_key="mt", task="synth/click", n=9, policy="scripted")
    episodes(lake, iteration=0, stage="rl", run_key="synth-guide", task="synth/type", n=5)  # the free synth oracle
    # ... but a paid teacher on a synthetic task spends like anywhere else
    episodes(lake, iteration=1, stage="rl", run_key="synth-claude", task="synth/type", n=1, policy="claude", cost=0.5)
    # a rerun of a run key replaces its rows: the same episodes count once
    episodes(lake, iteration=0, stage="rl", run_key="guide0", task="click-test", n=4, policy="claude", cost=1.0)

    spend = teacher_spend(connect(lake))
    assert spend.by_stage() == {"bootstrap": Spent(6, 6, 2.5), "rl": Spent(7, 5, 6.5)}
    assert spend.by_task() == {
        "click-test": Spent(10, 8, 8.0),
        "focus-text": Spent(2, 2, 0.5),
        "synth/type": Spent(1, 1, 0.5),
    }
    assert spend.by_iteration() == {0: Spent(11, 9, 8.0), 1: Spent(2, 2, 1.0)}
    assert spend.total == Spent(13, 11, 9.0)
    rows = {(r["iteration"], r["stage"], r["task_id"]): (r["episodes"], r["successes"], r["usd"]) for r in spend.rows}
    assert rows == {
        (0, "bootstrap", "click-test"): (3, 3, 1.5),
        (0, "bootstrap", "focus-text"): (2, 2, 0.5),
        (1, "bootstrap", "click-test"): (1, 1, 0.5),
        (0, "rl", "click-test"): (6, 4, 6.0),
        (1, "rl", "synth/type"): (1, 1, 0.5),
    }
    assert teacher_spend(connect(lake), iteration=1).total == Spent(2, 2, 1.0)


def test_config_one_budget_and_the_old_name_still_loads(tmp_path):
    for path in sorted((ROOT / "configs").glob("*.yaml")):  # every shipped config still loads
        load_config(path)
    flywheel8 = load_config(ROOT / "configs" / "flywheel8.yaml")
    assert limits(flywheel8).per_task == 20  # bootstrap.max_demos_per_task: the per-task budget's older name
    new = cfg_with(
        tmp_path,
        **{"teacher_budget.max_episodes_per_task": 7, "teacher_budget.max_episodes": 30, "teacher_budget.usd": 2.5},
    )
    assert (limits(new).per_task, limits(new).total, limits(new).usd) == (7, 30, 2.5)
    assert limits(cfg_with(tmp_path)).any is False
    same = cfg_with(tmp_path, **{"teacher_budget.max_episodes_per_task": 7, "bootstrap.max_demos_per_task": 7})
    assert limits(same).per_task == 7
    with pytest.raises(ConfigError, match="same budget under two names"):
        cfg_with(tmp_path, **{"teacher_budget.max_episodes_per_task": 7, "bootstrap.max_demos_per_task": 5})
    with pytest.raises(ConfigError, match="teacher_budget.usd"):
        cfg_with(tmp_path, **{"teacher_budget.usd": -1})


# ------------------------------------------------------------------------------------------ the RL stage's teacher
class FakeRunner:
    """Stands in for the rollout workers: records each teacher run's spec and writes its episodes as the real runner
    would (the jobs not yet in the lake, one row each, under the spec's run key), so the lake's spend follows."""

    def __init__(self, cost: float = 0.0):
        self.specs, self.cost = [], cost

    def run(self, spec, progress=True, pool=None, on_result=None):
        from flywheel.runtime.rollout import existing_episodes

        self.specs.append(spec)
        lake = spec.lake()
        done = existing_episodes(lake, spec)
        todo = [j for j in spec.jobs if j.episode_id not in done]
        for j in todo:
            lake.write(
                "episodes",
                [
                    dict(
                        episode_id=j.episode_id,
                        task_id=j.task_id,
                        seed=j.seed,
                        policy=spec.policy.kind,
                        status="ok",
                        success=True,
                        task_reward=1.0,
                        cost=self.cost,
                        n_steps=1,
                        split="train",
                        run_key=spec.run_key,
                    )
                ],
                iteration=spec.iteration,
                stage=spec.stage,
                run_key=spec.run_key,
                part=j.episode_id,
            )
        return RolloutSummary(
            spec.run_key, len(spec.jobs), len(spec.jobs) - len(todo), len(todo), len(todo), len(todo), 0, 0.0
        )


@pytest.fixture
def fake_runner(monkeypatch):
    import flywheel.rl_stage as rl_stage

    runner = FakeRunner()

    class Pool:
        def __init__(self, spec):
            self.spec = spec

        def close(self):
            pass

    monkeypatch.setattr(rl_stage, "run_rollouts", runner.run)
    monkeypatch.setattr(rl_stage, "RolloutPool", Pool)
    return runner


def test_rl_clone_fresh_gets_only_what_the_per_task_budget_left(tmp_path, lake_env, fake_runner):
    from flywheel.rl_stage import _fresh_seeds, _teach_fresh

    cfg = cfg_with(
        tmp_path,
        **{"teacher_budget.max_episodes_per_task": 10, "rl.enabled": True, "rl.clone_steps": 1, "rl.clone_fresh": 6},
    )
    episodes(lake_env, iteration=0, stage="bootstrap", run_key="boot-ct", task="click-test", n=6)
    episodes(lake_env, iteration=0, stage="bootstrap", run_key="boot-ft", task="focus-text", n=3)
    index = spend_index(lake_env)  # as the RL stage keeps one: each round reads only the files written since
    pool = _teach_fresh(cfg, 0, 0, TASKS, None, progress=False, spend=index)
    (spec,) = fake_runner.specs
    got = {t: [j.seed for j in spec.jobs if j.task_id == t] for t in TASKS}
    fresh = _fresh_seeds(cfg, 0, 0)
    assert got == {
        "click-test": fresh[:4],
        "focus-text": fresh,
    }  # 10 - 6 left for click-test, 10 - 3 >= 6 for focus-text
    assert pool is not None and spec.stage == "rl" and spec.policy.kind == "scripted"
    spend = teacher_spend(connect(lake_env))
    assert spend.by_task()["click-test"].episodes == 10 and spend.by_stage()["rl"].episodes == 10
    # the next round: click-test's budget is spent, focus-text has 1 left
    _teach_fresh(cfg, 0, 1, TASKS, pool, progress=False, spend=index)
    assert [(j.task_id, j.seed) for j in fake_runner.specs[1].jobs] == [("focus-text", _fresh_seeds(cfg, 0, 1)[0])]
    # every budget spent: no teacher run at all, not an error
    _teach_fresh(cfg, 0, 2, TASKS, pool, progress=False, spend=index)
    assert len(fake_runner.specs) == 2
    assert teacher_spend(connect(lake_env)).by_task() == {
        "click-test": Spent(10, 10, 0.0),
        "focus-text": Spent(10, 10, 0.0),
    }


def test_rl_guide_spent_budget_gives_no_guide_episodes(tmp_path, lake_env, fake_runner, caplog):
    import logging

    from flywheel.rl_stage import _guide

    cfg = cfg_with(tmp_path, **{"teacher_budget.max_episodes": 5, "rl.enabled": True, "rl.guide": "all"})
    # the round's student groups: every instance failed
    lake_env.replace_run(
        "episodes",
        [
            [
                dict(
                    episode_id=f"s{t}{s}{k}",
                    task_id=t,
                    seed=5000 + s,
                    policy="student",
                    status="ok",
                    success=False,
                    task_reward=0.0,
                    run_key="round0",
                )
                for t in TASKS
                for s in range(3)
                for k in range(2)
            ]
        ],
        iteration=0,
        stage="rl",
        run_key="round0",
    )
    episodes(lake_env, iteration=0, stage="bootstrap", run_key="boot", task="click-test", n=2)
    keys, pool = _guide(cfg, 0, "round0", lake_env, None, progress=False)
    (spec,) = fake_runner.specs
    # 5 in all - 2 spent = 3 new episodes, spread over both tasks rather than all on the first
    assert sorted((j.task_id, j.seed) for j in spec.jobs) == [
        ("click-test", 5000),
        ("click-test", 5001),
        ("focus-text", 5000),
    ]
    assert keys == [spec.run_key]
    caplog.set_level(logging.WARNING, logger="flywheel.teacher_budget")
    keys, _ = _guide(cfg, 0, "round0", lake_env, pool, progress=False)  # a rerun of the round: the same episodes
    assert keys == [spec.run_key] and fake_runner.specs[1].jobs == spec.jobs
    assert teacher_spend(connect(lake_env)).total.episodes == 5
    # another round's failures once the budget is spent: no guide episodes, no run key, a log line
    lake_env.replace_run(
        "episodes",
        [
            [
                dict(
                    episode_id=f"r1{t}",
                    task_id=t,
                    seed=5100,
                    policy="student",
                    status="ok",
                    success=False,
                    task_reward=0.0,
                    run_key="round1",
                )
                for t in TASKS
            ]
        ],
        iteration=0,
        stage="rl",
        run_key="round1",
    )
    caplog.clear()
    keys, _ = _guide(cfg, 0, "round1", lake_env, pool, progress=False)
    assert keys == [] and len(fake_runner.specs) == 2
    assert "rl.guide gets 0 new teacher episode(s)" in caplog.text


def test_dollars_left_cap_the_teacher_run_and_a_resumed_run_counts_once(tmp_path, lake_env):
    """teacher_budget.usd: a run's budget_usd is what the other run keys left (the runner adds its own run key's
    spend itself); once this run key's own spend reaches it, no new job is kept; its finished jobs always are."""
    from flywheel.specs import rollout_spec

    cfg = cfg_with(tmp_path, **{"teacher_budget.usd": 3.0})
    episodes(
        lake_env, iteration=0, stage="bootstrap", run_key="boot", task="click-test", n=2, policy="claude", cost=0.5
    )
    spec = rollout_spec(
        cfg,
        iteration=0,
        stage="rl",
        policy=PolicySpec("claude", version="m"),
        tasks=TASKS,
        seeds=[1000, 1001, 1002],
        split="train",
    )
    capped, cap = cap_teacher_spec(cfg, spec, what="rl.clone_fresh")
    assert capped.budget_usd == pytest.approx(2.0) and capped.jobs == spec.jobs and cap.dropped == 0
    # bootstrap.budget_usd (one run's guard) applies too, the lower one wins
    assert cap_teacher_spec(cfg, spec, run_usd=1.5)[0].budget_usd == pytest.approx(1.5)
    # the run spent $2.4 on two of its jobs (a crash stopped it): a resume keeps those, starts nothing new
    ran = spec.jobs[:2]
    lake_env.replace_run(
        "episodes",
        [
            [
                dict(
                    episode_id=j.episode_id,
                    task_id=j.task_id,
                    seed=j.seed,
                    policy="claude",
                    status="ok",
                    success=True,
                    cost=1.2,
                    run_key=spec.run_key,
                )
                for j in ran
            ]
        ],
        iteration=0,
        stage="rl",
        run_key=spec.run_key,
    )
    capped, cap = cap_teacher_spec(cfg, spec, what="rl.clone_fresh")
    assert capped.jobs == ran and capped.budget_usd == pytest.approx(2.0) and cap.dropped == 4
    spend = teacher_spend(connect(lake_env))
    assert spend.total == Spent(4, 4, 3.4)  # counted once: 2 x 0.5 + 2 x 1.2


def test_resumed_run_keeps_its_own_episodes_within_the_per_task_cap(tmp_path, lake_env):
    """A run key that already holds episodes gets the same jobs back (they are spent once, not twice), and only
    the jobs beyond what the budget left are cut."""
    from flywheel.specs import rollout_spec

    cfg = cfg_with(tmp_path, **{"teacher_budget.max_episodes_per_task": 4})
    spec = rollout_spec(
        cfg,
        iteration=0,
        stage="rl",
        policy=PolicySpec("scripted"),
        tasks=["click-test"],
        seeds=list(range(1000, 1006)),
        split="train",
    )
    first, _ = cap_teacher_spec(cfg, spec)
    assert [j.seed for j in first.jobs] == [1000, 1001, 1002, 1003]
    FakeRunner().run(first)
    again, cap = cap_teacher_spec(cfg, spec)
    assert again.jobs == first.jobs and cap.dropped == 2
    # without the budget every job would run: the cap is what keeps the lake at 4
    assert len(cap_teacher_spec(cfg_with(tmp_path), spec)[0].jobs) == 6
    # the free oracle on synthetic tasks is never cut (its episodes are not spend); a paid teacher there is
    synth = rollout_spec(
        cfg,
        iteration=0,
        stage="rl",
        policy=PolicySpec("scripted"),
        tasks=["synth/click"],
        seeds=list(range(1000, 1006)),
        split="train",
    )
    assert len(cap_teacher_spec(cfg, synth)[0].jobs) == 6
    paid = rollout_spec(
        cfg,
        iteration=0,
        stage="rl",
        policy=PolicySpec("claude", version="m"),
        tasks=["synth/click"],
        seeds=list(range(1000, 1006)),
        split="train",
    )
    assert len(cap_teacher_spec(cfg, paid)[0].jobs) == 4


def test_a_pools_later_run_keeps_its_own_dollar_budget(tmp_path):
    """The RL stage's teacher runs share one rollout pool: each run's budget_usd is its own (the budget left when
    it starts), not the first run's. A run whose dollars are spent starts no episode (and no browser)."""
    from flywheel.runtime.rollout import RolloutPool, RolloutSpec, make_jobs, run_rollouts

    root = str(tmp_path / "lake")

    def spec(key: str, budget: float | None) -> RolloutSpec:
        return RolloutSpec(
            run_key=key,
            iteration=0,
            stage="rl",
            lake_root=root,
            policy=PolicySpec("scripted"),
            jobs=make_jobs(key, ["click-test"], [1000, 1001], policy_tag="scripted:0"),
            n_envs=1,
            budget_usd=budget,
        )

    pool = RolloutPool(spec("first", None))
    try:
        res = run_rollouts(spec("second", 0.0), pool=pool, progress=False)
        assert (res.ran, res.budget_stopped) == (0, 2) and pool.runner.workers == []
    finally:
        pool.close()


# ------------------------------------------------------------------------------------------ bootstrap + curriculum
def test_bootstrap_counts_the_rl_stages_teacher_episodes(tmp_path, lake_env, monkeypatch):
    import flywheel.stages as stages

    runner = FakeRunner()
    monkeypatch.setattr(stages, "run_rollouts", lambda spec, progress=True, **kw: runner.run(spec))
    cfg = cfg_with(tmp_path, **{"bootstrap.max_demos_per_task": 4})
    episodes(lake_env, iteration=0, stage="bootstrap", run_key="boot", task="click-test", n=1)
    episodes(lake_env, iteration=0, stage="rl", run_key="fresh", task="click-test", n=2, seed0=1000)
    res = stages.bootstrap(cfg, 1, progress=False)
    (spec,) = runner.specs
    # click-test: 4 - (1 demo + 2 RL teacher episodes) = 1 more, on the seed after its demo; focus-text: its 3
    assert sorted((j.task_id, j.seed) for j in spec.jobs) == [
        ("click-test", 1),
        ("focus-text", 0),
        ("focus-text", 1),
        ("focus-text", 2),
    ]
    assert res["teacher_budget_capped"] == 0
    # the lake-wide cap: 9 in all, 7 spent now -> 2 more, one per task
    cfg = cfg_with(tmp_path, **{"teacher_budget.max_episodes": 9})
    stages.bootstrap(cfg, 2, progress=False)
    assert sorted(j.task_id for j in runner.specs[1].jobs) == ["click-test", "focus-text"]
    res = stages.bootstrap(cfg, 3, progress=False)
    assert res.skipped and res["teacher_budget_capped"] == 6 and len(runner.specs) == 2
    assert "bootstrap gets 0 new teacher episode(s)" in res.skipped


def test_curriculum_top_ups_count_every_stage(tmp_path, lake_env):
    from flywheel.curriculum import plan_iteration

    cfg = cfg_with(
        tmp_path,
        **{"curriculum.enabled": True, "teacher_budget.max_episodes_per_task": 6, "curriculum.top_up_demos": 4},
    )
    lake_env.write(
        "evals",
        [
            dict(
                eval_id="e0",
                checkpoint_id="ck",
                task_id=t,
                split="eval-seed",
                n_episodes=10,
                successes=0,
                success_rate=0.0,
                run_key="ev0",
            )
            for t in TASKS
        ],
        iteration=0,
        stage="evaluate",
        run_key="ev0",
    )
    episodes(lake_env, iteration=0, stage="bootstrap", run_key="boot", task="click-test", n=2)
    episodes(lake_env, iteration=0, stage="bootstrap", run_key="boot-ft", task="focus-text", n=2)
    episodes(lake_env, iteration=0, stage="rl", run_key="guide", task="click-test", n=3, seed0=5000)
    plan = {d.task_id: d for d in plan_iteration(cfg, lake_env, 1, TASKS).decisions}
    # click-test: 6 - (2 demos + 3 guide episodes) = 1 top-up; focus-text: min(4, 6 - 2)
    assert (plan["click-test"].decision, plan["click-test"].teacher_demos) == ("teacher", 1)
    assert plan["click-test"].demos_spent == 2  # its new demos' seeds start after its 2 bootstrap demos
    assert (plan["focus-text"].decision, plan["focus-text"].teacher_demos) == ("teacher", 4)
    episodes(lake_env, iteration=0, stage="rl", run_key="guide2", task="click-test", n=1, seed0=5010)
    plan = {d.task_id: d for d in plan_iteration(cfg, lake_env, 1, TASKS).decisions}
    assert plan["click-test"].decision == "park" and "budget of 6 demos is spent" in plan["click-test"].reason
    # a lake-wide budget is handed out in task order: 9 in all, 8 spent -> 1 top-up
    cfg = cfg_with(
        tmp_path, **{"curriculum.enabled": True, "teacher_budget.max_episodes": 9, "curriculum.top_up_demos": 4}
    )
    plan = {d.task_id: d for d in plan_iteration(cfg, lake_env, 1, TASKS).decisions}
    assert [plan[t].teacher_demos for t in TASKS] == [1, 0] and plan["focus-text"].decision == "park"


# ------------------------------------------------------------------------------------------ the iteration report
def report_lake(root: Path) -> Lake:
    """Two iterations of one task pair: teacher demos, the student's rollouts and RL episodes, an RL teacher run,
    each iteration's SFT dataset (its episodes' fit steps are the samples) and held-out evaluations."""
    lake = Lake(root)

    def eps(it, stage, rk, task, policy, succ, n0=0, cost=0.0):
        rows = [
            dict(
                episode_id=f"{rk}-{task}-{i}",
                task_id=task,
                seed=n0 + i,
                policy=policy,
                status="ok",
                success=s,
                task_reward=float(s),
                cost=cost,
                n_steps=2,
                split="train",
                run_key=rk,
            )
            for i, s in enumerate(succ)
        ]
        lake.write("episodes", rows, iteration=it, stage=stage, run_key=rk, part=task)
        return [r["episode_id"] for r in rows]

    def steps(ids, n_fit, n_unfit=0):
        rows = []
        for e in ids:
            for k in range(n_fit + n_unfit):
                rows.append(dict(episode_id=e, step_idx=k, is_final=False, parse_ok=k < n_fit, run_key="s"))
            rows.append(dict(episode_id=e, step_idx=n_fit + n_unfit, is_final=True, run_key="s"))
        lake.write("steps", rows, iteration=0, stage="x", run_key="s", part=ids[0])

    t0 = eps(0, "bootstrap", "boot0", "click-test", "claude", [True] * 3, cost=0.25)
    t0b = eps(0, "bootstrap", "boot0", "focus-text", "claude", [True, True])
    s0 = eps(0, "rollouts", "ro0", "click-test", "student", [True, False, False, False])
    eps(0, "rl", "rl0", "click-test", "student", [False] * 6)
    eps(0, "rl", "guide0", "click-test", "claude", [True, False], n0=5000, cost=1.0)
    s1 = eps(1, "rollouts", "ro1", "click-test", "student", [True, True, False, False], n0=10)
    eps(1, "rollouts", "ro1", "focus-text", "student", [True, True])
    ev1 = eps(1, "evaluate", "ev1", "click-test", "scripted", [True] * 5)  # not spend, not attempts
    old_ev1 = eps(1, "evaluate", "ev1-old", "click-test", "student", [True] * 2)  # an older evaluation's run
    steps(t0, 2)
    steps(t0b, 1)
    steps(s0, 1, n_unfit=2)  # unfit steps are never SFT samples
    steps(s1, 3)
    # evaluation steps: two of ev1's episodes had a click snapped onto the cited line (one of them twice), the
    # older run's episodes too (not the newest evaluation: never counted); a step whose context only mentions the
    # word in a string value is no snap
    snap = json.dumps({"snapped": {"line": 'button "OK" @ (10,10) [20x10]', "from": [40, 40]}})
    ctx = {ev1[0]: [snap, snap], ev1[1]: [None, snap], ev1[2]: [json.dumps({"note": '"snapped"'}), None]}
    ctx |= {e: [snap] for e in old_ev1}
    lake.write(
        "steps",
        [
            dict(episode_id=e, step_idx=k, is_final=False, parse_ok=True, prompt_context=c, run_key="ev")
            for e, cs in ctx.items()
            for k, c in enumerate(cs)
        ],
        iteration=1,
        stage="evaluate",
        run_key="ev",
    )
    from datetime import datetime, timezone

    lake.write(
        "datasets",
        [
            dict(
                dataset_id="ds0",
                episode_ids=t0 + t0b,
                n_episodes=5,
                n_steps=8,
                run_key="ds0",
                created_at=datetime(2025, 1, 1, tzinfo=timezone.utc),
            )
        ],
        iteration=0,
        stage="curate",
        run_key="ds0",
    )
    # the mid-training corpus is a dataset too (stage midtrain, iteration 0, newer): never the iteration's SFT data
    lake.write(
        "datasets",
        [
            dict(
                dataset_id="mt",
                episode_ids=s0,
                n_episodes=4,
                n_steps=4,
                run_key="mt",
                created_at=datetime(2025, 1, 2, tzinfo=timezone.utc),
            )
        ],
        iteration=0,
        stage="midtrain",
        run_key="mt",
    )
    lake.write(
        "datasets",
        [dict(dataset_id="ds1", episode_ids=t0 + t0b + s0[:1] + s1[:2], n_episodes=8, n_steps=15, run_key="ds1")],
        iteration=1,
        stage="curate",
        run_key="ds1",
    )
    for it, rates in (
        (0, {"click-test": 0.2, "focus-text": 0.5, "__all__": 0.35}),
        (1, {"click-test": 0.6, "focus-text": 1.0, "__all__": 0.8}),
    ):
        lake.write(
            "evals",
            [
                dict(
                    eval_id=f"ev{it}",
                    checkpoint_id=f"ck{it}",
                    task_id=t,
                    split="eval-seed",
                    n_episodes=10,
                    successes=int(r * 10),
                    success_rate=r,
                    ci_low=max(0.0, r - 0.3),
                    ci_high=min(1.0, r + 0.3),
                    run_key=f"ev{it}",
                )
                for t, r in rates.items()
            ],
            iteration=it,
            stage="evaluate",
            run_key=f"ev{it}",
        )
    return lake


EXPECTED = {  # (iteration, task): attempts, successes, teacher episodes, $, SFT samples, student samples, held-out
    (0, "click-test"): (10, 1, 5, 2.75, 6, 0, 0.2),
    (0, "focus-text"): (0, 0, 2, 0.0, 2, 0, 0.5),
    (0, "__all__"): (10, 1, 7, 2.75, 8, 0, 0.35),
    (1, "click-test"): (4, 2, 0, 0.0, 6 + 1 + 6, 1 + 6, 0.6),
    (1, "focus-text"): (2, 2, 0, 0.0, 2, 0, 1.0),
    (1, "__all__"): (6, 4, 0, 0.0, 15, 7, 0.8),
}


def test_iteration_table_on_a_small_lake(tmp_path):
    from flywheel.reports import iteration_table

    lake = report_lake(tmp_path / "lake")
    rows = iteration_table(connect(lake))
    got = {
        (r["iteration"], r["task_id"]): (
            r["attempts"],
            r["successes"],
            r["teacher_episodes"],
            r["teacher_usd"],
            r["sft_samples"],
            r["student_samples"],
            r["heldout_success"],
        )
        for r in rows
    }
    assert got == EXPECTED
    by = {(r["iteration"], r["task_id"]): r for r in rows}
    assert by[(1, "click-test")]["student_share"] == pytest.approx(7 / 13, abs=1e-3)
    assert (
        by[(1, "__all__")]["student_share"] == pytest.approx(7 / 15, abs=1e-3)
        and by[(0, "__all__")]["student_share"] == 0
    )
    assert by[(1, "click-test")]["heldout_n"] == 10
    # the newest evaluation's episodes with a snapped click, per task and in all; null where nothing was evaluated
    assert [by[(1, t)]["heldout_snapped"] for t in ("click-test", "focus-text", "__all__")] == [2, 0, 2]
    assert by[(0, "click-test")]["heldout_snapped"] == 0
    assert [r["task_id"] for r in rows] == ["click-test", "focus-text", "__all__"] * 2  # the total row last
    only = iteration_table(connect(lake), iteration=1)
    assert {(r["iteration"], r["task_id"]) for r in only} == {k for k in EXPECTED if k[0] == 1}
    # an empty lake: no rows, no error
    assert iteration_table(connect(Lake(tmp_path / "empty"))) == []


def test_prefect_artifact_and_viewer_show_the_same_rows(tmp_path, monkeypatch):
    from tasks.artifacts import flywheel_markdown
    from viewer.site import build_site

    monkeypatch.delenv("FLYWHEEL_LAKE", raising=False)
    lake = report_lake(tmp_path / "lake")
    cfg = cfg_with(tmp_path, **{"teacher_budget.max_episodes_per_task": 6, "teacher_budget.usd": 10.0})
    md = flywheel_markdown(cfg, 1)
    assert "**Teacher budget** (6 per task, $10): this iteration spent 0 teacher episodes" in md
    assert "the lake 7 episodes, $2.75 (bootstrap 5, rl 2)" in md
    assert "| click-test | 4 | 2 | 0 | 0 | 1 | 13 | 54% | 60% (n=10, 2 snapped) |" in md  # 6 - 5 teacher episodes left
    assert "| focus-text | 2 | 2 | 0 | 0 | 4 | 2 | 0% | 100% (n=10) |" in md
    assert "| all | 6 | 4 | 0 | 0 | – | 15 | 47% | 80% (n=10, 2 snapped) |" in md
    md0 = flywheel_markdown(cfg, 0)
    assert "| rl | click-test | 2 | 1 | 2 |" in md0 and "| bootstrap | click-test | 3 | 3 | 0.75 |" in md0
    out = tmp_path / "site"
    build_site(lake, out)
    html = (out / "report.html").read_text()
    per_task = html.split("<table id='per-task'>", 1)[1].split("</table>", 1)[0]
    assert per_task.count("<tr class='pt'>") == len(EXPECTED)
    assert (
        "<tr class='pt'><td>1</td><td>click-test</td><td>4</td><td>2</td><td>0</td><td>0</td><td>13</td>"
        "<td>7</td><td>54%</td><td>60% <span class='muted'>n=10</span> <span class='muted snapped'>2 snapped</span>"
        "</td></tr>"
    ) in per_task
    teacher = html.split("Teacher budget: where it went", 1)[1]
    assert "7 teacher episodes, 6 successes, $2.75 (bootstrap: 5 episodes, $0.75; rl: 2 episodes, $2)" in teacher
    assert "<td>0</td><td>rl</td><td>click-test</td><td>2</td><td>1</td><td>2.0</td>" in teacher


@pytest.mark.browser
def test_rl_teacher_run_in_chromium_stops_at_the_budget(tmp_path, lake_env):
    """The real path: rl.clone_fresh's scripted teacher in Chromium, its per-task budget nearly spent by the
    bootstrap -- only what is left runs, and the lake says so."""
    from flywheel.rl_stage import _teach_fresh

    cfg = cfg_with(
        tmp_path,
        **{
            "teacher_budget.max_episodes_per_task": 3,
            "rl.enabled": True,
            "rl.clone_steps": 1,
            "rl.clone_fresh": 3,
            "rl.tasks": ["click-test"],
        },
    )
    episodes(lake_env, iteration=0, stage="bootstrap", run_key="boot", task="click-test", n=2)
    pool = _teach_fresh(cfg, 0, 0, ["click-test"], None, progress=False)
    try:
        con = connect(lake_env)
        rl = con.execute("SELECT count(*), count(*) FILTER (success) FROM episodes WHERE stage = 'rl'").fetchone()
        assert rl == (1, 1)
        assert teacher_spend(con).by_task() == {"click-test": Spent(3, 3, 0.0)}
        assert _teach_fresh(cfg, 0, 1, ["click-test"], pool, progress=False) is pool  # spent: nothing runs
        assert connect(lake_env).execute("SELECT count(*) FROM episodes WHERE stage = 'rl'").fetchone()[0] == 1
    finally:
        pool.close()


def test_cli_bootstrap_with_the_budget_spent_says_so(tmp_path, lake_env):
    """`flywheel stage bootstrap` on a lake whose teacher budget is spent prints why it did nothing (a resumed
    experiment reruns it) instead of failing on the skipped result."""
    from typer.testing import CliRunner

    from flywheel.cli.stage import stage_app

    for task in TASKS:
        episodes(lake_env, iteration=0, stage="bootstrap", run_key=f"boot-{task}", task=task, n=2)
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text((ROOT / "configs" / "tiny.yaml").read_text() + "\nteacher_budget:\n  max_episodes: 4\n")
    cli = CliRunner().invoke(stage_app(), ["bootstrap", "-i", "0", "-c", str(cfg), "--lake", str(lake_env.root)])
    assert cli.exit_code == 0, cli.output
    assert "bootstrap skipped" in cli.output and "0 new teacher episode" in cli.output
