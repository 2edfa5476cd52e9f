"""RL training rows from the lake: one row per episode step, group advantages, replay and SDPO teacher context.

    rows = load_rl_rows(con, ["rl-it0-r0"], arch="qwen3-vl", opts=opts, targets="action", replay=True)
    attach_sdpo_context(rows, "both")                                # who the SDPO teacher sees, per row
    rows, stats = assign_advantages(rows, mode="zscore", drop_zero_variance=True, keep_sdpo_rows=True)
    rows, stats = assign_advantages(rows, gigpo_omega=1.0, gigpo_gamma=0.95)  # + GiGPO step-level groups

A row is one action step of an episode, rebuilt exactly as rollouts and SFT build it (agents.prompts.build_prompt
through the same history records as training.data.episode_samples: the instruction, earlier steps as text, the
K-screenshot window, the UI text in the model's coordinate space), plus the response the policy produced:
`steps.token_ids` with `steps.logprobs` (the sampler's behaviour log-probs). Final observation rows and steps
without token ids are skipped; steps whose output did not parse are kept (the model's own output, trained with
its episode's advantage). Rows are plain dicts (keys below), so tests and callers can build them directly.

Replay (ARPO / DART-GUI): a group whose episodes all failed gets a stored success of the same task from the lake
(a teacher demo or an earlier student success, outside the rollouts being trained on; same seed preferred, then
the newest) as an extra member with reward 1, so the group has a signal. Its steps carry no student tokens when
the teacher is scripted: the response is its SFT target text (training.data.target_text, retargeted to the SFT
target format) tokenised as SFT does; its behaviour log-probs are unknown (training.rl scores it under the current
weights, IS weight 1). Every iteration writes new episodes, so the lake is the replay buffer.

Row keys: episode_id, step_idx, group_id, task_id, seed, reward, success, replayed, policy, messages, images,
response_ids (list[int] | None), behaviour_logp (list[float] | None), target_text (str | None: replayed demo
steps), parse_error, solution (the episode's action sequence when it succeeded), feedback (the failure text when
it did not), screen_hash (sha1 of the step's screenshot PNG bytes: the GiGPO anchor), episode_steps (the episode's
action steps); attach_sdpo_context adds sdpo_solution, sdpo_sibling_episode_id, sdpo_feedback, sdpo;
assign_advantages adds advantage and group_kept (and step_advantage with GiGPO on). `lake_rows` shapes an update's
results as `rl_metrics` / `rl_rows` rows (storage/schema.py).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any

from agents.prompts import PromptOptions, build_prompt, cite_marks, transform_for
from training.data import _action, history_record, retarget, target_text

_STEP_COLS = (
    "episode_id, step_idx, screenshot, screen_w, screen_h, ui_text, thought, action_desc, raw_action, action, "
    "parse_ok, parse_error, exec_error, token_ids, logprobs, feedback"
)
_EP_COLS = (
    "episode_id, task_id, seed, instruction, policy, group_id, sample_idx, "
    "task_reward, success, status, n_steps, run_key"
)


# ------------------------------------------------------------------------------------------------ one episode
def solution_text(steps: Sequence[dict[str, Any]], arch: str, space: str = "native") -> str:
    """A successful episode's action sequence as the SDPO teacher sees it: each parsed step's reply without the
    thought (the model text format, model coordinate space), numbered."""
    out = []
    for s in steps:
        text = step_action_text(s, transform_for(arch, int(s["screen_w"]), int(s["screen_h"]), space=space))
        if text is not None:  # a reply that did not parse did nothing
            out.append(f"Step {int(s['step_idx']) + 1}:\n{text}")
    return "\n".join(out)


def step_action_text(step: dict[str, Any], t: Any) -> str | None:
    """One parsed step's reply without its thought, in the model text format and coordinates `t`; None unparsed."""
    from agents.parsing import format_response

    action = _action(step)
    return None if action is None else format_response(None, step.get("action_desc") or "", action, t)


