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
resumed invocations), and the targets (benchmarks/flywheel_report.py reads the lakes and writes the report):
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
from flywheel_report import (  # noqa: E402
    base_skills,
    evaluated_iterations,
    has_base,
    merged_runs,
    plot,
    query,
    summarize,
    training_steps,
)

from configs.loading import apply_overrides, read_config_data  # noqa: E402
from configs.models import FlywheelConfig  # noqa: E402

FLYWHEEL = [str(ROOT / ".venv" / "bin" / "flywheel")]


def seed_config(base: dict[str, Any], seed: int, demos_per_task: int) -> dict[str, Any]:
    return apply_overrides(
        copy.deepcopy(base),
        {"sft.seed": seed, "rl.seed": seed, "bootstrap.selection.seed_offset": demos_per_task * seed},
    )


def control_config(cfg: dict[str, Any], steps: int) -> dict[str, Any]:
    """The control's config: one SFT of exactly `steps` optimizer steps on the teacher demos. Its epochs are raised
    so that max_steps binds whatever the number of demos (session 43: 50 epochs of 80 demos stopped it at 250 of
    360 steps), as if every step took one sample."""
    sft = FlywheelConfig.model_validate(cfg).sft  # the schema's defaults where the config is silent
    per_step = sft.batch_size * sft.grad_accum
    return apply_overrides(
        copy.deepcopy(cfg),
        {
            "name": f"{cfg.get('name', 'flywheel')}-control",
            "iterations": 1,
            "curriculum.enabled": False,
            "rl.enabled": False,
            "sft.max_steps": int(steps),
            "sft.epochs": float(max(int(steps), 1) * per_step),
            "sft.max_minutes": max(float(cfg["sft"].get("max_minutes") or 0), 90.0),
        },
    )  # the minutes: a cap only


TEXT: dict[str, Any] = {"capture_output": True, "text": True}


def control_checkpoint(lake: Path) -> str | None:
    """The control's SFT checkpoint folder (relative to its lake), trained here or adopted; None before it."""
    rows = query(
        lake, "SELECT path FROM checkpoints WHERE iteration = 0 AND method = 'sft' ORDER BY created_at DESC LIMIT 1"
    )
    return rows[0]["path"] if rows else None


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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--config", default="configs/flywheel8.yaml")
    ap.add_argument("--root", default="runs/flywheel8")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--iterations", type=int, default=None, help="default: the config's")
    ap.add_argument("--no-control", action="store_true")
    ap.add_argument(
        "--control-elsewhere",
        action="store_true",
        help="prepare each control up to its SFT and write <root>/c<s>.plan.json (`flywheel stage sft --plan`) "
        "instead of training it here; train it with the plan's command on another machine, file it with "
        "`flywheel stage sft --adopt`, and rerun: the control then reuses it and is evaluated",
    )
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
    base = read_config_data(ROOT / a.config)  # its `extends:` resolved: the per-run configs below stand alone
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
            for stage in ("bootstrap", "curate"):
                run([*FLYWHEEL, "stage", stage, "-i", "0", *common], clog)
            if a.control_elsewhere and not control_checkpoint(clake):
                plan = root / f"c{s}.plan.json"
                out = subprocess.run([*FLYWHEEL, "stage", "sft", "-i", "0", "--plan", *common], cwd=ROOT, **TEXT)
                if out.returncode != 0:
                    raise SystemExit(f"flywheel stage sft --plan failed for {clake}:\n{out.stderr}")
                plan.write_text(out.stdout)
                print(
                    f"seed {s}: control to train elsewhere: {plan}; then `flywheel stage sft -i 0 --adopt <run> "
                    f"{' '.join(common)}` and rerun",
                    file=sys.stderr,
                )
                spent(f"c{s}", time.monotonic() - t0)
                continue
            run([*FLYWHEEL, "stage", "sft", "-i", "0", *common], clog)
            ck = control_checkpoint(clake)
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
