"""Curation: successful episodes from the lake -> a dataset manifest (`datasets` table) + an SFT Parquet export.

    res = curate(cfg, iteration=1)            # {"dataset_id", "path", "data_files", "n_episodes", "n_steps", ...}
    datasets.load_dataset("parquet", data_files=res["data_files"])["train"]   # columns messages, images, ...

Selection is one DuckDB query (storage.queries.CURATE_EPISODES, stored verbatim in the manifest): binary
task reward >= cfg.curate.reward_threshold (never the shaped reward), status 'ok', train split, iterations <= N,
no held-out task; deduplicated (task + seed + identical action sequence once), capped per task, and mixed by
source (teacher vs student) when cfg.curate.teacher_ratio is set. Steps whose action came from a fallback
parse, failed to parse or failed to execute are never targets (they stay in later steps' text history, as
the policy saw them).

The export is `<lake>/_datasets/<dataset_id>/train.parquet` (outside the lake tables), written to a temp file
and renamed; the manifest row stores its folder relative to the lake root (`lake.resolve(row["path"])`), so a
moved lake still finds it. Its rows are built by training.data.episode_samples with the student's prompt options and
coordinate convention, so SFT sees exactly the prompts rollouts and evaluation build. The dataset id is the
run key: deterministic in (iteration, curate config, student prompt/arch), so a rerun replaces the manifest
row and the file instead of adding new ones. On an object-store lake the export is written under the local root,
then uploaded to the bucket under the same relative path (`lake.publish`) before the manifest row is written, so
an SFT worker on another machine finds it (`lake.fetch(row["path"])`).
"""

from __future__ import annotations

import hashlib
import json
import os
import uuid
from collections import Counter
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from storage.catalog import connect
from storage.lake import Lake, LakeError
from storage.queries import CURATE_EPISODES, CURATE_EXPORT_STEPS

EXPORT_DIR = "_datasets"
EXPORT_FILE = "train.parquet"
_CHUNK_EPISODES = 64  # episodes whose screenshots are read per query: bounds memory on big datasets


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
    ).strip()


def dataset_id_for(cfg: Any, iteration: int) -> str:
    """Deterministic id (= run key) of iteration N's dataset under this config's curate + prompt settings."""
    payload = {
        "curate": cfg.curate.model_dump(mode="json"),
        "arch": cfg.student.arch,
        "history_images": cfg.student.history_images,
        "use_ui_text": cfg.student.use_ui_text,
    }
    h = hashlib.sha1(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:10]
    return f"curate-it{int(iteration)}-{h}"


def sft_features():
    """The export's HF `datasets` features: chat messages (role, content items) and images as Image()."""
    from datasets import Features, Image, List, Value

    return Features(
        {
            "messages": List(
                {"role": Value("string"), "content": List({"type": Value("string"), "text": Value("string")})}
            ),
            "images": List(Image()),
            "episode_id": Value("string"),
            "step_idx": Value("int32"),
            "task_id": Value("string"),
            "policy": Value("string"),
            "iteration": Value("int32"),
        }
    )


def _source(policy: str) -> str:
    """'student' for the student's own episodes, 'teacher' for every other policy (as CURATE_EPISODES says)."""
    return "student" if policy == "student" else "teacher"


def _export_rows(
    con, episodes: list[dict[str, Any]], arch: str, opts, drop_loops: bool = False, cut: Counter | None = None
) -> list[dict[str, Any]]:
    from training.data import cut_loops, episode_samples

    ids = [e["episode_id"] for e in episodes]
    steps = con.sql(CURATE_EXPORT_STEPS, params=[ids]).to_arrow_table().to_pylist()
    by_ep: dict[str, list[dict[str, Any]]] = {}
    for s in steps:
        by_ep.setdefault(s["episode_id"], []).append(s)
    rows = []
    for e in episodes:
        ep_steps = by_ep.get(e["episode_id"], [])
        if drop_loops:
            ep_steps, n_cut = cut_loops(ep_steps)
            if cut is not None and n_cut:
                cut[_source(e["policy"])] += n_cut
        for smp in episode_samples(e["instruction"] or "", ep_steps, arch, opts):
            rows.append(
                {
                    "messages": smp["messages"],
                    "images": [{"bytes": b, "path": None} for b in smp["images"]],
                    "episode_id": e["episode_id"],
                    "step_idx": int(ep_steps[smp["step_idx"]].get("lake_step_idx", smp["step_idx"])),
                    "task_id": e["task_id"],
                    "policy": e["policy"],
                    "iteration": e["iteration"],
                }
            )
    return rows


