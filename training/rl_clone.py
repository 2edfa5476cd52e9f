"""rl.clone_steps: behaviour-cloning steps interleaved with the policy updates (ReLIFT / SRFT-style RL + SFT).

    steps = clone_round(trainer, con, lake, round_idx=r)   # after the round's policy update; rl_metrics rows

After each round's policy update, the trainer takes `rl.clone_steps` optimizer steps of the token-mean NLL (SFT's
loss) on stored successes from the lake: teacher demos and the teacher's guidance episodes of earlier rounds and
this one (rl.guide); with rl.clone_source "all" also the student's own successes (rejection sampling). A fraction
`rl.clone_focus` of each batch is drawn from the RL tasks' successes, the rest from the other `rl.clone_tasks`
(rehearsal: the tasks the start was trained on stay learnt); of those RL-task draws, a fraction `rl.clone_hard` comes
from the answers to instances a round's student group failed entirely (ReLIFT's "hardest questions": the answers
rl.guide's teacher wrote for them). Draws are seeded by (rl.seed, round), with
replacement; each drawn episode contributes its step rows, rebuilt exactly as the policy update's rows
(training.rl_data.episode_rows). The optimizer (AdamW) and
its state are the policy update's, at `rl.clone_lr` (linear warmup over the run's first rl.clone_warmup clone
steps, then by default a cosine to 0 at the run's last clone step: clone_lr); the steps count towards
rl.max_minutes.

Why: on the 6M CPU student, GRPO's episode-level reward did not teach click-button's copy skill (docs/LOG.md,
sessions 3-11), while more SFT on teacher demos did; ReLIFT (Ma et al. 2025) interleaves SFT on the questions RL
fails for the same reason. The steps are logged as `rl_metrics` rows with algo 'clone' (loss = the NLL).
"""

from __future__ import annotations

import math
import time
from typing import Any, Sequence

CLONE_ALGO = "clone"


def draw(
    pool: dict[str, list[dict[str, Any]]],
    focus: Sequence[str],
    n: int,
    focus_frac: float,
    rng,
    hard: set[tuple[str, int]] = frozenset(),
    hard_frac: float = 0.0,
) -> list[dict[str, Any]]:
    """`n` episodes drawn with replacement from `pool` (task -> episodes): round(n x focus_frac) from the `focus`
    tasks, the rest from the other tasks (all n from whichever side is non-empty when the other is empty). Of the
    focus draws, round(k x hard_frac) come from the episodes whose (task_id, seed) is in `hard` (none when no
    such episode is in the pool)."""
    hot = [e for t in sorted(pool) if t in focus for e in pool[t]]
    rest = [e for t in sorted(pool) if t not in focus for e in pool[t]]
    if not hot and not rest:
        return []
    k = n if not rest else 0 if not hot else round(n * focus_frac)
    tough = [e for e in hot if (e["task_id"], int(e["seed"])) in hard] if hard_frac else []
    kh = round(k * hard_frac) if tough else 0
    idx_tough = rng.integers(len(tough), size=kh) if kh else []
    idx_hot = rng.integers(len(hot), size=k - kh) if k - kh else []
    idx_rest = rng.integers(len(rest), size=n - k) if n - k else []
    return [tough[i] for i in idx_tough] + [hot[i] for i in idx_hot] + [rest[i] for i in idx_rest]


# rl.clone_hard: the student's own attempts on the rounds' instances (a sampled episode carries its reward)
ATTEMPT_WHERE = "stage = 'rl' AND policy = 'student' AND split = 'train' AND task_reward IS NOT NULL"


def attempts_index(lake: Any):
    """The student's RL attempts (task_id, seed, success), read through storage.catalog.FilteredRows (kept on the
    trainer, as training.rl_data.stored_index)."""
    from storage.catalog import FilteredRows

    return FilteredRows(lake, "episodes", "task_id, seed, success", ATTEMPT_WHERE)


def hard_instances(attempts: Sequence[dict[str, Any]], tasks: Sequence[str]) -> set[tuple[str, int]]:
    """rl.clone_hard: the (task_id, seed) instances of these tasks among `attempts` (attempts_index's rows) whose
    student episodes all failed (the instances the policy could not solve when it met them)."""
    seen: set[tuple[str, int]] = set()
    solved: set[tuple[str, int]] = set()
    for a in attempts:
        if a["task_id"] in tasks:
            key = (a["task_id"], int(a["seed"]))
            seen.add(key)
            if a["success"]:
                solved.add(key)
    return seen - solved


def clone_lr(s: Any, n_done: int) -> float:
    """The learning rate of a run's clone step after `n_done` others: linear warmup over rl.clone_warmup steps, then
    constant or cosine to 0 at the run's last (rl.rounds x rl.clone_steps) -- a function of the step alone, so a
    resumed run takes the same steps."""
    warm = min(1.0, (n_done + 1) / s.clone_warmup) if s.clone_warmup else 1.0
    if s.clone_schedule == "constant":
        return s.clone_lr * warm
    total = max(s.rounds * s.clone_steps, 1)
    return s.clone_lr * warm * 0.5 * (1.0 + math.cos(math.pi * min(n_done, total) / total))


