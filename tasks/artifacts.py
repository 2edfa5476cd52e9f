"""The flywheel's report module: what users see in the Prefect UI, built from the lake with DuckDB.

    publish_stage(cfg, "rollouts", result, iteration=2)     # result: the stage's StageResult (timing included)
    publish_iteration(cfg, iteration=2, rows=[...], evaluation=result)    # markdown report + the static viewer
    with RolloutProgress("rollouts", total=8) as p: run(..., on_result=p.on_result)

Stages never write reports; the flows call these after a stage returns its StageResult. Any registered stage
(flywheel/pipeline.py) gets its stats table and links: nothing here is per stage but the plots' captions.
Artifact keys (lowercase, digits, dashes) are `<config name>-<stage>-stats` and
`<config name>-iteration-report`, so the Artifacts page keeps one versioned entry per kind.
Every function here is cheap (one DuckDB query, no screenshot columns) and never raises into
the flow: a broken report must not fail a finished stage, so errors are logged and skipped.
"""

from __future__ import annotations

import base64
import re
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from prefect import get_run_logger
from prefect.artifacts import (
    create_link_artifact,
    create_markdown_artifact,
    create_progress_artifact,
    create_table_artifact,
    update_progress_artifact,
)

from configs.models import FlywheelConfig
from flywheel.pipeline import StageResult

_STATS_SQL = """
SELECT task_id, count(*) AS episodes, round(avg(success::INT), 3) AS success_rate,
       sum(n_steps) AS steps, round(avg(n_steps), 2) AS avg_steps,
       count(*) FILTER (status <> 'ok') AS not_ok, round(avg(duration_s), 2) AS avg_episode_s
FROM episodes WHERE run_key = ? GROUP BY ROLLUP (task_id) ORDER BY task_id NULLS LAST
"""


def artifact_key(*parts: str) -> str:
    return re.sub(r"-+", "-", re.sub(r"[^a-z0-9-]", "-", "-".join(parts).lower())).strip("-")


