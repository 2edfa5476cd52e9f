"""The flywheel benchmark's report (benchmarks/flywheel_experiment.py runs the arms): what each seed's lakes hold
(evals, training steps, the dataset's teacher / student split, teacher episodes, curriculum, failed clicks), the
statistics across seeds with the targets, earlier reports merged in (--merge), and the plot.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from flywheel.evaluate import OVERALL  # noqa: E402

COPY_TASKS = ("enter-text", "login-user")  # the tasks that need text copied from the instruction


def query(lake: Path, sql: str, params: list | None = None) -> list[dict[str, Any]]:
    from storage.catalog import connect
    from storage.lake import open_lake

    lk = open_lake(lake, create=False)
    con = connect(lk)
    try:
        cur = con.execute(sql, params or [])
        cols = [d[0] for d in cur.description]
        return [dict(zip(cols, r)) for r in cur.fetchall()]
    except Exception as e:  # noqa: BLE001 - a table not written yet (e.g. no RL rows) reads as empty
        if "does not exist" in str(e) or "Catalog Error" in str(e):
            return []
        raise
    finally:
        con.close()


def has_base(lake: Path) -> bool:
    """Whether the shared base lake holds a mid-trained base checkpoint (`flywheel stage midtrain` finished)."""
    if not (lake / "catalog.sqlite").exists():
        return False
    return bool(query(lake, "SELECT checkpoint_id FROM checkpoints WHERE method = 'midtrain' LIMIT 1"))


def evaluated_iterations(lake: Path) -> int:
    """Iterations of this lake with a finished evaluation (where `flywheel run` would continue)."""
    from flows.flywheel import next_iteration_of
    from storage.lake import open_lake

    return next_iteration_of(open_lake(lake, create=False)) if lake.exists() else 0


def evals_by_iteration(lake: Path) -> dict[int, dict[str, dict[str, float]]]:
    rows = query(
        lake,
        """
        SELECT iteration, task_id, n_episodes, successes, success_rate, ci_low, ci_high FROM (
          SELECT *, row_number() OVER (PARTITION BY iteration, task_id ORDER BY created_at DESC) AS rn
          FROM evals WHERE stage = 'evaluate') WHERE rn = 1 ORDER BY iteration, task_id""",
    )
    out: dict[int, dict[str, dict[str, float]]] = {}
    for r in rows:
        out.setdefault(int(r["iteration"]), {})[r["task_id"]] = {
            "success": round(r["success_rate"], 4),
            "ci": [round(r["ci_low"], 4), round(r["ci_high"], 4)],
            "n": int(r["n_episodes"]),
        }
    return out


def training_steps(lake: Path) -> dict[str, Any]:
    """Optimizer steps per iteration: SFT (checkpoints.metrics) and RL (rl_metrics rows)."""
    sft = query(lake, "SELECT iteration, metrics FROM checkpoints WHERE method = 'sft' ORDER BY iteration, created_at")
    per_it: dict[int, dict[str, int]] = {}
    for r in sft:
        m = json.loads(r["metrics"] or "{}")
        it = per_it.setdefault(int(r["iteration"]), {"sft": 0, "rl": 0})
        it["sft"], it["sft_stopped"] = int(m.get("steps") or 0), m.get("stopped")  # 'budget' = the minutes cap hit
    # a DuckLake table is no folder of the lake: a table never written reads as empty (query)
    for r in query(lake, "SELECT iteration, count(*) AS n FROM rl_metrics GROUP BY iteration"):
        per_it.setdefault(int(r["iteration"]), {"sft": 0, "rl": 0})["rl"] = int(r["n"])
    total = sum(v["sft"] + v["rl"] for v in per_it.values())
    return {"per_iteration": {str(k): v for k, v in sorted(per_it.items())}, "total": total}


def trained_on(lake: Path) -> dict[str, Any] | None:
    """Where the newest iteration-0 SFT checkpoint trained (its row's metrics): device, dtype, and whether it was
    trained on another machine and adopted (`flywheel stage sft --adopt`)."""
    rows = query(
        lake, "SELECT metrics FROM checkpoints WHERE iteration = 0 AND method = 'sft' ORDER BY created_at DESC LIMIT 1"
    )
    if not rows:
        return None
    m = json.loads(rows[0]["metrics"] or "{}")
    return {"device": m.get("device"), "dtype": m.get("dtype"), "adopted": bool(m.get("adopted_from"))}


def dataset_growth(lake: Path) -> dict[str, dict[str, int]]:
    """Training samples (step rows) of each iteration's curated export, split into teacher and student."""
    rows = query(
        lake,
        """
        SELECT iteration, path FROM (
          SELECT *, row_number() OVER (PARTITION BY iteration ORDER BY created_at DESC) AS rn FROM datasets
          WHERE stage = 'curate') WHERE rn = 1
        ORDER BY iteration""",
    )
    import duckdb

    out = {}
    for r in rows:
        f = lake / r["path"] / "train.parquet"
        if not f.exists():
            continue
        counts = duckdb.sql(
            f"SELECT policy, count(*) AS n, count(DISTINCT episode_id) AS e FROM read_parquet('{f}') GROUP BY policy"
        ).fetchall()
        student = sum(n for p, n, _ in counts if p == "student")  # curate's own rule (training/queries.py)
        teacher = sum(n for _, n, _ in counts) - student
        out[str(r["iteration"])] = {
            "teacher_samples": teacher,
            "student_samples": student,
            "student_share": round(student / max(student + teacher, 1), 4),
            "episodes": sum(e for _, _, e in counts),
        }
    return out


def teacher_demos(lake: Path) -> dict[str, int]:
    rows = query(
        lake,
        "SELECT iteration, count(*) AS n FROM episodes WHERE stage = 'bootstrap' GROUP BY iteration ORDER BY iteration",
    )
    out, total = {}, 0
    for r in rows:
        total += int(r["n"])
        out[str(r["iteration"])] = total
    return out


def teacher_episodes(lake: Path) -> dict[str, dict[str, int]]:
    """Teacher episodes per stage (every policy but the student's; the mid-training oracle is not a teacher)."""
    rows = query(
        lake,
        "SELECT stage, count(*) AS n FROM episodes WHERE policy <> 'student' AND stage NOT LIKE 'midtrain%' "
        "GROUP BY stage ORDER BY stage",
    )
    return {r["stage"]: int(r["n"]) for r in rows}


def base_skills(lake: Path) -> dict[str, Any] | None:
    """The mid-trained base's held-out synthetic-page success (evals, stage 'midtrain')."""
    rows = query(
        lake,
        "SELECT checkpoint_id, task_id, success_rate, n_episodes FROM evals WHERE stage = 'midtrain' "
        "ORDER BY created_at",
    )
    if not rows:
        return None
    return {
        "checkpoint": rows[-1]["checkpoint_id"],
        "per_task": {
            r["task_id"]: round(r["success_rate"], 4) for r in rows if r["checkpoint_id"] == rows[-1]["checkpoint_id"]
        },
    }


def curriculum(lake: Path) -> list[dict[str, Any]]:
    return query(
        lake,
        "SELECT iteration, task_id, decision, success_rate, rollout_seeds, rl, teacher_demos FROM curriculum "
        "ORDER BY iteration, task_id",
    )


def grounding(lake: Path, iteration: int | None = None) -> dict[str, dict[str, int]]:
    """Held-out clicks of failed episodes by cause, per iteration's evaluation (flywheel/grounding.py): the cited
    element absent from the screen, the click off it, or a hit that still failed."""
    from flywheel.grounding import CATEGORIES, grounding_table
    from storage.catalog import connect
    from storage.lake import open_lake

    con = connect(open_lake(lake, create=False))
    try:
        its = (
            [iteration]
            if iteration is not None
            else [
                r[0]
                for r in con.execute(
                    "SELECT DISTINCT iteration FROM episodes WHERE stage = 'evaluate' ORDER BY 1"
                ).fetchall()
            ]
        )
        out = {}
        for it in its:
            rows = [r for r in grounding_table(con, stage="evaluate", iteration=it) if r["task_id"] == "__all__"]
            if rows:
                out[str(it)] = {c: rows[0][f"failed_{c}"] for c in ("clicks", *CATEGORIES)}
        return out
    finally:
        con.close()


# two-sided 95% Student-t quantiles by degrees of freedom (n seeds - 1); 1.96 beyond the table
T95 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262, 10: 2.228}


