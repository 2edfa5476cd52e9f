"""The flywheel's SQL, readable in one place. Every query runs on `storage.catalog.connect()` views.

CURATE_STEPS: the steps of successful episodes that are fit for SFT. It never names the
`screenshot` column, so DuckDB never reads screenshot bytes (they are fetched by
episode/step key only for the rows that are exported).

CURATE_EPISODES: the curate stage's selection (training/curation.py): successful train-split
episodes up to an iteration, deduplicated, capped per task and mixed by source. CURATE_EXPORT_STEPS
then reads every action step of the chosen episodes (screenshots included: earlier steps are the
prompt's history), flagging which ones are fit to be SFT targets.
"""

from __future__ import annotations

# A step is fit to be an SFT target only if its action parsed strictly (no fallback) and executed.
FIT_STEP = "s.parse_ok AND NOT coalesce(s.fallback_parse, false) AND s.exec_error IS NULL"

# Successful episodes (binary task reward, never the shaped one), minus steps whose action came
# from a fallback parse, failed to parse, or failed to execute; the final-observation rows hold
# no action and are excluded too.
CURATE_STEPS = """
SELECT s.episode_id, s.step_idx, s.thought, s.action_desc, s.action, s.ui_text, s.screen_w, s.screen_h,
       e.task_id, e.seed, e.instruction, e.policy, e.iteration, e.stage
FROM steps AS s
JOIN episodes AS e USING (episode_id)
WHERE e.task_reward >= {threshold}
  AND e.status = 'ok'
  AND NOT s.is_final
  AND s.parse_ok
  AND NOT coalesce(s.fallback_parse, false)
  AND s.exec_error IS NULL
"""

# The curate stage's episode selection. Placeholders: {threshold} (min binary task_reward),
# {iteration} (newest iteration included), {held_out} (VARCHAR[] of held-out task ids),
# {cap} (episodes per task), {ratio} (teacher fraction, or NULL = no mixing).
# - dedupe: one episode per (task, seed, identical action sequence), the earliest kept;
# - episodes without a single fit step are dropped before counting;
# - ranking inside a task (and source) is by md5(episode_id): deterministic, but not biased
#   toward low seeds or early iterations the way ORDER BY seed would be;
# - ratio: per task, keep the largest n <= cap with round(ratio * n) teacher and the rest student
#   episodes; a task with only one source keeps that source (up to cap) instead of vanishing.
# - {solved_keep}: the fraction (by md5(episode_id)) of student successes kept from instances the student
#   solved on every one of its >= 2 attempts there (same task, seed, iteration and stage). Those repeat what the
#   policy already does; the successes from instances it solves only sometimes are the new information.
# - copies: how many times the export writes an episode's samples. 1, or with {inverse_pass_rate} (TRUE/FALSE)
#   a student instance solved on `wins` of its `attempts` >= 2 counts about attempts / wins times, split over its
#   kept successes (whole copies, at least one each): rejection sampling otherwise keeps mostly the instances the
#   student already solves, and SFT on that mix pulls it further toward them.
CURATE_EPISODES = (
    """
WITH instance_passes AS (
    SELECT task_id, seed, iteration, stage, count(*) AS attempts,
           count(*) FILTER (task_reward >= {threshold}) AS wins
    FROM episodes
    WHERE policy = 'student' AND status = 'ok' AND split = 'train' AND iteration <= {iteration}
    GROUP BY task_id, seed, iteration, stage
),
candidates AS (
    SELECT e.episode_id, e.task_id, e.seed, e.instruction, e.policy, e.iteration, e.stage,
           CASE WHEN e.policy = 'student' THEN 'student' ELSE 'teacher' END AS source,
           p.attempts, p.wins
    FROM episodes AS e
    LEFT JOIN instance_passes AS p
           ON e.policy = 'student' AND p.task_id = e.task_id AND p.seed = e.seed
          AND p.iteration = e.iteration AND p.stage = e.stage
    WHERE e.task_reward >= {threshold}
      AND e.status = 'ok'
      AND e.split = 'train'
      AND e.iteration <= {iteration}
      AND NOT list_contains({held_out}, e.task_id)
      AND {stage_filter}
      AND (p.attempts IS NULL OR p.attempts < 2 OR p.wins < p.attempts
           OR md5_number(e.episode_id) % 10000 < round({solved_keep} * 10000))
),
signatures AS (
    SELECT s.episode_id,
           string_agg(coalesce(s.action, 'null'), ' | ' ORDER BY s.step_idx) AS actions,
           count(*) FILTER ("""
    + FIT_STEP
    + """) AS fit_steps
    FROM steps AS s JOIN candidates USING (episode_id)
    WHERE NOT s.is_final
    GROUP BY s.episode_id
),
unique_eps AS (
    SELECT c.*, g.fit_steps,
           row_number() OVER (PARTITION BY c.task_id, c.seed, g.actions
                              ORDER BY c.iteration, c.stage, c.episode_id) AS dup_rank
    FROM candidates AS c JOIN signatures AS g USING (episode_id)
    WHERE g.fit_steps > 0
),
ranked AS (
    SELECT *, row_number() OVER (PARTITION BY task_id ORDER BY md5(episode_id)) AS task_rank,
              row_number() OVER (PARTITION BY task_id, source ORDER BY md5(episode_id)) AS source_rank
    FROM unique_eps WHERE dup_rank = 1
),
sizes AS (
    SELECT task_id, count(*) FILTER (source = 'teacher') AS n_t, count(*) FILTER (source = 'student') AS n_s
    FROM ranked GROUP BY task_id
),
totals AS (
    SELECT task_id, n_t, n_s,
           CASE WHEN n_t = 0 OR n_s = 0 THEN least({cap}, n_t + n_s)
                ELSE least({cap},
                           CASE WHEN {ratio} > 0 THEN floor(n_t / {ratio}) ELSE n_s END,
                           CASE WHEN {ratio} < 1 THEN floor(n_s / (1 - {ratio})) ELSE n_t END)
           END::BIGINT AS n_keep
    FROM sizes
),
quotas AS (
    SELECT task_id, n_keep,
           CASE WHEN n_s = 0 THEN n_keep WHEN n_t = 0 THEN 0
                ELSE least(n_t, round({ratio} * n_keep)) END::BIGINT AS keep_teacher
    FROM totals
),
selected AS (
    SELECT r.*
    FROM ranked AS r JOIN quotas AS q USING (task_id)
    WHERE CASE WHEN {ratio} IS NULL THEN r.task_rank <= {cap}
               WHEN r.source = 'teacher' THEN r.source_rank <= q.keep_teacher
               ELSE r.source_rank <= q.n_keep - q.keep_teacher END
)
SELECT episode_id, task_id, seed, instruction, policy, source, iteration, stage, fit_steps,
       CASE WHEN {inverse_pass_rate} AND source = 'student' AND attempts >= 2 AND wins > 0
            THEN greatest(1, round(attempts / wins
                                   / count(*) OVER (PARTITION BY task_id, seed, iteration, stage, source)))
            ELSE 1 END::INTEGER AS copies
FROM selected
ORDER BY task_id, source, source_rank
"""
)