def feedback_text(episode: dict[str, Any], steps: Sequence[dict[str, Any]], arch: str, space: str = "native") -> str:
    """What went wrong in a failed episode, for the SDPO teacher: its length and status, the last action and
    its result, how many replies did not parse, and the env's own feedback text when it gave any."""
    from agents.parsing import action_text_for_history

    n = len(steps)
    status = episode.get("status") or "ok"
    how = {
        "truncated": " (it hit the step limit)",
        "timeout": " (it ran out of time)",
        "error": " (the environment failed)",
    }.get(status, "")
    parts = [f"The episode ended without success after {n} step{'s' if n != 1 else ''}{how}."]
    if steps:
        last = steps[-1]
        t = transform_for(arch, int(last["screen_w"]), int(last["screen_h"]), space=space)
        rec = history_record(last, t)
        act = action_text_for_history(rec.action, t) if rec.action is not None else "(no valid action)"
        desc = f"{rec.action_desc} -> " if rec.action_desc else ""
        parts.append(f"Last action: {desc}{act} [{rec.result}].")
    bad = sum(_action(s) is None for s in steps)
    if bad:
        parts.append(f"{bad} of your replies did not parse into an action.")
    env = [s["feedback"] for s in steps if s.get("feedback")]
    if env:
        parts.append(f"Environment feedback: {env[-1]}")
    return " ".join(parts)


def episode_rows(
    episode: dict[str, Any],
    steps: Sequence[dict[str, Any]],
    *,
    arch: str,
    opts: PromptOptions,
    targets: str = "full",
    replayed: bool = False,
    group_id: str | None = None,
) -> list[dict[str, Any]]:
    """Training rows of one episode (an `episodes` row and its non-final `steps` rows, any order).

    A step with token ids is a row (its response = those ids, behaviour = its logprobs). Without token ids, a
    `replayed` episode's parsed step is a row whose response is its SFT target text; other steps only appear in
    later steps' history. `group_id` overrides the episode's (a replayed episode joins another group)."""
    steps = sorted((s for s in steps if not s.get("is_final")), key=lambda s: int(s["step_idx"]))
    for i, s in enumerate(steps):
        if int(s["step_idx"]) != i:
            raise ValueError(
                f"episode {episode['episode_id']}: steps must be complete (got step_idx "
                f"{s['step_idx']} at position {i})"
            )
    success = bool(episode.get("success"))
    reward = 1.0 if replayed else float(episode.get("task_reward") or 0.0)
    common = dict(
        episode_id=episode["episode_id"],
        group_id=group_id or episode.get("group_id") or episode["episode_id"],
        task_id=episode.get("task_id"),
        seed=episode.get("seed"),
        reward=reward,
        success=success or replayed,
        replayed=replayed,
        policy=episode.get("policy"),
        solution=solution_text(steps, arch, opts.coord_space) if (success or replayed) else None,
        feedback=None if (success or replayed) else feedback_text(episode, steps, arch, opts.coord_space),
        episode_steps=len(steps),
    )
    rows, history = [], []
    for s in steps:
        ids, target = s.get("token_ids"), None
        t = transform_for(arch, int(s["screen_w"]), int(s["screen_h"]), space=opts.coord_space)
        if not ids and replayed and _action(s) is not None:
            target = retarget(cite_marks(target_text(s, t), s.get("ui_text"), opts, t), targets)
        if ids or target:
            prompt = build_prompt(episode.get("instruction") or "", s["screenshot"], s.get("ui_text"), history, opts, t)
            lp = s.get("logprobs")
            rows.append(
                dict(
                    common,
                    step_idx=int(s["step_idx"]),
                    messages=prompt.messages,
                    images=list(prompt.images),
                    response_ids=[int(x) for x in ids] if ids else None,
                    behaviour_logp=[float(x) for x in lp] if ids and lp and len(lp) == len(ids) else None,
                    target_text=target,
                    parse_error=_action(s) is None,
                    screen_hash=screen_hash(s),
                    step_action=step_action_text(s, t) if (success or replayed) else None,
                )
            )
        history.append(history_record(s, t))
    return rows


