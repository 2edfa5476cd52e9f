"""Mid-training: the student's base skills from synthetic pages, before the flywheel's first SFT.

    res = midtrain(cfg)          # corpus -> dataset -> base checkpoint -> skill report; cached
    res.checkpoint               # the base's model folder: where the flywheel's first SFT starts

A random-init student cannot copy text from an instruction or point at an element by its name, and twenty
teacher demos per task cannot teach it that. Real pipelines start their computer-use stage from a base that
already reads, copies and points (shared/research/midtraining.md); this stage builds one from a corpus with
unlimited variety at no teacher cost:

1. corpus: the scripted oracle solves `midtrain.episodes_per_task` train seeds of every synthetic kind
   (`midtrain.pages` sets the count of the kinds it names; `synth/*`, envs/synth: random pages rendered by the
   same Chromium, verified by the page) into the lake's
   `episodes`/`steps` under stage 'midtrain'. Every example is in the student's own prompt and reply format
   (screenshot + UI text + instruction -> Action line + tool call), because it goes through the same
   rollout runner and the same SFT export as the flywheel's own data.
2. dataset: one curate query over those episodes (stage 'midtrain' only) -> a `datasets` row + export with
   lineage, like any other dataset. The flywheel's own curate never selects these episodes.
3. base: SFT (settings `midtrain.sft`) from `midtrain.base` (default `student.model`) -> a `checkpoints` row with
   method 'midtrain'. Its id is content-addressed by the corpus episodes, the start model and the settings, so a
   second run on the same lake reuses it.
4. skill report: the base, greedy, on `midtrain.eval_seeds_per_task` held-out (eval-split) pages of every kind ->
   `evals` rows with stage 'midtrain' (per kind: the page's own verifier, i.e. the click landed inside the named
   element's box, or the typed text matched exactly).

On a GPU box the same stage is grounding mid-training for a pretrained VLM: set `midtrain.base` to the Hub
model, a bigger corpus and `midtrain.sft.method: lora`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from configs import runkeys
from configs.models import CurateConfig, FlywheelConfig, TaskSelection
from flywheel.errors import UserError
from flywheel.pipeline import StageResult, skipped_result, trained_result
from flywheel.runtime.rollout import PolicySpec, git_sha, run_rollouts
from training.curation import MIDTRAIN_STAGE, prompt_key

EVAL_STAGE = f"{MIDTRAIN_STAGE}-eval"
METHOD = "midtrain"


def _tasks(cfg: FlywheelConfig) -> list[str]:
    from envs import registry

    tasks = list(cfg.midtrain.tasks)
    bad = [t for t in tasks if not t.startswith("synth/") or t not in registry.TASKS_BY_ID]
    if bad or not tasks:
        known = sorted(t for t in registry.TASKS_BY_ID if t.startswith("synth/"))
        raise UserError(
            f"midtrain.tasks must be synthetic task ids (synth/<kind>); not usable: {bad or '[]'}; "
            f"known: {', '.join(known)}"
        )
    return tasks


def corpus_spec(cfg: FlywheelConfig):
    """The corpus run's RolloutSpec (its run key names the corpus: same kinds, seeds and env -> same key)."""
    from envs import registry
    from flywheel.specs import rollout_spec

    m = cfg.midtrain
    tasks = _tasks(cfg)
    seeds = registry.seeds("train", m.episodes_per_task, offset=m.seed_offset)
    # per-kind counts only when midtrain.pages is set, so a corpus without them keeps its run key
    task_seeds = {t: registry.seeds("train", m.pages_of(t), offset=m.seed_offset) for t in tasks} if m.pages else None
    return rollout_spec(
        cfg,
        iteration=0,
        stage=MIDTRAIN_STAGE,
        policy=PolicySpec("scripted", version="synth-oracle"),
        tasks=tasks,
        seeds=seeds,
        split="train",
        task_seeds=task_seeds,
    )


def _cap(cfg: FlywheelConfig) -> int:
    """The most pages any kind of the corpus has: the dataset's per-task cap keeps every one of them."""
    m = cfg.midtrain
    return max([m.episodes_per_task, *m.pages.values()])


def corpus(cfg: FlywheelConfig, *, progress: bool = True, on_result: Any = None) -> dict[str, Any]:
    """The oracle's episodes on the synthetic train pages (stage 'midtrain', iteration 0); idempotent by run key."""
    from dataclasses import asdict

    spec = corpus_spec(cfg)
    kw = {"on_result": on_result} if on_result is not None else {}
    summary = run_rollouts(spec, progress=progress, **kw)
    return {"run_key": spec.run_key, **asdict(summary)}


def corpus_sql(cfg: FlywheelConfig, run_key: str) -> str:
    """The dataset's selection: the curate query restricted to this corpus run (stage 'midtrain')."""
    from training.curation import _sql_str, curate_sql

    cur = CurateConfig(reward_threshold=1.0, max_episodes_per_task=_cap(cfg))
    return curate_sql(cur, 0, [], stage_filter=f"e.stage = '{MIDTRAIN_STAGE}' AND e.run_key = {_sql_str(run_key)}")


def dataset_id_for(cfg: FlywheelConfig, run_key: str) -> str:
    payload = {
        "corpus": run_key,
        **prompt_key(cfg.student),
        "cap": _cap(cfg),
    }
    return runkeys.run_key("midtrain", payload)


