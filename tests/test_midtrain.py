"""Mid-training (flywheel/midtrain.py) on a real lake: the oracle's corpus on synthetic pages in Chromium, its
dataset, a tiny model trained into the base checkpoint, the skill report, reuse by content, and the flywheel's
first SFT starting from that base while its own datasets never include the corpus."""

from __future__ import annotations

from pathlib import Path

import pytest

from configs.loading import load_config
from configs.models import ConfigError
from flywheel import midtrain as mt
from flywheel import specs, stages
from flywheel.errors import UserError
from storage.catalog import connect
from storage.lake import Lake

pytestmark = pytest.mark.browser
ROOT = Path(__file__).resolve().parents[1]
KINDS = ["synth/click", "synth/type"]


def _cfg(tmp: Path, **over):
    base = {
        "lake.root": str(tmp / "lake"),
        "student.model": str(tmp / "student"),
        "midtrain.enabled": True,
        "midtrain.tasks": KINDS,
        "midtrain.episodes_per_task": 3,
        "midtrain.eval_seeds_per_task": 1,
        "midtrain.sft.max_steps": 3,
        "midtrain.sft.batch_size": 2,
        "midtrain.sft.method": "full",
        "sft.max_steps": 2,
        "sft.batch_size": 2,
        "sft.method": "full",
        "rollout.envs": 2,
    }
    return load_config(ROOT / "configs" / "tiny.yaml", {**base, **over})


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    from training.models import init_model

    tmp = tmp_path_factory.mktemp("midtrain")
    init_model("qwen3-vl", "tiny", tmp / "student", seed=0)
    cfg = _cfg(tmp)
    return {"tmp": tmp, "cfg": cfg, "res": mt.midtrain(cfg, progress=False)}


def _rows(cfg, sql: str) -> list[dict]:
    return connect(Lake(cfg.lake.root)).sql(sql).to_arrow_table().to_pylist()


def test_corpus_dataset_base_and_skill_report(built):
    cfg, res = built["cfg"], built["res"]
    eps = _rows(
        cfg, "SELECT task_id, seed, split, success, policy, policy_version FROM episodes WHERE stage = 'midtrain'"
    )
    assert sorted((e["task_id"], e["seed"]) for e in eps) == sorted((t, s) for t in KINDS for s in range(3))
    assert all(e["success"] and e["split"] == "train" and e["policy"] == "scripted" for e in eps)
    ds = _rows(cfg, f"SELECT * FROM datasets WHERE dataset_id = '{res['dataset_id']}'")
    assert len(ds) == 1 and ds[0]["stage"] == "midtrain" and ds[0]["n_episodes"] == 6
    assert "e.stage = 'midtrain'" in ds[0]["query"]
    # every fit step of the corpus is a sample: a click page is one click, a type page click + type + press
    fit = _rows(
        cfg,
        "SELECT count(*) AS n FROM steps s JOIN episodes e USING (episode_id) "
        "WHERE e.stage = 'midtrain' AND NOT s.is_final AND s.parse_ok AND s.exec_error IS NULL",
    )[0]["n"]
    assert res["n_samples"] == ds[0]["n_steps"] == fit >= 6
    ck = _rows(cfg, "SELECT * FROM checkpoints WHERE stage = 'midtrain'")
    assert len(ck) == 1 and ck[0]["method"] == "midtrain" and ck[0]["checkpoint_id"] == res["checkpoint_id"]
    assert ck[0]["dataset_id"] == res["dataset_id"] and res["checkpoint_id"].startswith("base-")
    assert res["steps"] == 3 and not res.reused and Path(res["model_path"], "config.json").exists()
    ev = _rows(cfg, "SELECT task_id, n_episodes, split FROM evals WHERE stage = 'midtrain'")
    assert {r["task_id"] for r in ev} == {*KINDS, "__all__"} and all(r["split"] == "eval-seed" for r in ev)
    held = _rows(cfg, "SELECT DISTINCT split, seed >= 100000 AS eval_seed FROM episodes WHERE stage = 'midtrain-eval'")
    assert held == [{"split": "eval", "eval_seed": True}]  # held-out pages: the eval seed range only
    assert set(res["skills"]["per_task"]) == set(KINDS)
    assert mt.base_checkpoint(cfg) == res["model_path"]


def test_second_run_reuses_the_base_and_new_settings_train_a_new_one(built):
    cfg, res = built["cfg"], built["res"]
    n_eps = _rows(cfg, "SELECT count(*) AS n FROM episodes")[0]["n"]
    again = mt.midtrain(cfg, progress=False)
    assert again.reused and again["checkpoint_id"] == res["checkpoint_id"]
    assert _rows(cfg, "SELECT count(*) AS n FROM episodes")[0]["n"] == n_eps  # no episode ran again
    assert _rows(cfg, "SELECT count(*) AS n FROM checkpoints WHERE stage = 'midtrain'")[0]["n"] == 1
    other = mt.checkpoint_id_for(
        {"dataset_id": res["dataset_id"], "episode_ids": ["x"], "n_steps": 1},
        "m",
        __import__("training.sft", fromlist=["TrainSettings"]).TrainSettings(max_steps=4),
    )
    assert other != res["checkpoint_id"]


