"""`flywheel stage <name>`: one flywheel stage on its own, outside Prefect, for every registered stage.

    flywheel stage curate -i 0 && flywheel stage sft -i 0
    flywheel stage evaluate --checkpoint models/small-qwen3vl
    flywheel stage rollouts -i 1 --checkpoint lake/_checkpoints/sft-it0-.../merged

stage_app() builds the group from the registry (flywheel/pipeline.py): a stage that names its own command
(`Stage.cli`: the hand-written ones below) gets it, any other one a command built from its parameters
(generic_command: `--iteration`, one option per input, `--config`, `--lake`; it prints the result's summary line).
flywheel/cli/app.py mounts the group.
"""

from __future__ import annotations

import inspect
from typing import Any, Callable, Optional

import typer

from configs.algorithms import ALGORITHMS
from flywheel.cli.common import CONFIG_OPT, LAKE_OPT, load_cfg, print_arrow_table, use_lake
from flywheel.pipeline import STAGES, Stage


def stage_rl(
    iteration: int = typer.Option(
        0, "--iteration", "-i", help="Flywheel iteration (partition of the RL rollouts and checkpoint row)."
    ),
    algo: Optional[str] = typer.Option(None, "--algo", help=f"{' | '.join(ALGORITHMS)} (default: rl.algorithm)."),
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
    if res.skipped:
        con.print(f"rl skipped: {res.skipped}")
        return
    for h in res["history"]:
        con.print(f"round {h['round']}: success {h['round_success']:.0%} over {h['episodes']} episodes")
    con.print(
        f"checkpoint [bold]{res['checkpoint_id']}[/bold] ({res['algo']}, {res['rounds']} rounds): {res['model_path']}"
    )


def stage_midtrain(
    config: Optional[str] = CONFIG_OPT,
    lake: Optional[str] = LAKE_OPT,
):
    """Mid-training on synthetic pages: the oracle's corpus (synth/* tasks in Chromium), its dataset, the base
    checkpoint the first SFT starts from, and the base's success on held-out synthetic pages. Idempotent: a
    finished base of the same corpus and settings is reused."""
    from rich.console import Console

    from flywheel.midtrain import midtrain
    from flywheel.specs import ensure_student

    use_lake(lake)
    cfg = load_cfg(config, {"midtrain.enabled": True})
    if not cfg.midtrain.base:
        ensure_student(cfg)
    res = midtrain(cfg)
    skills = res.get("skills") or {}
    verb = "reused" if res.reused else "trained"
    Console().print(
        f"{verb} base [bold]{res['checkpoint_id']}[/bold] on {res['dataset_id']} ({res['n_samples']} samples, "
        f"{res['steps']} steps, final loss {res['final_loss']:.4f})\nmodel: {res['model_path']}\n"
        f"held-out synthetic pages: {skills.get('success_rate', float('nan')):.1%} {skills.get('per_task', {})}"
    )


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

    from flywheel.stages import bootstrap

    use_lake(lake)
    over = {"bootstrap.policy": policy, "bootstrap.budget_usd": budget_usd}
    res = bootstrap(load_cfg(config, {k: v for k, v in over.items() if v is not None}), iteration)
    if res.skipped:  # every demo is in the lake already, or the teacher budget is spent
        Console().print(f"bootstrap skipped: {res.skipped}")
        return
    stop = f"; budget reached, {res['budget_stopped']} not started" if res.get("budget_stopped") else ""
    Console().print(
        f"run [bold]{res['run_key']}[/bold] ({res['policy']}): ran {res['ran']} episodes "
        f"({res['skipped']} already in the lake), {res['successes']} successes, "
        f"${res['cost_usd']:.4f}{stop}"
    )


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

    from flywheel.stages import curate

    use_lake(lake)
    res = curate(load_cfg(config), iteration)
    Console().print(
        f"dataset [bold]{res['dataset_id']}[/bold]: {res['n_episodes']} episodes, {res['n_steps']} steps "
        f"-> {res['data_files']}\nsources: {json.dumps(res['source_counts']['by_policy_iteration'])}"
    )


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
    plan: bool = typer.Option(
        False,
        "--plan",
        help="Print what would be trained (export, base, settings, their sha256) and the `python -m training.sft` "
        "command that trains it on another machine, then stop.",
    ),
    adopt: Optional[str] = typer.Option(
        None,
        "--adopt",
        help="A finished run of this stage trained elsewhere (see --plan): checked against this stage's data, "
        "base and settings, then recorded as this stage's checkpoint instead of training here.",
    ),
    config: Optional[str] = CONFIG_OPT,
    lake: Optional[str] = LAKE_OPT,
):
    """Fine-tune the student (LoRA or full, vision frozen) on a curated dataset; resumes an interrupted run,
    reuses a finished one, and records the checkpoint in the `checkpoints` table."""
    import json

    from rich.console import Console

    from flywheel.stages import sft, sft_plan
    from training.curation import dataset_id_for

    use_lake(lake)
    cfg = load_cfg(config, {"sft.max_minutes": max_minutes} if max_minutes else None)
    dataset_id = dataset or dataset_id_for(cfg, iteration)
    if plan:
        print(json.dumps(sft_plan(cfg, iteration, dataset_id, base), indent=1))
        return
    res = sft(cfg, iteration, dataset_id, base, adopt=adopt)
    verb = "reused" if res.reused else "adopted" if res.get("adopted_from") else "trained"
    Console().print(
        f"{verb} checkpoint [bold]{res['checkpoint_id']}[/bold]: {res['steps']} steps, final loss "
        f"{res['final_loss']:.4f}, {res['tokens_per_s']:,.0f} tokens/s\nmodel: {res['model_path']}"
    )


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

    from flywheel.query import run_query
    from flywheel.specs import lake_for, latest_checkpoint
    from flywheel.stages import evaluate
    from storage.catalog import connect

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


