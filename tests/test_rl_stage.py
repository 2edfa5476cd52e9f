"""The RL stage end to end (real Chromium, a real lake, a tiny model): rounds, rerun, SIGKILL resume, held-out tasks.

The update math is tested on hand-built tensors (test_losses.py) and on lake rows (test_rl.py); here the
stage's own guarantees: a round's episodes land under the `rl` stage with their own run key, a finished
run reruns as a no-op, a run killed mid-way continues from its last finished round without duplicate
rows, and held-out tasks never reach training.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from configs.loading import load_config
from configs.models import ConfigError
from flywheel.errors import UserError
from storage.catalog import connect

pytestmark = pytest.mark.browser
ROOT = Path(__file__).resolve().parents[1]
# tiny.yaml with RL on: 2 tasks x 1 seed x group 2 per round, short episodes (a random tiny model only
# writes parse errors, so every group fails and replay of the bootstrap demos gives it signal)
OVERRIDES = {
    "rl.enabled": True,
    "rl.rounds": 2,
    "rl.group_size": 2,
    "rl.seeds_per_task_per_round": 1,
    "rl.batch_size": 4,
    "env.max_steps": 2,
    "student.max_new_tokens": 8,
}


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    from flywheel.specs import register_tasks
    from flywheel.stages import bootstrap
    from training.models import init_model

    root = tmp_path_factory.mktemp("rl")
    os.environ["FLYWHEEL_LAKE"] = str(root / "lake")
    cfg = load_config(ROOT / "configs" / "tiny.yaml", OVERRIDES)
    register_tasks(cfg)
    bootstrap(cfg, 0, progress=False)  # stored successes: the replay store
    model = init_model("qwen3-vl", "tiny", root / "start", seed=0)
    yield cfg, root, str(model)
    os.environ.pop("FLYWHEEL_LAKE", None)


def _counts(lake: Path) -> tuple[int, int, int]:
    con = connect(lake)
    eps = con.execute("SELECT count(*), count(DISTINCT episode_id) FROM episodes WHERE stage = 'rl'").fetchone()
    return eps[0], eps[1], con.execute("SELECT count(*) FROM rl_metrics").fetchone()[0]


def test_held_out_tasks_are_rejected(setup):
    from flywheel.stages import rl

    cfg, _, model = setup
    bad = load_config(ROOT / "configs" / "tiny.yaml", {**OVERRIDES, "rollouts.selection.tasks": ["click-test-2"]})
    with pytest.raises(UserError, match="held out"):
        rl(bad, 0, model, progress=False)
    bad = load_config(
        ROOT / "configs" / "tiny.yaml", {**OVERRIDES, "rl.clone_steps": 2, "rl.clone_tasks": ["click-test-2"]}
    )
    with pytest.raises(UserError, match="held out"):
        rl(bad, 0, model, progress=False)


def test_rounds_land_in_the_lake_and_a_rerun_is_a_no_op(setup):
    from flywheel.stages import rl

    cfg, root, model = setup
    res = rl(cfg, 0, model, progress=False)
    assert [h["round"] for h in res["history"]] == [0, 1]
    assert Path(res["model_path"]).name == "round-1" and (Path(res["model_path"]) / "rl_round.json").exists()
    con = connect(root / "lake")
    keys = con.execute("SELECT count(DISTINCT run_key), count(*) FROM episodes WHERE stage = 'rl'").fetchone()
    assert keys == (2, 8)  # one run key per round, 2 tasks x 1 seed x group 2 each
    # rl.end_on_parse_error: a reply that does not parse ends the RL episode (a random model never parses)
    pe = con.execute("SELECT max(n_steps), min(n_parse_errors) FROM episodes WHERE stage = 'rl'").fetchone()
    assert pe == (1, 1)
    assert con.execute("SELECT count(DISTINCT round) FROM rl_metrics").fetchone()[0] == 2
    assert con.execute("SELECT count(*) FROM rl_rows WHERE replayed").fetchone()[0] > 0  # all-failed groups got replay
    ck = con.execute("SELECT method, parent_checkpoint FROM checkpoints WHERE stage = 'rl'").fetchall()
    assert ck and ck[0][0] == "rl-grpo"
    assert Path(res["plot"]).read_bytes()[:4] == b"\x89PNG"  # the metrics plot the Prefect artifact inlines
    before = _counts(root / "lake")
    again = rl(cfg, 0, model, progress=False)
    assert again["history"] == [] and again["resumed_from_round"] == 2
    assert _counts(root / "lake") == before


def test_sigkill_mid_rl_resumes_from_the_last_finished_round(setup, tmp_path, monkeypatch):
    """SIGKILL after round 0 finished: the rerun starts at the first unfinished round (its result says so, its
    history holds only the rounds it ran), leaves every finished round's folder as it was (the same folder, the
    same rl_round.json, the same weights), and adds no duplicate episode and no second set of a round's metrics.
    The lake has the bootstrap's demos, so every round replays them and updates the weights (without them all
    groups fail alike: no update, and every round's weights would be the start's)."""
    from flywheel.stages import bootstrap

    cfg, root, model = setup
    lake = tmp_path / "lake"
    monkeypatch.setenv("FLYWHEEL_LAKE", str(lake))
    bootstrap(cfg, 0, progress=False)
    env = {**os.environ, "FLYWHEEL_LAKE": str(lake), "HF_HUB_OFFLINE": "1"}
    sets = [f"{k}={str(v).lower() if isinstance(v, bool) else v}" for k, v in OVERRIDES.items()]
    code = (
        "import json, sys; from configs.loading import load_config; from flywheel.specs import register_tasks;"
        "from flywheel.stages import rl;"
        "ov = dict(kv.split('=', 1) for kv in sys.argv[2:]);"
        "ov = {k: (True if v == 'true' else int(v) if v.isdigit() else v) for k, v in ov.items()};"
        "cfg = load_config('configs/tiny.yaml', ov); register_tasks(cfg);"
        "res = rl(cfg, 0, sys.argv[1], progress=False);"
        "print('RESULT ' + json.dumps({k: res[k] for k in ('resumed_from_round', 'history')}, default=str))"
    )
    cmd = [sys.executable, "-c", code, model, *sets, "rl.rounds=3"]
    p = subprocess.Popen(
        cmd, cwd=ROOT, env=env, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    round0 = None
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and round0 is None:
        round0 = next(lake.glob("_checkpoints/rl-*/round-0/rl_round.json"), None)
        time.sleep(0.5)
    assert round0 is not None, "round 0 never finished"
    os.killpg(p.pid, signal.SIGKILL)  # mid round 1 (or just after it): the runner, its workers and their browsers
    p.wait()
    out = round0.parent.parent
    assert not (out / "round-2" / "rl_round.json").exists()
    done = sum((out / f"round-{i}" / "rl_round.json").exists() for i in range(3))  # 1, or 2 if round 1 just finished
    kept = {}  # each finished round as the killed run left it: folder inode, marker mtime and text, weights
    for i in range(done):
        rdir = out / f"round-{i}"
        marker = (rdir / "rl_round.json").stat()
        kept[i] = (rdir.stat().st_ino, marker.st_mtime_ns, (rdir / "rl_round.json").read_text())
        kept[i] += ((rdir / "model.safetensors").read_bytes(),)
    sql = "SELECT round, count(*) FROM rl_metrics GROUP BY round"
    metrics = {k: n for k, n in connect(lake).execute(sql).fetchall() if k < done}
    assert sorted(metrics) == list(range(done)) and all(n > 0 for n in metrics.values())  # every round updated
    assert kept[0][3] != (Path(model) / "model.safetensors").read_bytes()
    r = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    res = json.loads([line for line in r.stdout.splitlines() if line.startswith("RESULT ")][-1][len("RESULT ") :])
    assert res["resumed_from_round"] == done  # rl_round.json is where it resumed from: round 0 is not redone
    assert [h["round"] for h in res["history"]] == list(range(done, 3))
    assert all((out / f"round-{i}" / "rl_round.json").exists() for i in range(3))
    for i, (ino, mtime, text, weights) in kept.items():  # a finished round is never redone, not even identically
        rdir = out / f"round-{i}"
        marker = (rdir / "rl_round.json").stat()
        assert (rdir.stat().st_ino, marker.st_mtime_ns, (rdir / "rl_round.json").read_text()) == (ino, mtime, text), i
        assert (rdir / "model.safetensors").read_bytes() == weights, i
    after = dict(connect(lake).execute(sql).fetchall())
    assert sorted(after) == [0, 1, 2] and all(after[i] == n for i, n in metrics.items())  # no round's metrics twice
    total, distinct, _ = _counts(lake)
    assert total == distinct == 12  # 3 rounds x 4 episodes, none duplicated by the rerun


def test_guide_teacher_solves_the_rounds_failed_instances(setup):
    """rl.guide all: after each round's sampling the scripted teacher solves the round's instances with a failure
    (a random tiny model fails them all), into the lake under stage rl; its successes are the groups' replayed
    members, not the bootstrap's demos of other instances."""
    from flywheel.stages import rl

    cfg, root, model = setup
    with pytest.raises(ConfigError, match="rl.guide .all. needs rl.source .sample."):
        load_config(ROOT / "configs" / "tiny.yaml", {**OVERRIDES, "rl.guide": "all", "rl.source": "lake"})
    guided = load_config(
        ROOT / "configs" / "tiny.yaml",
        {**OVERRIDES, "rl.guide": "all", "rl.rounds": 1, "rl.seed": 7, "rl.clone_steps": 2, "rl.clone_batch": 3},
    )
    res = rl(guided, 0, model, progress=False)
    con = connect(root / "lake")
    sampled = con.execute(
        "SELECT DISTINCT task_id, seed FROM episodes WHERE run_key = ?", [res["history"][0]["rollout_run_key"]]
    ).fetchall()
    teacher = con.execute(
        "SELECT task_id, seed, episode_id, success FROM episodes WHERE stage = 'rl' AND policy = 'scripted'"
    ).fetchall()
    assert sorted(t[:2] for t in teacher) == sorted(sampled) and all(t[3] for t in teacher)
    replayed = {
        r[0]
        for r in con.execute(
            "SELECT DISTINCT episode_id FROM rl_rows WHERE run_key = ? AND replayed", [res["checkpoint_id"]]
        ).fetchall()
    }
    assert replayed == {t[2] for t in teacher}
    # rl.clone_steps: two NLL steps after the round's update, on the lake's successes (the teacher's among them)
    clone = con.execute(
        "SELECT n_rows, loss FROM rl_metrics WHERE run_key = ? AND algo = 'clone'", [res["checkpoint_id"]]
    ).fetchall()
    assert [c[0] for c in clone] == [3, 3] and all(c[1] > 0 for c in clone) and Path(res["plot"]).exists()