def stats(vals: list[float | None]) -> dict[str, Any] | None:
    """Mean, spread (min, max, sample sd) and the 95% t-interval of the mean across seeds (None for one seed)."""
    vals = [v for v in vals if v is not None]
    if not vals:
        return None
    n, mean = len(vals), sum(vals) / len(vals)
    out: dict[str, Any] = {"mean": round(mean, 4), "min": min(vals), "max": max(vals), "n": n}
    if n > 1:
        sd = (sum((v - mean) ** 2 for v in vals) / (n - 1)) ** 0.5
        half = T95.get(n - 1, 1.96) * sd / n**0.5
        out |= {"sd": round(sd, 4), "ci95": [round(mean - half, 4), round(mean + half, 4)]}
    return out


def merged_runs(reports: list[str], root: Path) -> tuple[dict[str, dict[str, Any]], dict[str, float]]:
    """The runs (seed -> run) and wall times per arm of earlier reports (--merge), for the seeds whose flywheel lake
    is not under `root` (its lakes were deleted, or it ran on another machine). A seed in two reports is an error."""
    runs: dict[str, dict[str, Any]] = {}
    walls: dict[str, float] = {}
    for path in reports:
        f = ROOT / path
        try:
            report = json.loads(f.read_text())
            items = report["runs"].items()
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
            raise SystemExit(f"--merge {path}: not a report of this benchmark ({type(e).__name__}: {e})") from None
        for s, run in items:
            if (root / f"s{s}").exists():
                continue  # measured here: the lake wins
            if s in runs:
                raise SystemExit(f"--merge: seed {s} is in two reports ({runs[s]['merged_from']} and {path})")
            runs[s] = {**run, "merged_from": path}
            for arm in (f"s{s}", f"c{s}"):
                if arm in (report.get("wall_s") or {}):
                    walls[arm] = report["wall_s"][arm]
    return runs, walls


