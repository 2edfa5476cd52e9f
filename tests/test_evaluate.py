"""Evaluation: Wilson intervals, evals rows per task/overall/held-out, idempotent reruns, the plot."""

from __future__ import annotations

import pytest

from configs.loading import load_config
from flywheel.evaluate import HELD_OUT, OVERALL, wilson
from storage.catalog import connect


def test_wilson_interval_known_values():
    lo, hi = wilson(8, 10)
    assert lo == pytest.approx(0.4902, abs=1e-3) and hi == pytest.approx(0.9433, abs=1e-3)
    assert wilson(0, 20)[0] == 0.0 and wilson(0, 20)[1] == pytest.approx(0.1611, abs=1e-3)
    assert wilson(20, 20)[1] == 1.0 and wilson(0, 0) == (0.0, 0.0)
    # the interval always holds the rate (100 of 100 once gave ci_high 0.9999999999999999 and broke the plot)
    assert all(wilson(k, n)[0] <= k / n <= wilson(k, n)[1] for n in range(1, 301) for k in (0, 1, n // 2, n - 1, n))


@pytest.mark.browser
def test_evaluate_scripted_writes_evals_and_plot(tmp_path, monkeypatch):
    from flywheel.stages import evaluate

    monkeypatch.setenv("FLYWHEEL_LAKE", str(tmp_path / "lake"))
    cfg = load_config(
        "configs/tiny.yaml",
        {"evaluate.selection.seeds_per_task": 2, "rollout.envs": 2, "evaluate.held_out_seeds_per_task": 1},
    )
    res = evaluate(cfg, 0, "scripted", progress=False)
    assert res["success_rate"] == 1.0 and res["n_episodes"] == 4  # 2 tasks x 2 eval seeds
    con = connect(tmp_path / "lake")
    per_held = con.execute(
        "SELECT task_id, count(*) FROM episodes WHERE task_id NOT IN ('click-test', 'focus-text') GROUP BY ALL"
    ).fetchall()
    assert per_held and all(n == 1 for _, n in per_held)  # held-out tasks: held_out_seeds_per_task each
    rows = con.execute("SELECT task_id, split, n_episodes, successes FROM evals ORDER BY task_id").fetchall()
    names = [r[0] for r in rows]
    assert OVERALL in names and HELD_OUT in names and "click-test" in names
    assert all(split == "eval-task" for t, split, *_ in rows if t not in ("click-test", "focus-text", OVERALL))
    seeds = con.execute("SELECT min(seed), max(seed) FROM episodes WHERE stage = 'evaluate'").fetchone()
    assert seeds[0] >= 100_000  # the eval seed range only
    assert (tmp_path / "lake" / "_reports" / "success_rate.png").read_bytes()[:4] == b"\x89PNG"
    # a rerun runs nothing new and leaves row counts unchanged
    n_before = con.execute("SELECT (SELECT count(*) FROM evals), (SELECT count(*) FROM episodes)").fetchone()
    again = evaluate(cfg, 0, "scripted", progress=False)
    assert again["ran"] == 0 and again["eval_id"] == res["eval_id"]
    assert (
        connect(tmp_path / "lake")
        .execute("SELECT (SELECT count(*) FROM evals), (SELECT count(*) FROM episodes)")
        .fetchone()
        == n_before
    )