def _scalars(d: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """A result's scalar outputs as one row; nested dicts flattened to `key.sub` (e.g. midtrain's skills)."""
    row: dict[str, Any] = {}
    for k, v in d.items():
        if isinstance(v, (int, float, str, bool)) or v is None:
            row[prefix + k] = v
        elif isinstance(v, Mapping):
            row.update(_scalars(v, f"{prefix}{k}."))
    return row


def stage_stats(cfg: FlywheelConfig, stage: str, result: StageResult) -> list[dict[str, Any]]:
    """Per-task rows (plus a total row, task_id 'all') for a stage that ran episodes (its outputs name the run key
    and the episodes it ran); for any other stage, its typed fields and scalar outputs as one row."""
    if result.get("run_key") and "ran" in result and not result.skipped:
        from flywheel.specs import lake_for
        from storage.catalog import connect

        con = connect(lake_for(cfg))
        cur = con.execute(_STATS_SQL, [result["run_key"]])
        names = [d[0] for d in cur.description]
        rows = [dict(zip(names, r)) for r in cur.fetchall()]
        for r in rows:
            r["task_id"] = r["task_id"] or "all"
        if rows:
            return rows
    typed = {"checkpoint": result.checkpoint, "rows": result.rows, "skipped": result.skipped, "reused": result.reused}
    return [{**_scalars(result.outputs), **{k: v for k, v in typed.items() if v not in (None, 0, False)}}]


def lake_links(cfg: FlywheelConfig, stage: str, iteration: int, result: StageResult) -> list[tuple[str, str]]:
    """(link text, URL) for the lake partition the stage wrote (its registered table), the checkpoint it made and
    the dataset export it wrote; none for a stage that skipped (it wrote nothing)."""
    from flywheel.pipeline import get_stage
    from flywheel.specs import lake_for

    if result.skipped:
        return []
    lake, table, links = lake_for(cfg), get_stage(stage).table, []
    if table and lake._sqlite is not None:  # the catalog file: `flywheel query` or the DuckDB CLI opens it
        links.append(
            (
                f"lake: {table}, iteration {iteration}, stage {stage} (snapshot {lake.snapshot()})",
                lake._sqlite.as_uri(),
            )
        )
    if result.checkpoint:
        links.append((f"checkpoint: {result.checkpoint}", Path(result.checkpoint).resolve().as_uri()))
    if table == "datasets" and result.get("path"):
        links.append((f"dataset: {result['path']}", Path(result["path"]).resolve().as_uri()))
    return links


def publish_stage(cfg: FlywheelConfig, stage: str, result: StageResult, *, iteration: int) -> None:
    """A table of the stage's stats and links to what it wrote, on the current flow run; a plot the stage made
    (`plot` in its outputs) inline. Any registered stage gets them; a failure to build one is logged, never
    raised (reporting must not fail a finished stage)."""
    try:
        rows = stage_stats(cfg, stage, result)
        for r in rows:
            r["stage_wall_s"] = round(result.wall_s, 2)
        how = "cached result of an earlier run" if result.cached else f"ran in {result.wall_s:.1f}s"
        create_table_artifact(
            rows, key=artifact_key(cfg.name, stage, "stats"), description=f"{stage}, iteration {iteration} ({how})"
        )
        for text, url in lake_links(cfg, stage, iteration, result):
            create_link_artifact(url, link_text=text)
        plot = result.get("plot")
        if plot and Path(plot).exists():
            name, alt, what = PLOTS.get(stage, (f"{stage}-plot", stage, f"{stage}: the stage's plot"))
            create_markdown_artifact(plot_markdown(plot, alt), key=artifact_key(cfg.name, name), description=what)
    except Exception as e:  # noqa: BLE001 - reporting must never fail a finished stage
        get_run_logger().warning(f"{stage}: stats artifact skipped ({type(e).__name__}: {e})")


# the plot artifacts' keys and captions (any other stage's `plot` is published as `<config>-<stage>-plot`)
PLOTS = {
    "evaluate": ("success-rate-plot", "success rate", "held-out success rate per iteration"),
    "rl": ("rl-metrics", "RL metrics", "RL: loss, entropy, clip fraction, KL, grad norm, round success"),
}


def plot_markdown(png: str | Path, alt: str = "success rate") -> str:
    """A stage's PNG, inlined (the UI cannot load file:// images from the browser)."""
    data = base64.b64encode(Path(png).read_bytes()).decode()
    return f"![{alt}](data:image/png;base64,{data})\n\n`{png}`"


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.3g}"
    return "–" if v is None else str(v)


def iteration_markdown(
    cfg: FlywheelConfig,
    iteration: int,
    rows: list[dict[str, Any]],
    evaluation: dict[str, Any] | None,
    viewer: Path | None = None,
) -> str:
    """The iteration report: one line per stage (what it produced, how long, cached or not), the
    held-out success rate with its interval, and where everything lives."""
    from flywheel.specs import lake_for

    lines = [
        f"# {cfg.name}: iteration {iteration}",
        "",
        "| stage | status | wall s | episodes | success | output |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['stage']} | {r['status']} | {r['wall_s']:.1f} | {_fmt(r.get('episodes'))} | "
            f"{_fmt(r.get('success_rate'))} | {r.get('output') or ''} |"
        )
    if evaluation:
        lines += [
            "",
            f"**Held-out success**: {evaluation['success_rate']:.1%} "
            f"(95% CI {evaluation['ci_low']:.1%}–{evaluation['ci_high']:.1%}, "
            f"{evaluation.get('n_episodes', '?')} episodes) for `{evaluation.get('checkpoint')}`",
        ]
        per_task = evaluation.get("per_task") or {}
        if per_task:
            lines += ["", "| task | success |", "|---|---|"] + [f"| {t} | {s:.0%} |" for t, s in per_task.items()]
    lines += [
        "",
        f'Lake: `{lake_for(cfg).root}` (query: `flywheel query "SELECT * FROM episodes '
        f'WHERE iteration = {iteration} LIMIT 5"`)',
    ]
    if viewer is not None:
        lines += [
            "",
            f"**Viewer**: [iteration report]({(viewer / 'report.html').resolve().as_uri()}) · "
            f"[episodes]({(viewer / 'index.html').resolve().as_uri()}) (`flywheel view --serve` shows "
            "every episode)",
        ]
    if evaluation and evaluation.get("plot") and Path(evaluation["plot"]).exists():
        lines += ["", plot_markdown(evaluation["plot"])]
    return "\n".join(lines)


