"""The RL stage: rounds of sample -> group advantages -> update -> reload, on one pool of rollout workers.

    res = rl_stage(cfg, iteration=0, checkpoint="lake/_checkpoints/sft-it0-...", algo="grpo", rounds=4)

Each round:
  1. samples `rl.group_size` episodes per task instance with the current weights through the rollout runner
     (stage `rl`, one run key per round, so the lake partitions rounds by run key and `policy_version`);
  2. computes per-episode advantages within each group (training.rl, pure torch; replay of stored
     successes for all-failed groups);
  3. updates on the step rows (each step's own prompt and screenshots, its stored response tokens);
  4. saves the round's weights under `<lake>/_checkpoints/<rl run id>/round-<r>` and reloads them in the
     rollout workers in place (browsers keep running).

Resume: a round is finished when its folder holds `rl_round.json` (written last, after the weights and the
optimizer state). A rerun skips finished rounds, starts from the last finished round's weights and
optimizer state, and its rollouts fill in only the episodes missing from the lake, so a SIGKILLed run
continues where it stopped and a finished run is a no-op. Held-out tasks are rejected (resolve_tasks).
"""

from __future__ import annotations

import json
import shutil
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from configs.models import FlywheelConfig
from configs.runkeys import keyed, run_key
from flywheel.errors import UserError
from flywheel.evaluate import save_png
from flywheel.runtime.rollout import PolicySpec, RolloutPool, git_sha, run_rollouts
from storage.lake import Lake
from training import distributed

ROUND_DONE = "rl_round.json"
LAUNCH_FILE, RESULT_FILE = "ddp_job.json", "ddp_result.json"  # rl.distributed ddp: the workers' job and rank 0's result
# RL samples task instances of its own: train seeds after every bootstrap / rollout range this config can use
RL_SEED_OFFSET = 5000
# rl.clone_fresh: the teacher's fresh instances, between the bootstrap's / rollouts' low seeds and RL's own
FRESH_SEEDS = (1000, RL_SEED_OFFSET)


def _rl_tasks(cfg: FlywheelConfig) -> list[str]:
    return cfg.rl.tasks or cfg.rollouts.selection.tasks


def rl_run_id(cfg: FlywheelConfig, iteration: int, base: str, algo: str) -> str:
    # keyed: without the RUNTIME fields (rl.distributed, rl.nproc: how the update is spread over processes)
    payload = {"base": base, "algo": algo, "rl": keyed(cfg.rl), "tasks": _rl_tasks(cfg), "student": keyed(cfg.student)}
    return run_key(f"rl-it{iteration}-{algo}", payload)


def _round_seeds(cfg: FlywheelConfig, iteration: int, r: int) -> list[int]:
    """The round's task instances: consecutive train seeds from RL_SEED_OFFSET, a run seed (rl.seed) shifting the
    window, so runs with different seeds sample different instances (and never the bootstrap's low seeds)."""
    from envs import registry

    n = cfg.rl.seeds_per_task_per_round
    lo, hi = registry.SPLITS["train"]
    return _seed_window(cfg, iteration, r, n, RL_SEED_OFFSET, hi - lo - RL_SEED_OFFSET - n)


def _seed_window(cfg: FlywheelConfig, iteration: int, r: int, n: int, start: int, span: int) -> list[int]:
    """n consecutive train seeds from `start` + a shift in [0, span) that moves by n each round of each iteration
    and by rl.seed."""
    from envs import registry

    return registry.seeds("train", n, offset=start + ((iteration * cfg.rl.rounds + r) * n + cfg.rl.seed * 1543) % span)


def _fresh_seeds(cfg: FlywheelConfig, iteration: int, r: int) -> list[int]:
    """rl.clone_fresh: the round's fresh instances for the teacher, consecutive train seeds in FRESH_SEEDS (never
    sampled by a round, never an eval seed), the window moving by round and rl.seed as _round_seeds' does."""
    n = cfg.rl.clone_fresh
    lo, hi = FRESH_SEEDS
    return _seed_window(cfg, iteration, r, n, lo, hi - lo - n + 1)


def _finished_rounds(out: Path, rounds: int) -> int:
    done = 0
    while done < rounds and (out / f"round-{done}" / ROUND_DONE).exists():
        done += 1
    return done


def _policy(cfg: FlywheelConfig, model: str, version: str) -> PolicySpec:
    student = cfg.student.policy_config(model=model, temperature=cfg.rl_temperature())
    return PolicySpec("student", {"model": model, "config": student}, version=version)


