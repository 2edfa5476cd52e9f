"""The RL learning bar: GRPO vs SDPO from the embedded default's SFT checkpoint, seeded runs side by side.

    .venv/bin/python benchmarks/rl_bar.py --lake LAKE [--checkpoint PATH] [--algos grpo sdpo] [--seeds 0 1 2]
        [--config configs/local.yaml] [--set rl.rounds=12 ...] [--out docs/bench_rl_bar.json]
        [--plot docs/img/rl_bar.png]

LAKE holds a finished SFT stage (e.g. the lake of `flywheel run` on configs/local.yaml); --checkpoint picks
another start (default: the lake's newest `sft` checkpoint of iteration 0). For the start and for every
(algorithm, seed) run, in one process and one lake:
  1. the start checkpoint on the held-out eval seeds of the trained tasks (greedy; once);
  2. `flywheel.rl_stage.rl_stage` with the config's rl section (rl.seed = the run's seed: minibatch order and
     which task instances each round samples), the algorithm forced;
  3. the RL checkpoint on the same held-out eval seeds.
Each (algorithm, seed) run works on its own copy of LAKE as it was before any run (LAKE.<algo>-s<seed>, beside
it; --shared-lake runs them all in LAKE): the RL stage reads the lake's stored successes (replay, rl.guide,
rl.clone_steps), so a run in a shared lake would learn from the episodes of the runs before it. `--merge A.json
B.json ...` summarises and plots runs measured separately (e.g. one seed per machine) without running anything.
Prints JSON: per run the per-task held-out success, the RL wall time (rollouts + updates), and per round the
episodes sampled and their success (per task, from the lake); per algorithm the mean / min / max over seeds.
The bar (issue: RL stage): click-button >= 60%, the other tasks >= 90%, overall >= 85%, within 20 minutes of RL,
in every seeded run. SDPO efficiency: the episodes each algorithm needs until its sampled success (mean over
seeds, 2-round moving average) first reaches GRPO's final value.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

FOCUS = "click-button"
BAR = {"focus_task": FOCUS, "focus_min": 0.60, "others_min": 0.90, "overall_min": 0.85, "rl_wall_s_max": 1200}


def _eval(cfg, checkpoint: str) -> dict[str, Any]:
    from flywheel import stages

    r = stages.evaluate(cfg, 0, checkpoint, progress=False)
    per = {t: v["success_rate"] if isinstance(v, dict) else v for t, v in r["per_task"].items()}
    return {
        "success_rate": round(r["success_rate"], 3),
        "ci": [round(r["ci_low"], 3), round(r["ci_high"], 3)],
        "n": r["n_episodes"],
        "per_task": per,
    }


def _rounds(lake, history: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per round: episodes sampled, success overall and per task (from the lake's episodes of its rollout run)."""
    from storage.catalog import connect

    con = connect(lake)
    out, total = [], 0
    for h in history:
        rows = con.execute(
            "SELECT task_id, count(*), avg(success::INT) FROM episodes WHERE run_key = ? GROUP BY 1 ORDER BY 1",
            [h["rollout_run_key"]],
        ).fetchall()
        n = sum(r[1] for r in rows)
        total += n
        out.append(
            {
                "round": h["round"],
                "episodes": n,
                "episodes_cum": total,
                "success": round(sum(r[1] * r[2] for r in rows) / max(n, 1), 4),
                "per_task": {r[0]: round(r[2], 4) for r in rows},
                **({"clone_nll": round(m["clone_nll"], 4)} if (m := h.get("metrics") or {}).get("clone_nll") else {}),
            }
        )
    return out


def meets(after: dict[str, Any], wall_s: float) -> bool:
    per = after["per_task"]
    return (
        per.get(FOCUS, 0) >= BAR["focus_min"]
        and all(v >= BAR["others_min"] for t, v in per.items() if t != FOCUS)
        and after["success_rate"] >= BAR["overall_min"]
        and wall_s <= BAR["rl_wall_s_max"]
    )


def _curve(runs: list[dict[str, Any]]) -> tuple[list[float], list[float]]:
    """Mean over seeds of the per-round sampled success (2-round moving average) vs mean cumulative episodes."""
    k = min(len(r["rounds"]) for r in runs)
    xs = [sum(r["rounds"][i]["episodes_cum"] for r in runs) / len(runs) for i in range(k)]
    ys = [sum(r["rounds"][i]["success"] for r in runs) / len(runs) for i in range(k)]
    sm = [(ys[i] + ys[i - 1]) / 2 if i else ys[i] for i in range(k)]
    return xs, sm


def efficiency(by_algo: dict[str, list[dict[str, Any]]]) -> dict[str, Any] | None:
    if "grpo" not in by_algo or "sdpo" not in by_algo:
        return None
    curves = {a: _curve(r) for a, r in by_algo.items()}
    target = curves["grpo"][1][-1]
    # round 0 samples with the start weights: only rounds after an update count as "reached"
    first = {a: next((x for x, y in list(zip(*c))[1:] if y >= target), None) for a, c in curves.items()}
    ratio = first["sdpo"] / first["grpo"] if first["sdpo"] and first["grpo"] else None
    return {
        "grpo_final_sampled_success": round(target, 4),
        "episodes_to_reach (after round 0)": first,
        "sdpo_over_grpo": round(ratio, 3) if ratio else None,
        "target_ratio": 0.5,
        "met": bool(ratio is not None and ratio <= 0.5),
    }


