"""Benchmark (issue #12): does the flywheel spin? N iterations on their own data vs a control, on 3 seeds.

    .venv/bin/python benchmarks/flywheel_experiment.py                        # configs/flywheel8.yaml, seeds 0 1 2
    .venv/bin/python benchmarks/flywheel_experiment.py --seeds 0 --no-control # one flywheel run only
    .venv/bin/python benchmarks/flywheel_experiment.py --report-only          # re-read the lakes, rewrite JSON + PNG
    .venv/bin/python benchmarks/flywheel_experiment.py --seeds 2 --merge docs/bench_flywheel8.json  # + earlier seeds

With `midtrain.enabled` in the config, the mid-trained base is built once, in <root>/base (`flywheel stage
midtrain`), and every lake below starts as a copy of that lake (a lake is relocatable: its rows hold relative
paths), so both arms of every seed start from the same base checkpoint, found by its content address.

Per seed s, two lakes under --root:
  s<s>/  the flywheel: `flywheel run -c <config> --iterations N` (curriculum on, teacher budget spent in
         iteration 0, then rollouts -> curate -> SFT -> RL -> evaluate, each iteration continuing from the last
         checkpoint). A rerun continues where the lake stopped: finished iterations are not run again.
  c<s>/  the control: the same teacher demos (same bootstrap seeds), then ONE SFT over teacher demos only, with
         as many optimizer steps (batch sft.batch_size) as the flywheel run spent on SFT + RL together, then the
         same evaluation. Same total training compute; no student data.
The seed sets sft.seed, rl.seed and the bootstrap's first train seed (20 x seed), so runs differ in their demos,
init order, minibatches and sampled rollouts. Everything is read back from the lakes (evals, checkpoints,
rl_metrics, curriculum, the curated exports); nothing is timed into the verdict.

Prints JSON (also --json) with held-out success per iteration and task (95% Wilson CIs), the control, the
dataset's growth split into teacher and student samples (the student share per iteration), teacher demos spent,
across seeds the mean, spread and 95% t-interval of each, the wall time per arm (<root>/wall_s.json, summed over
resumed invocations), and the targets:
iteration N >= iteration 1 + 15 points, iteration N >= control + 10 points, on every seed. --png draws success
vs iteration (and the student's share of the SFT samples per iteration) for docs/RESULTS.md.
"""

from __future__ import annotations

import argparse
import copy
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import yaml  # noqa: E402

from configs.models import apply_overrides  # noqa: E402
from flywheel.evaluate import OVERALL  # noqa: E402

FLYWHEEL = [str(ROOT / ".venv" / "bin" / "flywheel")]
COPY_TASKS = ("enter-text", "login-user")  # the tasks that need text copied from the instruction


def seed_config(base: dict[str, Any], seed: int, demos_per_task: int) -> dict[str, Any]:
    return apply_overrides(
        copy.deepcopy(base),
        {"sft.seed": seed, "rl.seed": seed, "bootstrap.selection.seed_offset": demos_per_task * seed},
    )


def control_config(cfg: dict[str, Any], steps: int) -> dict[str, Any]:
    return apply_overrides(
        copy.deepcopy(cfg),
        {
            "name": f"{cfg.get('name', 'flywheel')}-control",
            "iterations": 1,
            "curriculum.enabled": False,
            "rl.enabled": False,
            "sft.max_steps": int(steps),
            "sft.max_minutes": max(float(cfg["sft"].get("max_minutes") or 0), 90.0),
        },
    )  # the minutes: a cap only