# ------------------------------------------------------------------------------------------------ from the registry
def generic_command(stage: Stage) -> Callable[..., None]:
    """`flywheel stage <name>` for a stage without a command of its own: `--iteration`, an option per input (type,
    default and help from the stage), `--config`, `--lake`; runs the stage and prints its summary line."""
    P, KO = inspect.Parameter, inspect.Parameter.KEYWORD_ONLY
    opts = [
        P("iteration", KO, default=typer.Option(0, "--iteration", "-i", help=stage.iteration_help()), annotation=int)
    ]
    for inp in stage.parameters():
        typ = inp.optional_type if inp.optional_type is not Any else str
        ann = Optional[typ] if not inp.required and inp.default is None else typ
        default = ... if inp.required else inp.default
        flag = f"--{inp.name.replace('_', '-')}"
        opts.append(P(inp.name, KO, default=typer.Option(default, flag, help=inp.description or None), annotation=ann))
    opts += [
        P("config", KO, default=CONFIG_OPT, annotation=Optional[str]),
        P("lake", KO, default=LAKE_OPT, annotation=Optional[str]),
    ]

    def command(**kw: Any) -> None:
        from rich.console import Console

        use_lake(kw.pop("lake"))
        cfg = load_cfg(kw.pop("config"))
        res = stage(cfg, kw.pop("iteration"), **kw)
        Console().print(f"{stage.name}: {res.summary()}", highlight=False)

    command.__signature__ = inspect.Signature(opts)  # what typer reads the options from
    command.__name__ = f"stage_{stage.name.replace('-', '_')}"
    command.__doc__ = stage.description or f"The {stage.name} stage."
    return command


def stage_app() -> typer.Typer:
    """The `flywheel stage` group: one command per registered stage, in pipeline order."""
    group = typer.Typer(help="Run one flywheel stage on its own.", no_args_is_help=True)
    for stage in STAGES:
        group.command(stage.name)(stage.command() or generic_command(stage))
    return group
