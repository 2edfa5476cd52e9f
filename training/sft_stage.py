"""The SFT stage: a curated dataset of the lake -> a trained (or reused, or adopted) checkpoint and its row.

    res = sft_stage(cfg, iteration=1, dataset_id="curate-it1-...")   # trains with training.sft.train, or reuses
    plan = sft_plan(cfg, 1, "curate-it1-...")                         # what it would train, to train it elsewhere
    checkpoint_id_for(1, manifest, base, settings)                    # the content-addressed id (`sft-it1-...`)

The training loop and its settings are training.sft's; this module is the lake side of it: the dataset manifest,
the base and its parent checkpoint, the checkpoint id, reuse of a finished run, adoption of a run trained on another
machine (training.adopt) and the `checkpoints` row. Mid-training (flywheel/midtrain.py) trains its base here too.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

from configs.runkeys import keyed, run_key
from training.adopt import adopt_run, file_digest, weights_digest
from training.core import MERGED_DIR, checkpoint_row, output_root, resolve_base, reusable
from training.core import lake_key as _lake_key
from training.distributed import RESULT_FILE
from training.sft import TrainSettings, train


def _reusable(con, ckpt_id: str, out: Path, root: Path) -> bool:
    """training.core.reusable for SFT's completion mark (sft_result.json)."""
    return reusable(con, ckpt_id, out, root, RESULT_FILE)


def checkpoint_id_for(
    iteration: int, dataset: dict[str, Any], base: str, s: TrainSettings, prefix: str | None = None
) -> str:
    """Deterministic in the data (the manifest's episodes, not just its id), the base and the settings;
    `<prefix>-<hash>`, the prefix `sft-it<iteration>` unless given (mid-training's is `base`)."""
    # keyed: the settings but the RUNTIME ones, which change how, not what, is trained (DDP and packing keep the
    # objective and the sample order)
    payload = {
        "dataset": dataset["dataset_id"],
        "episodes": sorted(dataset["episode_ids"]),
        "n_steps": dataset["n_steps"],
        "base": base,
        "settings": keyed(s),
    }
    return run_key(prefix or f"sft-it{int(iteration)}", payload)


def _stage_inputs(cfg, iteration, dataset_id, base, lake, sft_cfg, id_prefix) -> dict[str, Any]:
    """What an SFT stage trains: the lake, the dataset manifest, the base (and its parent checkpoint), the
    settings, the checkpoint id and its folder."""
    from storage.catalog import connect
    from storage.lake import open_lake
    from training.curation import EXPORT_FILE, manifest

    lake = lake or open_lake(cfg)
    dataset = manifest(lake, dataset_id)
    con = connect(lake)
    base_path, parent = resolve_base(cfg, con, iteration, base, lake.root)
    s = TrainSettings.from_config(sft_cfg or cfg.sft)
    ckpt_id = checkpoint_id_for(iteration, dataset, _lake_key(base_path, lake.root), s, id_prefix)
    return dict(
        lake=lake,
        con=con,
        base_path=base_path,
        parent=parent,
        settings=s,
        ckpt_id=ckpt_id,
        out=output_root(cfg, lake.root) / ckpt_id,
        # a callable: on an object-store lake it downloads the export, which a reused checkpoint never reads
        export=lambda: lake.fetch(dataset["path"]) / EXPORT_FILE,
    )


def sft_plan(
    cfg: Any,
    iteration: int,
    dataset_id: str,
    base: str | None = None,
    *,
    sft_cfg: Any = None,
    id_prefix: str | None = None,
) -> dict[str, Any]:
    """What `sft_stage` would train, for training it on another machine and adopting the run (training.adopt):
    the checkpoint id, the export, the base, the settings and the `python -m training.sft` command."""
    import shlex

    x = _stage_inputs(cfg, iteration, dataset_id, base, None, sft_cfg, id_prefix)
    settings = {k: v for k, v in asdict(x["settings"]).items() if k not in ("keep_state", "step_sleep_s")}
    export = x["export"]()
    cmd = ["python", "-m", "training.sft", "--base", x["base_path"], "--data", str(export), "--out", "<folder>"]
    return {
        "checkpoint_id": x["ckpt_id"],
        "data": str(export),
        "data_sha256": file_digest(export),
        "base": x["base_path"],
        "base_sha256": weights_digest(x["base_path"]),
        "settings": settings,
        "command": shlex.join([*cmd, "--settings", json.dumps(settings)]),
    }


def sft_stage(
    cfg: Any,
    iteration: int,
    dataset_id: str,
    base: str | None = None,
    *,
    lake: Any = None,
    progress: bool = True,
    git_sha: str | None = None,
    method: str = "sft",
    sft_cfg: Any = None,
    id_prefix: str | None = None,
    adopt: str | Path | None = None,
) -> dict[str, Any]:
    """Fine-tune on a dataset manifest; a finished checkpoint of this lake (its row is here) is reused, not retrained.
    Writes a `checkpoints` row; the checkpoint folder is under the lake (output_root).

    `method` names the row's method, its stage partition and the config section hashed into it; `sft_cfg` holds the
    training settings (default cfg.sft) and `id_prefix` the checkpoint id's prefix (checkpoint_id_for). Mid-training
    (flywheel/midtrain.py) trains its base through here with method 'midtrain' and cfg.midtrain.sft. `adopt`: a
    finished run of this stage trained elsewhere (sft_plan), checked and recorded instead of training here."""
    x = _stage_inputs(cfg, iteration, dataset_id, base, lake, sft_cfg, id_prefix)
    lake, con, base_path, parent, s, ckpt_id, out = (
        x[k] for k in ("lake", "con", "base_path", "parent", "settings", "ckpt_id", "out")
    )
    done = out / RESULT_FILE
    skipped = _reusable(con, ckpt_id, out, lake.root)
    if skipped:
        metrics = json.loads(done.read_text())
    elif adopt is not None:
        metrics = adopt_run(adopt, out, s, x["export"](), base_path, RESULT_FILE)
    else:
        metrics = train(base_path, x["export"](), out, s, progress=progress)
    # sft_result.json holds the absolute paths of when it was trained: the folder may have moved with its lake since
    merged = str(out / MERGED_DIR) if metrics.get("merged_path") else None
    metrics.update(merged_path=merged, model_path=merged or str(out))
    row = checkpoint_row(
        lake,
        ckpt_id=ckpt_id,
        out=out,
        method=method,
        base_model=metrics["base_model"],
        parent=parent,
        dataset_id=dataset_id,
        adapter=metrics["adapter"],
        metrics=metrics,
        git_sha=git_sha,
        config_hash=cfg.config_hash(method),
    )
    if not skipped and out.resolve().is_relative_to(lake.root):
        lake.publish(out)  # an object-store lake: into the bucket before its row (no-op on disk)
    lake.replace_run("checkpoints", [[row]], iteration=iteration, stage=method, run_key=ckpt_id)
    return {
        "checkpoint_id": ckpt_id,
        "path": str(out),
        "model_path": metrics["model_path"],
        "merged_path": metrics["merged_path"],
        "adapter": metrics["adapter"],
        "dataset_id": dataset_id,
        "base_model": metrics["base_model"],
        "parent_checkpoint": parent,
        "skipped": skipped,
        "final_loss": metrics["final_loss"],
        "steps": metrics["steps"],
        "tokens_per_s": metrics["tokens_per_s"],
        "stopped": metrics.get("stopped"),
        "train_s": metrics.get("wall_s"),
        "adopted_from": metrics.get("adopted_from"),
    }
