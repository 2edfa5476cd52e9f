"""The failure-driven curriculum and entropulse: decisions from hand-built evidence, and from a real lake."""

from __future__ import annotations

from pathlib import Path

import pytest

from configs.loading import default_config_path, load_config
from flywheel.curriculum import Evidence, decide, load_plan, plan_for, sft_decision
from storage.catalog import connect
from storage.lake import Lake

ROOT = Path(__file__).resolve().parents[1]


def cfg_with(tmp_path: Path, **overrides):
    return load_config(
        ROOT / "configs" / "tiny.yaml", {"lake.root": str(tmp_path / "lake"), "curriculum.enabled": True, **overrides}
    )


def test_decisions_follow_success_and_the_teacher_budget(tmp_path):
    cfg = cfg_with(
        tmp_path,
        **{
            "bootstrap.max_demos_per_task": 30,
            "curriculum.top_up_demos": 20,
            "curriculum.solved_threshold": 0.9,
            "curriculum.check_seeds": 1,
            "rollouts.selection.seeds_per_task": 4,
        },
    )
    ev = {
        "never": Evidence(0.0, 25, "evaluate", 1),
        "spent": Evidence(0.0, 25, "evaluate", 1),
        "half": Evidence(0.5, 25, "evaluate", 1),
        "solved": Evidence(0.96, 25, "rollouts", 1),
    }
    spent = {"never": 15, "spent": 30, "half": 15, "solved": 15, "new": 0}
    d = {x.task_id: x for x in decide(["never", "spent", "half", "solved", "new"], ev, spent, cfg, iteration=2)}
    assert (d["never"].decision, d["never"].teacher_demos, d["never"].rollout_seeds, d["never"].rl) == (
        "teacher",
        15,
        4,
        False,
    )
    assert "15 teacher demos, 0 left in its budget of 30" in d["never"].reason
    assert (d["spent"].decision, d["spent"].teacher_demos, d["spent"].rollout_seeds, d["spent"].rl) == (
        "park",
        0,
        0,
        False,
    )
    assert "budget of 30 demos is spent" in d["spent"].reason
    assert (d["half"].decision, d["half"].teacher_demos, d["half"].rollout_seeds, d["half"].rl) == ("train", 0, 4, True)
    assert (d["solved"].decision, d["solved"].teacher_demos, d["solved"].rollout_seeds, d["solved"].rl) == (
        "check",
        0,
        1,
        False,
    )
    assert d["solved"].evidence == "rollouts it1" and d["half"].success_rate == 0.5
    # no evidence and no demos yet: the teacher bootstraps it (within budget)
    assert (d["new"].decision, d["new"].teacher_demos, d["new"].rl) == ("bootstrap", 3, True)
    # no budget cap: the top-up size alone
    unlimited = cfg_with(tmp_path, **{"curriculum.top_up_demos": 7})
    assert decide(["never"], ev, spent, unlimited, iteration=2)[0].teacher_demos == 7


def _evals(lake: Lake, iteration: int, rates: dict[str, float]) -> None:
    lake.write(
        "evals",
        [
            dict(
                eval_id=f"e{iteration}",
                checkpoint_id=f"ck{iteration}",
                task_id=t,
                split="eval-seed",
                n_episodes=20,
                successes=int(r * 20),
                success_rate=r,
                run_key=f"ev{iteration}",
            )
            for t, r in rates.items()
        ],
        iteration=iteration,
        stage="evaluate",
        run_key=f"ev{iteration}",
    )


def test_entropulse_runs_sft_on_collapse_or_plateau_only(tmp_path):
    cfg = cfg_with(
        tmp_path,
        **{"curriculum.sft_every_iteration": False, "curriculum.entropy_floor": 0.05, "curriculum.plateau_points": 2.0},
    )
    lake = Lake(tmp_path / "lake")
    _evals(lake, 0, {"__all__": 0.40})
    _evals(lake, 1, {"__all__": 0.55})

    def metrics(entropy: float) -> None:
        lake.write(
            "rl_metrics",
            [
                dict(round=r, update_step=0, global_step=r, entropy=entropy if r == 1 else 0.9, run_key="rl1")
                for r in (0, 1)
            ],
            iteration=1,
            stage="rl",
            run_key="rl1",
        )

    metrics(0.30)
    con = connect(lake)
    assert sft_decision(con, 0, cfg).decision == "sft"  # the first iteration trains on the demos
    d = sft_decision(con, 2, cfg)
    assert d.decision == "skip_sft" and "entropy 0.300 >= floor 0.05" in d.reason
    metrics(0.01)  # the last round's entropy collapsed
    d = sft_decision(connect(lake), 2, cfg)
    assert d.decision == "sft" and "entropy 0.010 < floor 0.05" in d.reason
    metrics(0.30)
    _evals(lake, 1, {"__all__": 0.41})  # 40% -> 41%: a plateau
    d = sft_decision(connect(lake), 2, cfg)
    assert d.decision == "sft" and "plateaued" in d.reason
    every = cfg_with(tmp_path)  # the default: SFT every iteration
    assert sft_decision(connect(lake), 2, every).decision == "sft"


