"""Hub-ready folders for a curated dataset and a checkpoint, and pushing them with `huggingface_hub`.

    export_dataset(lake, "curate-it1-ab12cd34ef", Path("out/ds"), license="cc-by-4.0")
    export_checkpoint(lake, "sft-it1-0123456789", Path("out/model"), dataset_repo="me/gui-sft")
    push(Path("out/ds"), "me/gui-sft", "dataset")        # HfApi.create_repo + HfApi.upload_folder

A dataset folder is ``data/train-0000k-of-0000n.parquet`` (the curated export's rows: student-format
``messages`` + ``images``, with their HF features in the Parquet metadata), ``lineage.json`` (every source episode
id, the teacher/student mix, the curate query, config hash and git sha) and a ``README.md`` dataset card whose
YAML header holds the licence, the ``configs`` data files and the ``dataset_info`` features, so
``datasets.load_dataset(folder)`` and the Hub viewer read it as is. A checkpoint folder holds the model files
(the merged model when SFT merged a LoRA; never optimizer state or local result files), ``eval_results.json``
and a model card with base model, dataset and the newest `evals` rows as ``model-index``.

An export is written to a temp folder next to --out and renamed into place; --out must not exist or be empty.
`push` reads the token the way huggingface_hub does (HF_TOKEN, or `hf auth login`); the token is passed to the
client only, never printed or written. Failures (no token, offline, unreachable, refused) raise HubError with
one line, and the exported folder stays for a later push.
"""

from __future__ import annotations

import json
import os
import shutil
import uuid
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from storage.catalog import connect
from storage.lake import Lake, LakeError

SHARD_ROWS = 2000  # rows per Parquet shard; screenshots are a few KB each, so shards stay well under the Hub's limits
DATA_DIR = "data"
# top-level files of a model folder that belong on the Hub (weights, configs, tokenizer, processor, template)
_MODEL_SUFFIXES = (".safetensors", ".json", ".jinja", ".txt", ".model", ".bin")
_NOT_PUBLISHED = {"sft_result.json", "rl_result.json", "round_info.json", "trainer_state.json"}


class HubError(LakeError):
    """An export or push that cannot go ahead: one line naming the cause and what to do."""


# ------------------------------------------------------------------------------------------------ output folder
def _staging(out: Path) -> Path:
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise HubError(f"--out {out} exists and is not an empty folder: choose a new folder")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.parent / f".{out.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp"
    tmp.mkdir()
    return tmp


def _finish(tmp: Path, out: Path) -> Path:
    if out.exists():
        out.rmdir()  # empty (checked in _staging)
    tmp.rename(out)
    return out


def _card(data, body: str) -> str:
    return f"---\n{data.to_yaml()}\n---\n\n{body.strip()}\n"


# ------------------------------------------------------------------------------------------------ dataset
def _dataset_body(row: dict, lineage: dict, n_rows: int, license: str) -> str:
    mix = lineage["teacher_student_mix"]
    by_policy = "\n".join(f"| {k} | {v} |" for k, v in lineage["source_counts"].get("by_policy_iteration", {}).items())
    return f"""
# {row["dataset_id"]}

GUI-agent SFT data curated by gui-flywheel: {row["n_episodes"]} successful episodes, {n_rows} training rows
(one per step that parsed and executed). Each row is one chat sample in the student's format: `messages`
(system / user turns with `{{"type": "image"}}` items, and the assistant's `<thinking>`, `Action:` and
`<tool_call>` reply) and `images` (the screenshots the image items refer to, in order).

```python
from datasets import load_dataset
ds = load_dataset("path/or/hub-id", split="train")
```

## Lineage

- dataset id: `{row["dataset_id"]}`, config hash `{row.get("config_hash")}`, git sha `{row.get("git_sha")}`
- source episodes: {len(lineage["source_episodes"])} (their ids are in `lineage.json`, as is the curate SQL)
- teacher / student mix (episodes): teacher {mix.get("teacher", 0)}, student {mix.get("student", 0)}

| policy / iteration | episodes |
|---|---|
{by_policy}

## Licence

`{license}`. Rows from imported demonstrations (OSWorld runs, AgentNet, slime) keep their source's terms.
"""


