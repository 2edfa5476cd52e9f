"""Curation's storage side: the selection SQL, dataset ids, the mix, and the `datasets` manifest row.

    sql = curate_sql(cfg.curate, iteration=1, held_out=["click-test-2"])   # the selection (stored verbatim)
    dataset_id_for(cfg, 1)                                                 # "curate-it1-<hash>" (= run key)
    record_dataset(lake, dataset_id=..., ...)                              # the manifest row
    manifest(lake, dataset_id)                                             # ... read back

Selection is one DuckDB query (training.queries.CURATE_EPISODES, stored verbatim in the manifest): binary
task reward >= cfg.curate.reward_threshold (never the shaped reward), status 'ok', train split, iterations <= N,
no held-out task; deduplicated (task + seed + identical action sequence once), capped per task, and mixed by
source (teacher vs student) when cfg.curate.teacher_ratio is set. Steps whose action came from a fallback
parse, failed to parse or failed to execute are never targets (they stay in later steps' text history, as
the policy saw them).

The SFT export and the curate stage itself (select, export, record) are training.export's: building a sample
needs the student's prompt builder, which storage/ never imports. The export lives at
`<lake>/_datasets/<dataset_id>/train.parquet` (outside the lake tables); the manifest row stores its folder
relative to the lake root (`lake.resolve(row["path"])`), so a moved lake still finds it. The dataset id is the
run key: deterministic in (iteration, curate config, student prompt/arch), so a rerun replaces the manifest row.
"""

from __future__ import annotations

import json
from collections import Counter
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from configs.runkeys import at_default_if_set_only, keyed, run_key
from storage.catalog import connect
from storage.lake import Lake, LakeError
from training.queries import CURATE_EPISODES

EXPORT_DIR = "_datasets"
EXPORT_FILE = "train.parquet"


class CurateError(LakeError):
    """Nothing to curate, or a bad curate setting: one clear line."""


def _sql_str(s: str) -> str:
    return "'" + s.replace("'", "''") + "'"


# The mid-training corpus (flywheel/midtrain.py) lives in stages 'midtrain' (train pages) and 'midtrain-eval'
# (held-out pages): the flywheel's SFT data never includes it, the base checkpoint already learned from it.
MIDTRAIN_STAGE = "midtrain"
FLYWHEEL_STAGES = f"e.stage NOT LIKE '{MIDTRAIN_STAGE}%'"


def curate_sql(curate_cfg: Any, iteration: int, held_out: list[str], stage_filter: str = FLYWHEEL_STAGES) -> str:
    """The selection SQL for a CurateConfig, with its settings inlined (the manifest stores this text)."""
    ratio = curate_cfg.teacher_ratio
    held = "[" + ", ".join(_sql_str(t) for t in sorted(held_out)) + "]::VARCHAR[]"
    return CURATE_EPISODES.format(
        threshold=float(curate_cfg.reward_threshold),
        iteration=int(iteration),
        held_out=held,
        cap=int(curate_cfg.max_episodes_per_task),
        stage_filter=stage_filter,
        ratio="NULL" if ratio is None else repr(float(ratio)),
        solved_keep=repr(float(getattr(curate_cfg, "solved_instance_keep", 1.0))),
        inverse_pass_rate=str(getattr(curate_cfg, "instance_weight", "none") == "inverse_pass_rate").upper(),
    ).strip()


PROMPT_KEYED_IF_SET = ("coord_space", "system_prompt", "ui_sizes", "ui_marks")


def prompt_key(student: Any) -> dict[str, Any]:
    """What of the student's prompt format goes into a dataset's id (its export holds rendered prompts). The
    options added later (PROMPT_KEYED_IF_SET) are keyed only when they are not at their default, so the ids of
    earlier lakes still hold."""
    out = {"arch": student.arch, "history_images": student.history_images, "use_ui_text": student.use_ui_text}
    at_default = at_default_if_set_only(student)
    out.update({f: getattr(student, f) for f in PROMPT_KEYED_IF_SET if f not in at_default})
    return out


def dataset_id_for(cfg: Any, iteration: int) -> str:
    """Deterministic id (= run key) of iteration N's dataset under this config's curate + prompt settings."""
    payload = {
        "curate": keyed(cfg.curate),
        **prompt_key(cfg.student),
    }
    return run_key(f"curate-it{int(iteration)}", payload)


def source_of(policy: str) -> str:
    """'student' for the student's own episodes, 'teacher' for every other policy (as CURATE_EPISODES says)."""
    return "student" if policy == "student" else "teacher"


def source_counts(
    episodes: list[dict[str, Any]], samples: Counter | None = None, loops: Counter | None = None
) -> dict[str, Any]:
    """The manifest's source_counts JSON (the dataset's mix): episodes per (policy, iteration), per task and per
    source, and, given the export's `samples` per source, the SFT samples per source and the student's share;
    given `loops`, the steps cut as loops per source."""
    by_src = Counter(f"{e['policy']}/it{e['iteration']}" for e in episodes)
    by_task = Counter(e["task_id"] for e in episodes)
    by_kind = Counter(e["source"] for e in episodes)
    out: dict[str, Any] = {
        "by_policy_iteration": dict(sorted(by_src.items())),
        "by_task": dict(sorted(by_task.items())),
        "by_source": dict(sorted(by_kind.items())),
    }
    if samples is not None:
        total = sum(samples.values())
        out["samples_by_source"] = {k: int(samples.get(k, 0)) for k in ("student", "teacher")}
        out["student_sample_share"] = round(samples.get("student", 0) / total, 4) if total else 0.0
    if loops is not None:
        out["loop_steps_cut"] = {k: int(loops.get(k, 0)) for k in ("student", "teacher")}
    return out


def record_dataset(
    lake: Lake,
    *,
    dataset_id: str,
    name: str,
    sql: str,
    episode_ids: list[str],
    n_steps: int,
    counts: dict[str, Any],
    folder: Path,
    iteration: int,
    stage: str,
    git_sha: str | None,
    config_hash: str | None,
    lake_snapshot: int | None = None,
) -> dict[str, Any]:
    """Write a dataset's `datasets` row (the manifest: ids, query, mix, where its export lives); a rerun with the
    same id replaces it. Returns the row."""
    row = dict(
        dataset_id=dataset_id,
        name=f"{name}: {len(episode_ids)} episodes, {n_steps} steps",
        query=sql,
        episode_ids=episode_ids,
        n_episodes=len(episode_ids),
        n_steps=n_steps,
        source_counts=json.dumps(counts, sort_keys=True),
        path=lake.rel(folder),
        created_at=datetime.now(timezone.utc),
        run_key=dataset_id,
        git_sha=git_sha,
        config_hash=config_hash,
        lake_snapshot=lake_snapshot,
    )
    lake.replace_run("datasets", [[row]], iteration=iteration, stage=stage, run_key=dataset_id)
    return row


def manifest(lake: Lake, dataset_id: str) -> dict[str, Any]:
    """The `datasets` row of a dataset id (the newest if several iterations wrote it)."""
    rows = (
        connect(lake)
        .sql(
            "SELECT * EXCLUDE (stage) FROM datasets WHERE dataset_id = ? ORDER BY created_at DESC LIMIT 1",
            params=[dataset_id],
        )
        .to_arrow_table()
        .to_pylist()
    )
    if not rows:
        raise CurateError(f"no dataset {dataset_id!r} in the lake at {lake.location}: run the curate stage first")
    return rows[0]