def test_plan_is_written_once_and_the_stages_follow_it(tmp_path):
    from flywheel.runtime.rollout import PolicySpec
    from flywheel.specs import rollout_spec
    from flywheel.stages import _demo_seeds

    cfg = cfg_with(tmp_path, **{"bootstrap.max_demos_per_task": 5, "curriculum.top_up_demos": 4})
    lake = Lake(tmp_path / "lake")
    _evals(lake, 0, {"click-test": 0.0, "focus-text": 0.5, "__all__": 0.25})
    lake.write(
        "episodes",
        [
            dict(episode_id=f"d{t}{s}", task_id=t, seed=s, policy="scripted", status="ok", run_key="boot")
            for t in ("click-test", "focus-text")
            for s in range(3)
        ],
        iteration=0,
        stage="bootstrap",
        run_key="boot",
    )
    plan = plan_for(cfg, lake, 1)
    by = {d.task_id: d for d in plan.decisions}
    assert by["click-test"].decision == "teacher" and by["click-test"].teacher_demos == 2  # 5 - 3 spent
    assert by["focus-text"].decision == "train" and plan.rl_tasks == ["focus-text"] and plan.run_sft
    rows = (
        connect(lake)
        .execute("SELECT task_id, decision, demos_spent FROM curriculum WHERE iteration = 1 ORDER BY task_id")
        .fetchall()
    )
    assert rows == [("__sft__", "sft", 0), ("click-test", "teacher", 3), ("focus-text", "train", 3)]
    # later calls read the stored plan, even when the evidence changed since
    _evals(lake, 0, {"click-test": 1.0, "focus-text": 1.0, "__all__": 1.0})
    assert [d.decision for d in plan_for(cfg, lake, 1).decisions] == [d.decision for d in load_plan(lake, 1).decisions]
    assert load_plan(lake, 1).bootstrap_tasks == {"click-test": 2}
    # bootstrap takes the seeds after the task's 3 demos; the job list holds exactly those
    seeds = _demo_seeds(cfg, 1, ["click-test", "focus-text"])
    assert seeds == {"click-test": [3, 4]}
    spec = rollout_spec(
        cfg,
        iteration=1,
        stage="bootstrap",
        policy=PolicySpec("scripted"),
        tasks=["click-test", "focus-text"],
        seeds=[0, 1, 2],
        split="train",
        task_seeds=seeds,
    )
    assert [(j.task_id, j.seed) for j in spec.jobs] == [("click-test", 3), ("click-test", 4)]


def test_budget_without_curriculum_caps_the_plain_bootstrap(tmp_path):
    from flywheel.stages import _demo_seeds

    cfg = load_config(
        ROOT / "configs" / "tiny.yaml", {"lake.root": str(tmp_path / "lake"), "bootstrap.max_demos_per_task": 4}
    )
    lake = Lake(tmp_path / "lake")
    assert _demo_seeds(cfg, 0, ["click-test", "focus-text"]) == {"click-test": [0, 1, 2], "focus-text": [0, 1, 2]}
    lake.write(
        "episodes",
        [
            dict(episode_id=f"d{s}", task_id="click-test", seed=s, policy="scripted", status="ok", run_key="boot")
            for s in range(3)
        ],
        iteration=0,
        stage="bootstrap",
        run_key="boot",
    )
    assert _demo_seeds(cfg, 1, ["click-test", "focus-text"]) == {"click-test": [3], "focus-text": [0, 1, 2]}
    assert _demo_seeds(load_config(default_config_path()), 0, ["click-test"]) is None  # no cap: the plain selection


def test_bad_curriculum_config_is_one_clear_error(tmp_path):
    from configs.models import ConfigError

    with pytest.raises(ConfigError, match="curriculum.solved_threshold"):
        cfg_with(tmp_path, **{"curriculum.solved_threshold": 1.5})