def clone_rows(con, lake: Any, episodes: Sequence[dict[str, Any]], *, arch: str, opts, targets: str) -> list[dict]:
    """The step rows of the drawn episodes, in draw order (an episode drawn twice gives its rows twice)."""
    from training.rl_data import _steps_of, episode_rows

    uniq = {e["episode_id"]: e for e in episodes}
    steps = _steps_of(con, list(uniq.values()), lake)
    rows = {k: episode_rows(e, steps[k], arch=arch, opts=opts, targets=targets, replayed=True) for k, e in uniq.items()}
    return [r for e in episodes for r in rows[e["episode_id"]]]


def clone_round(trainer: Any, con, lake: Any, *, round_idx: int, lines: bool = True) -> list[dict[str, Any]]:
    """`rl.clone_steps` NLL steps of `trainer` on stored successes (module doc); their rl_metrics-shaped records.
    `lines`: log progress lines (training.progress) on DDP rank 0."""
    import numpy as np
    import torch

    from training.models import model_arch
    from training.progress import ProgressLog
    from training.rl_data import stored_successes
    from training.rl_encode import length_batches, response_logprobs

    s = trainer.s
    tasks = list(dict.fromkeys([*s.focus_tasks, *s.clone_tasks]))
    pool = stored_successes(con, tasks, [], index=trainer._stored)
    if s.clone_source == "teacher":  # a sampled success may carry a garbled Action line (rl.clone_source)
        pool = {t: [e for e in eps if e["policy"] != "student"] for t, eps in pool.items()}
    rng = np.random.default_rng([s.seed, round_idx, 7])
    hard: set[tuple[str, int]] = set()
    if s.clone_hard:
        if trainer._attempts is None or trainer._attempts.lake is not lake:
            trainer._attempts = attempts_index(lake)  # kept across rounds, as trainer._stored
        hard = hard_instances(trainer._attempts.rows(con), s.focus_tasks)
    picked = draw(pool, s.focus_tasks, s.clone_steps * s.clone_batch, s.clone_focus, rng, hard, s.clone_hard)
    rows = clone_rows(con, lake, picked, arch=model_arch(trainer.model), opts=s.prompt_options, targets=s.targets)
    encoded: dict[int, Any] = {}  # id(row) -> (encoding, response length) or None: a row drawn twice is encoded once
    for r in rows:
        if id(r) not in encoded:
            ids = trainer.encoder.response_ids(r)
            ok = ids and trainer.encoder.scorable(ids)
            encoded[id(r)] = (trainer.encoder.encode(r["messages"], r["images"], ids), len(ids)) if ok else None
    drawn = [encoded[id(r)] for r in rows if encoded[id(r)] is not None]
    enc, n_resp = [e for e, _ in drawn], [n for _, n in drawn]
    out: list[dict[str, Any]] = []
    n = min(len(enc), s.clone_steps * s.clone_batch)
    plog = ProgressLog(
        f"rl round {round_idx + 1} clone",
        math.ceil(n / s.clone_batch),
        quiet=not lines or not n or not trainer.ctx.main,
    )
    for k in range(0, n, s.clone_batch):
        if s.max_minutes and trainer.state.elapsed_s >= s.max_minutes * 60:
            trainer.state.stopped = "budget"
            break
        t0 = time.monotonic()
        mb = list(range(k, min(k + s.clone_batch, len(enc))))
        n_tok = sum(n_resp[i] for i in mb)  # the step's token-mean normaliser, over its micro-batches
        acc = {"loss": 0.0, "ent": 0.0}
        for idx in length_batches(mb, enc, s.micro_batch or len(mb)):
            batch, pos, mask = trainer.encoder.pad([enc[i] for i in idx], trainer.device, trainer.pixel_dtype)
            logp, ent = response_logprobs(trainer.model, batch, pos, mask, entropy=True)
            nll = -torch.where(mask, logp, torch.zeros_like(logp)).sum()
            (nll / n_tok).backward()
            acc["loss"] += float(nll.detach())
            acc["ent"] += float(torch.where(mask, ent, torch.zeros_like(ent)).sum())
        lr = clone_lr(s, round_idx * s.clone_steps + k // s.clone_batch)
        grad_norm = trainer.apply_step(lr, len(mb), n_tok)
        trainer.count_time(t0)
        out.append(
            dict(
                round=round_idx,
                global_step=trainer.state.step - 1,
                epoch=None,
                algo=CLONE_ALGO,
                loss=acc["loss"] / n_tok,
                entropy=acc["ent"] / n_tok,
                grad_norm=grad_norm,
                lr=lr,
                n_rows=len(mb),
                n_tokens=n_tok,
            )
        )
        plog.update(len(out), loss=out[-1]["loss"])
    plog.stop()
    return out