def export_dataset(
    lake: Lake, dataset_id: str, out: Path, *, license: str = "unknown", shard_rows: int = SHARD_ROWS
) -> dict[str, Any]:
    """A curated dataset (a `datasets` manifest row) -> a Hub-ready dataset folder; returns its counts."""
    from huggingface_hub import DatasetCardData

    from training.curation import EXPORT_FILE, manifest
    from training.export import sft_features

    row = manifest(lake, dataset_id)
    src = lake.resolve(row["path"]) / EXPORT_FILE
    if not src.is_file():
        raise HubError(f"dataset {dataset_id}: its export {src} is missing; rerun the curate stage")
    out = Path(out)
    tmp = _staging(out)
    try:
        pf = pq.ParquetFile(src)
        n = pf.metadata.num_rows
        n_shards = max(1, -(-n // shard_rows))
        (tmp / DATA_DIR).mkdir()
        table = pf.read()  # the curate export's schema, HF features metadata included
        for k in range(n_shards):
            pq.write_table(
                table.slice(k * shard_rows, shard_rows),
                tmp / DATA_DIR / f"train-{k:05d}-of-{n_shards:05d}.parquet",
                compression="zstd",
            )
        counts = json.loads(row["source_counts"] or "{}")
        lineage = {
            "dataset_id": dataset_id,
            "name": row["name"],
            "config_hash": row.get("config_hash"),
            "git_sha": row.get("git_sha"),
            "created_at": str(row.get("created_at")),
            "n_episodes": row["n_episodes"],
            "n_rows": n,
            "source_episodes": list(row["episode_ids"] or []),
            "teacher_student_mix": counts.get("by_source", {}),
            "source_counts": counts,
            "curate_query": row.get("query"),
        }
        (tmp / "lineage.json").write_text(json.dumps(lineage, indent=2, sort_keys=True) + "\n")
        info = {"features": sft_features()._to_yaml_list(), "splits": [{"name": "train", "num_examples": n}]}
        data = DatasetCardData(
            license=license,
            pretty_name=f"gui-flywheel {dataset_id}",
            task_categories=["image-text-to-text"],
            tags=["gui-agent", "computer-use", "gui-flywheel"],
            configs=[
                {"config_name": "default", "data_files": [{"split": "train", "path": f"{DATA_DIR}/train-*.parquet"}]}
            ],
            dataset_info=info,
        )
        (tmp / "README.md").write_text(_card(data, _dataset_body(row, lineage, n, license)))
        _finish(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return {
        "path": str(out),
        "rows": n,
        "shards": n_shards,
        "episodes": row["n_episodes"],
        "mix": lineage["teacher_student_mix"],
    }


# ------------------------------------------------------------------------------------------------ checkpoint
def _checkpoint_row(lake: Lake, checkpoint_id: str) -> dict[str, Any]:
    rows = (
        connect(lake)
        .sql(
            "SELECT * FROM checkpoints WHERE checkpoint_id = ? ORDER BY created_at DESC LIMIT 1", params=[checkpoint_id]
        )
        .to_arrow_table()
        .to_pylist()
        if lake.has_data("checkpoints")
        else []
    )
    if not rows:
        raise HubError(f"no checkpoint {checkpoint_id!r} in the lake at {lake.root}: run the sft or rl stage first")
    return rows[0]


def _model_folder(lake: Lake, row: dict) -> Path:
    from training.core import MERGED_DIR

    folder = lake.resolve(row["path"])
    if (folder / MERGED_DIR / "config.json").is_file():  # SFT merged its LoRA: publish the full model
        folder = folder / MERGED_DIR
    if not (folder / "config.json").is_file() and not (folder / "adapter_config.json").is_file():
        raise HubError(f"checkpoint {row['checkpoint_id']}: {folder} holds no model (no config.json)")
    return folder


def eval_rows(lake: Lake, row: dict, folder: Path) -> list[dict[str, Any]]:
    """The newest evaluation of this checkpoint (evals.checkpoint_id names it by id or by its folder)."""
    if not lake.has_data("evals"):
        return []
    names = sorted({row["checkpoint_id"], row["path"], lake.rel(folder), str(folder), str(lake.resolve(row["path"]))})
    return (
        connect(lake)
        .sql(
            """SELECT eval_id, task_id, split, n_episodes, successes, success_rate, ci_low, ci_high, iteration
           FROM evals WHERE eval_id = (SELECT eval_id FROM evals WHERE list_contains(?, checkpoint_id)
                                       ORDER BY created_at DESC LIMIT 1)
           ORDER BY task_id""",
            params=[names],
        )
        .to_arrow_table()
        .to_pylist()
    )


def _hub_id(name: str | None) -> str | None:
    """A base model written as a Hub id (org/name), not a local folder: the card's base_model may only name those."""
    if not name or Path(name).is_absolute() or name.startswith(".") or name.count("/") != 1 or Path(name).exists():
        return None
    return name


def export_checkpoint(
    lake: Lake, checkpoint_id: str, out: Path, *, license: str = "unknown", dataset_repo: str | None = None
) -> dict[str, Any]:
    """A checkpoint row -> a Hub-ready model folder with a model card; returns what was written."""
    from huggingface_hub import EvalResult, ModelCardData

    row = _checkpoint_row(lake, checkpoint_id)
    folder = _model_folder(lake, row)
    evals = eval_rows(lake, row, folder)
    out = Path(out)
    tmp = _staging(out)
    try:
        files = sorted(
            p.name
            for p in folder.iterdir()
            if p.is_file() and p.suffix in _MODEL_SUFFIXES and p.name not in _NOT_PUBLISHED
        )
        for name in files:
            shutil.copy2(folder / name, tmp / name)
        (tmp / "eval_results.json").write_text(json.dumps(evals, indent=2, default=str) + "\n")
        adapter = (folder / "adapter_config.json").is_file() and not (folder / "config.json").is_file()
        results = [
            EvalResult(
                task_type="gui-control",
                task_name="GUI control",
                dataset_type="miniwob",
                dataset_name=f"MiniWoB++ {e['split']} ({e['task_id']})",
                metric_type="success_rate",
                metric_name="success rate",
                metric_value=round(float(e["success_rate"]), 4),
            )
            for e in evals
            if e["task_id"].startswith("__")
        ]
        base = _hub_id(row.get("base_model"))
        data = ModelCardData(
            base_model=base,
            datasets=[dataset_repo] if dataset_repo else None,
            license=license,
            library_name="peft" if adapter else "transformers",
            pipeline_tag="image-text-to-text",
            tags=["gui-agent", "computer-use", "gui-flywheel"],
            model_name=checkpoint_id,
            eval_results=results or None,
        )
        table = "\n".join(
            f"| {e['task_id']} | {e['split']} | {e['n_episodes']} | {e['successes']} | "
            f"{e['success_rate']:.3f} | [{e['ci_low']:.3f}, {e['ci_high']:.3f}] |"
            for e in evals
        )
        dataset_link = f" ([{dataset_repo}](https://huggingface.co/datasets/{dataset_repo}))" if dataset_repo else ""
        eval_intro = (
            "(no evaluation of this checkpoint in the lake)"
            if not evals
            else f"Eval `{evals[0]['eval_id']}`, success on held-out seeds (eval-seed) and held-out tasks (eval-task), "
            "95% Wilson interval:"
        )
        body = f"""
# {checkpoint_id}

A gui-flywheel student checkpoint (method `{row.get("method")}`{", a LoRA adapter" if adapter else ""}).

- base model: `{row.get("base_model")}`; parent checkpoint: `{row.get("parent_checkpoint")}`
- dataset: `{row.get("dataset_id")}`{dataset_link}
- config hash `{row.get("config_hash")}`, git sha `{row.get("git_sha")}`
- training metrics: `{row.get("metrics") or "{}"}`

## Evaluation

{eval_intro}

| task | split | episodes | successes | success rate | 95% CI |
|---|---|---|---|---|---|
{table}

## Licence

`{license}`.
"""
        (tmp / "README.md").write_text(_card(data, body))
        _finish(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return {"path": str(out), "files": files, "evals": len(evals), "source": str(folder)}


# ------------------------------------------------------------------------------------------------ push
def push(folder: Path, repo_id: str, repo_type: str, *, private: bool = False, endpoint: str | None = None) -> str:
    """Upload an exported folder as one commit (create the repo if needed); returns the commit URL.
    endpoint: the Hub's URL (default: huggingface_hub's, i.e. HF_ENDPOINT or https://huggingface.co)."""
    from huggingface_hub import HfApi, constants, get_token
    from huggingface_hub.errors import HfHubHTTPError, OfflineModeIsEnabled

    if repo_id.count("/") != 1 or not all(repo_id.split("/")):
        raise HubError(f"--push {repo_id!r}: give the repo as org/name")
    if constants.HF_HUB_OFFLINE:
        raise HubError(f"offline (HF_HUB_OFFLINE is set): nothing pushed; the folder is ready at {folder}")
    token = get_token()
    if not token:
        raise HubError(
            f"no Hugging Face token (set HF_TOKEN or run `hf auth login`): nothing pushed; the folder "
            f"is ready at {folder}"
        )
    api = HfApi(endpoint=endpoint, token=token)
    where = api.endpoint
    try:
        api.create_repo(repo_id, repo_type=repo_type, private=private, exist_ok=True)
        info = api.upload_folder(
            folder_path=str(folder),
            repo_id=repo_id,
            repo_type=repo_type,
            commit_message=f"gui-flywheel export of {folder.name}",
        )
    except OfflineModeIsEnabled:
        raise HubError(f"offline: nothing pushed; the folder is ready at {folder}") from None
    except HfHubHTTPError as e:
        status = e.response.status_code if e.response is not None else None
        why = "the Hub refused the token" if status in (401, 403) else f"the Hub answered {status}"
        raise HubError(f"{why} for {repo_type} {repo_id}: nothing pushed; the folder is ready at {folder}") from None
    except ValueError as e:  # huggingface_hub: the Hub's YAML check rejected the card's metadata
        raise HubError(f"the Hub rejected the card of {repo_id}: {str(e).splitlines()[0]}; nothing pushed") from None
    except OSError as e:  # connection refused, DNS, timeouts (httpx errors are not OSError: see below)
        raise HubError(
            f"cannot reach the Hub at {where} ({type(e).__name__}): nothing pushed; the folder is ready at {folder}"
        ) from None
    except Exception as e:  # noqa: BLE001 - httpx transport errors: one line, never the request headers
        if type(e).__module__.startswith("httpx"):
            raise HubError(
                f"cannot reach the Hub at {where} ({type(e).__name__}): nothing pushed; the folder is ready at {folder}"
            ) from None
        raise
    return str(info.commit_url) if hasattr(info, "commit_url") else str(info)