def test_clone_fresh_teacher_solves_fresh_instances_for_the_clone_steps(setup):
    """rl.clone_fresh: each round the teacher also solves n fresh instances of each RL task -- seeds no round samples,
    different each round and run seed -- into the lake under stage rl, and the clone steps' pool (the lake's stored
    teacher successes) holds them (replay may also draw them, as any stored success)."""
    from flywheel.rl_stage import FRESH_SEEDS, _fresh_seeds, _round_seeds
    from flywheel.stages import rl
    from training.rl_data import stored_successes

    cfg, root, model = setup
    with pytest.raises(ConfigError, match="rl.clone_fresh needs rl.clone_steps"):
        load_config(ROOT / "configs" / "tiny.yaml", {**OVERRIDES, "rl.clone_fresh": 2})
    with pytest.raises(ConfigError, match="rl.clone_hard needs rl.clone_steps"):  # rl.guide is off in OVERRIDES
        load_config(ROOT / "configs" / "tiny.yaml", {**OVERRIDES, "rl.clone_hard": 0.5, "rl.clone_steps": 1})
    fresh = load_config(
        ROOT / "configs" / "tiny.yaml",
        {**OVERRIDES, "rl.rounds": 2, "rl.seed": 11, "rl.clone_fresh": 2, "rl.clone_steps": 1, "rl.clone_batch": 2},
    )
    windows = [_fresh_seeds(fresh, 0, r) for r in range(2)]
    assert all(len(w) == 2 and all(FRESH_SEEDS[0] <= x < FRESH_SEEDS[1] for x in w) for w in windows)
    assert not set(windows[0]) & set(windows[1]) and not set(windows[0] + windows[1]) & set(
        _round_seeds(fresh, 0, 0) + _round_seeds(fresh, 0, 1)
    )
    res = rl(fresh, 0, model, progress=False)
    con = connect(root / "lake")
    got = con.execute(
        "SELECT task_id, seed, episode_id, success FROM episodes WHERE stage = 'rl' AND "
        "policy = 'scripted' AND seed >= ? AND seed < ?",
        list(FRESH_SEEDS),
    ).fetchall()
    tasks = sorted(fresh.rollouts.selection.tasks)
    assert sorted((t, s) for t, s, _, _ in got) == sorted((t, s) for t in tasks for s in windows[0] + windows[1])
    assert all(ok for *_, ok in got)
    pool = {e["episode_id"] for eps in stored_successes(con, tasks, []).values() for e in eps}
    assert {e for _, _, e, _ in got} <= pool
    assert (
        con.execute(
            "SELECT count(*) FROM rl_metrics WHERE run_key = ? AND algo = 'clone'", [res["checkpoint_id"]]
        ).fetchone()[0]
        == 2
    )


