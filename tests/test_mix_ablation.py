"""benchmarks/mix_ablation.py's mixes: task weighting and the replay of mid-training rows (`+rNN` variants)."""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from mix_ablation import mix, split_variant, with_replay  # noqa: E402

COLUMNS = ["messages", "task_id", "policy", "episode_id", "step_idx"]


def rows(task: str, policy: str, n: int) -> list[dict]:
    return [
        {
            "messages": f"{task}-{policy}-{i}",
            "task_id": task,
            "policy": policy,
            "episode_id": f"{task}{i}",
            "step_idx": 0,
        }
        for i in range(n)
    ]


def test_split_variant_names_the_mix_and_the_replay_share():
    assert split_variant("control_task") == ("control_task", 0.0)
    assert split_variant("control_task+r50") == ("control_task", 0.5)
    assert split_variant("task+r25") == ("task", 0.25)
    for bad in ("nosuch", "control+r0", "control+r100", "control+rx", "nosuch+r50"):
        with pytest.raises(ValueError, match="unknown variant"):
            split_variant(bad)


def test_replayed_rows_make_up_the_share_and_keep_the_train_columns():
    train = mix(rows("click-tab-2", "scripted", 4) + rows("click-link", "scripted", 2), "control_task", 0)
    assert Counter(r["task_id"] for r in train) == {"click-tab-2": 4, "click-link": 4}  # each task the same weight
    replay = [{**r, "images": b"png", "extra": 1} for r in rows("synth/search", "scripted", 3)]
    out = with_replay(train, replay, 0.5, 0, COLUMNS)
    by_task = Counter(r["task_id"] for r in out)
    assert by_task["synth/search"] == 8 and len(out) == 16  # half of the mix, from 3 rows: whole copies + 2 more
    assert all(set(r) == set(COLUMNS) for r in out if r["task_id"] == "synth/search")
    assert with_replay(train, replay, 0.5, 0, COLUMNS) == out  # seeded
    assert with_replay(train, [], 0.0, 0, COLUMNS) is train
    with pytest.raises(ValueError, match="needs --replay"):
        with_replay(train, [], 0.25, 0, COLUMNS)