def screen_hash(step: dict[str, Any]) -> str | None:
    """The GiGPO anchor of a step: sha1 of its screenshot's PNG bytes (the observation the policy acted on)."""
    png = step.get("screenshot")
    return hashlib.sha1(bytes(png)).hexdigest() if png else None


# ------------------------------------------------------------------------------------------------ the lake
def _query(con, sql: str, params: list[Any]) -> list[dict[str, Any]]:
    return con.sql(sql, params=params).to_arrow_table().to_pylist()


def _source(lake: Any, table: str, run_keys: Sequence[str]) -> str:
    """The table's view, or with a lake only the files of these run keys (catalog.runs_sql)."""
    from storage.catalog import runs_sql

    return f"({runs_sql(lake, table, sorted(set(run_keys)))})" if lake is not None else table


def _steps_of(con, episodes: Sequence[dict[str, Any]], lake: Any = None) -> dict[str, list[dict[str, Any]]]:
    """The non-final steps of these episodes (rows with episode_id and run_key), in order, per episode id."""
    out: dict[str, list[dict[str, Any]]] = {e["episode_id"]: [] for e in episodes}
    if not episodes:
        return out
    src = _source(lake, "steps", [e["run_key"] for e in episodes])
    got = _query(
        con,
        f"SELECT {_STEP_COLS} FROM {src} WHERE NOT is_final AND list_contains($1, episode_id) "
        f"ORDER BY episode_id, step_idx",
        [list(out)],
    )
    for s in got:
        out[s["episode_id"]].append(s)
    return out


STORED_WHERE = "success AND status = 'ok' AND split = 'train'"


def stored_index(lake: Any):
    """The lake's stored successes (storage.catalog.FilteredRows): one per RL run, passed to load_rl_rows."""
    from storage.catalog import FilteredRows

    return FilteredRows(lake, "episodes", _EP_COLS + ", ended_at", STORED_WHERE)


def stored_successes(
    con, task_ids: Sequence[str], exclude_run_keys: Sequence[str], index: Any = None
) -> dict[str, list[dict[str, Any]]]:
    """Successful train-split episodes of these tasks outside `exclude_run_keys`, per task, newest first (`index`:
    a stored_index, the same rows without reading every file of the table)."""
    if not task_ids:
        return {}
    if index is None:
        rows = _query(
            con,
            f"SELECT {_EP_COLS} FROM episodes WHERE {STORED_WHERE} "
            f"AND list_contains($1, task_id) AND NOT list_contains($2, run_key) "
            f"ORDER BY task_id, ended_at DESC NULLS LAST, episode_id",
            [list(task_ids), list(exclude_run_keys)],
        )
    else:  # the same filter and order as the query above
        tasks, skip = set(task_ids), set(exclude_run_keys)
        rows = sorted(
            (r for r in index.rows(con) if r["task_id"] in tasks and r["run_key"] not in skip),
            key=lambda r: r["episode_id"],
        )
        rows.sort(key=lambda r: (0,) if r["ended_at"] is None else (1, r["ended_at"]), reverse=True)
        rows = [{k: v for k, v in r.items() if k != "ended_at"} for r in sorted(rows, key=lambda r: r["task_id"])]
    out: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        out.setdefault(r["task_id"], []).append(r)
    return out


def _pick(cands: list[dict[str, Any]], seed: Any, same_seed: bool = False, turn: int = 0) -> list[dict[str, Any]]:
    """Candidates in the order tried: the same task instance (seed) first (newest first), then the others (none
    when `same_seed`), rotated by `turn` so that the all-failed groups of one round replay different stored
    successes instead of all the newest one."""
    same = [e for e in cands if e["seed"] == seed]
    if same_seed:
        return same
    other = [e for e in cands if e["seed"] != seed]
    k = turn % len(other) if other else 0
    return same + other[k:] + other[:k]