def test_rl_from_stored_groups_samples_nothing(setup):
    """rl.source: lake (a GPU worker without browsers): each round trains on the iteration's stored student
    rollout groups; no episode is sampled, and an iteration without groups is one clear error."""
    from flywheel.stages import rl, student_rollouts

    cfg, root, model = setup
    lake_cfg = load_config(ROOT / "configs" / "tiny.yaml", {**OVERRIDES, "rl.source": "lake"})
    with pytest.raises(UserError, match="rl.source is 'lake' but iteration 0 has no student rollout groups"):
        rl(lake_cfg, 0, model, progress=False)
    ro = student_rollouts(cfg, 0, model, progress=False)
    con = connect(root / "lake")
    rl_eps = con.execute("SELECT count(*) FROM episodes WHERE stage = 'rl'").fetchone()[0]
    res = rl(lake_cfg, 0, model, progress=False)
    assert [h["round"] for h in res["history"]] == [0, 1] and res["history"][0]["rollout_run_key"] == ro["run_key"]
    con = connect(root / "lake")
    assert con.execute("SELECT count(*) FROM episodes WHERE stage = 'rl'").fetchone()[0] == rl_eps  # none sampled
    trained = {
        r[0]
        for r in con.execute(
            "SELECT DISTINCT episode_id FROM rl_rows WHERE run_key = ? AND NOT replayed", [res["checkpoint_id"]]
        ).fetchall()
    }
    stored = {
        r[0] for r in con.execute("SELECT episode_id FROM episodes WHERE run_key = ?", [ro["run_key"]]).fetchall()
    }
    assert trained and trained <= stored
    assert (
        con.execute(
            "SELECT count(DISTINCT round) FROM rl_metrics WHERE run_key = ?", [res["checkpoint_id"]]
        ).fetchone()[0]
        == 2
    )


