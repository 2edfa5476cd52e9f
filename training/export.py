"""The curate stage's SFT export: successful episodes from the lake -> a dataset manifest + an SFT Parquet file.

    res = curate(cfg, iteration=1)            # {"dataset_id", "path", "data_files", "n_episodes", "n_steps", ...}
    datasets.load_dataset("parquet", data_files=res["data_files"])["train"]   # columns messages, images, ...

The selection is training.curation's SQL (curate_sql); the rows are built by training.data.episode_samples with the
student's prompt options and coordinate convention, so SFT sees exactly the prompts rollouts and evaluation build.
The export is `<lake>/_datasets/<dataset_id>/train.parquet` (outside the lake tables), written to a temp file
and renamed; training.curation.record_dataset then writes the manifest row. On an object-store lake the export is
written under the local root, then uploaded to the bucket under the same relative path (`lake.publish`) before
the manifest row is written, so an SFT worker on another machine finds it (`lake.fetch(row["path"])`).
"""

from __future__ import annotations

import os
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from storage.catalog import connect
from storage.lake import Lake, open_lake
from training.curation import (  # noqa: F401 - CurateError, dataset_id_for: importable with curate()
    EXPORT_DIR,
    EXPORT_FILE,
    CurateError,
    curate_sql,
    dataset_id_for,
    record_dataset,
    source_counts,
    source_of,
)
from training.data import cite_what_it_did, cut_loops, episode_samples, prompt_options
from training.queries import CURATE_EXPORT_STEPS

_CHUNK_EPISODES = 64  # episodes whose screenshots are read per query: bounds memory on big datasets


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


def _export_rows(
    con,
    episodes: list[dict[str, Any]],
    arch: str,
    opts,
    drop_loops: bool = False,
    cut: Counter | None = None,
    rebuild: bool = False,
) -> list[dict[str, Any]]:
    ids = [e["episode_id"] for e in episodes]
    steps = con.sql(CURATE_EXPORT_STEPS, params=[ids]).to_arrow_table().to_pylist()
    by_ep: dict[str, list[dict[str, Any]]] = {}
    for s in steps:
        by_ep.setdefault(s["episode_id"], []).append(s)
    rows = []
    for e in episodes:
        ep_steps = by_ep.get(e["episode_id"], [])
        if rebuild and source_of(e["policy"]) == "student":
            ep_steps = [cite_what_it_did(s) for s in ep_steps]
        if drop_loops:
            ep_steps, n_cut = cut_loops(ep_steps)
            if cut is not None and n_cut:
                cut[source_of(e["policy"])] += n_cut
        for smp in episode_samples(e["instruction"] or "", ep_steps, arch, opts) * int(e.get("copies") or 1):
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
    balance: str = "none",
    repeats: dict[str, int] | None = None,
    rebuild_action_lines: bool = False,
) -> int:
    """Write the SFT rows of `episodes` to `out` (Parquet, atomically); returns the number of rows.
    `samples_by_source` (a Counter) gets the rows per source ('teacher' / 'student'), as written. With
    `drop_loops`, each episode's loops are cut first (training.data.cut_loops; `loops_by_source` gets the steps cut
    per source). With `balance="task"`, each task's rows are written task_repeats() times (`repeats` gets them).
    With `rebuild_action_lines`, the student's steps carry Action lines rebuilt from what they did
    (training.data.cite_what_it_did)."""
    schema = sft_features().arrow_schema
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.parent / f".{out.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp"
    staged = tmp.with_suffix(".rows")
    n, by_task, by_source = 0, Counter(), Counter()
    try:
        with pq.ParquetWriter(staged if balance == "task" else tmp, schema, compression="zstd") as w:
            for i in range(0, len(episodes), _CHUNK_EPISODES):
                chunk = episodes[i : i + _CHUNK_EPISODES]
                rows = _export_rows(con, chunk, arch, opts, drop_loops, loops_by_source, rebuild_action_lines)
                if rows:
                    w.write_table(pa.Table.from_pylist(rows, schema=schema), row_group_size=256)
                    n += len(rows)
                    by_task.update(r["task_id"] for r in rows)
                    by_source.update(source_of(r["policy"]) for r in rows)
        if balance == "task":
            times = task_repeats(by_task)
            if repeats is not None:
                repeats.update(times)
            n, by_source = _write_repeated(staged, tmp, schema, times)
        with open(tmp, "rb") as fh:
            os.fsync(fh.fileno())
        os.replace(tmp, out)
    finally:
        tmp.unlink(missing_ok=True)
        staged.unlink(missing_ok=True)
    if samples_by_source is not None:
        samples_by_source.update(by_source)
    return n