def build_dataset(cfg: FlywheelConfig, run_key: str) -> dict[str, Any]:
    """The corpus as a dataset (export + `datasets` row, stage 'midtrain'); rebuilt only when missing."""
    from flywheel.specs import lake_for
    from storage.catalog import connect
    from training.curation import CurateError, manifest
    from training.export import write_dataset

    lake, dataset_id = lake_for(cfg), dataset_id_for(cfg, run_key)
    try:
        row = manifest(lake, dataset_id)
        if lake.fetch(row["path"]).exists():
            return {
                "dataset_id": dataset_id,
                "n_episodes": row["n_episodes"],
                "n_steps": row["n_steps"],
                "reused": True,
            }
    except CurateError:
        pass
    con = connect(lake)
    sql = corpus_sql(cfg, run_key)
    episodes = con.sql(sql).to_arrow_table().to_pylist()
    if not episodes:
        raise UserError(
            f"the mid-training corpus {run_key} has no successful episode: the synthetic pages or the "
            f'oracle are broken (see `flywheel query "SELECT task_id, status, error FROM episodes WHERE '
            f"run_key = '{run_key}'\"`)"
        )
    return write_dataset(
        cfg,
        lake,
        con,
        episodes,
        dataset_id=dataset_id,
        sql=sql,
        iteration=0,
        stage=MIDTRAIN_STAGE,
        name="midtrain",
        git_sha=git_sha(),
    )


def checkpoint_id_for(dataset: dict[str, Any], base: str, settings: Any) -> str:
    from training.sft_stage import checkpoint_id_for as sft_id

    return sft_id(0, dataset, base, settings, prefix="base")


def train_base(cfg: FlywheelConfig, dataset_id: str, *, progress: bool = True) -> dict[str, Any]:
    """SFT from the start model on the corpus -> the base checkpoint (a `checkpoints` row, method and stage
    'midtrain', id `base-<hash>`): training.sft_stage.sft_stage with cfg.midtrain.sft."""
    from flywheel.specs import lake_for
    from training.models import ModelError
    from training.sft_stage import sft_stage

    start = cfg.midtrain.base or cfg.student.model
    base_path = str(Path(start).expanduser().resolve()) if Path(start).expanduser().exists() else start
    try:
        return sft_stage(
            cfg,
            0,
            dataset_id,
            base_path,
            lake=lake_for(cfg),
            progress=progress,
            git_sha=git_sha(),
            method=METHOD,
            sft_cfg=cfg.midtrain.sft,
            id_prefix="base",
        )
    except ModelError as e:
        raise UserError(str(e).splitlines()[0]) from None


def skill_report(cfg: FlywheelConfig, model: str, *, progress: bool = True) -> dict[str, Any] | None:
    """The model, greedy, on held-out synthetic pages of every corpus kind -> `evals` rows (stage 'midtrain')."""
    from flywheel.evaluate import evaluate_checkpoint

    n = cfg.midtrain.eval_seeds_per_task
    if n <= 0:
        return None
    sel = TaskSelection(tasks=_tasks(cfg), seeds_per_task=n)
    res = evaluate_checkpoint(
        cfg,
        0,
        model,
        progress=progress,
        selection=sel,
        held_out_tasks=False,
        stage=EVAL_STAGE,
        eval_stage=MIDTRAIN_STAGE,
    )
    return {k: res[k] for k in ("eval_id", "run_key", "success_rate", "ci_low", "ci_high", "n_episodes", "per_task")}


def base_checkpoint(cfg: FlywheelConfig) -> str:
    """The model folder of this config's base: the newest `midtrain` checkpoint trained on this config's corpus
    dataset. Raises UserError when there is none yet (never a silent fall back to the random-init student)."""
    from flywheel.specs import lake_for
    from storage.catalog import connect
    from training.core import model_path_of

    lake = lake_for(cfg)
    dataset_id = dataset_id_for(cfg, corpus_spec(cfg).run_key)
    rows = (
        connect(lake)
        .sql(
            "SELECT * FROM checkpoints WHERE method = ? AND dataset_id = ? ORDER BY created_at DESC LIMIT 1",
            params=[METHOD, dataset_id],
        )
        .to_arrow_table()
        .to_pylist()
        if lake.has_data("checkpoints")
        else []
    )
    if not rows:
        raise UserError(
            f"midtrain.enabled, but the lake at {lake.location} has no base checkpoint for this corpus "
            f"({dataset_id}): run `flywheel stage midtrain` first (or pass --base)"
        )
    return model_path_of(rows[0], lake.root)


def midtrain(cfg: FlywheelConfig, *, progress: bool = True) -> StageResult:
    """Corpus -> dataset -> base checkpoint -> skill report. Every step is idempotent (the corpus by run key, the
    dataset by id, the base by content), so a rerun after a kill resumes where it stopped (`reused`: the base was
    already trained). The base belongs to the lake, not to an iteration: its result is iteration 0's."""
    if not cfg.midtrain.enabled:
        return skipped_result(MIDTRAIN_STAGE, 0, "midtrain.enabled is false")
    import time

    t0 = time.monotonic()
    cor = corpus(cfg, progress=progress)
    t1 = time.monotonic()
    ds = build_dataset(cfg, cor["run_key"])
    t2 = time.monotonic()
    base = train_base(cfg, ds["dataset_id"], progress=progress)
    t3 = time.monotonic()
    skills = skill_report(cfg, base["model_path"], progress=progress)
    t4 = time.monotonic()
    outputs = {
        "stage": MIDTRAIN_STAGE,
        "corpus_run_key": cor["run_key"],
        "corpus_episodes": cor.get("ran"),
        "dataset_id": ds["dataset_id"],
        "n_samples": ds["n_steps"],
        **base,
        "skills": skills,
        "timings_s": {
            "corpus": round(t1 - t0, 1),
            "dataset": round(t2 - t1, 1),
            "train": round(t3 - t2, 1),
            "skill_report": round(t4 - t3, 1),
        },
    }
    return trained_result(MIDTRAIN_STAGE, 0, outputs)
