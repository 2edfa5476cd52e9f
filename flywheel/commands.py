"""The flywheel's run/rollout/stage/up/down commands (registered on flywheel.cli.app)."""

from __future__ import annotations

from typing import Optional

import typer

from flywheel.cli import CONFIG_OPT, app, stage_app
from flywheel.errors import UserError


def _not_yet(what: str, issue: int) -> None:
    raise UserError(f"{what} is not implemented yet (tracked in issue #{issue})")


for _name, _issue, _help in [
    ("curate", 5, "Select successful episodes into an SFT dataset manifest."),
    ("sft", 5, "Fine-tune the student on the latest dataset."),
    ("rl", 7, "GRPO / SDPO on the latest student rollouts."),
]:
    def _make(name=_name, issue=_issue):
        def cmd(iteration: int = typer.Option(0, "--iteration", "-i", help="Flywheel iteration."),
                config: Optional[str] = CONFIG_OPT):
            _not_yet(f"stage {name}", issue)
        cmd.__doc__ = _help
        return cmd
    stage_app.command(_name, help=_help)(_make())


@stage_app.command("evaluate")
def stage_evaluate(
    iteration: int = typer.Option(0, "--iteration", "-i", help="Flywheel iteration (partition of the eval rows)."),
    checkpoint: Optional[str] = typer.Option(None, "--checkpoint", help="Model folder / Hub id, or 'scripted' for the teacher (default: the config's student.model)."),
    config: Optional[str] = CONFIG_OPT,
):
    """Evaluate a checkpoint on held-out seeds (and held-out tasks): success rate with 95% CI per task,
    average steps, parse-error rate -> the `evals` table, a table here and a PNG plot."""
    from rich.console import Console
    from flywheel.cli import load_cfg, print_arrow_table
    from flywheel.stages import evaluate, lake_for
    from storage.catalog import connect, run_query

    cfg = load_cfg(config)
    res = evaluate(cfg, iteration, checkpoint or cfg.student.model)
    lk = lake_for(cfg)
    t = run_query(connect(lk), f"""SELECT task_id, split, n_episodes AS n, successes, round(success_rate, 3) AS rate,
        round(ci_low, 3) AS ci_low, round(ci_high, 3) AS ci_high, round(avg_steps, 2) AS avg_steps,
        round(parse_error_rate, 3) AS parse_err FROM evals WHERE eval_id = '{res["eval_id"]}' ORDER BY split, task_id""", lk)
    print_arrow_table(t, title=f"evaluation of {res['checkpoint']} (iteration {iteration})")
    Console().print(f"overall {res['success_rate']:.1%} (95% CI {res['ci_low']:.1%}-{res['ci_high']:.1%}); plot: {res['plot']}")


@app.command()
def up():
    """Start a local Prefect server, work pools, deployments and workers."""
    _not_yet("flywheel up", 6)


@app.command()
def down():
    """Stop what `flywheel up` started."""
    _not_yet("flywheel down", 6)


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


