"""`flywheel export dataset|checkpoint` and `--push`: a real lake (slime demos imported, then curated), a real tiny
model folder, `datasets.load_dataset` reading the exported folder back, and the push checked at the HTTP boundary
against tests/hub_server.py (the Hub API as huggingface_hub calls it). The token must never leave the request."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path

import pytest
from hub_server import HubServer

from storage.catalog import connect

ROOT = Path(__file__).resolve().parents[1]
SLIME = ROOT / "tests" / "fixtures" / "slime" / "osworld_reasoning_sft_sample.jsonl"
TOKEN = "hf_flywheelTestSecret0123456789"


@pytest.fixture(scope="module")
def lake(tmp_path_factory) -> dict:
    from configs.loading import load_config
    from flywheel.interop.slime import import_slime
    from storage.lake import Lake
    from training.export import curate

    root = tmp_path_factory.mktemp("export") / "lake"
    lk = Lake(root)
    import_slime(SLIME, lk)
    ds = curate(load_config(ROOT / "configs" / "tiny.yaml", {"lake.root": str(root)}), iteration=0, held_out=[])
    return {"root": root, "lake": lk, "dataset": ds}


def fw(*args, **env):
    return subprocess.run(
        [sys.executable, "-m", "flywheel", *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
        # large files take the git-lfs path (tests/hub_server.py stands in for it; not for Xet's CAS protocol)
        env={**os.environ, "FLYWHEEL_LAKE": "", "HF_HUB_DISABLE_TELEMETRY": "1", "HF_HUB_DISABLE_XET": "1", **env},
    )


def _all_text(folder: Path) -> bytes:
    return b"".join(p.read_bytes() for p in folder.rglob("*") if p.is_file())


def test_export_dataset_loads_back_with_card_and_lineage(lake, tmp_path):
    import datasets
    from huggingface_hub import DatasetCard

    ds_id, out = lake["dataset"]["dataset_id"], tmp_path / "hub-ds"
    r = fw("export", "dataset", ds_id, "--out", str(out), "--license", "cc-by-4.0", "--lake", str(lake["root"]))
    assert r.returncode == 0, r.stderr
    assert f"exported dataset {ds_id}: 5 rows in 1 shard(s) from 1 episodes" in r.stdout
    loaded = datasets.load_dataset(str(out), cache_dir=str(tmp_path / "cache"))["train"]
    assert len(loaded) == 5 and {"messages", "images"} <= set(loaded.features)
    row = loaded[0]
    assert row["images"][0].size == (64, 36)  # the imported screenshot, decoded as a PIL image
    assert [m["role"] for m in row["messages"]][-1] == "assistant" and "<tool_call>" in row["messages"][-1]["content"][
        0
    ]["text"]

    card = DatasetCard.load(out / "README.md")
    assert card.data.license == "cc-by-4.0"
    assert card.data.dataset_info["splits"] == [{"name": "train", "num_examples": 5}]
    assert [f["name"] for f in card.data.dataset_info["features"]][:2] == ["messages", "images"]
    lineage = json.loads((out / "lineage.json").read_text())
    ep_ids = connect(lake["root"]).execute("SELECT episode_id FROM episodes WHERE success").fetchall()
    assert lineage["source_episodes"] == [e[0] for e in ep_ids] and lineage["teacher_student_mix"] == {"teacher": 1}
    assert lineage["config_hash"] and "teacher 1, student 0" in card.text

    again = fw("export", "dataset", ds_id, "--out", str(out), "--lake", str(lake["root"]))  # never overwrites
    assert again.returncode == 2 and "exists and is not an empty folder" in again.stderr
    assert len(again.stderr.strip().splitlines()) == 1 and (out / "lineage.json").exists()
    missing = fw("export", "dataset", "curate-nope", "--out", str(tmp_path / "x"), "--lake", str(lake["root"]))
    assert missing.returncode == 2 and "no dataset 'curate-nope'" in missing.stderr and not (tmp_path / "x").exists()


def test_push_dataset_goes_through_the_hub_api_and_keeps_the_token_secret(lake, tmp_path):
    ds_id, out = lake["dataset"]["dataset_id"], tmp_path / "hub-ds"
    with HubServer(TOKEN) as hub:
        r = fw(
            "export",
            "dataset",
            ds_id,
            "--out",
            str(out),
            "--push",
            "me/gui-sft",
            "--lake",
            str(lake["root"]),
            HF_ENDPOINT=hub.url,
            HF_TOKEN=TOKEN,
            HF_HUB_OFFLINE="0",
        )
    assert r.returncode == 0, r.stderr
    assert "pushed dataset me/gui-sft" in r.stdout
    parquet = "data/train-00000-of-00001.parquet"
    oid = hashlib.sha256((out / parquet).read_bytes()).hexdigest()
    # in order; huggingface_hub checks the card's YAML once per upload step (the LFS upload adds one)
    paths = [q["path"] for i, q in enumerate(hub.requests) if i == 0 or q["path"] != hub.requests[i - 1]["path"]]
    assert paths == [
        "/api/repos/create",
        "/api/validate-yaml",
        "/api/datasets/me/gui-sft/preupload/main",
        "/datasets/me/gui-sft.git/info/lfs/objects/batch",  # the Parquet file is an LFS file on the Hub
        f"/lfs/{oid}",
        "/lfs/verify",
        "/api/datasets/me/gui-sft/commit/main",
    ]
    # the token goes to the Hub's API only, never to the upload href (on the Hub, a presigned storage URL)
    assert [q["auth"] for q in hub.requests if q["method"] == "PUT"] == [None]
    assert all(q["auth"] == f"Bearer {TOKEN}" for q in hub.requests if q["method"] == "POST")
    assert hub.requests[0]["json"] == {
        "name": "gui-sft",
        "organization": "me",
        "visibility": "public",
        "type": "dataset",
    }
    commit = hub.requests[-1]["ndjson"]
    assert commit[0]["key"] == "header" and "gui-flywheel export" in commit[0]["value"]["summary"]
    files = {ln["value"]["path"]: base64.b64decode(ln["value"]["content"]) for ln in commit if ln["key"] == "file"}
    assert sorted(files) == ["README.md", "lineage.json"]
    lfs = {ln["value"]["path"]: ln["value"] for ln in commit if ln["key"] == "lfsFile"}
    assert lfs == {parquet: {"path": parquet, "algo": "sha256", "oid": oid, "size": (out / parquet).stat().st_size}}
    files[parquet] = hub.lfs[oid]
    assert all(files[p] == (out / p).read_bytes() for p in files)  # byte for byte what was exported
    # the token went only into the Authorization header: not into output, logs, card or files
    assert TOKEN not in r.stdout + r.stderr and TOKEN.encode() not in _all_text(out)
    assert all(TOKEN.encode() not in c for c in files.values())


def test_push_without_a_token_is_one_line_and_keeps_the_export(lake, tmp_path):
    ds_id = lake["dataset"]["dataset_id"]
    no_token = fw(
        "export",
        "dataset",
        ds_id,
        "--out",
        str(tmp_path / "a"),
        "--push",
        "me/x",
        "--lake",
        str(lake["root"]),
        HF_TOKEN="",
        HF_HUB_OFFLINE="0",
        HF_HOME=str(tmp_path / "hf-home"),
    )
    assert no_token.returncode == 2 and "no Hugging Face token" in no_token.stderr
    assert len(no_token.stderr.strip().splitlines()) == 1 and (tmp_path / "a" / "README.md").exists()


def test_push_offline_unreachable_or_refused_is_one_hub_error(lake, tmp_path, monkeypatch):
    import socket

    from huggingface_hub import constants

    from flywheel.interop.hub import HubError, export_dataset, push

    folder = Path(export_dataset(lake["lake"], lake["dataset"]["dataset_id"], tmp_path / "ds")["path"])
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    with pytest.raises(HubError, match="offline"):  # HF_HUB_OFFLINE=1 (conftest): nothing is tried
        push(folder, "me/x", "dataset")
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    with socket.socket() as s:  # a port nothing listens on: the network is unreachable
        s.bind(("127.0.0.1", 0))
        closed = f"http://127.0.0.1:{s.getsockname()[1]}"
    with pytest.raises(HubError, match="cannot reach the Hub at http://127.0.0.1") as unreachable:
        push(folder, "me/x", "dataset", endpoint=closed)
    with HubServer("hf_someone_else") as hub:
        with pytest.raises(HubError, match="the Hub refused the token for dataset me/x") as refused:
            push(folder, "me/x", "dataset", endpoint=hub.url)
    # in order; huggingface_hub checks the card's YAML once per upload step (the LFS upload adds one)
    paths = [q["path"] for i, q in enumerate(hub.requests) if i == 0 or q["path"] != hub.requests[i - 1]["path"]]
    assert paths[0] == "/api/repos/create" and not any("/commit/" in p or "/preupload/" in p for p in paths)
    for e in (unreachable, refused):
        assert TOKEN not in str(e.value) and "\n" not in str(e.value) and "nothing pushed" in str(e.value)
    assert (folder / "lineage.json").exists()  # the export stays for a later push


def test_export_checkpoint_model_card_with_evals_and_push(lake, tmp_path):
    from huggingface_hub import ModelCard

    from training.models import describe, init_model

    lk, root = lake["lake"], lake["root"]
    model = init_model("qwen3-vl", "tiny", root / "_checkpoints" / "sft-it0-test")
    (model / "sft_result.json").write_text(json.dumps({"model_path": str(model)}))  # local bookkeeping: not published
    now = datetime.now(timezone.utc)
    lk.replace_run(
        "checkpoints",
        [
            [
                dict(
                    checkpoint_id="sft-it0-test",
                    path=lk.rel(model),
                    method="sft",
                    base_model="Qwen/Qwen3-VL-2B-Instruct",
                    parent_checkpoint=None,
                    dataset_id=lake["dataset"]["dataset_id"],
                    adapter=False,
                    metrics=json.dumps({"final_loss": 0.5}),
                    created_at=now,
                    run_key="sft-it0-test",
                    git_sha=None,
                    config_hash="abc",
                )
            ]
        ],
        iteration=0,
        stage="sft",
        run_key="sft-it0-test",
    )
    # the rows flywheel.evaluate writes: per task, then the overall row; evals name a lake folder relative to the root
    ev = [
        dict(
            eval_id="eval-1",
            checkpoint_id=lk.rel(model),
            task_id=t,
            split="eval-seed",
            n_episodes=4,
            successes=s,
            success_rate=s / 4,
            ci_low=0.1,
            ci_high=0.9,
            avg_steps=2.0,
            parse_error_rate=0.0,
            created_at=now,
            run_key="ev",
            git_sha=None,
            config_hash="abc",
        )
        for t, s in (("click-test", 3), ("__all__", 3))
    ]
    lk.replace_run("evals", [ev], iteration=0, stage="evaluate", run_key="ev")

    out = tmp_path / "hub-model"
    with HubServer(TOKEN) as hub:
        r = fw(
            "export",
            "checkpoint",
            "sft-it0-test",
            "--out",
            str(out),
            "--dataset-repo",
            "me/gui-sft",
            "--license",
            "apache-2.0",
            "--push",
            "me/gui-student",
            "--lake",
            str(root),
            HF_ENDPOINT=hub.url,
            HF_TOKEN=TOKEN,
            HF_HUB_OFFLINE="0",
        )
    assert r.returncode == 0, r.stderr
    assert "2 eval rows" in r.stdout and "pushed model me/gui-student" in r.stdout
    assert {"config.json", "model.safetensors", "tokenizer.json", "README.md"} <= {p.name for p in out.iterdir()}
    assert not (out / "sft_result.json").exists()
    assert describe(out)["arch"] == "qwen3-vl"  # the exported folder is a loadable model folder
    card = ModelCard.load(out / "README.md")
    assert card.data.base_model == "Qwen/Qwen3-VL-2B-Instruct" and card.data.datasets == ["me/gui-sft"]
    assert card.data.license == "apache-2.0"
    (res,) = card.data.eval_results
    assert res.metric_type == "success_rate" and res.metric_value == 0.75
    assert "| click-test | eval-seed | 4 | 3 | 0.750 |" in card.text
    assert [q["path"] for q in hub.requests][-1] == "/api/models/me/gui-student/commit/main"
    commit = hub.requests[-1]["ndjson"]
    pushed = {ln["value"]["path"] for ln in commit if ln["key"] in ("file", "lfsFile")}
    assert pushed == {p.name for p in out.iterdir()}
    # the weights went the large-file way: LFS batch, PUT of the exact bytes, verify, then an lfsFile commit line
    (weights,) = [ln["value"] for ln in commit if ln["key"] == "lfsFile"]
    data = (out / "model.safetensors").read_bytes()
    assert weights["path"] == "model.safetensors" and weights["oid"] == hashlib.sha256(data).hexdigest()
    assert hub.lfs[weights["oid"]] == data and weights["size"] == len(data)
    assert TOKEN not in r.stdout + r.stderr and TOKEN.encode() not in _all_text(out)