def _join_guides(
    con,
    rows: list[dict[str, Any]],
    groups: dict[str, list[dict[str, Any]]],
    guide_keys: Sequence[str],
    guide: str,
    *,
    arch: str,
    opts: PromptOptions,
    targets: str,
    lake: Any,
) -> set[str]:
    """rl.guide: append the teacher's successful episode of each group's (task, seed) to `rows` as a replayed
    member of that group (when the group has a failure, or only failures with `guide` "failed"); the group ids
    that got one."""
    if not guide_keys:
        return set()
    eps = _query(
        con,
        f"SELECT {_EP_COLS} FROM {_source(lake, 'episodes', list(guide_keys))} WHERE "
        f"list_contains($1, run_key) AND {STORED_WHERE} ORDER BY episode_id",
        [list(guide_keys)],
    )
    by_instance = {(e["task_id"], e["seed"]): e for e in eps}
    steps = _steps_of(con, eps, lake)
    joined: set[str] = set()
    for g, members in groups.items():
        fails = sum(not m["success"] for m in members)
        e = by_instance.get((members[0]["task_id"], members[0]["seed"]))
        if e is None or fails == 0 or (guide == "failed" and fails < len(members)):
            continue
        got = episode_rows(e, steps[e["episode_id"]], arch=arch, opts=opts, targets=targets, replayed=True, group_id=g)
        if got:
            rows += got
            joined.add(g)
    return joined


def load_rl_rows(
    con,
    run_keys: Sequence[str],
    *,
    arch: str = "qwen3-vl",
    opts: PromptOptions = PromptOptions(),
    targets: str = "full",
    replay: bool = True,
    stored_context: bool = True,
    same_seed: bool = False,
    lake: Any = None,
    guide_keys: Sequence[str] = (),
    guide: str = "all",
    index: Any = None,
) -> list[dict[str, Any]]:
    """Step rows of the episodes the rollouts `run_keys` wrote (episodes that never got a reward are left out).

    `replay`: each all-failed group gets a stored success of its task as an extra, replayed member (`same_seed`:
    only one of the same task instance). Without
    replay but with `stored_context`, that success only becomes the SDPO teacher's "Correct solution" for the
    group's rows (keys stored_solution / stored_episode_id). `lake` (the one `con` views): the rounds' episodes
    and all steps are read from their runs' files only (the same rows, without opening the whole table); `index`
    (stored_index) finds the stored successes without reading every episode file again.
    `guide_keys` (rl.guide): the teacher's episodes on the round's instances; a success joins the group of its
    (task, seed) as a replayed member when that group has a failure (`guide` "all") or only failures ("failed"),
    and such a group takes no stored success."""
    run_keys = list(run_keys)
    if not run_keys:
        return []
    eps = _query(
        con,
        f"SELECT {_EP_COLS} FROM {_source(lake, 'episodes', run_keys)} WHERE list_contains($1, run_key) "
        f"AND task_reward IS NOT NULL ORDER BY group_id, sample_idx, episode_id",
        [run_keys],
    )
    steps = _steps_of(con, eps, lake)
    rows: list[dict[str, Any]] = []
    groups: dict[str, list[dict[str, Any]]] = {}
    for e in eps:
        rows += episode_rows(e, steps[e["episode_id"]], arch=arch, opts=opts, targets=targets)
        groups.setdefault(e["group_id"] or e["episode_id"], []).append(e)
    guided = _join_guides(con, rows, groups, guide_keys, guide, arch=arch, opts=opts, targets=targets, lake=lake)
    failed = {g: members for g, members in groups.items() if g not in guided and not any(m["success"] for m in members)}
    if not failed or not (replay or stored_context):
        return rows
    stored = stored_successes(
        con, sorted({m[0]["task_id"] for m in failed.values()}), list(run_keys) + list(guide_keys), index
    )
    cache: dict[str, list[dict[str, Any]]] = {}
    for turn, (g, members) in enumerate(failed.items()):
        for cand in _pick(stored.get(members[0]["task_id"], []), members[0]["seed"], same_seed, turn):
            if cand["episode_id"] not in cache:
                cache.update(_steps_of(con, [cand], lake))
            got = episode_rows(
                cand, cache[cand["episode_id"]], arch=arch, opts=opts, targets=targets, replayed=True, group_id=g
            )
            if not got:
                continue  # nothing trainable in it: try the next one
            if replay:
                rows += got
            else:
                for r in rows:
                    if r["group_id"] == g:
                        r.update(stored_solution=got[0]["solution"], stored_episode_id=cand["episode_id"])
            break
    return rows


