"""`flywheel export ...`: Hub-ready folders of a curated dataset or a checkpoint, optionally pushed to the Hub.

    flywheel export dataset curate-it1-ab12cd34ef --out hub/ds --license cc-by-4.0 [--push me/gui-sft]
    flywheel export checkpoint sft-it1-0123456789 --out hub/model --dataset-repo me/gui-sft [--push me/gui-student]

--push uploads the folder with huggingface_hub (token from HF_TOKEN or `hf auth login`; HF_ENDPOINT picks the
server). Without a token or network it prints one line and exits 2; the exported folder stays for a later push.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from flywheel.cli.common import CONFIG_OPT, LAKE_OPT, open_lake

export_app = typer.Typer(
    help="Export a dataset or checkpoint as a Hub-ready folder (and push it).", no_args_is_help=True
)

OUT_OPT = typer.Option(..., "--out", help="Folder to write (must not exist or be empty).")
PUSH_OPT = typer.Option(None, "--push", help="Also upload to this Hub repo (org/name).")
LICENSE_OPT = typer.Option("unknown", "--license", help="Licence id for the card (e.g. apache-2.0, cc-by-4.0).")
PRIVATE_OPT = typer.Option(False, "--private", help="Create the Hub repo as private.")


def _push(folder: Path, repo: Optional[str], repo_type: str, private: bool) -> None:
    if repo:
        from flywheel.interop.hub import push

        url = push(folder, repo, repo_type, private=private)
        typer.echo(f"pushed {repo_type} {repo}: {url}")


@export_app.command("dataset")
def dataset(
    dataset_id: str = typer.Argument(..., help="Dataset id (datasets.dataset_id, printed by the curate stage)."),
    out: Path = OUT_OPT,
    push: Optional[str] = PUSH_OPT,
    license: str = LICENSE_OPT,
    private: bool = PRIVATE_OPT,
    lake: Optional[str] = LAKE_OPT,
    config: Optional[Path] = CONFIG_OPT,
):
    """Parquet shards (messages + images), lineage.json and a dataset card; datasets.load_dataset(DIR) reads it."""
    from flywheel.interop.hub import export_dataset

    res = export_dataset(open_lake(lake, config, create=True), dataset_id, out, license=license)
    typer.echo(
        f"exported dataset {dataset_id}: {res['rows']} rows in {res['shards']} shard(s) from "
        f"{res['episodes']} episodes -> {res['path']}"
    )
    _push(out, push, "dataset", private)


@export_app.command("checkpoint")
def checkpoint(
    checkpoint_id: str = typer.Argument(..., help="Checkpoint id (checkpoints.checkpoint_id)."),
    out: Path = OUT_OPT,
    push: Optional[str] = PUSH_OPT,
    license: str = LICENSE_OPT,
    dataset_repo: Optional[str] = typer.Option(
        None, "--dataset-repo", help="Hub id of its exported dataset, for the card."
    ),
    private: bool = PRIVATE_OPT,
    lake: Optional[str] = LAKE_OPT,
    config: Optional[Path] = CONFIG_OPT,
):
    """The model files and a model card (base model, dataset, eval results from the evals table)."""
    from flywheel.interop.hub import export_checkpoint

    res = export_checkpoint(
        open_lake(lake, config, create=True), checkpoint_id, out, license=license, dataset_repo=dataset_repo
    )
    typer.echo(
        f"exported checkpoint {checkpoint_id}: {len(res['files'])} files from {res['source']}, "
        f"{res['evals']} eval rows -> {res['path']}"
    )
    _push(out, push, "model", private)