def _save_round(model, processor, trainer_state: dict[str, Any], rdir: Path, info: dict[str, Any]) -> None:
    """Weights + processor + optimizer state, then the done marker last (a half-written round is redone)."""
    import torch

    tmp = rdir.with_name(rdir.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    processor.save_pretrained(tmp)
    torch.save(trainer_state, tmp / "trainer_state.pt")
    shutil.rmtree(rdir, ignore_errors=True)
    tmp.rename(rdir)
    (rdir / ROUND_DONE).write_text(json.dumps(info, indent=1, default=str))


def plot_rl_metrics(lake: Lake, run_id: str, out: Path) -> Path | None:
    """Per policy-update step: loss, entropy, clip fraction, approx KL, grad norm, |advantage|; per round: success;
    per rl.clone_steps step (algo 'clone'): its NLL."""
    from storage.catalog import connect

    cols = ["loss", "entropy", "clip_frac", "approx_kl", "grad_norm", "adv_abs", "round_success"]
    con = connect(lake)
    rows = con.execute(
        f"SELECT global_step, {', '.join(cols)} FROM rl_metrics WHERE run_key = ? "
        "AND algo IS DISTINCT FROM 'clone' ORDER BY global_step",
        [run_id],
    ).fetchall()
    clone = con.execute(
        "SELECT global_step, loss FROM rl_metrics WHERE run_key = ? AND algo = 'clone' ORDER BY global_step", [run_id]
    ).fetchall()
    if not rows and not clone:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 4, figsize=(12, 5), dpi=90)
    steps = [r[0] for r in rows]
    for ax, (i, name) in zip(axes.flat, enumerate(cols, start=1)):
        ax.plot(steps, [r[i] for r in rows], "-o" if len(rows) < 30 else "-", ms=3)
        ax.set_title(name, fontsize=9)
        ax.grid(alpha=0.3)
    if clone:
        axes.flat[-1].plot([c[0] for c in clone], [c[1] for c in clone], "-", color="tab:green")
        axes.flat[-1].set_title("clone NLL", fontsize=9)
        axes.flat[-1].grid(alpha=0.3)
    else:
        axes.flat[-1].axis("off")
    fig.suptitle(f"{run_id}: per optimizer step", fontsize=10)
    return save_png(fig, out)


def _stored_groups(lake: Lake, iteration: int) -> tuple[list[str], int]:
    """Run keys and episode count of the iteration's student rollout groups (rl.source: lake)."""
    from storage.catalog import connect

    rows = (
        connect(lake)
        .execute(
            "SELECT run_key, count(*) FROM episodes WHERE stage = 'rollouts' AND iteration = ? AND policy = 'student' "
            "AND group_id IS NOT NULL GROUP BY run_key ORDER BY run_key",
            [iteration],
        )
        .fetchall()
    )
    if not rows:
        raise UserError(
            f"rl.source is 'lake' but iteration {iteration} has no student rollout groups in {lake.root}: "
            "run the rollouts stage first (rollout.group_size >= 2 gives the groups a signal)"
        )
    return [k for k, _ in rows], sum(n for _, n in rows)


def rl_stage(
    cfg: FlywheelConfig,
    iteration: int,
    checkpoint: str,
    *,
    lake: Lake,
    algo: str | None = None,
    rounds: int | None = None,
    progress: bool = True,
) -> dict[str, Any]:
    from flywheel.specs import resolve_tasks

    algo = algo or cfg.rl.algorithm
    if rounds is not None:
        cfg = cfg.model_copy(update={"rl": cfg.rl.model_copy(update={"rounds": rounds})})
    tasks = resolve_tasks(_rl_tasks(cfg), for_training=True)
    resolve_tasks(cfg.rl.clone_tasks or [], for_training=True)  # rl.clone_steps never learns a held-out task
    base = str(lake.resolve(checkpoint)) if not Path(checkpoint).is_absolute() else checkpoint
    if not Path(base).exists():
        raise UserError(
            f"RL start checkpoint {checkpoint} does not exist; run the sft stage first or pass --checkpoint"
        )
    run_id = rl_run_id(cfg, iteration, lake.rel(base), algo)
    out = lake.root / "_checkpoints" / run_id
    out.mkdir(parents=True, exist_ok=True)
    if cfg.rl.distributed == "ddp" and not distributed.in_worker() and distributed.nproc_for(cfg.rl) > 1:
        return _launch(cfg, iteration, base, algo, lake, out, progress=progress)
    ctx = distributed.setup()
    try:
        start, history, current = _rounds(cfg, iteration, base, algo, lake, out, run_id, tasks, ctx, progress=progress)
    finally:
        distributed.teardown(ctx)
    if not ctx.main:
        return {}
    row = dict(
        checkpoint_id=run_id,
        path=lake.rel(current),
        method=f"rl-{algo}",
        base_model=lake.rel(base),
        parent_checkpoint=lake.rel(base),
        dataset_id=None,
        adapter=False,
        metrics=json.dumps({"rounds": cfg.rl.rounds, "history": history}, default=str),
        created_at=datetime.now(timezone.utc),
        run_key=run_id,
        git_sha=git_sha(),
        config_hash=cfg.config_hash("rl"),
    )
    lake.replace_run("checkpoints", [[row]], iteration=iteration, stage="rl", run_key=run_id)
    plot = plot_rl_metrics(lake, run_id, lake.root / "_reports" / f"{run_id}.png")
    return {
        "checkpoint_id": run_id,
        "checkpoint": current,
        "model_path": current,
        "algo": algo,
        "plot": str(plot) if plot else None,
        "rounds": cfg.rl.rounds,
        "resumed_from_round": start,
        "history": history,
        "skipped": False,
    }