# ------------------------------------------------------------------------------------------------ groups
def attach_sdpo_context(rows: list[dict[str, Any]], mode: str = "both", hint: str = "episode") -> list[dict[str, Any]]:
    """Set each row's SDPO teacher context in place: sdpo_solution + sdpo_sibling_episode_id (mode sibling|both),
    sdpo_feedback (mode feedback|both: the row's own failure text, failed episodes only) and sdpo (either is
    present). Rows with neither get no SDPO term. The sibling's solution (rl.sdpo_hint):
    - "episode": every step of the first successful episode of the row's group other than its own (a replayed one
      included), else the group's stored success;
    - "screen": the one step a successful other episode of the group took on this row's very screen (same
      screen_hash), numbered as this row's step ("Step k:", the block hint-aware SFT shows); a row whose screen no
      success saw gets none. A small student reads this block; shown a whole multi-step episode it predicted
      `</tool_call>` as the first reply token (docs/LOG.md, session 47)."""
    if mode not in ("sibling", "feedback", "both"):
        raise ValueError(f"unknown sdpo context {mode!r}: use sibling, feedback or both")
    if hint not in ("episode", "screen"):
        raise ValueError(f"unknown sdpo hint {hint!r}: use episode or screen")
    winners: dict[str, list[tuple[str, str]]] = {}
    # (group, screen) -> {successful episode: (step, action)}: its last step on that screen, the one that moved on
    at_screen: dict[tuple[str, str], dict[str, tuple[int, str]]] = {}
    for r in rows:
        if r.get("solution"):
            w = winners.setdefault(r["group_id"], [])
            if r["episode_id"] not in {e for e, _ in w}:
                w.append((r["episode_id"], r["solution"]))
        if r.get("step_action") and r.get("screen_hash"):
            seen = at_screen.setdefault((r["group_id"], r["screen_hash"]), {})
            if r["step_idx"] >= seen.get(r["episode_id"], (-1, ""))[0]:
                seen[r["episode_id"]] = (r["step_idx"], r["step_action"])
    for r in rows:
        sib, sol, sib_step = None, None, None
        if mode in ("sibling", "both") and hint == "screen":
            seen = at_screen.get((r["group_id"], r.get("screen_hash")), {})
            other = [(e, k, a) for e, (k, a) in seen.items() if e != r["episode_id"]]
            if other:
                sib, sol, sib_step = other[0][0], f"Step {int(r['step_idx']) + 1}:\n{other[0][2]}", other[0][1]
        elif mode in ("sibling", "both"):
            other = [(e, s) for e, s in winners.get(r["group_id"], []) if e != r["episode_id"]]
            if other:
                sib, sol = other[0]
            elif r.get("stored_solution") and r.get("stored_episode_id") != r["episode_id"]:
                sib, sol = r["stored_episode_id"], r["stored_solution"]
        fb = r.get("feedback") if mode in ("feedback", "both") and not r.get("success") else None
        r.update(
            sdpo_sibling_episode_id=sib,
            sdpo_sibling_step=sib_step,
            sdpo_solution=sol,
            sdpo_feedback=fb,
            sdpo=bool(sol or fb),
        )
    return rows


