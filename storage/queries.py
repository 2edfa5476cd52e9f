"""The flywheel's SQL, readable in one place. Every query runs on `storage.catalog.connect()` views.

CURATE_STEPS: the steps of successful episodes that are fit for SFT. It never names the
`screenshot` column, so DuckDB never reads screenshot bytes (they are fetched by
episode/step key only for the rows that are exported).
"""

from __future__ import annotations

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

PER_TASK_SUCCESS = """
SELECT task_id, count(*) AS episodes, round(avg(success::INT), 3) AS success_rate,
       round(avg(n_steps), 2) AS avg_steps, count(*) FILTER (status <> 'ok') AS not_ok
FROM episodes {where}
GROUP BY task_id ORDER BY task_id
"""


def curate_steps_sql(threshold: float = 1.0) -> str:
    return CURATE_STEPS.format(threshold=float(threshold))