# Every action step of the chosen episodes ($1: VARCHAR[] of episode ids), in order, with the
# screenshot (this is the only curate query that reads screenshot bytes) and the fit flag.
CURATE_EXPORT_STEPS = (
    """
SELECT s.episode_id, s.step_idx, s.screenshot, s.screen_w, s.screen_h, s.ui_text, s.thought, s.action_desc,
       s.raw_action, s.action, s.parse_error, s.exec_error, ("""
    + FIT_STEP
    + """) AS fit
FROM steps AS s
WHERE NOT s.is_final AND list_contains($1, s.episode_id)
ORDER BY s.episode_id, s.step_idx
"""
)

PER_TASK_SUCCESS = """
SELECT task_id, count(*) AS episodes, round(avg(success::INT), 3) AS success_rate,
       round(avg(n_steps), 2) AS avg_steps, count(*) FILTER (status <> 'ok') AS not_ok
FROM episodes {where}
GROUP BY task_id ORDER BY task_id
"""


def curate_steps_sql(threshold: float = 1.0) -> str:
    return CURATE_STEPS.format(threshold=float(threshold))


# Dollars per verified success by task (paid teachers, e.g. the Claude bootstrap): what every episode of the
# task cost, over the episodes whose binary task reward passed (status 'ok'). NULL when none succeeded.
COST_PER_SUCCESS = """
SELECT task_id, policy, count(*) AS episodes, count(*) FILTER (success AND status = 'ok') AS successes,
       round(sum(cost), 4) AS dollars,
       round(sum(cost) / nullif(count(*) FILTER (success AND status = 'ok'), 0), 4) AS dollars_per_success
FROM episodes
WHERE cost > 0
GROUP BY task_id, policy ORDER BY task_id, policy
"""