def assign_advantages(
    rows: list[dict[str, Any]],
    *,
    mode: str = "zscore",
    drop_zero_variance: bool = True,
    parse_error_penalty: float = 0.0,
    keep_sdpo_rows: bool = False,
    gigpo_omega: float = 0.0,
    gigpo_gamma: float = 0.95,
    step_weight: str = "step",
) -> tuple[list[dict[str, Any]], dict]:
    """Episode-level group advantages (training.losses.group_advantages over one reward per episode, so long
    episodes weigh no more than short ones), broadcast to each of the episode's rows, minus `parse_error_penalty`
    on rows whose reply did not parse. Rows of zero-variance (or singleton) groups are dropped when
    `drop_zero_variance` (DAPO), except rows with an SDPO context when `keep_sdpo_rows`. Returns (kept rows,
    stats: n_groups, n_groups_kept, n_episodes, n_replayed, round_success over the sampled episodes).

    GiGPO (`gigpo_omega` > 0; arXiv 2505.10978): each row also gets a step advantage A^S (`step_advantage`): its
    step return R_t = gigpo_gamma^(T-1-t) x the episode reward (losses.discounted_returns; the binary reward comes at
    the last of the episode's T steps), centred (normalised as `mode` says, as verl-agent's gigpo mode sets both
    levels) within its step group: the rows of its group_id with the same screen_hash (the same screen reached by
    different episodes, or again in one episode); singleton step groups give 0. advantage = A^E + omega A^S
    (losses.combine), then the penalty. The zero-variance filter then keeps a row whose A^S is nonzero although its
    group's episodes all got the same reward (e.g. an all-success group: the same screen led to success in fewer
    steps in one episode than in another); rows with neither signal are dropped as before. Replayed rows are
    ordinary members of their step groups: a stored success of the same seed shares the group's first screen(s),
    so the failed rows there get a state-level signal against the demo; one of another seed usually shares no
    screen (A^S = 0). A row without a screenshot hash is its own step group. With omega 0 nothing changes.

    `step_weight`: "step" gives every row its advantage in full; "episode" divides it by the episode's row count, so
    each episode weighs the same in the update. Without it a failed episode that wanders to the step cap (6 rows of
    the same reply format) outweighs a one-step success on the tokens they share, and a few updates push the format
    itself down (measured: every reply unparseable after one round, docs/LOG.md)."""
    if step_weight not in ("step", "episode"):
        raise ValueError(f"unknown step_weight {step_weight!r}: use step or episode")
    from training.losses import group_advantages

    episodes: dict[str, dict[str, Any]] = {}
    for r in rows:
        episodes.setdefault(r["episode_id"], r)
    ids = list(episodes)
    adv, keep = group_advantages([episodes[e]["reward"] for e in ids], [episodes[e]["group_id"] for e in ids], mode)
    by_ep = {e: (float(a), bool(k)) for e, a, k in zip(ids, adv.tolist(), keep.tolist())}
    step = (
        gigpo_advantages(rows, [by_ep[r["episode_id"]][0] for r in rows], mode, gigpo_gamma, gigpo_omega)
        if gigpo_omega > 0
        else None
    )
    n_rows: dict[str, int] = {}
    for r in rows:
        n_rows[r["episode_id"]] = n_rows.get(r["episode_id"], 0) + 1
    out = []
    for i, r in enumerate(rows):
        a, k = by_ep[r["episode_id"]]
        if step is not None:
            r["step_advantage"], a = step[i]
        r["advantage"] = a - (parse_error_penalty if r.get("parse_error") else 0.0)
        if step_weight == "episode":
            r["advantage"] /= n_rows[r["episode_id"]]
        r["group_kept"] = k
        if (
            k
            or not drop_zero_variance
            or (keep_sdpo_rows and r.get("sdpo"))
            or (step is not None and r["step_advantage"] != 0.0)
        ):
            out.append(r)
    sampled = [e for e in ids if not episodes[e].get("replayed")]
    groups = {episodes[e]["group_id"] for e in ids}
    stats = {
        "n_groups": len(groups),
        "n_groups_kept": len({episodes[e]["group_id"] for e in ids if by_ep[e][1]}),
        "n_episodes": len(sampled),
        "n_replayed": len(ids) - len(sampled),
        "round_success": (sum(bool(episodes[e]["success"]) for e in sampled) / len(sampled)) if sampled else None,
    }
    if step is not None:
        stats["n_step_signal_rows"] = sum(a_s != 0.0 for a_s, _ in step)
    return out, stats


