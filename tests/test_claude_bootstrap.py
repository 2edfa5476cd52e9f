"""A Claude bootstrap end to end: real MiniWoB episodes in Chromium, the real `anthropic` SDK, recorded Messages
API replies from tests/claude_replay.py, the lake, the cost query, curate's SFT export, and the dollar budget."""

from __future__ import annotations

import json
import logging
import os

import pyarrow.parquet as pq
import pytest
from claude_replay import ClaudeReplay, fixture

from agents.claude import Price
from configs.loading import parse_config
from flywheel.errors import UserError
from storage.catalog import connect
from training.queries import COST_PER_SUCCESS

KEY = "sk-ant-api03-FAKE-bootstrap-8d2b6e0c4a"
SONNET = Price(3.0, 15.0, 3.75, 0.3)


def cost(*names: str) -> float:
    return sum(SONNET.cost(fixture(n)["body"]["usage"]) for n in names)


@pytest.fixture
def server():
    srv = ClaudeReplay().start()
    yield srv
    srv.stop()


def config(server, tmp_path, **over):
    data = {
        "lake": {"root": str(tmp_path / "lake")},
        "env": {"screenshot_scale": over.pop("scale", 1)},
        "rollout": {"envs": 1, "episode_timeout_s": 60},
        "bootstrap": {
            "policy": over.pop("policy", "claude"),
            "budget_usd": over.pop("budget", None),
            "selection": {"tasks": ["click-test"], "seeds_per_task": over.pop("seeds", 2)},
        },
        "claude": {"base_url": server.url, "max_retries": 3, "thinking_budget": 1024},
    }
    return parse_config(data)


@pytest.fixture
def env(monkeypatch, tmp_path):
    monkeypatch.setenv("ANTHROPIC_API_KEY", KEY)  # rollout workers inherit it; it is never in the spec
    monkeypatch.delenv("FLYWHEEL_LAKE", raising=False)


# Put first on the spawned rollout workers' PYTHONPATH: every logger of theirs at DEBUG, to their stderr (inherited
# from pytest, whose fd capture holds it), each line tagged with its process id. Claude is called from them.
WORKER_LOGGING = """import logging, sys
logging.basicConfig(level=logging.DEBUG, stream=sys.stderr, format="[pid %(process)d] %(name)s: %(message)s")
"""


@pytest.fixture
def worker_logs(tmp_path, monkeypatch):
    site = tmp_path / "worker-site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(WORKER_LOGGING)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")])))