def build_viewer(cfg: FlywheelConfig, max_pages: int = 200) -> Path | None:
    """Refresh the static viewer in `<lake>/_reports/view` (the newest episodes get pages); None if it failed."""
    from flywheel.specs import lake_for
    from viewer.site import build_site

    try:
        out = lake_for(cfg).root / "_reports" / "view"
        res = build_site(lake_for(cfg).root, out, max_pages=max_pages)
        get_run_logger().info(
            f"viewer: {res['episodes']} episodes, {res['pages']} pages in {res['total_s']:.1f} s "
            f"-> {out / 'index.html'}"
        )
        return out
    except Exception as e:  # noqa: BLE001 - see publish_stage
        get_run_logger().warning(f"viewer skipped ({type(e).__name__}: {e})")
        return None


def curriculum_markdown(decisions: list[dict[str, Any]]) -> str:
    lines = [
        "",
        "**Curriculum** (`curriculum` table)",
        "",
        "| task | decision | success | demos | rollout seeds | RL | why |",
        "|---|---|---|---|---|---|---|",
    ]
    for d in decisions:
        sr = "–" if d.get("success_rate") is None else f"{d['success_rate']:.0%}"
        lines.append(
            f"| {d['task_id']} | {d['decision']} | {sr} | {d.get('teacher_demos') or 0} | "
            f"{d.get('rollout_seeds') or 0} | {'yes' if d.get('rl') else 'no'} | {d.get('reason', '')} |"
        )
    return "\n".join(lines)


def _pct(v: Any) -> str:
    return "–" if v is None else f"{v:.0%}"