def gigpo_advantages(
    rows: list[dict[str, Any]], episode_adv: Sequence[float], mode: str, gamma: float, omega: float
) -> list[tuple[float, float]]:
    """Per row (A^S, A^E + omega A^S) as assign_advantages describes; `episode_adv`: each row's A^E."""
    import torch

    from training.losses import combine, discounted_returns, gigpo_step_advantages

    episodes: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        episodes.setdefault(r["episode_id"], []).append(r)
    ret = {}
    for e, members in episodes.items():  # T: the episode's action steps (rows may skip some), reward at the last
        n = members[0].get("episode_steps") or max(int(m["step_idx"]) for m in members) + 1
        ret[e] = discounted_returns([0.0] * (n - 1) + [float(members[0]["reward"])], gamma).tolist()
    returns = [ret[r["episode_id"]][int(r["step_idx"])] for r in rows]
    anchors = [r.get("screen_hash") or f"row:{r['episode_id']}:{r['step_idx']}" for r in rows]
    a_s = gigpo_step_advantages(returns, [r["group_id"] for r in rows], anchors, mode)
    a = combine(torch.tensor(list(episode_adv), dtype=torch.float32), a_s, omega)
    return list(zip(a_s.tolist(), a.tolist()))


def row_record(r: dict[str, Any]) -> dict[str, Any]:
    """The JSON-able part of a row (no prompt or images): what `rl_rows` stores besides the update's numbers."""
    keep = (
        "episode_id",
        "step_idx",
        "group_id",
        "task_id",
        "reward",
        "advantage",
        "step_advantage",
        "screen_hash",
        "replayed",
        "parse_error",
        "sdpo",
        "sdpo_sibling_episode_id",
        "sdpo_feedback",
    )
    return {k: r.get(k) for k in keep}


def update_summary(steps: list[dict[str, Any]]) -> dict[str, Any]:
    """Means over an update's optimizer steps (None where a metric never applied) and row counts."""
    keys = ("loss", "entropy", "clip_frac", "approx_kl", "kl_ref", "grad_norm", "adv_abs")
    out: dict[str, Any] = {
        "n_steps": len(steps),
        "n_rows": sum(m["n_rows"] for m in steps),
        "n_sdpo_rows": sum(m["n_sdpo_rows"] for m in steps),
    }
    for k in keys:
        vals = [m[k] for m in steps if m.get(k) is not None]
        out[k] = sum(vals) / len(vals) if vals else None
    return out


def lake_rows(
    res: dict[str, Any],
    stats: dict[str, Any],
    *,
    round_idx: int,
    run_key: str,
    run_keys: list[str],
    git_sha: str | None = None,
    config_hash: str | None = None,
) -> tuple[list[dict], list[dict]]:
    """(rl_metrics rows, rl_rows rows) of one round's update, shaped for storage.schema."""
    from datetime import datetime, timezone

    from storage.schema import RL_METRICS, RL_ROWS

    now = datetime.now(timezone.utc)
    prov = dict(run_key=run_key, git_sha=git_sha, config_hash=config_hash, created_at=now)
    mcols = set(RL_METRICS.names)
    metrics = [
        {
            **{k: v for k, v in m.items() if k in mcols},
            **prov,
            "rollout_run_keys": list(run_keys),
            "round_success": stats.get("round_success"),
            "n_groups": stats.get("n_groups"),
            "n_groups_kept": stats.get("n_groups_kept"),
            "n_replayed": stats.get("n_replayed"),
        }
        for m in res["steps"]
    ]
    rcols = set(RL_ROWS.names)
    rows = [
        {
            **{k: v for k, v in r.items() if k in rcols},
            **prov,
            "round": round_idx,
            "replayed": bool(r.get("replayed")),
            "parse_error": bool(r.get("parse_error")),
        }
        for r in res["rows"]
    ]
    return metrics, rows