def summarize(
    root: Path, seeds: list[int], iterations: int, control: bool, merged: dict[str, dict[str, Any]] | None = None
) -> dict[str, Any]:
    """The report of the seeds' lakes under `root`; `merged` (seed -> run, from earlier reports: merged_runs, which
    leaves out the seeds measured here) adds its seeds, and every statistic and target covers them too."""
    merged = merged or {}
    runs: dict[str, dict[str, Any]] = {}
    for s in seeds:
        if str(s) in merged:
            continue
        lake = root / f"s{s}"
        ev = evals_by_iteration(lake) if lake.exists() else {}
        run = {
            "lake": str(lake.relative_to(ROOT) if lake.is_relative_to(ROOT) else lake),
            "success": {str(k): v.get(OVERALL, {}).get("success") for k, v in ev.items()},
            "per_task": {
                str(k): {t: v["success"] for t, v in tasks.items() if t != OVERALL} for k, tasks in ev.items()
            },
            "ci": {str(k): v.get(OVERALL, {}).get("ci") for k, v in ev.items()},
            "steps": training_steps(lake) if lake.exists() else {},
            "dataset": dataset_growth(lake) if lake.exists() else {},
            "teacher_demos": teacher_demos(lake) if lake.exists() else {},
            "teacher_episodes_by_stage": teacher_episodes(lake) if lake.exists() else {},
            "base": base_skills(lake) if lake.exists() else None,
            "curriculum": curriculum(lake) if lake.exists() else [],
            "failed_clicks": grounding(lake) if lake.exists() else {},
        }
        c = root / f"c{s}"
        if control and c.exists():
            cev = evals_by_iteration(c).get(0, {})
            run["control"] = {
                "success": cev.get(OVERALL, {}).get("success"),
                "ci": cev.get(OVERALL, {}).get("ci"),
                "per_task": {t: v["success"] for t, v in cev.items() if t != OVERALL},
                "steps": training_steps(c)["total"],
                "trained_on": trained_on(c),
                "failed_clicks": grounding(c, 0).get("0"),
                "dataset": dataset_growth(c).get("0"),
            }
        runs[str(s)] = run
    runs = dict(sorted((runs | merged).items(), key=lambda kv: int(kv[0])))
    last, first = str(iterations - 1), "0"
    verdict = {}
    for s, r in runs.items():
        a, b = r["success"].get(first), r["success"].get(last)
        cs = (r.get("control") or {}).get("success")
        share = (r["dataset"].get(last) or {}).get("student_share")
        last_tasks = r["per_task"].get(last, {})
        verdict[s] = {
            "gain_points": None if a is None or b is None else round(100 * (b - a), 1),
            "vs_control_points": None if cs is None or b is None else round(100 * (b - cs), 1),
            # the most each margin can be on this seed (iteration 3 at 100%): below the target, no flywheel meets it
            "gain_points_max": None if a is None else round(100 * (1 - a), 1),
            "vs_control_points_max": None if cs is None else round(100 * (1 - cs), 1),
            "student_share_last": share,
            # only the copy tasks this experiment scores (configs/flywheel4.yaml has none)
            "copy_tasks_last": {
                t: last_tasks.get(t) for t in COPY_TASKS if any(t in p for p in r["per_task"].values())
            },
        }
    met_gain = all(v["gain_points"] is not None and v["gain_points"] >= 15 for v in verdict.values())
    met_ctrl = all(v["vs_control_points"] is not None and v["vs_control_points"] >= 10 for v in verdict.values())
    # whether the two margins can be met at all from where each seed's iteration 1 and control stand
    reach_gain = all(v["gain_points_max"] is not None and v["gain_points_max"] >= 15 for v in verdict.values())
    reach_ctrl = all(
        v["vs_control_points_max"] is not None and v["vs_control_points_max"] >= 10 for v in verdict.values()
    )
    met_share = all((v["student_share_last"] or 0) >= 0.5 for v in verdict.values())
    met_copy = all(all((x or 0) > 0 for x in v["copy_tasks_last"].values()) for v in verdict.values())
    if not any(v["copy_tasks_last"] for v in verdict.values()):
        met_copy = None  # not applicable: no seed scores a copy task

    per_iteration = {str(i): stats([r["success"].get(str(i)) for r in runs.values()]) for i in range(iterations)}
    share = {
        str(i): stats([(r["dataset"].get(str(i)) or {}).get("student_share") for r in runs.values()])
        for i in range(iterations)
    }
    return {
        "root": str(root),
        "seeds": [int(k) for k in runs],
        "iterations": iterations,
        "runs": runs,
        "per_iteration": per_iteration,
        "control": stats([(r.get("control") or {}).get("success") for r in runs.values()]),
        "student_share": share[last],
        "student_share_per_iteration": share,
        "gain_points": stats([v["gain_points"] for v in verdict.values()]),
        "vs_control_points": stats([v["vs_control_points"] for v in verdict.values()]),
        "verdict": verdict,
        "targets": {
            "iteration_last_vs_first_plus_15": met_gain,
            "iteration_last_vs_control_plus_10": met_ctrl,
            "student_share_last_at_least_half": met_share,
            "enter_text_and_login_user_above_0": met_copy,
        },
        "reachable": {"iteration_last_vs_first_plus_15": reach_gain, "iteration_last_vs_control_plus_10": reach_ctrl},
    }