def _rounds(
    cfg: FlywheelConfig,
    iteration: int,
    base: str,
    algo: str,
    lake: Lake,
    out: Path,
    run_id: str,
    tasks: list[str],
    ctx,
    *,
    progress: bool,
) -> tuple[int, list[dict[str, Any]], str]:
    """The rounds not yet finished: sample (or take the stored groups), update, save, reload; under DDP (rl.source
    lake) every rank runs them, rank 0 saves. Returns (first round run here, their history, the last round's folder)."""
    from flywheel.specs import rollout_spec
    from training import rl as rlcore
    from training.models import load_model
    from training.progress import ProgressLog, draws_bar

    start = _finished_rounds(out, cfg.rl.rounds)
    current = str(out / f"round-{start - 1}") if start else base
    model, processor = load_model(current)
    trainer = rlcore.RLTrainer(model, processor, rlcore.RLSettings.from_config(cfg, algo), base_model=base, ctx=ctx)
    if start:
        trainer.load_state(Path(current) / "trainer_state.pt")
    from flywheel.teacher_budget import spend_index

    history, pool, guides, guide_keys, spend = [], None, None, [], None
    sample_cfg = (
        cfg
        if not cfg.rl.end_on_parse_error
        else cfg.model_copy(update={"rollout": cfg.rollout.model_copy(update={"on_parse_error": "end"})})
    )
    stored = _stored_groups(lake, iteration) if cfg.rl.source == "lake" else None
    lines = not draws_bar(progress)  # where no bar draws: a progress line per round and for the update / clone steps
    plog = ProgressLog("rl", cfg.rl.rounds, start, unit="round", quiet=not lines or not ctx.main)
    try:
        for r in range(start, cfg.rl.rounds):
            if stored is not None:  # decoupled: the groups were sampled elsewhere (stage rollouts)
                keys, n_episodes = stored
            else:
                spec = rollout_spec(
                    sample_cfg,
                    iteration=iteration,
                    stage="rl",
                    policy=_policy(cfg, current, current),
                    tasks=tasks,
                    seeds=_round_seeds(cfg, iteration, r),
                    split="train",
                    group_size=cfg.rl.group_size,
                )
                if pool is None:
                    pool = RolloutPool(spec)
                keys, n_episodes = [spec.run_key], run_rollouts(spec, progress=progress, pool=pool).total
                if (cfg.rl.guide != "off" or cfg.rl.clone_fresh) and spend is None:
                    spend = spend_index(lake)  # the teacher budget's count, kept current run by run
                if cfg.rl.guide != "off":
                    guide_keys, guides = _guide(
                        cfg, iteration, spec.run_key, lake, guides, progress=progress, spend=spend
                    )
                if cfg.rl.clone_fresh:
                    guides = _teach_fresh(cfg, iteration, r, tasks, guides, progress=progress, spend=spend)
            res = trainer.train_round(
                lake,
                keys,
                round_idx=r,
                iteration=iteration,
                run_key=run_id,
                git_sha=git_sha(),
                guide_keys=guide_keys,
                lines=lines,
            )
            rdir = out / f"round-{r}"
            info = {
                "round": r,
                "rollout_run_key": keys[0] if len(keys) == 1 else keys,
                "episodes": n_episodes,
                "round_success": res.get("round_success"),
                "metrics": res.get("summary", {}),
            }
            if ctx.main:
                _save_round(trainer.model, processor, trainer.state_dict(), rdir, info)
            distributed.barrier(ctx)
            current = str(rdir)
            if pool is not None:
                pool.reload(current, version=current)
            history.append(info)
            plog.update(r + 1, success=res.get("round_success"))
    finally:
        plog.stop()
        for p in (pool, guides):
            if p is not None:
                p.close()
    return start, history, current