def plot(res: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from flywheel.evaluate import save_png

    colors = {"grpo": "tab:blue", "sdpo": "tab:orange", "gspo": "tab:green", "dr_grpo": "tab:purple"}
    fig, axes = plt.subplots(1, 2, figsize=(11, 4), dpi=90)
    for algo, runs in res["runs_by_algo"].items():
        c = colors.get(algo, "k")
        for r in runs:
            xs = [p["episodes_cum"] for p in r["rounds"]]
            axes[0].plot(xs, [p["success"] for p in r["rounds"]], color=c, alpha=0.25, lw=1)
            axes[1].plot(xs, [p["per_task"].get(FOCUS, float("nan")) for p in r["rounds"]], color=c, alpha=0.25, lw=1)
        xs, ys = _curve(runs)
        axes[0].plot(xs, ys, color=c, lw=2.5, label=f"{algo} (mean of {len(runs)} seeds, 2-round avg)")
        ev = [r["after"]["per_task"].get(FOCUS, 0) for r in runs]
        x_end = max(p["episodes_cum"] for r in runs for p in r["rounds"])
        axes[1].errorbar(
            [x_end],
            [sum(ev) / len(ev)],
            yerr=[[sum(ev) / len(ev) - min(ev)], [max(ev) - sum(ev) / len(ev)]],
            fmt="s",
            color=c,
            ms=8,
            capsize=4,
            label=f"{algo}: held-out after RL (mean, min-max)",
        )
    start = res["start"]["per_task"].get(FOCUS)
    if start is not None:
        axes[1].axhline(start, color="gray", ls="--", lw=1, label=f"SFT start, held-out ({start:.0%})")
    axes[1].axhline(BAR["focus_min"], color="red", ls=":", lw=1, label="bar 60%")
    axes[0].set_title("sampled success per round (all RL tasks)", fontsize=10)
    axes[1].set_title(f"{FOCUS}: sampled per round (thin) and held-out (squares)", fontsize=10)
    for ax in axes:
        ax.set_xlabel("episodes sampled")
        ax.set_ylim(-0.02, 1.02)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="lower right")
    axes[0].set_ylabel("success")
    fig.suptitle("RL from the SFT checkpoint: GRPO vs SDPO (embedded default, 2 CPU cores)", fontsize=11)
    save_png(fig, path)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default="configs/local.yaml")
    ap.add_argument(
        "--lake", help="lake with a finished SFT stage; the start's eval is added to it, each run gets a copy"
    )
    ap.add_argument(
        "--shared-lake",
        action="store_true",
        help="run every (algo, seed) in LAKE itself (later runs then "
        "see the earlier runs' episodes as stored successes)",
    )
    ap.add_argument(
        "--merge",
        nargs="+",
        default=None,
        metavar="JSON",
        help="summarise and plot these earlier outputs' runs (same start) instead of running",
    )
    ap.add_argument(
        "--checkpoint", default=None, help="start weights (default: the lake's newest sft checkpoint, iteration 0)"
    )
    ap.add_argument("--algos", nargs="+", default=["grpo", "sdpo"])
    ap.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    ap.add_argument("--skip", nargs="*", default=[], metavar="ALGO:SEED", help="leave these runs out (e.g. sdpo:2)")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="config override (repeatable)")
    ap.add_argument("--out", default=None, help="also write the JSON here")
    ap.add_argument("--plot", default=None, help="PNG of success vs episodes")
    a = ap.parse_args()
    if a.merge:
        res = merged(a.merge)
    elif a.lake:
        res = measure(a)
    else:
        ap.error("--lake (or --merge) is required")
    finish(res, a)


def merged(paths: list[str]) -> dict[str, Any]:
    """The runs of earlier outputs as one result (the first file's start, config and bar)."""
    docs = [json.loads(Path(p).read_text()) for p in paths]
    res = {k: docs[0][k] for k in ("benchmark", "config", "checkpoint", "rl", "bar", "start")}
    res.update(
        merged_from=list(paths), overrides=[d["overrides"] for d in docs], runs=[r for d in docs for r in d["runs"]]
    )
    return res


def _run_lake(lake_root: Path, algo: str, seed: int, shared: bool) -> Path:
    """Where one run trains: a copy of the start lake (made once; a rerun resumes in it), or the lake itself."""
    import shutil

    if shared:
        return lake_root
    root = lake_root.parent / f"{lake_root.name}.{algo}-s{seed}"
    if not root.exists():
        shutil.copytree(lake_root, root.with_name(root.name + ".tmp"), dirs_exist_ok=True)
        root.with_name(root.name + ".tmp").rename(root)
    return root


