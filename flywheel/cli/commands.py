"""`flywheel run`, `flywheel rollout`, `flywheel up` and `flywheel down` (flywheel/cli/app.py mounts them).

flywheel run [-c configs/tiny.yaml] [--iterations 2] [--mode deployed]
flywheel rollout --policy scripted --tasks click-test,focus-text --seeds 0-19 --envs 2
flywheel up [--host 0.0.0.0] [--lake s3://bucket/lake] && flywheel down
"""

from __future__ import annotations

from typing import Optional

import typer

from flywheel.cli.common import CONFIG_OPT, LAKE_OPT, err_console, load_cfg, print_arrow_table, use_lake
from flywheel.errors import UserError


def up(
    port: int = typer.Option(4200, "--port", help="Port of the Prefect server (API and UI)."),
    host: str = typer.Option(
        "127.0.0.1", "--host", help="Interface to listen on (0.0.0.0 lets workers on other machines connect)."
    ),
    lake: Optional[str] = LAKE_OPT,
):
    """Start a local Prefect server, the cpu/gpu work pools, the deployments of prefect.yaml and one worker per pool."""
    from rich.console import Console

    from flows.orchestrate import up as start

    use_lake(lake)  # the workers inherit it: deployed stages write where this says
    console = Console()
    console.print(f"starting the Prefect server on {host}:{port}, pools, deployments and workers (about a minute)...")
    st = start(host=host, port=port)
    for p in st["processes"]:
        console.print(f"  {p['name']:<12} pid {p['pid']:<8} log {p['log']}")
    console.print(f"UI: [bold]{st['ui_url']}[/bold]   API: {st['api_url']}")
    console.print(
        "`flywheel run` now shows in that UI; `flywheel run --mode deployed` sends stages to the pools; "
        "`flywheel down` stops all of the above."
    )


def down():
    """Stop exactly the processes `flywheel up` started (by process group; nothing else)."""
    from rich.console import Console

    from flows.orchestrate import down as stop

    stopped = stop()
    Console().print(f"stopped: {', '.join(stopped)}" if stopped else "nothing to stop (no running `flywheel up`)")


def _parse_seeds(text: str) -> list[int]:
    """'0-9' | '3,5,8' | '0-4,10' -> sorted unique seeds."""
    out: set[int] = set()
    try:
        for part in text.split(","):
            part = part.strip()
            if "-" in part:
                a, b = part.split("-", 1)
                lo, hi = int(a), int(b)
                if hi < lo:
                    raise ValueError
                out.update(range(lo, hi + 1))
            elif part:
                out.add(int(part))
    except ValueError:
        raise UserError(f"bad --seeds {text!r}: use e.g. '0-19' or '1,5,9'") from None
    if not out:
        raise UserError("--seeds selects no seeds")
    return sorted(out)


def rollout(
    policy: str = typer.Option("scripted", "--policy", help="scripted | student"),
    tasks: str = typer.Option(
        "click-test,focus-text", "--tasks", help="Comma-separated task ids, or 'all' (teacher-supported)."
    ),
    seeds: str = typer.Option("0-9", "--seeds", help="Env seeds, e.g. '0-19' or '1,5,9'; all must lie in one split."),
    envs: Optional[int] = typer.Option(
        None, "--envs", "-n", help="Parallel env workers (default: config rollout.envs)."
    ),
    group_size: int = typer.Option(1, "--group-size", "-g", help="Episodes per (task, seed): the RL group G."),
    iteration: int = typer.Option(0, "--iteration", "-i", help="Iteration partition to write under."),
    stage: str = typer.Option(
        "rollouts", "--stage", help="Stage partition to write under (bootstrap | rollouts | evaluate)."
    ),
    model: Optional[str] = typer.Option(None, "--model", help="Student checkpoint folder (policy 'student')."),
    config: Optional[str] = CONFIG_OPT,
    lake: Optional[str] = LAKE_OPT,
):
    """Run episodes in parallel envs and write every one (steps, screenshots, status) to the lake."""
    from rich.console import Console

    from envs import registry
    from flywheel.query import run_query
    from flywheel.runtime.rollout import PolicySpec, run_rollouts
    from flywheel.specs import check_student_model, lake_for, register_tasks, resolve_tasks, rollout_spec
    from storage.catalog import connect

    use_lake(lake)
    cfg = load_cfg(config)
    seed_list = _parse_seeds(seeds)
    try:
        splits = {registry.split_of(s) for s in seed_list}
    except ValueError as e:
        raise UserError(str(e)) from None
    if len(splits) != 1:
        raise UserError(f"--seeds mixes splits {sorted(splits)}: train and eval seeds must not be mixed")
    split = splits.pop()
    task_list = resolve_tasks(
        [t.strip() for t in tasks.split(",") if t.strip()], for_training=stage != "evaluate", cfg=cfg
    )
    if policy == "scripted":
        spec_p = PolicySpec("scripted")
    elif policy == "student":
        path = check_student_model(cfg, model or cfg.student.model)  # before the lake or any worker is touched
        spec_p = PolicySpec("student", {"model": path, "config": cfg.student.policy_config()}, version=str(path))
    else:
        raise UserError(f"unknown --policy {policy!r}; use scripted or student")
    register_tasks(cfg)
    spec = rollout_spec(
        cfg,
        iteration=iteration,
        stage=stage,
        policy=spec_p,
        tasks=task_list,
        seeds=seed_list,
        split=split,
        group_size=group_size,
        n_envs=envs,
    )
    s = run_rollouts(spec)
    Console().print(
        f"run key [bold]{spec.run_key}[/bold]: ran {s.ran}, skipped {s.skipped} already in the lake, "
        f"{s.successes} successes, {s.errors} errors, {s.steps_per_s:.1f} steps/s in {s.duration_s:.1f}s"
    )
    lk = lake_for(cfg)
    t = run_query(
        connect(lk),
        f"""
        SELECT task_id, count(*) AS episodes, round(avg(success::INT), 3) AS success_rate,
               round(avg(n_steps), 2) AS avg_steps, count(*) FILTER (status = 'error') AS errors
        FROM episodes WHERE run_key = '{spec.run_key}' GROUP BY task_id ORDER BY task_id""",
        lk,
    )
    print_arrow_table(t, title=f"{stage} iteration {iteration}")


