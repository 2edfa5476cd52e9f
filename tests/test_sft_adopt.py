"""Training elsewhere, recorded here: `flywheel stage sft --plan` prints what the stage would train, the printed
`python -m training.sft` command trains it in another folder (another machine's paths), and `--adopt` checks that
run against the stage's data, base and settings and files it as the stage's own checkpoint."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from safetensors.torch import load_file, save_file

from configs.loading import load_config
from storage.catalog import connect
from tests.test_sft import FAST, data_only_lake, env  # noqa: F401 (env: the module fixture)
from training.adopt import weights_digest

pytestmark = pytest.mark.browser
ROOT = Path(__file__).resolve().parents[1]


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "flywheel", "stage", "sft", "-i", "0", *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=300,
        env={**os.environ, "COLUMNS": "400"},
    )


def _train_as_planned(plan: dict, remote: Path, base: Path, data: Path, **settings) -> Path:
    """Run the plan's command with the other machine's paths (copies of the base and the export)."""
    cmd = shlex.split(plan["command"])
    cmd[0] = sys.executable
    subs = {plan["base"]: str(base), plan["data"]: str(data), "<folder>": str(remote)}
    cmd = [subs.get(c, c) for c in cmd]
    if settings:
        i = cmd.index("--settings") + 1
        cmd[i] = json.dumps({**json.loads(cmd[i]), **settings})
    r = subprocess.run([*cmd, "--no-progress"], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    return remote


def test_a_run_trained_elsewhere_is_adopted_as_the_stage_checkpoint(env, tmp_path):  # noqa: F811
    from flywheel.errors import UserError
    from flywheel.stages import sft

    def cfg_file(name: str) -> tuple[Path, object]:
        cfg = load_config(
            ROOT / "configs" / "tiny.yaml",
            {
                "lake.root": str(data_only_lake(env, tmp_path / name)),
                "student.model": str(env["tiny"]),
                **{f"sft.{k}": v for k, v in FAST.items()},
                "sft.max_steps": 3,
            },
        )
        path = tmp_path / f"{name}.yaml"
        path.write_text(json.dumps(cfg.model_dump(mode="json")))
        return path, cfg

    path, cfg = cfg_file("here")
    r = _cli("--plan", "-c", str(path))
    assert r.returncode == 0, r.stderr
    plan = json.loads(r.stdout)
    assert plan["base"] == str(Path(env["tiny"]).resolve()) and plan["settings"]["max_steps"] == 3
    assert plan["base_sha256"] == weights_digest(env["tiny"]) and Path(plan["data"]).is_file()
    # "another machine": the base and the export copied to its own paths, trained there by the printed command
    other = tmp_path / "other"
    shutil.copytree(env["tiny"], other / "base")
    shutil.copy(plan["data"], other / "train.parquet")
    remote = _train_as_planned(plan, other / "run", other / "base", other / "train.parquet")
    assert not list(Path(cfg.lake.root).glob("_checkpoints/*"))  # nothing trained in the lake yet

    r = _cli("--adopt", str(remote), "-c", str(path))
    assert r.returncode == 0, r.stderr
    assert f"adopted checkpoint {plan['checkpoint_id']}: 3 steps" in r.stdout
    row = connect(cfg.lake.root).sql("SELECT * FROM checkpoints").to_arrow_table().to_pylist()
    assert len(row) == 1 and row[0]["checkpoint_id"] == plan["checkpoint_id"]
    metrics = json.loads(row[0]["metrics"])
    assert metrics["steps"] == 3 and metrics["adopted_from"] == str(remote.resolve())
    assert row[0]["base_model"] == str(Path(env["tiny"]).resolve())  # this lake's base, not the other machine's
    assert metrics["trained_base_model"] == str((other / "base").resolve())
    ckpt = Path(cfg.lake.root) / row[0]["path"]
    assert not (ckpt / "state").exists() and weights_digest(ckpt / "merged") == weights_digest(remote / "merged")
    # the stage now reuses it: the same checkpoint it would have trained here (same id, same losses)
    again = sft(cfg, 0, env["dataset_id"], progress=False)
    assert again.reused and again["checkpoint_id"] == plan["checkpoint_id"]
    reread = connect(cfg.lake.root).sql("SELECT base_model, metrics FROM checkpoints").fetchall()
    assert reread[0][0] == row[0]["base_model"] and json.loads(reread[0][1])["adopted_from"] == str(remote.resolve())
    _, cfg_b = cfg_file("trained-here")
    local = sft(cfg_b, 0, env["dataset_id"], progress=False)
    assert local["checkpoint_id"] == plan["checkpoint_id"] and not local.reused
    assert local["final_loss"] == pytest.approx(again["final_loss"], abs=1e-4)
    # the flywheel benchmark reads where its control trained from the lake, not from a hand-written note
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from flywheel_report import trained_on

    assert trained_on(Path(cfg.lake.root)) == {"device": "cpu", "dtype": "float32", "adopted": True}
    assert trained_on(Path(cfg_b.lake.root))["adopted"] is False

    # a run that cannot stand in for the stage: other settings, other data, other base weights; each is named
    other_base = other / "base2"
    shutil.copytree(other / "base", other_base)
    weights = other_base / "model.safetensors"
    tensors = load_file(weights)
    name = sorted(tensors)[-1]
    tensors[name] = tensors[name] + 1.0
    save_file(tensors, weights, metadata={"format": "pt"})
    table = pq.read_table(other / "train.parquet")
    pq.write_table(table.slice(0, table.num_rows - 1), other / "fewer.parquet")
    wrong = _train_as_planned(plan, other / "wrong", other_base, other / "fewer.parquet", lr=0.02)
    path_c, _ = cfg_file("c")
    r = _cli("--adopt", str(wrong), "-c", str(path_c))
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert r.stderr.startswith(f"error: cannot adopt {wrong}"), r.stderr
    for why in ("lr=0.02 (the stage's: 0.01)", "other data than", "other weights than"):
        assert why in r.stderr, r.stderr
    assert connect(tmp_path / "c").sql("SELECT count(*) FROM checkpoints").fetchone()[0] == 0
    with pytest.raises(UserError, match="not a finished training run"):
        sft(load_config(path_c), 0, env["dataset_id"], adopt=str(other / "base"))


def test_weights_digest_follows_the_tensors_not_the_files(tmp_path):
    import torch

    a = {"w": torch.arange(6, dtype=torch.float32).reshape(2, 3), "b": torch.ones(3, dtype=torch.bfloat16)}
    (tmp_path / "one").mkdir()
    save_file(a, tmp_path / "one" / "model.safetensors", metadata={"format": "pt"})
    (tmp_path / "two").mkdir()  # the same tensors in two shards, other metadata
    save_file({"b": a["b"]}, tmp_path / "two" / "model-00001.safetensors")
    save_file({"w": a["w"]}, tmp_path / "two" / "model-00002.safetensors", metadata={"x": "y"})
    assert weights_digest(tmp_path / "one") == weights_digest(tmp_path / "two")
    (tmp_path / "three").mkdir()
    save_file({**a, "w": a["w"].reshape(3, 2)}, tmp_path / "three" / "model.safetensors")  # same bytes, other shape
    assert weights_digest(tmp_path / "three") != weights_digest(tmp_path / "one")
    assert weights_digest("Qwen/Qwen2.5-VL-3B-Instruct") is None and weights_digest(tmp_path) is None
