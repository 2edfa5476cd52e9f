"""Run keys and ids: the same config gives the same ids, pinned.

The values below were computed from the code before configs/runkeys.py existed (each id function then hashed its
own payload with its own exclusion list). A change that moves one of them renames every run of that kind in an
existing lake: a rerun would train or sample again instead of finding its finished result.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from configs.loading import load_config

ROOT = Path(__file__).resolve().parents[1]
# a fixed manifest and base: the checkpoint ids hash the data (episodes, steps) and the base, not a lake
DATASET = {"dataset_id": "curate-it1-0123456789", "episode_ids": ["ep-b", "ep-a", "ep-c"], "n_steps": 7}
BASE = "_checkpoints/sft-it0-0123456789/merged"
MODEL = "models/tiny-qwen3vl"

# config_hash of the whole config changes with every new config field (provenance, by design): env.ca_file
# (session 18) moved the first entry; the run keys and ids above it did not move. Session 23's curate.balance and
# curate.rebuild_action_lines moved the dataset ids and the whole and curate hashes (flywheel8 sets both). Session
# 24's curriculum.target_successes / max_rollout_seeds moved the whole hash; flywheel8's rollouts settings (16 seeds x
# 3 attempts at temperature 0.7) its rollouts run key. Session 29's midtrain.pages moved the whole hash; flywheel8's
# small student, sft.lr 3e-4 and mid-training recipe its sft, rl, rollouts and midtrain ids. Session 30's
# curate.instance_weight moved the whole and curate hashes only: a KEYED_IF_SET field at its default is in no run key.
# Session 37's student.coord_space (KEYED_IF_SET, left out of the student policy config at its default) moved the
# whole hash only. Session 38's student.system_prompt, ui_sizes and ui_marks (KEYED_IF_SET) moved the whole hash only;
# so did session 39's student.snap_to_cited, and session 45's curriculum.rollout_evidence (in no run key). Session
# 47's rl.sdpo_teacher_check and rl.sdpo_hint (KEYED_IF_SET) moved the whole and rl hashes only. Session 48's
# rollouts.openings and openings_temperature (KEYED_IF_SET, in the rollouts run key only when set) the whole hash only.
PINNED = {
    "tiny": {
        "dataset": "curate-it1-1d85b16819",
        "sft": "sft-it1-3f4f5cdca7",
        "sft_max_minutes_99": "sft-it1-8efe1c003a",
        "midtrain_ckpt": "base-6989c7801c",
        "midtrain_dataset": "midtrain-ff7e6263ce",
        "rl": "rl-it1-grpo-b3ea827fb7",
        "rollouts": "rollouts-it1-603f8a26a7",
        "bootstrap": "bootstrap-it0-0072cbbc90",
        "config_hash": ("77fbac626604", "757b200797c9", "ebba1a7b6135", "5213006ef40a"),
    },
    "flywheel8": {
        "dataset": "curate-it1-a23f677c86",
        "sft": "sft-it1-b381c8664e",
        "sft_max_minutes_99": "sft-it1-c232275f2d",
        "midtrain_ckpt": "base-e899bb77f5",
        "midtrain_dataset": "midtrain-240d6a96c0",
        "rl": "rl-it1-grpo-52eaf15bee",
        "rollouts": "rollouts-it1-e16e5412c2",
        "bootstrap": "bootstrap-it0-74e451a815",
        "config_hash": ("824162ae2496", "4d0cc0ac4822", "c308ac49de23", "8783cf88f913"),
    },
}


@pytest.fixture(autouse=True)
def _lake(tmp_path, monkeypatch):
    monkeypatch.setenv("FLYWHEEL_LAKE", str(tmp_path / "lake"))  # rollout_spec opens the lake its workers write
    monkeypatch.delenv("FLYWHEEL_S3_ENDPOINT", raising=False)


def _cfg(name: str, overrides: dict | None = None):
    return load_config(ROOT / "configs" / f"{name}.yaml", overrides)


@pytest.mark.parametrize("name", sorted(PINNED))
def test_dataset_and_checkpoint_ids_are_pinned(name):
    from flywheel import midtrain as mt
    from training.curation import dataset_id_for
    from training.sft import TrainSettings
    from training.sft_stage import checkpoint_id_for

    cfg, want = _cfg(name), PINNED[name]
    s = TrainSettings.from_config(cfg.sft)
    assert dataset_id_for(cfg, 1) == want["dataset"]
    assert checkpoint_id_for(1, DATASET, MODEL, s) == want["sft"]
    assert checkpoint_id_for(1, DATASET, MODEL, dataclasses.replace(s, max_minutes=99.0)) == want["sft_max_minutes_99"]
    assert mt.checkpoint_id_for(DATASET, MODEL, TrainSettings.from_config(cfg.midtrain.sft)) == want["midtrain_ckpt"]
    assert mt.dataset_id_for(cfg, "midtrain-it0-0123456789") == want["midtrain_dataset"]


@pytest.mark.parametrize("name", sorted(PINNED))
def test_sft_checkpoint_id_ignores_how_it_is_trained(name):
    """DDP, packing, the encode cache and workers, the vision cache and the test/benchmark knobs keep the objective
    and the sample order: the same checkpoint id."""
    from training.sft import TrainSettings
    from training.sft_stage import checkpoint_id_for

    s = TrainSettings.from_config(_cfg(name).sft)
    how = dict(packing=True, pack_tokens=999, distributed="ddp", nproc=2, encode_cache_gib=1.0, encode_workers=3)
    how.update(vision_cache=True, micro_batch=3, keep_state=True, step_sleep_s=0.5, record_step_times=True)
    assert checkpoint_id_for(1, DATASET, MODEL, dataclasses.replace(s, **how)) == PINNED[name]["sft"]


@pytest.mark.parametrize("name", sorted(PINNED))
def test_rl_run_id_is_pinned_and_ignores_how_the_update_is_spread(name):
    from flywheel.rl_stage import rl_run_id

    cfg = _cfg(name)
    assert rl_run_id(cfg, 1, BASE, cfg.rl.algorithm) == PINNED[name]["rl"]
    ddp = cfg.model_copy(update={"rl": cfg.rl.model_copy(update={"distributed": "ddp", "nproc": 4})})
    assert rl_run_id(ddp, 1, BASE, cfg.rl.algorithm) == PINNED[name]["rl"]
    slower = cfg.model_copy(update={"rl": cfg.rl.model_copy(update={"lr": 3e-4})})
    assert rl_run_id(slower, 1, BASE, cfg.rl.algorithm) != PINNED[name]["rl"]


@pytest.mark.parametrize("name", sorted(PINNED))
def test_rollout_run_keys_are_pinned(name):
    from envs import registry
    from flywheel.runtime.spec import PolicySpec
    from flywheel.specs import rollout_spec

    cfg, want = _cfg(name), PINNED[name]
    student = cfg.student.policy_config(model=MODEL)  # as flywheel.stages.student_rollouts builds it
    pol = PolicySpec("student", {"model": MODEL, "config": student}, version=MODEL)
    seeds = registry.seeds("train", cfg.rollouts.selection.seeds_per_task, offset=10)
    spec = rollout_spec(
        cfg,
        iteration=1,
        stage="rollouts",
        policy=pol,
        tasks=cfg.rollouts.selection.tasks,
        seeds=seeds,
        split="train",
        group_size=cfg.rollout_attempts(),
    )
    assert spec.run_key == want["rollouts"]
    boot = rollout_spec(
        cfg,
        iteration=0,
        stage="bootstrap",
        policy=PolicySpec("scripted"),
        tasks=cfg.bootstrap.selection.tasks,
        seeds=registry.seeds("train", 3),
        split="train",
    )
    assert boot.run_key == want["bootstrap"]


def test_remote_env_servers_are_not_in_the_rollout_run_key():
    """Where the envs run (env servers, their slot wait) is not in the key: moving servers resumes the run."""
    from flywheel.runtime.spec import PolicySpec
    from flywheel.specs import rollout_spec

    keys = set()
    for servers, wait in ((["http://127.0.0.1:8100"], 120.0), (["http://10.0.0.9:8100"], 5.0)):
        cfg = _cfg("tiny", {"env.name": "remote", "env.servers": servers, "env.acquire_timeout_s": wait})
        spec = rollout_spec(
            cfg,
            iteration=0,
            stage="bootstrap",
            policy=PolicySpec("scripted"),
            tasks=["click-test"],
            seeds=[0, 1],
            split="train",
        )
        keys.add(spec.run_key)
    assert keys == {"bootstrap-it0-3cc828ad7c"}


@pytest.mark.parametrize("name", sorted(PINNED))
def test_config_hashes_on_lake_rows_are_pinned(name):
    cfg = _cfg(name)
    assert tuple(cfg.config_hash(s) for s in (None, "rl", "sft", "curate")) == PINNED[name]["config_hash"]


# ------------------------------------------------------------------------------------------------ the one rule
def test_run_key_is_sha1_of_sorted_json():
    import hashlib
    import json

    from configs.runkeys import run_key

    payload = {"b": [1, 2], "a": {"y": None, "x": 0.5}}
    want = hashlib.sha1(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:10]
    assert run_key("curate-it3", payload) == f"curate-it3-{want}"
    assert run_key("x", {"a": 1, "b": 2}) == run_key("x", {"b": 2, "a": 1})  # key order never matters
    assert run_key("x", {"p": Path("a/b")}) == run_key("x", {"p": "a/b"})  # non-JSON values as str


def test_runtime_markers_are_the_old_exclusion_lists():
    """RUNTIME marks exactly the fields each id function used to leave out by hand."""
    from configs.models import CurateConfig, SFTConfig, StudentConfig
    from configs.rl import RLConfig
    from configs.runkeys import keyed, runtime_fields
    from training.sft import TrainSettings

    sft_runtime = {"distributed", "nproc", "packing", "pack_tokens", "encode_cache_gib", "encode_workers"}
    sft_runtime |= {"vision_cache", "micro_batch"}
    assert runtime_fields(SFTConfig) == sft_runtime
    assert runtime_fields(TrainSettings) == sft_runtime | {"keep_state", "step_sleep_s", "record_step_times"}
    assert runtime_fields(RLConfig) == {"distributed", "nproc"}
    assert runtime_fields(CurateConfig) == runtime_fields(StudentConfig) == frozenset()
    rl = RLConfig(max_minutes=5.0)
    # wall-clock caps are keyed; a KEYED_IF_SET field at its default is not
    assert keyed(rl) == rl.model_dump(mode="json", exclude={"distributed", "nproc", "sdpo_teacher_check", "sdpo_hint"})
    assert "max_minutes" in keyed(TrainSettings(max_minutes=5.0))


def test_an_option_added_later_keys_only_when_set():
    """curate.instance_weight (KEYED_IF_SET) at its default leaves the dataset id where it was before the option
    existed; set, it moves it."""
    from training.curation import dataset_id_for

    for name in PINNED:
        assert dataset_id_for(_cfg(name), 1) == PINNED[name]["dataset"]
        weighted = _cfg(name, {"curate.instance_weight": "inverse_pass_rate"})
        assert dataset_id_for(weighted, 1) != PINNED[name]["dataset"]