def plot(summary: dict[str, Any], png: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    n = summary["iterations"]
    colors = ["tab:blue", "tab:orange", "tab:green", "tab:purple", "tab:brown"]
    for k, (s, r) in enumerate(summary["runs"].items()):
        its = [i for i in range(n) if r["success"].get(str(i)) is not None]
        ys = [100 * r["success"][str(i)] for i in its]
        lo = [100 * (r["success"][str(i)] - r["ci"][str(i)][0]) for i in its]
        hi = [100 * (r["ci"][str(i)][1] - r["success"][str(i)]) for i in its]
        col = colors[k % len(colors)]
        ax.errorbar(
            [i + 1 + 0.05 * (k - 1) for i in its],
            ys,
            yerr=[lo, hi],
            marker="o",
            color=col,
            capsize=3,
            label=f"flywheel seed {s}",
        )
        if r.get("control") and r["control"].get("success") is not None:
            ax.axhline(
                100 * r["control"]["success"],
                color=col,
                ls="--",
                lw=1,
                label=f"control seed {s} ({r['control']['steps']} SFT steps)",
            )
        shares = [(i, (r["dataset"].get(str(i)) or {}).get("student_share")) for i in range(n)]
        shares = [(i, v) for i, v in shares if v is not None]
        ax2.plot([i + 1 for i, _ in shares], [100 * v for _, v in shares], marker="o", color=col, label=f"seed {s}")
    ax.set_xlabel("iteration")
    ax.set_ylabel("held-out success (%)")
    ax.set_xticks(range(1, n + 1))
    ax.set_ylim(0, 100)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="lower right")
    ax.set_title("Success per iteration (95% Wilson CI); dashed: control")
    ax2.axhline(50, color="grey", ls=":", lw=1, label="target at the last iteration")
    ax2.set_xlabel("iteration")
    ax2.set_ylabel("student share of the SFT samples (%)")
    ax2.set_xticks(range(1, n + 1))
    ax2.set_ylim(0, 100)
    ax2.grid(alpha=0.3)
    ax2.set_title("The student's own data (teacher demos fixed)")
    ax2.legend(fontsize=7)
    fig.tight_layout()
    png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png, dpi=110)