def test_target_successes_sizes_each_frontier_tasks_rollouts(tmp_path):
    """A rarely solved task gets many instances, a nearly solved one few, each iteration its own seed range."""
    from flywheel.curriculum import frontier_seeds
    from flywheel.stages import rollouts_spec

    over = {
        "curriculum.target_successes": 6,
        "curriculum.max_rollout_seeds": 8,
        "rollouts.selection.seeds_per_task": 2,
        "rollouts.attempts": 2,
    }
    cfg = cfg_with(tmp_path, **over)
    # ceil(6 / (p x 2)) seeds, within [2, 8]
    assert [frontier_seeds(cfg, p) for p in (0.75, 0.5, 0.3, 0.05)] == [4, 6, 8, 8]
    assert frontier_seeds(cfg_with(tmp_path, **{**over, "curriculum.target_successes": 1}), 0.8) == 2
    assert frontier_seeds(cfg_with(tmp_path, **{**over, "curriculum.target_successes": None}), 0.05) == 2
    ev = {"click-test": Evidence(0.5, 20, "evaluate", 0), "focus-text": Evidence(0.95, 20, "evaluate", 0)}
    d = {x.task_id: x for x in decide(["click-test", "focus-text"], ev, {}, cfg, iteration=1)}
    assert (d["click-test"].decision, d["click-test"].rollout_seeds) == ("train", 6)
    assert "6 seeds x 2 attempts for ~6 successes" in d["click-test"].reason
    assert (d["focus-text"].decision, d["focus-text"].rollout_seeds) == ("check", 1)

    lake = Lake(tmp_path / "lake")
    _evals(lake, 0, {"click-test": 0.5, "focus-text": 0.95, "__all__": 0.7})
    _evals(lake, 1, {"click-test": 0.25, "focus-text": 0.95, "__all__": 0.6})
    jobs = {}
    for it in (1, 2):
        spec = rollouts_spec(cfg, it, "student-model")
        for j in spec.jobs:
            jobs.setdefault((it, j.task_id), []).append(j.seed)
    # bootstrap: 3 seeds a task, so rollouts start at train seed 3, 8 seeds (the cap) per iteration
    assert sorted(set(jobs[(1, "click-test")])) == list(range(11, 17))  # 6 instances x 2 attempts
    assert len(jobs[(1, "click-test")]) == 12
    assert sorted(set(jobs[(1, "focus-text")])) == [11]  # solved: a 1-seed check
    assert sorted(set(jobs[(2, "click-test")])) == list(range(19, 27))  # success fell to 25%: the cap
    # without the sizing: seeds_per_task for every frontier task, the old seed ranges
    plain = cfg_with(tmp_path / "plain", **{**over, "curriculum.target_successes": None})
    _evals(Lake(tmp_path / "plain" / "lake"), 0, {"click-test": 0.5, "focus-text": 0.5, "__all__": 0.5})
    spec = rollouts_spec(plain, 1, "student-model")
    assert sorted({(j.task_id, j.seed) for j in spec.jobs}) == [
        (t, s) for t in ("click-test", "focus-text") for s in (5, 6)
    ]


def test_a_held_out_zero_that_the_rollouts_solved_stays_on_the_frontier(tmp_path):
    """Held-out is greedy; the rollouts sample k attempts an instance. A task whose rollouts of the evaluated
    iteration succeeded is not parked (nor topped up) on a greedy 0: its rollouts are sized by their rate."""
    cfg = cfg_with(
        tmp_path,
        **{
            "bootstrap.max_demos_per_task": 20,
            "curriculum.top_up_demos": 5,
            "curriculum.target_successes": 20,
            "curriculum.max_rollout_seeds": 48,
            "rollouts.attempts": 3,
            "rollouts.selection.seeds_per_task": 16,
        },
    )
    held_out = {t: Evidence(0.0, 15, "evaluate", 1) for t in ("sampled", "stale", "failed", "topped")}
    rollouts = {
        "sampled": Evidence(12 / 75, 75, "rollouts", 1),  # 12 of 75 in the evaluated iteration
        "stale": Evidence(0.3, 48, "rollouts", 0),  # before the evaluated iteration: today's student scored 0
        "failed": Evidence(0.0, 48, "rollouts", 1),
    }
    spent = {"sampled": 20, "stale": 20, "failed": 20, "topped": 10}
    tasks = list(held_out)
    d = {x.task_id: x for x in decide(tasks, held_out, spent, cfg, iteration=2, rollouts=rollouts)}
    s = d["sampled"]
    assert (s.decision, s.teacher_demos, s.rl, s.evidence, s.n_evidence) == ("train", 0, True, "rollouts it1", 75)
    assert s.rollout_seeds == 42  # ceil(20 / (0.16 x 3)) within [16, 48]
    assert s.reason.startswith("held-out 0 of 15 (evaluate it1) but 0 < success 16%")
    assert (d["stale"].decision, d["failed"].decision) == ("park", "park")
    assert (d["topped"].decision, d["topped"].teacher_demos) == ("teacher", 5)  # no rollouts evidence: top-ups
    off = cfg_with(tmp_path, **{"curriculum.rollout_evidence": False, "bootstrap.max_demos_per_task": 20})
    assert decide(["sampled"], held_out, spent, off, iteration=2, rollouts=rollouts)[0].decision == "park"


def test_the_plan_reads_the_rollouts_behind_a_held_out_zero_from_the_lake(tmp_path):
    cfg = cfg_with(tmp_path, **{"bootstrap.max_demos_per_task": 2, "curriculum.top_up_demos": 0})
    lake = Lake(tmp_path / "lake")
    _evals(lake, 1, {"click-test": 0.0, "focus-text": 0.0, "__all__": 0.0})
    rows = [
        dict(
            episode_id=f"r{t}{i}",
            task_id=t,
            seed=i,
            split="train",
            policy="student",
            success=(t == "click-test" and i == 0),
        )
        for t in ("click-test", "focus-text")
        for i in range(4)
    ]
    lake.write("episodes", rows, iteration=1, stage="rollouts", run_key="ro1")
    plan = {d.task_id: d for d in plan_for(cfg, lake, iteration=2).decisions}
    assert (plan["click-test"].decision, plan["click-test"].evidence, plan["click-test"].success_rate) == (
        "train",
        "rollouts it1",
        0.25,
    )
    assert plan["focus-text"].decision == "park"