@pytest.mark.browser
def test_claude_bootstrap_fills_the_lake_that_curate_consumes(server, tmp_path, env, caplog, capfd, worker_logs):
    from flywheel import stages

    caplog.set_level(logging.DEBUG)
    # click-test at screenshot_scale 8: a 1280x1680 screen, which Claude sees downscaled to 936x1228.
    # seed 0: a 429 and a 529 on the way (retried by the SDK), a screenshot request (answered without an env
    # step), a zoom (not in our action set: a recorded error Claude is told about), then the click.
    server.plan(
        "error_rate_limit",
        "screenshot_first",
        "zoom_unsupported",
        "error_overloaded",
        "click_ct_seed0",
        "click_ct_seed1",
    )
    cfg = config(server, tmp_path, scale=8)
    res = stages.bootstrap(cfg, 0, progress=False)
    assert (res["policy"], res["ran"], res["successes"], res["errors"]) == ("claude", 2, 2, 0)
    spent = cost("screenshot_first", "zoom_unsupported", "click_ct_seed0", "click_ct_seed1")
    assert res["cost_usd"] == pytest.approx(spent) and res["budget_stopped"] == 0
    assert len(server.sent("/v1/models/claude-sonnet-4-6")) == 1 and len(server.sent()) == 6

    con = connect(tmp_path / "lake")
    steps = con.execute("""SELECT e.seed, s.step_idx, s.parse_ok, s.parse_error, s.thought, s.raw_action, s.action,
                                  s.cost, s.prompt_tokens, s.completion_tokens, s.raw_response
                           FROM steps s JOIN episodes e USING (episode_id) WHERE NOT s.is_final
                           ORDER BY e.seed, s.step_idx""").fetchall()
    assert [(r[0], r[1], r[2]) for r in steps] == [(0, 0, False), (0, 1, True), (1, 0, True)]
    zoom, click0, click1 = steps
    assert "unknown action 'zoom'" in zoom[3] and zoom[4].startswith("The button is small")
    assert zoom[7] == pytest.approx(cost("screenshot_first", "zoom_unsupported"))
    assert [m["id"] for m in json.loads(zoom[10])] == ["msg_01Scr", "msg_02Zoom"]  # the raw replies, verbatim
    assert json.loads(click0[5]) == {"action": "left_click", "coordinate": [176, 830]}
    act = json.loads(click0[6])  # Claude's (176, 830) on 936x1228 -> screen px of the 1280x1680 screen
    assert (act["x"], act["y"]) == pytest.approx((176 * 1280 / 936, 830 * 1680 / 1228))
    assert click0[4].startswith("The 'Click Me!' button") and click0[7] == pytest.approx(cost("click_ct_seed0"))
    assert (click0[8], click0[9]) == (4010 + 1200, 141)
    eps = con.execute(
        "SELECT seed, cost, input_tokens, output_tokens, policy, policy_version FROM episodes ORDER BY seed"
    ).fetchall()
    assert eps[0][1] == pytest.approx(zoom[7] + click0[7]) and eps[1][1] == pytest.approx(click1[7])
    assert eps[0][2:] == (1890 + 3420 + 4010 + 1200, 64 + 96 + 141, "claude", "claude-sonnet-4-6")
    # "dollars per verified success by task" (README)
    (row,) = con.execute(COST_PER_SUCCESS).fetchall()
    assert row[:4] == ("click-test", "claude", 2, 2) and row[5] == pytest.approx(spent / 2, abs=1e-4)

    # what Claude saw and was told: the scaled screenshot size, the beta header, the zoom error fed back
    first = server.sent()[0]
    assert first["headers"]["anthropic-beta"] == "computer-use-2025-11-24"
    assert (
        first["body"]["tools"][0]["display_width_px"] == 936 and first["body"]["tools"][0]["display_height_px"] == 1228
    )
    after_zoom = server.sent()[3]["body"]["messages"][-1]["content"][0]
    assert after_zoom["tool_use_id"] == "toolu_02Zoom" and after_zoom["is_error"] is True

    # curate consumes the Claude demos unchanged: the click steps become student-format targets
    cur = stages.curate(cfg, 0)
    rows = pq.read_table(cur["data_files"]).to_pylist()
    assert cur["n_episodes"] == 2 and len(rows) == 2  # the zoom step is history, never a target
    (ep0,) = con.execute("SELECT episode_id FROM episodes WHERE seed = 0").fetchone()
    (row0,) = [r for r in rows if r["episode_id"] == ep0]  # export order ranks by md5(episode id): not by seed
    target = row0["messages"][-1]["content"][0]["text"]
    call = json.loads(target.split("<tool_call>")[1].split("</tool_call>")[0])
    assert call["arguments"]["action"] == "click"  # the student's own schema, in its 0-1000 space
    assert call["arguments"]["x"] == round(act["x"] / 1280 * 1000) and "The 'Click Me!' button" in target
    assert {r["policy"] for r in rows} == {"claude"}

    # ... and SFT trains on that export unchanged (a tiny student, two optimizer steps)
    from training.models import init_model

    base = init_model("qwen3-vl", "tiny", tmp_path / "student", seed=0)
    scfg = cfg.model_copy(
        update={
            "sft": cfg.sft.model_copy(update={"method": "full", "max_steps": 2, "batch_size": 2}),
            "student": cfg.student.model_copy(update={"model": str(base), "size": "tiny"}),
        }
    )
    trained = stages.sft(scfg, 0, cur["dataset_id"], base=str(base), progress=False)
    assert trained["steps"] == 2 and 0 < trained["final_loss"] < 20
    ck = connect(tmp_path / "lake").execute("SELECT dataset_id, method FROM checkpoints WHERE stage = 'sft'").fetchall()
    assert ck == [(cur["dataset_id"], "sft")]

    # the key reaches no lake row, no file the run wrote (lake, export, checkpoint), no log line of this process or
    # of the rollout workers that called Claude (their stderr, every logger at DEBUG)
    dump = [
        repr(con.execute(f"SELECT * EXCLUDE ({'screenshot' if t == 'steps' else 'run_key'}) FROM {t}").fetchall())
        for t in ("steps", "episodes", "datasets")
    ]
    files = [p for p in tmp_path.rglob("*") if p.is_file() and p.parent.name != "worker-site"]
    assert len([p for p in files if p.is_relative_to(tmp_path / "lake")]) > 10
    assert not [d for d in dump if KEY in d] and not [p for p in files if KEY.encode() in p.read_bytes()]
    assert KEY not in caplog.text and KEY not in json.dumps(res, default=str)
    out, err = capfd.readouterr()
    worker = [ln for ln in err.splitlines() if ln.startswith("[pid ") and ln[5:].split("]")[0] != str(os.getpid())]
    assert [ln for ln in worker if "anthropic" in ln and "/v1/messages" in ln]  # the workers' Claude calls, logged
    assert KEY not in out and KEY not in err