def test_ddp_update_over_two_processes_matches_one(setup):
    """rl.distributed ddp (rl.source lake): the stage reruns itself under torchrun (2 gloo processes on CPU), each rank
    takes its token-balanced share of every minibatch and of the old-log-prob pass, rank 0 writes. Its per-step loss,
    grad norm and trained weights equal one process's on the same stored groups; its run id, rounds, lake rows and
    checkpoint row are those of the single-process run."""
    import shutil

    import torch
    from safetensors.torch import load_file

    from flywheel.stages import rl, student_rollouts

    cfg, root, model = setup
    student_rollouts(cfg, 0, model, progress=False)  # the stored groups (a no-op when an earlier test made them)
    ov = {
        **OVERRIDES,
        "rl.source": "lake",
        "rl.seed": 7,
        "rl.batch_size": 3,
        "rl.micro_batch": 1,
        "rl.warmup_steps": 0,
    }  # a rank's 2 rows of a minibatch: 2 micro-batches, the first without the all-reduce
    one = rl(load_config(ROOT / "configs" / "tiny.yaml", ov), 0, model, progress=False)
    out = Path(one["model_path"]).parent
    keep = root / "one-round-1"
    shutil.copytree(out / "round-1", keep)
    sql = "SELECT global_step, loss, grad_norm, n_rows FROM rl_metrics WHERE run_key = ? ORDER BY global_step"
    m_one = connect(root / "lake").execute(sql, [one["checkpoint_id"]]).fetchall()
    shutil.rmtree(out)  # the same run id: train it again, now over two processes
    ddp_cfg = load_config(ROOT / "configs" / "tiny.yaml", {**ov, "rl.distributed": "ddp", "rl.nproc": 2})
    two = rl(ddp_cfg, 0, model, progress=False)
    assert two["checkpoint_id"] == one["checkpoint_id"] and [h["round"] for h in two["history"]] == [0, 1]
    con = connect(root / "lake")
    m_two = con.execute(sql, [two["checkpoint_id"]]).fetchall()
    assert len(m_two) == len(m_one) > 2  # (a 1-row minibatch, when a round has one, leaves a rank at weight 0)
    for a, b in zip(m_one, m_two):
        assert a[0] == b[0] and a[3] == b[3]
        assert b[1] == pytest.approx(a[1], abs=1e-5) and b[2] == pytest.approx(a[2], rel=1e-3)
    n_ck = con.execute("SELECT count(*) FROM checkpoints WHERE checkpoint_id = ?", [two["checkpoint_id"]]).fetchone()[0]
    assert n_ck == 1
    wa, wb = load_file(str(keep / "model.safetensors")), load_file(str(out / "round-1" / "model.safetensors"))
    for k in wa:  # gloo sums in another order: float noise, which Adam can lift in near-zero coordinates
        assert torch.linalg.norm(wa[k] - wb[k]) <= 1e-3 * torch.linalg.norm(wa[k]) + 1e-6, k
    # resume under DDP: a lost last round is redone from the last finished one's state, to the same weights
    shutil.rmtree(out / "round-1")
    again = rl(ddp_cfg, 0, model, progress=False)
    assert again["resumed_from_round"] == 1 and [h["round"] for h in again["history"]] == [1]
    redone = load_file(str(out / "round-1" / "model.safetensors"))
    assert all(torch.equal(redone[k], wb[k]) for k in wb)
    start = load_file(str(Path(model) / "model.safetensors"))
    moved = sum(not torch.equal(start[k], wa[k]) for k in wa)
    assert moved > 0  # the runs trained something
