"""One RL round over the lake: the rollouts' step rows in, an update (+ rl.clone_steps), the round's records out.

    res = train_round(trainer, lake, ["<rollout run key>"], round_idx=0, iteration=0, run_key="rl-it0-...")

`trainer` is a training.rl.RLTrainer (kept across rounds: optimizer, weights, the stored-success index).
"""

from __future__ import annotations

from typing import Any, Sequence


def train_round(
    trainer: Any,
    lake: Any,
    run_keys: list[str],
    *,
    round_idx: int,
    iteration: int,
    run_key: str,
    git_sha: str | None = None,
    progress: bool = False,
    lines: bool = True,
    guide_keys: Sequence[str] = (),
) -> dict[str, Any]:
    """Load the rollouts' step rows (+ replay, + the teacher's `guide_keys` episodes), prepare, update, take the
    rl.clone_steps (training.rl_clone) unless the update hit rl.max_minutes, and write `rl_metrics` / `rl_rows`
    (stage rl, run key `run_key`, one part per round). Returns {"round_success", "summary", "stats", "n_rows",
    "stopped"}. `progress` draws the update's bar on a terminal; else `lines` logs progress lines."""
    from storage.catalog import connect
    from training.models import model_arch
    from training.rl_clone import clone_round
    from training.rl_data import lake_rows, load_rl_rows, stored_index

    s = trainer.s
    if trainer._stored is None or trainer._stored.lake is not lake:
        trainer._stored = stored_index(lake)  # kept across rounds: each opens only the new episode files
    con = connect(lake)
    rows = load_rl_rows(
        con,
        run_keys,
        arch=model_arch(trainer.model),
        opts=s.prompt_options,
        targets=s.targets,
        replay=s.replay,
        stored_context=s.distill_weight > 0,
        same_seed=s.stored_same_seed,
        lake=lake,
        guide_keys=guide_keys,
        guide=s.guide,
        index=trainer._stored,
    )
    rows, stats = trainer.prepare(rows)
    res = trainer.update(rows, round_idx=round_idx, progress=progress, lines=lines)
    if s.clone_steps and res["stopped"] != "budget":
        clone = clone_round(trainer, con, lake, round_idx=round_idx, lines=lines)
        for k, m in enumerate(clone):
            m["update_step"] = len(res["steps"]) + k
        res["steps"] += clone
        res["summary"].update(clone_steps=len(clone), clone_nll=sum(m["loss"] for m in clone) / max(len(clone), 1))
    metrics, row_rows = lake_rows(
        res, stats, round_idx=round_idx, run_key=run_key, run_keys=run_keys, git_sha=git_sha, config_hash=s.config_hash
    )
    part = f"r{round_idx:03d}"
    if trainer.ctx.main:  # under DDP every rank holds the same records; rank 0 writes them
        lake.write_many(
            [("rl_metrics", metrics), ("rl_rows", row_rows)],
            iteration=iteration,
            stage="rl",
            run_key=run_key,
            part=part,
        )
    return {
        "round_success": stats["round_success"],
        "summary": res["summary"],
        "stats": stats,
        "n_rows": len(rows),
        "stopped": res["stopped"],
    }
