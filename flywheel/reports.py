"""The flywheel's per-iteration numbers, one DuckDB query each, over a connection with the lake's views
(`storage.catalog.connect`, or the viewer's own connection): the Prefect iteration artifact
(tasks/artifacts.py) and the viewer's iteration report (viewer/) both show these rows.

    teacher_spend_rows(con)        # where the teacher budget went: per iteration, stage and task
    iteration_table(con)           # per iteration and task: attempts, successes, SFT mix, held-out success

What counts as teacher spend (TEACHER_SPEND): every episode of a policy other than the student that the flywheel
itself ran, whichever stage ran it (bootstrap and curriculum top-ups, the RL stage's rl.guide and rl.clone_fresh,
...). Not spend: imported demos (stage 'import': someone else ran them), the evaluate stage (a teacher checkpoint
measured on held-out seeds is never training data), mid-training's corpus (stages 'midtrain*') and the free oracle's
episodes on synthetic tasks (synth/<kind> at no cost). A rerun of a run key replaces its rows (same episode ids), so
an episode counts once however often its stage ran. Errored episodes count: their steps (and dollars) were spent.
"""

from __future__ import annotations

from typing import Any

from training.queries import FIT_STEP

# The `episodes` rows that spend the teacher budget (see the module doc). Synthetic tasks (synth/<kind>, envs/synth)
# come with a programmatic oracle and unlimited instances: its episodes on them are free (issue 28: RL on synth tasks
# spends no teacher budget); a paid teacher's episodes on them (cost > 0) are spend like any other.
SYNTH_PREFIX = "synth/"

# A step whose click the student policy moved onto the UI line its Action line cites (agents.student.snap_to_cited).
SNAPPED_STEP = "s.prompt_context LIKE '%\"snapped\"%' AND json_extract(s.prompt_context, '$.snapped') IS NOT NULL"
TEACHER_SPEND = (
    "policy <> 'student' AND stage NOT IN ('import', 'evaluate') AND stage NOT LIKE 'midtrain%' "
    f"AND NOT (task_id LIKE '{SYNTH_PREFIX}%' AND coalesce(cost, 0) = 0)"
)

TEACHER_SPEND_SQL = f"""
SELECT iteration, stage, task_id, count(*) AS episodes, count(*) FILTER (success) AS successes,
       round(coalesce(sum(cost), 0), 6)::DOUBLE AS usd
FROM episodes WHERE {TEACHER_SPEND} {{extra}}
GROUP BY ALL ORDER BY iteration, stage, task_id
"""