def measure(a) -> dict[str, Any]:
    import yaml

    from configs.loading import load_config
    from flywheel.rl_stage import rl_stage
    from storage.lake import open_lake

    lake_root = Path(a.lake).resolve()
    over: dict[str, Any] = {"lake.root": str(lake_root), "rl.enabled": True, "evaluate.held_out_tasks": False}
    for item in a.set:
        key, _, value = item.partition("=")
        over[key] = yaml.safe_load(value)
    os.environ["FLYWHEEL_LAKE"] = str(lake_root)  # it outranks lake.root
    cfg = load_config(a.config, over)
    lake = open_lake(lake_root)
    ckpt = a.checkpoint
    if ckpt is None:
        from storage.catalog import connect

        row = (
            connect(lake)
            .execute(
                "SELECT path FROM checkpoints WHERE iteration = 0 AND method LIKE 'sft%' "
                "ORDER BY created_at DESC LIMIT 1"
            )
            .fetchone()
        )
        if row is None:
            sys.exit(f"{lake_root}: no sft checkpoint in iteration 0; run `flywheel run --lake {a.lake}` first")
        ckpt = row[0]
    start_path = str(lake.resolve(ckpt))
    t_all = time.time()
    res: dict[str, Any] = {
        "benchmark": "rl_bar",
        "config": a.config,
        "overrides": over,
        "checkpoint": lake.rel(start_path),
        "rl": cfg.rl.model_dump(mode="json"),
        "bar": BAR,
        "runs": [],
    }
    res["start"] = _eval(cfg, start_path)
    print(json.dumps({"start": res["start"]}), file=sys.stderr, flush=True)
    for algo in a.algos:
        for seed in a.seeds:
            if f"{algo}:{seed}" in a.skip:
                continue
            root = _run_lake(lake_root, algo, seed, a.shared_lake)
            os.environ["FLYWHEEL_LAKE"] = str(root)
            rcfg = load_config(a.config, {**over, "lake.root": str(root), "rl.seed": seed})
            run_lake = open_lake(root)
            t0 = time.time()
            out = rl_stage(rcfg, 0, str(run_lake.resolve(ckpt)), lake=run_lake, algo=algo, progress=False)
            wall = time.time() - t0
            after = _eval(rcfg, out["model_path"])
            # every round's record from its folder (a rerun that found the run finished returns no history)
            done = sorted(
                Path(out["model_path"]).parent.glob("round-*/rl_round.json"), key=lambda q: int(q.parent.name[6:])
            )
            history = [json.loads(q.read_text()) for q in done]
            run = {
                "algo": algo,
                "seed": seed,
                "lake": str(root),
                "checkpoint": run_lake.rel(out["model_path"]),
                "rl_wall_s": round(wall, 1),
                "resumed_from_round": out["resumed_from_round"],
                "rounds": _rounds(run_lake, history),
                "after": after,
            }
            run["bar_met"] = meets(after, wall)
            res["runs"].append(run)
            print(
                json.dumps({k: run[k] for k in ("algo", "seed", "rl_wall_s", "after", "bar_met")}),
                file=sys.stderr,
                flush=True,
            )
    res["total_wall_s"] = round(time.time() - t_all, 1)
    return res


def finish(res: dict[str, Any], a) -> None:
    """Per-algorithm summary over seeds, SDPO efficiency, the plot; print (and write) the JSON."""
    by_algo: dict[str, list[dict[str, Any]]] = {}
    for r in res["runs"]:
        by_algo.setdefault(r["algo"], []).append(r)
    res["runs_by_algo"] = by_algo
    res["summary"] = {}
    for algo, runs in by_algo.items():
        s: dict[str, Any] = {"bar_met_all_seeds": all(r["bar_met"] for r in runs), "seeds": [r["seed"] for r in runs]}
        for name, get in (
            ("overall", lambda r: r["after"]["success_rate"]),
            (FOCUS, lambda r: r["after"]["per_task"].get(FOCUS, 0.0)),
            ("rl_wall_s", lambda r: r["rl_wall_s"]),
            ("episodes", lambda r: r["rounds"][-1]["episodes_cum"] if r["rounds"] else 0),
        ):
            v = [get(r) for r in runs]
            s[name] = {"mean": round(sum(v) / len(v), 3), "min": min(v), "max": max(v)}
        tasks = sorted({t for r in runs for t in r["after"]["per_task"]})
        s["per_task_mean"] = {
            t: round(sum(r["after"]["per_task"].get(t, 0) for r in runs) / len(runs), 3) for t in tasks
        }
        res["summary"][algo] = s
    res["sdpo_efficiency"] = efficiency(by_algo)
    if a.plot:
        plot(res, Path(a.plot))
        res["plot"] = a.plot
    del res["runs_by_algo"]
    res.update(cpus=os.cpu_count(), load_avg_end=os.getloadavg(), date=time.strftime("%Y-%m-%d %H:%M"))
    text = json.dumps(res, indent=1, default=str)
    print(text)
    if a.out:
        Path(a.out).write_text(text + "\n")


if __name__ == "__main__":
    main()