def _guide(
    cfg: FlywheelConfig, iteration: int, round_key: str, lake: Lake, pool, *, progress: bool, spend=None
) -> tuple[list[str], Any]:
    """rl.guide: the bootstrap teacher solves the round's instances whose group has a failure ("all") or only
    failures ("failed"), one episode each, into the lake (stage rl, a run key of its own: a rerun of the round
    finds them). Returns ([its run key] or [], the teacher's rollout pool, started on first use and kept)."""
    from storage.catalog import connect, runs_sql

    need = "count(*) FILTER (WHERE NOT success) > 0"
    if cfg.rl.guide == "failed":
        need += " AND bool_or(success) IS NOT TRUE"
    got = (
        connect(lake)
        .execute(
            f"SELECT task_id, seed FROM ({runs_sql(lake, 'episodes', [round_key])}) WHERE run_key = ? "
            f"AND task_reward IS NOT NULL GROUP BY task_id, seed "
            f"HAVING {need} ORDER BY task_id, seed",
            [round_key],
        )
        .fetchall()
    )
    if not got:
        return [], pool
    task_seeds: dict[str, list[int]] = {}
    for task, seed in got:
        task_seeds.setdefault(task, []).append(int(seed))
    key, pool = _teach(
        cfg,
        iteration,
        pool,
        progress=progress,
        what="rl.guide",
        spend=spend,
        tasks=sorted(task_seeds),
        seeds=[],
        task_seeds=task_seeds,
    )
    return ([key] if key else []), pool


def _teach_fresh(cfg: FlywheelConfig, iteration: int, r: int, tasks: list[str], pool, *, progress: bool, spend=None):
    """rl.clone_fresh: the bootstrap teacher solves the round's fresh instances of the RL tasks, one episode each,
    into the lake (stage rl, a run key of their own: a rerun of the round finds them). They join no group as
    guidance; the clone steps (and replay) draw them as stored successes. Returns the teacher's rollout pool."""
    return _teach(
        cfg,
        iteration,
        pool,
        progress=progress,
        what="rl.clone_fresh",
        spend=spend,
        tasks=tasks,
        seeds=_fresh_seeds(cfg, iteration, r),
    )[1]


def _teach(
    cfg: FlywheelConfig, iteration: int, pool, *, progress: bool, what: str = "rl", spend=None, **instances
) -> tuple[str | None, Any]:
    """The bootstrap teacher's episodes on these instances (rollout_spec's tasks / seeds / task_seeds), one each,
    into the lake under stage rl, within the teacher budget left (flywheel/teacher_budget.py: its jobs are cut to
    the episodes and dollars left; a spent budget runs none and logs it; `spend`: the stage's spend_index).
    Returns (their run key, None when the budget left it no episode; the teacher's rollout pool: started on first
    use)."""
    from flywheel.specs import rollout_spec, teacher_policy
    from flywheel.teacher_budget import cap_teacher_spec

    spec = rollout_spec(cfg, iteration=iteration, stage="rl", policy=teacher_policy(cfg), split="train", **instances)
    spec, _ = cap_teacher_spec(cfg, spec, what=what, index=spend)
    if not spec.jobs:
        return None, pool
    pool = pool or RolloutPool(spec)
    run_rollouts(spec, progress=progress, pool=pool)
    return spec.run_key, pool


def _launch(
    cfg: FlywheelConfig, iteration: int, base: str, algo: str, lake: Lake, out: Path, *, progress: bool
) -> dict[str, Any]:
    """rl.distributed ddp: this stage again under torchrun, one process per GPU; rank 0's result."""
    job = out / LAUNCH_FILE
    job.write_text(
        json.dumps({"config": cfg.model_dump(mode="json"), "iteration": iteration, "checkpoint": base, "algo": algo})
    )
    (out / RESULT_FILE).unlink(missing_ok=True)
    env = {"FLYWHEEL_LAKE": lake.uri, **({"FLYWHEEL_S3_ENDPOINT": lake.endpoint} if lake.endpoint else {})}
    distributed.torchrun(
        "flywheel.rl_stage",
        [str(job)] + ([] if progress else ["--no-progress"]),
        distributed.nproc_for(cfg.rl),
        progress=progress,
        env=env,
        what="DDP RL",
    )
    return json.loads((out / RESULT_FILE).read_text())


def main(argv: list[str] | None = None) -> None:
    """A torchrun worker of `_launch`: python -m flywheel.rl_stage <job.json> [--no-progress]."""
    import argparse

    from configs.models import FlywheelConfig as Cfg
    from flywheel.specs import lake_for

    ap = argparse.ArgumentParser()
    ap.add_argument("job", type=Path)
    ap.add_argument("--no-progress", action="store_true")
    a = ap.parse_args(argv)
    job = json.loads(a.job.read_text())
    cfg = Cfg.model_validate(job["config"])
    res = rl_stage(
        cfg, job["iteration"], job["checkpoint"], lake=lake_for(cfg), algo=job["algo"], progress=not a.no_progress
    )
    if res:
        (a.job.parent / RESULT_FILE).write_text(json.dumps(res, default=str))
    distributed.exit_worker()  # a torchrun rank ends here, skipping the shutdown that could abort it


if __name__ == "__main__":
    main()