# Per iteration and task (plus an '__all__' row per iteration):
# - attempts / successes: the student's episodes in the rollouts and RL stages (what it tried on train seeds);
# - teacher_episodes / teacher_usd: teacher spend (TEACHER_SPEND) of the iteration, every stage;
# - sft_samples / student_samples / student_share: the SFT rows (fit steps, as curate exports them) of the
#   iteration's curate dataset (its newest `datasets` row of stage curate, by its episode_ids) and the
#   student's share of them;
# - heldout_success / heldout_n: the iteration's newest evaluation on held-out seeds (`evals`; held-out tasks
#   show under their own id);
# - heldout_snapped: of that evaluation's episodes, how many had a click moved onto the UI line its Action line cites
#   (`student.snap_to_cited`; the step's prompt_context holds `snapped`): the part of held-out success that rests on
#   the snap rather than the model's own numbers. 0 with the snap off, null without an evaluation.
ITERATION_TABLE_SQL = f"""
WITH student AS (
    SELECT iteration, coalesce(task_id, '__all__') AS task, count(*) AS attempts,
           count(*) FILTER (success) AS successes
    FROM episodes WHERE policy = 'student' AND stage IN ('rollouts', 'rl')
    GROUP BY GROUPING SETS ((iteration, task_id), (iteration))
),
teacher AS (
    SELECT iteration, coalesce(task_id, '__all__') AS task, count(*) AS teacher_episodes,
           round(coalesce(sum(cost), 0), 6)::DOUBLE AS teacher_usd
    FROM episodes WHERE {TEACHER_SPEND}
    GROUP BY GROUPING SETS ((iteration, task_id), (iteration))
),
ds AS (
    SELECT iteration, episode_ids FROM datasets WHERE stage = 'curate'
    QUALIFY row_number() OVER (PARTITION BY iteration ORDER BY created_at DESC NULLS LAST, dataset_id DESC) = 1
),
ds_eps AS (SELECT DISTINCT iteration, unnest(episode_ids) AS episode_id FROM ds),
ep AS (SELECT DISTINCT episode_id, task_id, policy FROM episodes),
fit AS (
    SELECT s.episode_id, count(*) AS n FROM steps AS s
    WHERE NOT s.is_final AND {FIT_STEP} AND s.episode_id IN (SELECT episode_id FROM ds_eps)
    GROUP BY s.episode_id
),
samples AS (
    SELECT d.iteration, coalesce(e.task_id, '__all__') AS task, sum(f.n)::BIGINT AS sft_samples,
           coalesce(sum(f.n) FILTER (e.policy = 'student'), 0)::BIGINT AS student_samples
    FROM ds_eps AS d JOIN ep AS e USING (episode_id) JOIN fit AS f USING (episode_id)
    GROUP BY GROUPING SETS ((d.iteration, e.task_id), (d.iteration))
),
heldout AS (
    SELECT iteration, task_id AS task, success_rate AS heldout_success, n_episodes AS heldout_n
    FROM evals WHERE stage = 'evaluate' AND task_id <> '__held_out_tasks__'
    QUALIFY row_number() OVER (PARTITION BY iteration, task_id ORDER BY created_at DESC NULLS LAST, eval_id DESC) = 1
),
newest_eval AS (
    SELECT iteration, run_key, eval_id FROM evals WHERE stage = 'evaluate' AND task_id = '__all__'
    QUALIFY row_number() OVER (PARTITION BY iteration ORDER BY created_at DESC NULLS LAST, eval_id DESC) = 1
),
eval_eps AS (
    SELECT e.iteration, e.task_id, e.episode_id FROM episodes AS e JOIN newest_eval AS n USING (iteration, run_key)
    WHERE e.stage = 'evaluate'
),
snapped AS (
    SELECT x.iteration, x.task_id, count(DISTINCT x.episode_id) AS n
    FROM eval_eps AS x JOIN steps AS s USING (episode_id) WHERE {SNAPPED_STEP} GROUP BY ALL
),
snapped_tasks AS (
    SELECT v.iteration, v.task_id AS task, v.split, coalesce(sn.n, 0) AS n
    FROM evals AS v JOIN newest_eval USING (iteration, eval_id, run_key)
    LEFT JOIN snapped AS sn ON sn.iteration = v.iteration AND sn.task_id = v.task_id
    WHERE NOT starts_with(v.task_id, '__')
),
heldout_snapped AS (
    SELECT iteration, task, n AS heldout_snapped FROM snapped_tasks
    UNION ALL
    SELECT iteration, '__all__', sum(n) FILTER (split = 'eval-seed') FROM snapped_tasks GROUP BY iteration
),
keys AS (
    SELECT iteration, task FROM student UNION SELECT iteration, task FROM teacher
    UNION SELECT iteration, task FROM samples UNION SELECT iteration, task FROM heldout
)
SELECT k.iteration, k.task AS task_id,
       coalesce(st.attempts, 0) AS attempts, coalesce(st.successes, 0) AS successes,
       coalesce(t.teacher_episodes, 0) AS teacher_episodes, coalesce(t.teacher_usd, 0)::DOUBLE AS teacher_usd,
       coalesce(sa.sft_samples, 0) AS sft_samples, coalesce(sa.student_samples, 0) AS student_samples,
       round(sa.student_samples / nullif(sa.sft_samples, 0), 3) AS student_share,
       h.heldout_success, h.heldout_n,
       CASE WHEN h.heldout_n IS NOT NULL THEN coalesce(hs.heldout_snapped, 0) END::BIGINT AS heldout_snapped
FROM keys AS k
LEFT JOIN student AS st USING (iteration, task)
LEFT JOIN teacher AS t USING (iteration, task)
LEFT JOIN samples AS sa USING (iteration, task)
LEFT JOIN heldout AS h USING (iteration, task)
LEFT JOIN heldout_snapped AS hs USING (iteration, task)
{{where}}
ORDER BY k.iteration, k.task = '__all__', k.task
"""


def _rows(con, sql: str, params: list[Any]) -> list[dict[str, Any]]:
    cur = con.execute(sql, params)
    names = [d[0] for d in cur.description]
    return [dict(zip(names, r)) for r in cur.fetchall()]


def teacher_spend_rows(con, *, iteration: int | None = None) -> list[dict[str, Any]]:
    """Teacher spend per (iteration, stage, task): episodes, successes, usd (`iteration`: that one only)."""
    if iteration is None:
        return _rows(con, TEACHER_SPEND_SQL.format(extra=""), [])
    return _rows(con, TEACHER_SPEND_SQL.format(extra="AND iteration = ?"), [int(iteration)])


def iteration_table(con, *, iteration: int | None = None) -> list[dict[str, Any]]:
    """Per (iteration, task), and an '__all__' row per iteration: attempts, successes, teacher_episodes,
    teacher_usd, sft_samples, student_samples, student_share (null without SFT data), heldout_success and
    heldout_n (null without an evaluation). `iteration`: that one only."""
    if iteration is None:
        return _rows(con, ITERATION_TABLE_SQL.format(where=""), [])
    return _rows(con, ITERATION_TABLE_SQL.format(where="WHERE k.iteration = ?"), [int(iteration)])