def run(
    config: Optional[str] = CONFIG_OPT,
    iterations: Optional[int] = typer.Option(None, "--iterations", help="Override the config's iteration count."),
    start: Optional[int] = typer.Option(
        None,
        "--start",
        help="First iteration number (default: the one after the "
        "lake's newest evaluated iteration, so a stopped iteration resumes).",
    ),
    mode: str = typer.Option(
        "local",
        "--mode",
        help="local: every stage in this process | deployed: each stage on its work pool (needs `flywheel up`).",
    ),
    refresh: bool = typer.Option(
        False, "--refresh", help="Run every stage again even where a finished result is cached."
    ),
    lake: Optional[str] = LAKE_OPT,
):
    """Run flywheel iterations through Prefect (default: one iteration of the embedded MiniWoB config).

    Each iteration: bootstrap (iteration 0, or when the last evaluation fell below
    bootstrap.success_threshold), student rollouts, curate, SFT, RL, evaluate. Finished stages are
    cached, so after a failure the same command (or `prefect flow-run retry`) resumes at the failed stage.
    """
    from rich.console import Console

    from configs.loading import default_config_path
    from flows.flywheel import RunFailed, run_flywheel
    from flywheel.specs import check_student_model, ensure_student

    use_lake(lake)
    console = Console()
    cfg = load_cfg(config)
    check_student_model(cfg, ensure_student(cfg))  # a Hub id that cannot load fails here, not in the rollouts stage
    try:
        out = run_flywheel(
            str(config or default_config_path()),
            iterations=iterations,
            start_iteration=start,
            mode=mode,
            refresh=refresh,
        )
    except RunFailed as e:
        err_console.print(f"[red]error:[/red] {e}", highlight=False, markup=True)
        if e.flow_run_id:
            err_console.print(
                f"resume: rerun this command, or `prefect flow-run retry {e.flow_run_id} "
                f"--entrypoint flows.flywheel:flywheel`",
                highlight=False,
                markup=False,
            )
        raise typer.Exit(2 if e.user_error else 1) from None
    for it in out:
        console.print(iteration_table(it))
        ev = it["stages"]["evaluate"]
        console.print(
            f"held-out success {ev['success_rate']:.1%} (95% CI {ev['ci_low']:.1%}-{ev['ci_high']:.1%}) "
            f"for {it['checkpoint']}"
        )


def iteration_table(it: dict):
    """The table `flywheel run` prints for one iteration of the flywheel flow's result: per stage its status
    (flows.common.stage_status: ran, cached, reused or skipped), wall seconds and output (flows.common.output_id)."""
    from rich.table import Table

    from flows.common import stage_row

    table = Table(title=f"iteration {it['iteration']}", header_style="bold cyan")
    for c in ("stage", "status", "wall s", "result"):
        table.add_column(c)
    for stage, res in it["stages"].items():
        row = stage_row(stage, res, it["started_at"])
        table.add_row(stage, row["status"], f"{row['wall_s']:.1f}", row["output"])
    return table