def task_repeats(samples_by_task: Counter) -> dict[str, int]:
    """Whole copies per task that bring each task's samples to about the largest task's count (>= 1 each)."""
    top = max(samples_by_task.values(), default=0)
    return {t: max(1, round(top / c)) for t, c in sorted(samples_by_task.items()) if c}


def _write_repeated(src: Path, dst: Path, schema, times: dict[str, int]) -> tuple[int, Counter]:
    """Copy `src` to `dst` batch by batch, each row `times[task]` times in place; (rows written, rows per source)."""
    n, by_source = 0, Counter()
    with pq.ParquetWriter(dst, schema, compression="zstd") as w:
        for batch in pq.ParquetFile(src).iter_batches(batch_size=256):
            tasks, policies = batch.column("task_id").to_pylist(), batch.column("policy").to_pylist()
            idx = [i for i, t in enumerate(tasks) for _ in range(times[t])]
            w.write_table(pa.Table.from_batches([batch], schema=schema).take(idx), row_group_size=256)
            n += len(idx)
            by_source.update(source_of(policies[i]) for i in idx)
    return n, by_source


def curate(
    cfg: Any,
    iteration: int,
    lake: Lake | None = None,
    *,
    held_out: list[str] | None = None,
    git_sha: str | None = None,
    at: int | None = None,
) -> dict[str, Any]:
    """Select, export and record iteration N's SFT dataset; returns its id, export folder and counts.

    held_out: task ids never to train on (default: the registry's held-out tasks).
    at: read the lake as of this snapshot (default: the current one); the dataset row records it, and curate
    at a dataset's `lake_snapshot` writes the same export, byte for byte."""
    if iteration < 0:
        raise CurateError(f"iteration must be >= 0, got {iteration}")
    if held_out is None:
        from envs.registry import HELD_OUT

        held_out = HELD_OUT
    lake = lake or open_lake(cfg)
    if not lake.has_data("episodes"):
        raise CurateError(f"no episodes in the lake at {lake.location}: run the bootstrap (teacher demos) first")
    sql = curate_sql(cfg.curate, iteration, held_out)
    snapshot = lake.snapshot() if at is None else int(at)
    con = connect(lake, at=snapshot)
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
        lake_snapshot=snapshot,
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
    lake_snapshot: int | None = None,
) -> dict[str, Any]:
    """Export the chosen episodes' SFT samples and write their `datasets` row (the manifest: ids, query, mix)."""
    folder = lake.root / EXPORT_DIR / dataset_id
    samples, loops, repeats = Counter(), Counter(), {}
    drop_loops = bool(getattr(cfg.curate, "drop_loops", False)) and stage == "curate"
    balance = getattr(cfg.curate, "balance", "none") if stage == "curate" else "none"
    n_steps = export_sft(
        con,
        episodes,
        folder / EXPORT_FILE,
        cfg.student.arch,
        prompt_options(cfg.student),
        samples,
        drop_loops=drop_loops,
        loops_by_source=loops,
        balance=balance,
        repeats=repeats,
        rebuild_action_lines=bool(getattr(cfg.curate, "rebuild_action_lines", False)) and stage == "curate",
    )
    lake.publish(folder)  # before the row: a reader that sees the row finds the whole export
    ids = [e["episode_id"] for e in episodes]
    counts = source_counts(episodes, samples, loops if drop_loops else None)
    if balance == "task":
        counts["repeats_by_task"] = repeats
    if getattr(cfg.curate, "instance_weight", "none") != "none" and stage == "curate":
        weighted = [e for e in episodes if int(e.get("copies") or 1) > 1]
        counts["instance_copies"] = {
            "episodes": len(weighted),  # student successes written more than once (their instance's pass rate)
            "extra_copies": sum(int(e["copies"]) - 1 for e in weighted),
            "by_task": dict(sorted(Counter(e["task_id"] for e in weighted).items())),
        }
    record_dataset(
        lake,
        dataset_id=dataset_id,
        name=name,
        sql=sql,
        episode_ids=ids,
        n_steps=n_steps,
        counts=counts,
        folder=folder,
        iteration=iteration,
        stage=stage,
        git_sha=git_sha,
        config_hash=cfg.config_hash("curate"),
        lake_snapshot=lake_snapshot,
    )
    return {
        "dataset_id": dataset_id,
        "path": str(folder),
        "data_files": str(folder / EXPORT_FILE),
        "n_episodes": len(ids),
        "n_steps": n_steps,
        "source_counts": counts,
        "lake_snapshot": lake_snapshot,
    }