def export_sft(
    con,
    episodes: list[dict[str, Any]],
    out: Path,
    arch: str,
    opts,
    samples_by_source: Counter | None = None,
    *,
    drop_loops: bool = False,
    loops_by_source: Counter | None = None,
) -> int:
    """Write the SFT rows of `episodes` to `out` (Parquet, atomically); returns the number of rows.
    `samples_by_source` (a Counter) gets the rows per source ('teacher' / 'student'). With `drop_loops`, each
    episode's loops are cut first (training.data.cut_loops; `loops_by_source` gets the steps cut per source)."""
    schema = sft_features().arrow_schema
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.parent / f".{out.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp"
    n = 0
    try:
        with pq.ParquetWriter(tmp, schema, compression="zstd") as w:
            for i in range(0, len(episodes), _CHUNK_EPISODES):
                rows = _export_rows(con, episodes[i : i + _CHUNK_EPISODES], arch, opts, drop_loops, loops_by_source)
                if rows:
                    w.write_table(pa.Table.from_pylist(rows, schema=schema), row_group_size=256)
                    n += len(rows)
                    if samples_by_source is not None:
                        samples_by_source.update(_source(r["policy"]) for r in rows)
        with open(tmp, "rb") as fh:
            os.fsync(fh.fileno())
        os.replace(tmp, out)
    finally:
        tmp.unlink(missing_ok=True)
    return n


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


def curate(
    cfg: Any, iteration: int, lake: Lake | None = None, *, held_out: list[str] | None = None, git_sha: str | None = None
) -> dict[str, Any]:
    """Select, export and record iteration N's SFT dataset; returns its id, export folder and counts.

    held_out: task ids never to train on (default: the registry's held-out tasks)."""
    if iteration < 0:
        raise CurateError(f"iteration must be >= 0, got {iteration}")
    if held_out is None:
        from envs.registry import HELD_OUT

        held_out = HELD_OUT
    lake = lake or Lake(cfg.lake.root, endpoint=cfg.lake.s3_endpoint, cache_dir=cfg.lake.cache_dir)
    if not lake.has_data("episodes"):
        raise CurateError(f"no episodes in the lake at {lake.location}: run the bootstrap (teacher demos) first")
    sql = curate_sql(cfg.curate, iteration, held_out)
    con = connect(lake)
    episodes = con.sql(sql).to_arrow_table().to_pylist()
    if not episodes:
        raise CurateError(
            f"no successful train episodes up to iteration {iteration} with task_reward >= "
            f"{cfg.curate.reward_threshold} in {lake.location}"
        )
    return write_dataset(
        cfg,
        lake,
        con,
        episodes,
        dataset_id=dataset_id_for(cfg, iteration),
        sql=sql,
        iteration=iteration,
        stage="curate",
        name=f"sft it{iteration}",
        git_sha=git_sha,
    )


def write_dataset(
    cfg: Any,
    lake: Lake,
    con,
    episodes: list[dict[str, Any]],
    *,
    dataset_id: str,
    sql: str,
    iteration: int,
    stage: str,
    name: str,
    git_sha: str | None,
) -> dict[str, Any]:
    """Export the chosen episodes' SFT samples and write their `datasets` row (the manifest: ids, query, mix)."""
    from training.data import prompt_options

    folder = lake.root / EXPORT_DIR / dataset_id
    samples, loops = Counter(), Counter()
    drop_loops = bool(getattr(cfg.curate, "drop_loops", False)) and stage == "curate"
    n_steps = export_sft(
        con,
        episodes,
        folder / EXPORT_FILE,
        cfg.student.arch,
        prompt_options(cfg.student),
        samples,
        drop_loops=drop_loops,
        loops_by_source=loops,
    )
    lake.publish(folder)  # before the row: a reader that sees the row finds the whole export
    ids = [e["episode_id"] for e in episodes]
    counts = source_counts(episodes, samples, loops if drop_loops else None)
    row = dict(
        dataset_id=dataset_id,
        name=f"{name}: {len(ids)} episodes, {n_steps} steps",
        query=sql,
        episode_ids=ids,
        n_episodes=len(ids),
        n_steps=n_steps,
        source_counts=json.dumps(counts, sort_keys=True),
        path=lake.rel(folder),
        created_at=datetime.now(timezone.utc),
        run_key=dataset_id,
        git_sha=git_sha,
        config_hash=cfg.config_hash("curate"),
    )
    lake.replace_run("datasets", [[row]], iteration=iteration, stage=stage, run_key=dataset_id)
    return {
        "dataset_id": dataset_id,
        "path": str(folder),
        "data_files": str(folder / EXPORT_FILE),
        "n_episodes": len(ids),
        "n_steps": n_steps,
        "source_counts": counts,
    }


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
