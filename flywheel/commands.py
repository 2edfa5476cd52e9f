"""The flywheel's run/rollout/stage/up/down commands (registered on flywheel.cli.app)."""

from __future__ import annotations

from typing import Optional

import typer

from flywheel.cli import CONFIG_OPT, LAKE_OPT, app, stage_app, use_lake
from flywheel.errors import UserError


@stage_app.command("rl")
def stage_rl(
    iteration: int = typer.Option(
        0, "--iteration", "-i", help="Flywheel iteration (partition of the RL rollouts and checkpoint row)."
    ),
    algo: Optional[str] = typer.Option(None, "--algo", help="grpo | dr_grpo | gspo | sdpo (default: rl.algorithm)."),
    rounds: Optional[int] = typer.Option(None, "--rounds", help="Sample/update rounds (default: rl.rounds)."),
    checkpoint: Optional[str] = typer.Option(
        None, "--checkpoint", help="Start weights (default: this iteration's SFT checkpoint)."
    ),
    group_size: Optional[int] = typer.Option(
        None, "--group-size", "-g", help="Episodes per task instance (default: rl.group_size)."
    ),
    seeds_per_task: Optional[int] = typer.Option(
        None, "--seeds-per-task", help="Task instances per task per round (default: rl.seeds_per_task_per_round)."
    ),
    config: Optional[str] = CONFIG_OPT,
    lake: Optional[str] = LAKE_OPT,
):
    """GRPO / Dr.GRPO / GSPO / SDPO rounds from an SFT checkpoint: sample groups with the current weights,
    update on the step rows, reload the weights in the rollout workers; resumes by round."""
    from rich.console import Console

    from flywheel.cli import load_cfg
    from flywheel.stages import rl

    use_lake(lake)
    over = {
        "rl.enabled": True,
        "rl.algorithm": algo,
        "rl.rounds": rounds,
        "rl.group_size": group_size,
        "rl.seeds_per_task_per_round": seeds_per_task,
    }
    cfg = load_cfg(config, {k: v for k, v in over.items() if v is not None})
    res = rl(cfg, iteration, checkpoint)
    con = Console()
    for h in res["history"]:
        con.print(f"round {h['round']}: success {h['round_success']:.0%} over {h['episodes']} episodes")
    con.print(
        f"checkpoint [bold]{res['checkpoint_id']}[/bold] ({res['algo']}, {res['rounds']} rounds): {res['model_path']}"
    )


@stage_app.command("midtrain")
def stage_midtrain(
    config: Optional[str] = CONFIG_OPT,
    lake: Optional[str] = LAKE_OPT,
):
    """Mid-training on synthetic pages: the oracle's corpus (synth/* tasks in Chromium), its dataset, the base
    checkpoint the first SFT starts from, and the base's success on held-out synthetic pages. Idempotent: a
    finished base of the same corpus and settings is reused."""
    from rich.console import Console

    from flywheel.cli import load_cfg
    from flywheel.midtrain import midtrain
    from flywheel.specs import ensure_student

    use_lake(lake)
    cfg = load_cfg(config, {"midtrain.enabled": True})
    if not cfg.midtrain.base:
        ensure_student(cfg)
    res = midtrain(cfg)
    skills = res.get("skills") or {}
    verb = "reused" if res["skipped"] else "trained"
    Console().print(
        f"{verb} base [bold]{res['checkpoint_id']}[/bold] on {res['dataset_id']} ({res['n_samples']} samples, "
        f"{res['steps']} steps, final loss {res['final_loss']:.4f})\nmodel: {res['model_path']}\n"
        f"held-out synthetic pages: {skills.get('success_rate', float('nan')):.1%} {skills.get('per_task', {})}"
    )


@stage_app.command("bootstrap")
def stage_bootstrap(
    iteration: int = typer.Option(0, "--iteration", "-i", help="Flywheel iteration the demos are written under."),
    policy: Optional[str] = typer.Option(
        None, "--policy", help="scripted | claude | auto (default: bootstrap.policy)."
    ),
    budget_usd: Optional[float] = typer.Option(
        None, "--budget-usd", help="Dollar cap of the run (default: bootstrap.budget_usd)."
    ),
    config: Optional[str] = CONFIG_OPT,
    lake: Optional[str] = LAKE_OPT,
):
    """Teacher demonstrations on the train split (scripted DOM teacher or Claude computer use); a rerun fills in
    only what is missing, and a Claude run stops starting episodes once its dollar budget is spent."""
    from rich.console import Console

    from flywheel.cli import load_cfg
    from flywheel.stages import bootstrap

    use_lake(lake)
    over = {"bootstrap.policy": policy, "bootstrap.budget_usd": budget_usd}
    res = bootstrap(load_cfg(config, {k: v for k, v in over.items() if v is not None}), iteration)
    stop = f"; budget reached, {res['budget_stopped']} not started" if res["budget_stopped"] else ""
    Console().print(
        f"run [bold]{res['run_key']}[/bold] ({res['policy']}): ran {res['ran']} episodes "
        f"({res['skipped']} already in the lake), {res['successes']} successes, "
        f"${res['cost_usd']:.4f}{stop}"
    )