def flywheel_markdown(cfg: FlywheelConfig, iteration: int) -> str:
    """Where the teacher budget went (this iteration by stage and task, the lake's total against the budget), and
    per task: the student's attempts and successes (rollouts + RL), its share of the SFT samples, held-out success.
    The rows are flywheel.reports' queries, the same the viewer's iteration report shows."""
    from flywheel.reports import iteration_table
    from flywheel.specs import lake_for
    from flywheel.teacher_budget import Spent, TeacherSpend, limits, teacher_spend
    from storage.catalog import connect

    con = connect(lake_for(cfg))
    try:
        table, spend = iteration_table(con, iteration=iteration), teacher_spend(con)
    finally:
        con.close()
    lim, total, by_task = limits(cfg), spend.total, spend.by_task()
    mine = [r for r in spend.rows if r["iteration"] == iteration]
    stages = ", ".join(f"{k} {v.episodes}" for k, v in TeacherSpend(mine).by_stage().items()) or "none"
    lake_stages = ", ".join(f"{k} {v.episodes}" for k, v in spend.by_stage().items()) or "none"
    lines = [
        "",
        f"**Teacher budget** ({lim.describe()}): this iteration spent {sum(r['episodes'] for r in mine)} "
        f"teacher episodes, ${sum(r['usd'] for r in mine):.4g} ({stages}); the lake {total.episodes} episodes, "
        f"${total.usd:.4g} ({lake_stages})",
    ]
    if mine:
        lines += ["", "| stage | task | teacher episodes | successes | $ |", "|---|---|---|---|---|"]
        lines += [
            f"| {r['stage']} | {r['task_id']} | {r['episodes']} | {r['successes']} | {r['usd']:.4g} |" for r in mine
        ]
    lines += [
        "",
        f"**Per task** (iteration {iteration}; attempts = the student's rollout and RL episodes)",
        "",
        "| task | attempts | successes | teacher episodes | teacher $ | teacher budget left (now) | SFT samples | "
        "student share | held-out success (n, episodes with a snapped click) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in table:
        t = r["task_id"]
        if lim.per_task is not None and not t.startswith("__"):
            left = str(max(0, lim.per_task - by_task.get(t, Spent()).episodes))
        elif lim.total is not None and t == "__all__":
            left = str(max(0, lim.total - total.episodes))
        else:
            left = "–"
        held = "–" if r["heldout_success"] is None else f"{r['heldout_success']:.0%} (n={r['heldout_n']}{_snaps(r)})"
        lines.append(
            f"| {'all' if t == '__all__' else t} | {r['attempts']} | {r['successes']} | {r['teacher_episodes']} | "
            f"{r['teacher_usd']:.4g} | {left} | {r['sft_samples']} | {_pct(r['student_share'])} | {held} |"
        )
    return "\n".join(lines)


def _snaps(row: dict[str, Any]) -> str:
    """', k snapped' when k of the evaluation's episodes had a click moved onto the line it cited (the held-out
    success that rests on student.snap_to_cited), else ''."""
    k = row.get("heldout_snapped")
    return f", {k} snapped" if k else ""


def publish_iteration(
    cfg: FlywheelConfig,
    iteration: int,
    rows: list[dict[str, Any]],
    evaluation: dict[str, Any] | None,
    curriculum: list[dict[str, Any]] | None = None,
) -> None:
    viewer = build_viewer(cfg)
    try:
        md = iteration_markdown(cfg, iteration, rows, evaluation, viewer)
        try:
            md += flywheel_markdown(cfg, iteration)
        except Exception as e:  # noqa: BLE001 - see publish_stage
            get_run_logger().warning(
                f"iteration report: teacher budget / per-task table skipped ({type(e).__name__}: {e})"
            )
        create_markdown_artifact(
            md + (curriculum_markdown(curriculum) if curriculum else ""),
            key=artifact_key(cfg.name, "iteration-report"),
            description=f"flywheel iteration {iteration}",
        )
    except Exception as e:  # noqa: BLE001 - see publish_stage
        get_run_logger().warning(f"iteration report skipped ({type(e).__name__}: {e})")


class RolloutProgress:
    """A progress artifact fed by the rollout runner's per-episode `on_result` callback.

    Updates are throttled (one API call per `min_interval_s`) so a fast scripted teacher does not
    turn every episode into a server round trip; the last update is always sent."""

    def __init__(self, stage: str, total: int | None, key: str | None = None, min_interval_s: float = 1.0):
        self.stage, self.total, self.key = stage, total, key
        self.done = self.successes = 0
        self.min_interval_s, self._last = min_interval_s, 0.0
        self.id = None

    def __enter__(self) -> "RolloutProgress":
        self.id = create_progress_artifact(0.0, key=self.key, description=f"{self.stage}: episodes done")
        return self

    def on_result(self, r: dict[str, Any]) -> None:
        self.done += 1
        self.successes += int(bool(r.get("success")))
        if time.monotonic() - self._last >= self.min_interval_s:
            self._send()

    def percent(self) -> float:
        return min(100.0, 100.0 * self.done / self.total) if self.total else 0.0

    def _send(self, final: bool = False) -> None:
        self._last = time.monotonic()
        pct = 100.0 if final else self.percent()
        desc = f"{self.stage}: {self.done} episodes, {self.successes} successes"
        try:
            update_progress_artifact(self.id, pct, description=desc)
        except Exception as e:  # noqa: BLE001 - progress is informational
            get_run_logger().debug(f"progress update failed: {e}")

    def __exit__(self, *exc: Any) -> None:
        if self.id is not None:
            self._send(final=exc[0] is None)