def test_first_sft_starts_from_the_base_and_curate_leaves_the_corpus_out(built):
    cfg = built["cfg"]
    specs.register_tasks(cfg)
    stages.bootstrap(cfg, 0, progress=False)
    cur = stages.curate(cfg, 0)
    chosen = set(cur["source_counts"]["by_task"])
    assert chosen == {"click-test", "focus-text"}  # the flywheel's own tasks, no synth/* corpus
    trained = stages.sft(cfg, 0, cur["dataset_id"])
    assert trained["parent_checkpoint"] == built["res"]["checkpoint_id"]
    # later stages never take the base for a flywheel checkpoint
    assert specs.latest_checkpoint(cfg, 1).startswith(str(Path(cfg.lake.root).resolve() / "_checkpoints" / "sft-it0"))


def test_midtrain_tasks_must_be_synthetic(tmp_path):
    with pytest.raises(UserError, match="synth/<kind>"):
        mt.corpus(_cfg(tmp_path, **{"midtrain.tasks": ["click-test"]}), progress=False)


def test_base_is_found_by_its_corpus_and_a_missing_base_is_an_error(built, tmp_path):
    cfg = built["cfg"]
    # a setting that changes neither the corpus nor the dataset still finds the same base
    other = cfg.model_copy(update={"midtrain": cfg.midtrain.model_copy(update={"eval_seeds_per_task": 5})})
    assert mt.base_checkpoint(other) == built["res"]["model_path"]
    with pytest.raises(UserError, match="flywheel stage midtrain"):
        mt.base_checkpoint(_cfg(tmp_path))  # an empty lake: one clear line, not the random-init student


def test_pages_size_each_named_kind_and_leave_the_rest_at_episodes_per_task(built):
    cfg = _cfg(built["tmp"], **{"midtrain.pages": {"synth/click": 4}})
    spec = mt.corpus_spec(cfg)
    per_kind = {t: sorted(j.seed for j in spec.jobs if j.task_id == t) for t in KINDS}
    assert {t: len(s) for t, s in per_kind.items()} == {"synth/click": 4, "synth/type": 3}
    assert per_kind["synth/type"] == per_kind["synth/click"][:3]  # the same first train seeds
    assert spec.run_key != mt.corpus_spec(built["cfg"]).run_key  # another corpus, another run
    # without `pages` the corpus keeps the run key it had before the field existed: the built lake's corpus
    assert mt.corpus_spec(built["cfg"]).run_key == built["res"]["corpus_run_key"]
    res = mt.corpus(cfg, progress=False)
    counts = _rows(
        cfg, f"SELECT task_id, count(*) AS n FROM episodes WHERE run_key = '{res['run_key']}' GROUP BY 1 ORDER BY 1"
    )
    assert counts == [{"task_id": "synth/click", "n": 4}, {"task_id": "synth/type", "n": 3}]
    # the dataset keeps every page of the biggest kind (its per-task cap is the largest count)
    assert mt.build_dataset(cfg, res["run_key"])["n_episodes"] == 7
    assert mt.dataset_id_for(cfg, res["run_key"]) != mt.dataset_id_for(built["cfg"], res["run_key"])


def test_pages_must_name_kinds_of_the_corpus(tmp_path):
    with pytest.raises(ConfigError, match="midtrain.pages names kinds not in midtrain.tasks: synth/form"):
        _cfg(tmp_path, **{"midtrain.pages": {"synth/form": 5}})
    with pytest.raises(ConfigError, match=">= 1 page"):
        _cfg(tmp_path, **{"midtrain.pages": {"synth/click": 0}})


def test_a_changed_page_generator_is_another_corpus(built, monkeypatch):
    """The same kinds and seeds draw other pages once synth.js changes: the corpus (and so its dataset and the base)
    must not be found by the old run key, and a MiniWoB-only rollout's key does not depend on the generator."""
    from envs import synth

    cfg = built["cfg"]

    def miniwob_key() -> str:
        policy = mt.PolicySpec("scripted")
        spec = specs.rollout_spec(
            cfg, iteration=0, stage="bootstrap", policy=policy, tasks=["click-test"], seeds=[1], split="train"
        )
        return spec.run_key

    before, plain = mt.corpus_spec(cfg).run_key, miniwob_key()
    monkeypatch.setattr(synth, "version", lambda: "0123456789ab")
    assert mt.corpus_spec(cfg).run_key != before
    assert mt.dataset_id_for(cfg, mt.corpus_spec(cfg).run_key) != mt.dataset_id_for(cfg, before)
    assert miniwob_key() == plain