@app.command()
def rollout(
    policy: str = typer.Option("scripted", "--policy", help="scripted | student"),
    tasks: str = typer.Option("click-test,focus-text", "--tasks", help="Comma-separated task ids, or 'all' (teacher-supported)."),
    seeds: str = typer.Option("0-9", "--seeds", help="Env seeds, e.g. '0-19' or '1,5,9'; all must lie in one split."),
    envs: Optional[int] = typer.Option(None, "--envs", "-n", help="Parallel env workers (default: config rollout.envs)."),
    group_size: int = typer.Option(1, "--group-size", "-g", help="Episodes per (task, seed): the RL group G."),
    iteration: int = typer.Option(0, "--iteration", "-i", help="Iteration partition to write under."),
    stage: str = typer.Option("rollouts", "--stage", help="Stage partition to write under (bootstrap | rollouts | evaluate)."),
    model: Optional[str] = typer.Option(None, "--model", help="Student checkpoint folder (policy 'student')."),
    config: Optional[str] = CONFIG_OPT,
):
    """Run episodes in parallel envs and write every one (steps, screenshots, status) to the lake."""
    from rich.console import Console
    from envs import registry
    from flywheel.cli import load_cfg, print_arrow_table
    from flywheel.rollout import PolicySpec, run_rollouts
    from flywheel.stages import lake_for, register_tasks, resolve_tasks, rollout_spec
    from storage.catalog import connect, run_query

    cfg = load_cfg(config)
    seed_list = _parse_seeds(seeds)
    try:
        splits = {registry.split_of(s) for s in seed_list}
    except ValueError as e:
        raise UserError(str(e)) from None
    if len(splits) != 1:
        raise UserError(f"--seeds mixes splits {sorted(splits)}: train and eval seeds must not be mixed")
    split = splits.pop()
    task_list = resolve_tasks([t.strip() for t in tasks.split(",") if t.strip()], for_training=stage != "evaluate")
    if policy == "scripted":
        spec_p = PolicySpec("scripted")
    elif policy == "student":
        path = model or cfg.student.model
        spec_p = PolicySpec("student", {"model": path, "config": cfg.student.model_dump()}, version=str(path))
    else:
        raise UserError(f"unknown --policy {policy!r}; use scripted or student")
    register_tasks(cfg)
    spec = rollout_spec(cfg, iteration=iteration, stage=stage, policy=spec_p, tasks=task_list, seeds=seed_list,
                        split=split, group_size=group_size, n_envs=envs)
    s = run_rollouts(spec)
    Console().print(f"run key [bold]{spec.run_key}[/bold]: ran {s.ran}, skipped {s.skipped} already in the lake, "
                    f"{s.successes} successes, {s.errors} errors, {s.steps_per_s:.1f} steps/s in {s.duration_s:.1f}s")
    lk = lake_for(cfg)
    t = run_query(connect(lk), f"""
        SELECT task_id, count(*) AS episodes, round(avg(success::INT), 3) AS success_rate,
               round(avg(n_steps), 2) AS avg_steps, count(*) FILTER (status = 'error') AS errors
        FROM episodes WHERE run_key = '{spec.run_key}' GROUP BY task_id ORDER BY task_id""", lk)
    print_arrow_table(t, title=f"{stage} iteration {iteration}")


@app.command()
def run(
    config: Optional[str] = CONFIG_OPT,
    iterations: Optional[int] = typer.Option(None, "--iterations", help="Override the config's iteration count."),
):
    """Run flywheel iterations on the configured environment (default: the embedded MiniWoB config).

    Today this runs the stages that exist: the task registry and teacher demonstrations
    (bootstrap). Student rollouts, curation, SFT, RL and evaluation join as they land.
    """
    from rich.console import Console
    from flywheel.cli import load_cfg, print_arrow_table
    from flywheel.stages import bootstrap, lake_for, register_tasks
    from storage.catalog import connect, run_query
    from storage.queries import PER_TASK_SUCCESS

    cfg = load_cfg(config, {"iterations": iterations} if iterations else None)
    console = Console()
    reg = register_tasks(cfg)
    console.print(f"task registry: {reg['tasks']} tasks")
    for it in range(cfg.iterations):
        res = bootstrap(cfg, iteration=it)
        console.print(f"iteration {it}: bootstrap run {res['run_key']} ran {res['ran']} episodes "
                      f"({res['skipped']} already in the lake), {res['successes']} successes")
        lk = lake_for(cfg)
        t = run_query(connect(lk), PER_TASK_SUCCESS.format(where=f"WHERE run_key = '{res['run_key']}'"), lk)
        print_arrow_table(t, title=f"iteration {it}: teacher demonstrations")
    console.print(f"lake: {lake_for(cfg).root}  (try: flywheel query \"SELECT * FROM episodes LIMIT 5\")")