@pytest.mark.browser
def test_budget_stops_new_episodes_and_keeps_finished_ones(server, tmp_path, env):
    from flywheel import stages

    server.plan("click_small_seed0")
    one = cost("click_small_seed0")
    cfg = config(server, tmp_path, seeds=3, budget=one * 0.9)  # the first episode already spends it
    res = stages.bootstrap(cfg, 0, progress=False)
    assert (res["ran"], res["successes"], res["budget_stopped"]) == (1, 1, 2)
    con = connect(tmp_path / "lake")
    assert con.execute("SELECT count(*), sum(cost) FROM episodes").fetchone() == (1, pytest.approx(one))
    # the same budget again: what was spent counts, nothing new starts
    res = stages.bootstrap(cfg, 0, progress=False)
    assert (res["ran"], res["skipped"], res["budget_stopped"]) == (0, 1, 2)
    # a larger budget resumes the run: the finished episode is kept, the other two run
    server.plan("click_small_seed1", "click_small_seed2")
    cfg = config(server, tmp_path, seeds=3, budget=1.0)
    res = stages.bootstrap(cfg, 0, progress=False)
    assert (res["ran"], res["skipped"], res["successes"], res["budget_stopped"]) == (2, 1, 2, 0)
    con = connect(tmp_path / "lake")
    assert con.execute("SELECT count(*), count(*) FILTER (success) FROM episodes").fetchone() == (3, 3)
    assert len(server.sent()) == 3


def test_auto_uses_claude_with_a_key_and_falls_back_without(server, tmp_path, monkeypatch, caplog):
    from flywheel.specs import teacher_policy

    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    cfg = config(server, tmp_path, policy="auto")
    with caplog.at_level(logging.INFO):
        assert teacher_policy(cfg).kind == "scripted"
    lines = [r.getMessage() for r in caplog.records if "auto" in r.getMessage()]
    assert lines == ["bootstrap.policy is 'auto' and ANTHROPIC_API_KEY is not set: using the scripted teacher"]
    with pytest.raises(UserError, match="bootstrap.policy is 'claude' but ANTHROPIC_API_KEY is not set"):
        teacher_policy(config(server, tmp_path, policy="claude"))
    assert server.requests == []
    monkeypatch.setenv("ANTHROPIC_API_KEY", KEY)
    spec = teacher_policy(cfg)
    assert spec.kind == "claude" and spec.version == "claude-sonnet-4-6" and KEY not in repr(spec)
    server.model_reply = "error_auth"  # a bad key fails the stage up front, in one line
    with pytest.raises(UserError, match=r"rejected the API key \(HTTP 401"):
        teacher_policy(cfg)