def write_yaml(path: Path, data: dict[str, Any]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def run(cmd: list[str], log: Path) -> float:
    """Run one CLI command, its output appended to `log`; raises with the log's tail when it fails."""
    t0 = time.monotonic()
    with log.open("a") as fh:
        fh.write(f"\n$ {' '.join(cmd)}\n")
        fh.flush()
        rc = subprocess.call(cmd, cwd=ROOT, stdout=fh, stderr=subprocess.STDOUT)
    if rc != 0:
        tail = log.read_text()[-2000:]
        raise SystemExit(f"command failed (exit {rc}): {' '.join(cmd)}\n--- {log} (tail) ---\n{tail}")
    return time.monotonic() - t0


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
            "student_share_last": share,
            "copy_tasks_last": {t: last_tasks.get(t) for t in COPY_TASKS},
        }
    met_gain = all(v["gain_points"] is not None and v["gain_points"] >= 15 for v in verdict.values())
    met_ctrl = all(v["vs_control_points"] is not None and v["vs_control_points"] >= 10 for v in verdict.values())
    met_share = all((v["student_share_last"] or 0) >= 0.5 for v in verdict.values())
    met_copy = all(all((x or 0) > 0 for x in v["copy_tasks_last"].values()) for v in verdict.values())

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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--config", default="configs/flywheel8.yaml")
    ap.add_argument("--root", default="runs/flywheel8")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--iterations", type=int, default=None, help="default: the config's")
    ap.add_argument("--no-control", action="store_true")
    ap.add_argument("--report-only", action="store_true")
    ap.add_argument(
        "--set",
        dest="sets",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a config key for every run (dotted, YAML value), e.g. rollouts.temperature=0.3",
    )
    ap.add_argument(
        "--merge",
        action="append",
        default=[],
        metavar="JSON",
        help="an earlier report of this benchmark: its seeds whose lakes are not under --root join this report",
    )
    ap.add_argument("--json", default="docs/bench_flywheel8.json")
    ap.add_argument("--png", default="docs/img/flywheel8.png")
    a = ap.parse_args()
    base = yaml.safe_load((ROOT / a.config).read_text())
    apply_overrides(base, {k: yaml.safe_load(v) for k, _, v in (kv.partition("=") for kv in a.sets)}, "--set")
    n = a.iterations or int(base.get("iterations", 1))
    demos = int(base["bootstrap"]["selection"]["seeds_per_task"])
    root = (ROOT / a.root).resolve()
    walls: dict[str, float] = {}
    wall_file = root / "wall_s.json"  # per arm, summed over invocations (a resumed run adds its part)

    def spent(arm: str, seconds: float) -> None:
        walls[arm] = walls.get(arm, 0.0) + seconds
        total = json.loads(wall_file.read_text()) if wall_file.exists() else {}
        total[arm] = round(total.get(arm, 0.0) + seconds, 1)
        wall_file.parent.mkdir(parents=True, exist_ok=True)
        wall_file.write_text(json.dumps(total, indent=1) + "\n")

    if not a.report_only:
        start = None
        if (base.get("midtrain") or {}).get("enabled"):
            start = root / "base"
            if not has_base(start):
                print(f"mid-training the shared base -> {start}", file=sys.stderr)
                bcfg = write_yaml(root / "configs" / "base.yaml", base)
                spent(
                    "base",
                    run([*FLYWHEEL, "stage", "midtrain", "-c", str(bcfg), "--lake", str(start)], root / "base.log"),
                )
        for s in a.seeds:
            lake, log = root / f"s{s}", root / f"s{s}.log"
            for arm in (lake, root / f"c{s}"):
                if start is not None and not arm.exists():
                    shutil.copytree(start, arm, ignore=shutil.ignore_patterns("_reports", ".cache"))
            cfg_path = write_yaml(root / "configs" / f"s{s}.yaml", seed_config(base, s, demos))
            left = n - evaluated_iterations(lake)
            if left > 0:
                print(f"seed {s}: flywheel, {left} iteration(s) left -> {lake}", file=sys.stderr)
                spent(
                    f"s{s}",
                    run([*FLYWHEEL, "run", "-c", str(cfg_path), "--lake", str(lake), "--iterations", str(left)], log),
                )
            if a.no_control:
                continue
            clake, clog = root / f"c{s}", root / f"c{s}.log"
            if evaluated_iterations(clake) >= 1:
                continue
            steps = training_steps(lake)["total"]
            ccfg = write_yaml(root / "configs" / f"c{s}.yaml", control_config(seed_config(base, s, demos), steps))
            print(f"seed {s}: control, {steps} SFT steps -> {clake}", file=sys.stderr)
            t0 = time.monotonic()
            common = ["-c", str(ccfg), "--lake", str(clake)]
            for stage in ("bootstrap", "curate", "sft"):
                run([*FLYWHEEL, "stage", stage, "-i", "0", *common], clog)
            ck = query(
                clake,
                "SELECT path FROM checkpoints WHERE iteration = 0 AND method = 'sft' ORDER BY created_at DESC LIMIT 1",
            )[0]["path"]
            run([*FLYWHEEL, "stage", "evaluate", "-i", "0", "--checkpoint", str(clake / ck), *common], clog)
            spent(f"c{s}", time.monotonic() - t0)
    merged, merged_walls = merged_runs(a.merge, root)
    summary = summarize(root, a.seeds, n, not a.no_control, merged)
    summary["config"], summary["overrides"] = a.config, a.sets
    if a.merge:
        summary["merged"] = a.merge
    if walls:
        summary["wall_s_this_invocation"] = {k: round(v, 1) for k, v in walls.items()}
    here = json.loads(wall_file.read_text()) if wall_file.exists() else {}
    if here or merged_walls:  # per arm, every invocation (2 CPU cores unless the note says otherwise)
        summary["wall_s"] = merged_walls | here
    if (root / "base").exists():
        summary["base"] = base_skills(root / "base")
    text = json.dumps(summary, indent=1, default=str)
    if a.json:
        (ROOT / a.json).parent.mkdir(parents=True, exist_ok=True)
        (ROOT / a.json).write_text(text + "\n")
    if a.png:
        plot(summary, ROOT / a.png)
    print(text)


if __name__ == "__main__":
    main()