@stage_app.command("curate")
def stage_curate(
    iteration: int = typer.Option(
        0, "--iteration", "-i", help="Flywheel iteration: episodes of iterations <= N are used."
    ),
    config: Optional[str] = CONFIG_OPT,
    lake: Optional[str] = LAKE_OPT,
):
    """Select successful train episodes (deduplicated, capped per task, fit steps only) into an SFT dataset:
    a `datasets` manifest row and a Parquet export under <lake>/_datasets/."""
    import json

    from rich.console import Console

    from flywheel.cli import load_cfg
    from flywheel.stages import curate

    use_lake(lake)
    res = curate(load_cfg(config), iteration)
    Console().print(
        f"dataset [bold]{res['dataset_id']}[/bold]: {res['n_episodes']} episodes, {res['n_steps']} steps "
        f"-> {res['data_files']}\nsources: {json.dumps(res['source_counts']['by_policy_iteration'])}"
    )


@stage_app.command("sft")
def stage_sft(
    iteration: int = typer.Option(0, "--iteration", "-i", help="Flywheel iteration (partition of the checkpoint row)."),
    dataset: Optional[str] = typer.Option(
        None, "--dataset", help="Dataset id (default: this iteration's curate output under this config)."
    ),
    base: Optional[str] = typer.Option(
        None,
        "--base",
        help="Base model folder or checkpoint id (default: the latest earlier checkpoint, else student.model).",
    ),
    max_minutes: Optional[float] = typer.Option(
        None, "--max-minutes", help="Wall-clock budget (overrides sft.max_minutes)."
    ),
    config: Optional[str] = CONFIG_OPT,
    lake: Optional[str] = LAKE_OPT,
):
    """Fine-tune the student (LoRA or full, vision frozen) on a curated dataset; resumes an interrupted run,
    reuses a finished one, and records the checkpoint in the `checkpoints` table."""
    from rich.console import Console

    from flywheel.cli import load_cfg
    from flywheel.stages import sft
    from storage.curate import dataset_id_for

    use_lake(lake)
    cfg = load_cfg(config, {"sft.max_minutes": max_minutes} if max_minutes else None)
    res = sft(cfg, iteration, dataset or dataset_id_for(cfg, iteration), base)
    verb = "reused" if res["skipped"] else "trained"
    Console().print(
        f"{verb} checkpoint [bold]{res['checkpoint_id']}[/bold]: {res['steps']} steps, final loss "
        f"{res['final_loss']:.4f}, {res['tokens_per_s']:,.0f} tokens/s\nmodel: {res['model_path']}"
    )


@stage_app.command("evaluate")
def stage_evaluate(
    iteration: int = typer.Option(0, "--iteration", "-i", help="Flywheel iteration (partition of the eval rows)."),
    checkpoint: Optional[str] = typer.Option(
        None,
        "--checkpoint",
        help=(
            "Model folder / Hub id, or 'scripted' for the teacher (default: the "
            "newest checkpoint of this iteration or an earlier one in the lake, else "
            "the config's student.model)."
        ),
    ),
    config: Optional[str] = CONFIG_OPT,
    lake: Optional[str] = LAKE_OPT,
):
    """Evaluate a checkpoint on held-out seeds (and held-out tasks): success rate with 95% CI per task,
    average steps, parse-error rate -> the `evals` table, a table here and a PNG plot."""
    from rich.console import Console

    from flywheel.cli import load_cfg, print_arrow_table
    from flywheel.specs import lake_for, latest_checkpoint
    from flywheel.stages import evaluate
    from storage.catalog import connect, run_query

    use_lake(lake)
    cfg = load_cfg(config)
    # after `stage sft` (or `stage rl`) a bare `stage evaluate` scores what was just trained, not the start weights
    res = evaluate(cfg, iteration, checkpoint or latest_checkpoint(cfg, iteration + 1) or cfg.student.model)
    lk = lake_for(cfg)
    t = run_query(
        connect(lk),
        f"""SELECT task_id, split, n_episodes AS n, successes, round(success_rate, 3) AS rate,
        round(ci_low, 3) AS ci_low, round(ci_high, 3) AS ci_high, round(avg_steps, 2) AS avg_steps,
        round(parse_error_rate, 3) AS parse_err FROM evals """
        f"""WHERE eval_id = '{res["eval_id"]}' ORDER BY split, task_id""",
        lk,
    )
    print_arrow_table(t, title=f"evaluation of {res['checkpoint']} (iteration {iteration})")
    Console().print(
        f"overall {res['success_rate']:.1%} (95% CI {res['ci_low']:.1%}-{res['ci_high']:.1%}); plot: {res['plot']}"
    )


@app.command()
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


@app.command()
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


@app.command()
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
    from flywheel.cli import load_cfg, print_arrow_table
    from flywheel.runtime.rollout import PolicySpec, run_rollouts
    from flywheel.specs import check_student_model, lake_for, register_tasks, resolve_tasks, rollout_spec
    from storage.catalog import connect, run_query

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
    task_list = resolve_tasks([t.strip() for t in tasks.split(",") if t.strip()], for_training=stage != "evaluate")
    if policy == "scripted":
        spec_p = PolicySpec("scripted")
    elif policy == "student":
        path = check_student_model(cfg, model or cfg.student.model)  # before the lake or any worker is touched
        spec_p = PolicySpec("student", {"model": path, "config": cfg.student.model_dump()}, version=str(path))
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


@app.command()
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

    from configs.models import default_config_path
    from flows.flywheel import RunFailed, run_flywheel
    from flywheel.cli import err_console, load_cfg
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
