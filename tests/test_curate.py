"""Curation over a real lake: scripted-teacher rollouts in Chromium, plus variants of those rows (student copies,
duplicates, failed/held-out/eval/later-iteration episodes, unfit steps) -> selection, manifest, Parquet export."""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from agents.parsing import parse_response
from agents.prompts import build_prompt, sft_messages, transform_for
from configs.loading import load_config
from flywheel.runtime.rollout import PolicySpec, RolloutSpec, make_jobs, run_rollouts
from storage.catalog import connect
from storage.lake import Lake
from training.data import episode_samples, history_record, prompt_options
from training.export import CurateError, curate

pytestmark = pytest.mark.browser
ROOT = Path(__file__).resolve().parents[1]
TASKS, SEEDS = ("click-test", "focus-text"), (0, 1, 2)


def _variant(
    lake: Lake,
    ep: dict,
    steps: list[dict],
    tag: str,
    *,
    iteration: int,
    stage: str = "rollouts",
    step_edit=None,
    **ep_changes,
) -> str:
    """Write a copy of a real episode (new id) with changed fields; step_edit(step_row) edits each step."""
    eid = hashlib.sha1(f"{ep['episode_id']}|{tag}".encode()).hexdigest()[:16]
    new_steps = []
    for s in steps:
        s = dict(s, episode_id=eid, run_key=tag)
        if step_edit and not s["is_final"]:
            step_edit(s)
        new_steps.append(s)
    lake.write("steps", new_steps, iteration=iteration, stage=stage, run_key=tag, part=eid)
    lake.write(
        "episodes",
        [dict(ep, episode_id=eid, run_key=tag, **ep_changes)],
        iteration=iteration,
        stage=stage,
        run_key=tag,
        part=eid,
    )
    return eid


def _shift_clicks(s: dict) -> None:
    """A policy that clicked one pixel to the right: same task, a different action sequence (not a duplicate).
    Its thought and raw call name the new point, in screen pixels as the teacher writes them."""
    a, raw = json.loads(s["action"]), json.loads(s["raw_action"])
    if "x" in a:
        s["thought"] = s["thought"].replace(f"at ({raw['x']},", f"at ({raw['x'] + 1},")
        a["x"] += 1
        raw["x"] += 1
    s["action"], s["raw_action"] = json.dumps(a), json.dumps(raw)


@pytest.fixture(scope="module")
def lake(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("curate") / "lake"
    jobs = make_jobs("boot", list(TASKS), list(SEEDS), policy_tag="scripted:0")
    spec = RolloutSpec(
        run_key="boot",
        iteration=0,
        stage="bootstrap",
        lake_root=str(root),
        jobs=jobs,
        policy=PolicySpec("scripted"),
        max_steps=6,
        episode_timeout_s=60,
        n_envs=2,
    )
    assert run_rollouts(spec, progress=False).successes == len(TASKS) * len(SEEDS)
    lk = Lake(root)
    con = connect(lk)
    eps = {
        (e["task_id"], e["seed"]): e
        for e in con.sql("SELECT * EXCLUDE (iteration, stage) FROM episodes").to_arrow_table().to_pylist()
    }
    steps = {}
    for s in con.sql("SELECT * EXCLUDE (iteration, stage) FROM steps ORDER BY step_idx").to_arrow_table().to_pylist():
        steps.setdefault(s["episode_id"], []).append(s)
    ids: dict[str, list[str]] = {"teacher": [e["episode_id"] for e in eps.values()]}
    S = lambda t, sd: steps[eps[(t, sd)]["episode_id"]]  # noqa: E731
    E = lambda t, sd: eps[(t, sd)]  # noqa: E731
    # iteration 1: an exact duplicate of a teacher demo, and student successes (different clicks)
    ids["duplicate"] = [_variant(lk, E("click-test", 0), S("click-test", 0), "dup", iteration=1)]
    ids["student"] = [
        _variant(lk, E(t, sd), S(t, sd), f"stu-{t}-{sd}", iteration=1, step_edit=_shift_clicks, policy="student")
        for t in TASKS
        for sd in SEEDS
    ]

    # a student episode whose first action came from a fallback parse: only its second step is a target
    def two_steps(s):  # the real click, preceded by an unfit copy of itself
        _shift_clicks(s)

    ep, st = E("click-test", 1), S("click-test", 1)
    unfit = dict(st[0], step_idx=0, fallback_parse=True)
    fit = dict(st[0], step_idx=1)
    final = dict(st[-1], step_idx=2)
    ids["fallback"] = [
        _variant(
            lk, dict(ep, n_steps=2), [unfit, fit, final], "fallback", iteration=1, step_edit=two_steps, policy="student"
        )
    ]
    # never selected: failed (high shaped reward), error-only steps, held-out task, eval split, later iteration
    ids["excluded"] = [
        _variant(
            lk,
            E("click-test", 2),
            S("click-test", 2),
            "failed",
            iteration=1,
            task_reward=0.0,
            success=False,
            shaped_reward=1.0,
            policy="student",
        ),
        _variant(
            lk,
            E("focus-text", 2),
            S("focus-text", 2),
            "exec-err",
            iteration=1,
            policy="student",
            step_edit=lambda s: s.update(exec_error="element not interactable"),
        ),
        _variant(lk, E("click-test", 0), S("click-test", 0), "held", iteration=1, task_id="click-test-2"),
        _variant(lk, E("focus-text", 0), S("focus-text", 0), "eval", iteration=1, split="eval"),
        _variant(lk, E("focus-text", 1), S("focus-text", 1), "later", iteration=2, step_edit=_shift_clicks),
        # the mid-training corpus: the base checkpoint learned from it, the flywheel's datasets never hold it
        _variant(
            lk,
            E("click-test", 1),
            S("click-test", 1),
            "midtrain",
            iteration=0,
            stage="midtrain",
            step_edit=_shift_clicks,
        ),
    ]
    return {"root": root, "ids": ids}


def _cfg(lake_root: Path, **curate_kw):
    over = {"lake.root": str(lake_root), **{f"curate.{k}": v for k, v in curate_kw.items()}}
    return load_config(ROOT / "configs" / "tiny.yaml", over)


def _rows(res: dict) -> list[dict]:
    return pq.read_table(res["data_files"]).to_pylist()


def _selected(res: dict) -> list[dict]:
    return pq.read_table(res["data_files"], columns=["episode_id", "step_idx", "task_id", "policy"]).to_pylist()


def test_selection_dedupes_and_excludes(lake):
    res = curate(_cfg(lake["root"]), iteration=1, held_out=["click-test-2"])
    rows = _selected(res)
    chosen = {r["episode_id"] for r in rows}
    ids = lake["ids"]
    assert chosen == set(ids["teacher"]) | set(ids["student"]) | set(ids["fallback"])
    assert not chosen & (set(ids["duplicate"]) | set(ids["excluded"]))  # the duplicate and the never-selected
    assert res["n_episodes"] == len(chosen) == 13 and res["n_steps"] == len(rows)
    # only the fit step of the fallback episode is a target
    assert [r["step_idx"] for r in rows if r["episode_id"] == ids["fallback"][0]] == [1]
    assert res["source_counts"]["by_source"] == {"student": 7, "teacher": 6}
    # the mix in samples (the SFT rows), which is what the student's share of the data means
    by_policy = {p: sum(r["policy"] == p for r in rows) for p in ("student", "scripted")}
    assert res["source_counts"]["samples_by_source"] == {
        "student": by_policy["student"],
        "teacher": by_policy["scripted"],
    }
    assert res["source_counts"]["student_sample_share"] == round(by_policy["student"] / len(rows), 4)
    # iteration 0 sees only the teacher demos
    assert curate(_cfg(lake["root"]), iteration=0)["n_episodes"] == 6


def test_cap_and_teacher_ratio(lake):
    capped = _selected(curate(_cfg(lake["root"], max_episodes_per_task=2), iteration=1))
    per_task = {t: len({r["episode_id"] for r in capped if r["task_id"] == t}) for t in TASKS}
    assert per_task == {"click-test": 2, "focus-text": 2}
    # click-test: 3 teacher + 4 student; focus-text: 3 + 3. Ratio 0.5 -> equal numbers per task
    half = curate(_cfg(lake["root"], teacher_ratio=0.5), iteration=1)
    assert half["source_counts"]["by_source"] == {"student": 6, "teacher": 6}
    assert curate(_cfg(lake["root"], teacher_ratio=1.0), iteration=1)["source_counts"]["by_source"] == {"teacher": 6}
    third = curate(_cfg(lake["root"], teacher_ratio=0.25, max_episodes_per_task=4), iteration=1)
    assert third["source_counts"]["by_source"] == {"student": 6, "teacher": 2}  # 4 per task: 1 teacher + 3 student


def test_manifest_row_and_rerun_is_idempotent(lake):
    cfg = _cfg(lake["root"])
    a = curate(cfg, iteration=1)
    b = curate(cfg, iteration=1)
    assert a["dataset_id"] == b["dataset_id"] and a["n_steps"] == b["n_steps"]
    con = connect(lake["root"])
    rows = con.sql(f"SELECT * FROM datasets WHERE dataset_id = '{a['dataset_id']}'").to_arrow_table().to_pylist()
    assert len(rows) == 1  # replaced, not duplicated
    row = rows[0]
    assert row["n_episodes"] == a["n_episodes"] and row["n_steps"] == a["n_steps"]
    assert sorted(row["episode_ids"]) == sorted({r["episode_id"] for r in _selected(a)})
    assert row["run_key"] == a["dataset_id"] and row["iteration"] == 1 and row["stage"] == "curate"
    assert "task_reward >= 1.0" in row["query"] and "shaped_reward" not in row["query"]
    assert json.loads(row["source_counts"])["by_policy_iteration"] == {"scripted/it0": 6, "student/it1": 7}
    # the row names the export relative to the lake root (a moved lake still finds it); the stage returns it absolute
    assert row["path"] == f"_datasets/{a['dataset_id']}" and Path(a["path"]) == lake["root"] / row["path"]
    assert not list(Path(a["path"]).glob(".*tmp"))  # the export was renamed into place


def test_curate_at_a_datasets_snapshot_reproduces_it_byte_for_byte(lake, tmp_path):
    """The dataset row records the lake snapshot curate read; after the lake grows, curate at that snapshot writes
    the same export, byte for byte (on a copy of the lake: a moved lake opens as it is)."""
    import shutil

    root = tmp_path / "lake"
    shutil.copytree(lake["root"], root)
    cfg = _cfg(root)
    first = curate(cfg, iteration=1)
    before = Path(first["data_files"]).read_bytes()
    snap = connect(root).execute("SELECT lake_snapshot FROM datasets WHERE dataset_id = ?", [first["dataset_id"]])
    snap = snap.fetchone()[0]
    assert snap == first["lake_snapshot"] is not None
    con = connect(root)
    ep = con.sql("SELECT * EXCLUDE (iteration, stage) FROM episodes WHERE policy = 'scripted' LIMIT 1").to_arrow_table()
    ep = ep.to_pylist()[0]
    steps = con.execute(
        "SELECT * EXCLUDE (iteration, stage) FROM steps WHERE episode_id = ? ORDER BY step_idx", [ep["episode_id"]]
    ).to_arrow_table()
    twice = lambda st: (_shift_clicks(st), _shift_clicks(st))  # noqa: E731 - not a duplicate of the other variants
    _variant(Lake(root), ep, steps.to_pylist(), "grown", iteration=1, step_edit=twice, policy="student")
    grown = curate(cfg, iteration=1)
    assert grown["n_episodes"] == first["n_episodes"] + 1 and grown["lake_snapshot"] > snap
    again = curate(cfg, iteration=1, at=snap)
    assert again["lake_snapshot"] == snap and again["n_episodes"] == first["n_episodes"]
    assert Path(again["data_files"]).read_bytes() == before


def test_drop_loops_cuts_the_detour_and_counts_it(lake):
    """The fallback episode's first step left the page as it was (its step 1 sees the same UI text and screenshot):
    with drop_loops (the default) it is cut, so the kept click's prompt has no history; without, it stays."""
    fb = lake["ids"]["fallback"][0]
    cut = curate(_cfg(lake["root"]), iteration=1)
    kept = curate(_cfg(lake["root"], drop_loops=False), iteration=1)
    assert cut["dataset_id"] != kept["dataset_id"]
    assert cut["source_counts"]["loop_steps_cut"] == {"student": 1, "teacher": 0}
    assert "loop_steps_cut" not in kept["source_counts"]
    rows = {key: pq.read_table(res["data_files"]).to_pylist() for key, res in (("cut", cut), ("kept", kept))}
    fb_rows = {key: [r for r in rs if r["episode_id"] == fb] for key, rs in rows.items()}
    # the row still names the step's index in the lake (lineage), whatever was cut before it
    assert [r["step_idx"] for r in fb_rows["cut"]] == [r["step_idx"] for r in fb_rows["kept"]] == [1]
    history = lambda r: " ".join(c["text"] or "" for c in r["messages"][1]["content"])  # noqa: E731
    assert "Step 1:" in history(fb_rows["kept"][0]) and "Step 1:" not in history(fb_rows["cut"][0])
    # the episodes without a loop export the same samples either way
    same = lambda rs: sorted((r["episode_id"], r["step_idx"]) for r in rs if r["episode_id"] != fb)  # noqa: E731
    assert same(rows["cut"]) == same(rows["kept"])


def _copy_with_demo(lake: dict, tmp_path: Path, task: str) -> tuple[Path, dict, list[dict]]:
    """A copy of the fixture lake (to add episodes to), with one of `task`'s teacher demos and its steps."""
    import shutil

    root = tmp_path / "lake"
    shutil.copytree(lake["root"], root)
    con = connect(root)
    sql = "SELECT * EXCLUDE (iteration, stage) FROM episodes WHERE policy = 'scripted' AND task_id = ?"
    ep = con.execute(sql, [task]).to_arrow_table().to_pylist()[0]
    steps = con.execute(
        "SELECT * EXCLUDE (iteration, stage) FROM steps WHERE episode_id = ? ORDER BY step_idx", [ep["episode_id"]]
    )
    return root, ep, steps.to_arrow_table().to_pylist()


def test_task_repeats_bring_each_task_near_the_largest():
    from collections import Counter

    from training.export import task_repeats

    assert task_repeats(Counter({"a": 100, "b": 30, "c": 100, "d": 9})) == {"a": 1, "b": 3, "c": 1, "d": 11}
    assert task_repeats(Counter({"a": 5})) == {"a": 1} and task_repeats(Counter()) == {}


def test_balance_task_writes_whole_copies_and_records_them(lake, tmp_path):
    """curate.balance=task: a task with fewer samples is written in whole copies (each row identical), the manifest
    records the copies per task, and the source counts count what SFT will see."""
    from collections import Counter

    from training.export import task_repeats

    root, ep, steps = _copy_with_demo(lake, tmp_path, "click-test")
    for k in range(2, 12):  # ten more click-test successes, each clicking k pixels right: distinct, so all kept
        shift = lambda st, k=k: [_shift_clicks(st) for _ in range(k)]  # noqa: E731
        _variant(Lake(root), ep, steps, f"more-{k}", iteration=1, step_edit=shift, policy="student")
    cfg = lambda **kw: _cfg(root, **kw)  # noqa: E731
    plain = curate(cfg(), iteration=1)
    bal = curate(cfg(balance="task"), iteration=1)
    assert bal["dataset_id"] != plain["dataset_id"] and "repeats_by_task" not in plain["source_counts"]
    p, b = (pq.read_table(r["data_files"]).to_pylist() for r in (plain, bal))
    per_task = lambda rows: Counter(r["task_id"] for r in rows)  # noqa: E731
    reps = bal["source_counts"]["repeats_by_task"]
    assert reps == task_repeats(per_task(p)) and max(reps.values()) > 1, (per_task(p), reps)
    assert per_task(b) == {t: n * reps[t] for t, n in per_task(p).items()}
    key = lambda r: json.dumps([r["episode_id"], r["step_idx"], r["messages"]], sort_keys=True)  # noqa: E731
    copies = Counter(key(r) for r in b)
    assert all(copies[key(r)] == reps[r["task_id"]] for r in p)
    assert sum(bal["source_counts"]["samples_by_source"].values()) == bal["n_steps"] == len(b)


def test_rebuild_action_lines_cites_what_the_student_clicked(lake, tmp_path):
    """A student success whose Action line is a guess (`Click button "DDDD2"`) and whose click is 2 px off the
    centre: with curate.rebuild_action_lines its target cites the UI line of the element it hit and clicks that
    element's centre, which is the teacher's target for the same page; without, the guess is what SFT would learn."""
    root, ep, steps = _copy_with_demo(lake, tmp_path, "focus-text")

    def guess(st):
        _shift_clicks(st)
        _shift_clicks(st)
        st["action_desc"] = 'Click button "DDDD2" @ (1,1)'

    eid = _variant(Lake(root), ep, steps, "guess", iteration=1, step_edit=guess, policy="student")
    from training.data import retarget

    target = lambda res, e: retarget(  # noqa: E731 - the Action line and the call (the thought is the policy's own)
        next(r["messages"][-1]["content"][0]["text"] for r in _rows(res) if r["episode_id"] == e), "action"
    )
    own = curate(_cfg(root), iteration=1)
    rebuilt = curate(_cfg(root, rebuild_action_lines=True), iteration=1)
    assert own["dataset_id"] != rebuilt["dataset_id"]
    assert 'Click button "DDDD2"' in target(own, eid)
    assert target(rebuilt, eid) == target(rebuilt, ep["episode_id"]) == target(own, ep["episode_id"])
    assert "input_text" in target(rebuilt, eid)  # focus-text's field, cited as the teacher cites it


def test_solved_instance_keep_keeps_the_frontier(lake):
    """Instances where every student attempt succeeded (click-test seed 1: two successes; focus-text seed 2:
    two) give no new information; click-test seed 2 (one of two failed) does, and single attempts stay."""
    ids = lake["ids"]
    stu = {f"{t}-{sd}": i for (t, sd), i in zip(((t, sd) for t in TASKS for sd in SEEDS), ids["student"])}
    res = curate(_cfg(lake["root"], solved_instance_keep=0.0), iteration=1)
    chosen = {r["episode_id"] for r in _selected(res)}
    want_students = {stu["click-test-0"], stu["click-test-2"], stu["focus-text-0"], stu["focus-text-1"]}
    assert chosen == set(ids["teacher"]) | want_students
    # keep 1.0 (the default) is the plain selection; a fraction keeps a deterministic part of the solved ones
    assert curate(_cfg(lake["root"], solved_instance_keep=1.0), iteration=1)["n_episodes"] == 13
    part = {r["episode_id"] for r in _selected(curate(_cfg(lake["root"], solved_instance_keep=0.5), iteration=1))}
    again = {r["episode_id"] for r in _selected(curate(_cfg(lake["root"], solved_instance_keep=0.5), iteration=1))}
    assert chosen <= part == again <= chosen | {stu["click-test-1"], ids["fallback"][0], stu["focus-text-2"]}


def test_inverse_pass_rate_weighs_the_instances_the_student_solves_sometimes(lake):
    """click-test seed 2: the student won one of its two attempts there, so with instance_weight
    inverse_pass_rate its success is written twice (2 / 1 attempts per win); click-test seed 1 (two attempts, two
    distinct successes) and single attempts stay at one copy, teacher demos too."""
    ids = lake["ids"]
    stu = {f"{t}-{sd}": i for (t, sd), i in zip(((t, sd) for t in TASKS for sd in SEEDS), ids["student"])}
    plain = curate(_cfg(lake["root"]), iteration=1)
    weighted = curate(_cfg(lake["root"], instance_weight="inverse_pass_rate"), iteration=1)
    assert weighted["dataset_id"] != plain["dataset_id"]
    assert weighted["n_episodes"] == plain["n_episodes"] == 13  # the same episodes, some written more often
    per_ep = lambda res: Counter(r["episode_id"] for r in _selected(res))  # noqa: E731
    a, b = per_ep(plain), per_ep(weighted)
    assert b[stu["click-test-2"]] == 2 * a[stu["click-test-2"]] > 0
    assert {e: n for e, n in b.items() if e != stu["click-test-2"]} == {
        e: n for e, n in a.items() if e != stu["click-test-2"]
    }
    assert weighted["n_steps"] == plain["n_steps"] + a[stu["click-test-2"]]
    con = connect(Lake(lake["root"]))
    row = con.sql("SELECT source_counts FROM datasets WHERE dataset_id = ?", params=[weighted["dataset_id"]]).fetchone()
    counts = json.loads(row[0])
    assert counts["instance_copies"] == {"episodes": 1, "extra_copies": 1, "by_task": {"click-test": 1}}
    assert (
        counts["samples_by_source"]["student"]
        == json.loads(
            con.sql("SELECT source_counts FROM datasets WHERE dataset_id = ?", params=[plain["dataset_id"]]).fetchone()[
                0
            ]
        )["samples_by_source"]["student"]
        + a[stu["click-test-2"]]
    )


def test_load_dataset_roundtrip_same_prompt_as_rollouts(lake, tmp_path):
    import datasets

    cfg = _cfg(lake["root"], drop_loops=False)  # the fallback episode's unfit step stays in the history
    res = curate(cfg, iteration=1)
    ds = datasets.load_dataset("parquet", data_files=res["data_files"], cache_dir=str(tmp_path))["train"]
    assert len(ds) == res["n_steps"]
    fb = lake["ids"]["fallback"][0]
    row = next(r for r in ds if r["episode_id"] == fb)
    img = row["images"][0]
    assert img.size == (160, 210)  # decodable PIL image
    # rebuild the prompt as the student policy would, from the lake rows, and compare with the export
    con = connect(lake["root"])
    steps = (
        con.sql(f"SELECT * FROM steps WHERE episode_id = '{fb}' AND NOT is_final ORDER BY step_idx")
        .to_arrow_table()
        .to_pylist()
    )
    instruction = con.sql(f"SELECT instruction FROM episodes WHERE episode_id = '{fb}'").fetchall()[0][0]
    t = transform_for(cfg.student.arch, steps[1]["screen_w"], steps[1]["screen_h"])
    prompt = build_prompt(
        instruction,
        steps[1]["screenshot"],
        steps[1]["ui_text"],
        [history_record(steps[0], t)],
        prompt_options(cfg.student),
        t,
    )
    got = [
        {"role": m["role"], "content": [{k: v for k, v in c.items() if v is not None} for c in m["content"]]}
        for m in row["messages"]
    ]
    target = got[-1]["content"][0]["text"]
    assert got == sft_messages(prompt, target)
    assert "Step 1:" in got[1]["content"][1]["text"] and "[ok]" in got[1]["content"][1]["text"]  # unfit step in history
    # the teacher's Action line cites the clicked element's UI line, in the model's space as the UI text shows it
    cited = re.search(r"Step 1: Click (.*? @ \(\d+,\d+\)) ->", got[1]["content"][1]["text"]).group(1)
    assert cited in got[1]["content"][-1]["text"] and cited != history_record(steps[0]).action_desc
    # the target parses back (strictly) to the executed screen action, in the 0-1000 convention
    parsed = parse_response(target, t)
    action = json.loads(steps[1]["action"])
    assert parsed.ok and not parsed.fallback
    assert abs(parsed.action.x - action["x"]) <= 1 and abs(parsed.action.y - action["y"]) <= 1
    x_model = round(t.to_model(action["x"], action["y"])[0])
    assert f'"x": {x_model}' in target and f"({x_model}," in target  # thought and call in the same space


def test_cut_loops_keeps_the_short_path():
    from training.data import cut_loops

    page = lambda ui, png, i: {"step_idx": i, "ui_text": ui, "screenshot": png}  # noqa: E731
    # A -> B -> A (back where it started) -> C: the first two steps are the detour
    steps = [page("A", b"a", 0), page("B", b"b", 1), page("A", b"a", 2), page("C", b"c", 3)]
    kept, n = cut_loops(steps)
    assert n == 2 and [(s["ui_text"], s["step_idx"], s["lake_step_idx"]) for s in kept] == [("A", 0, 2), ("C", 1, 3)]
    # same UI text but another screenshot is another page; no UI text is never matched
    kept, n = cut_loops([page("A", b"a", 0), page("A", b"x", 1), page("", b"z", 2), page("", b"z", 3)])
    assert n == 0 and [s["lake_step_idx"] for s in kept] == [0, 1, 2, 3]
    # nested: A B C B A D -> A D
    seq = [page(u, u.encode(), i) for i, u in enumerate("ABCBAD")]
    kept, n = cut_loops(seq)
    assert n == 4 and [s["ui_text"] for s in kept] == ["A", "D"]


def test_episode_samples_rejects_incomplete_steps():
    with pytest.raises(ValueError, match="complete and ordered"):
        episode_samples(
            "x",
            [{"episode_id": "e", "step_idx": 1, "fit": True}],
            "qwen3-vl",
            prompt_options(load_config(ROOT / "configs" / "tiny.yaml").student),
        )


def test_empty_lake_and_cli(lake, tmp_path):
    with pytest.raises(CurateError, match="no episodes"):
        curate(_cfg(tmp_path / "empty"), iteration=0)
    with pytest.raises(CurateError, match="no successful train episodes"):
        curate(_cfg(lake["root"]), iteration=0, held_out=list(TASKS))
    cfg_file = tmp_path / "c.yaml"
    cfg_file.write_text(f"lake:\n  root: {lake['root']}\n")
    r = subprocess.run(
        [sys.executable, "-m", "flywheel", "stage", "curate", "--iteration", "1", "-c", str(cfg_file)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
        env={**os.environ, "COLUMNS": "400"},
    )  # rich would fold the long path at 80 columns
    assert r.returncode == 0, r.stderr
    assert "13 episodes" in r.stdout and "train.parquet" in r.stdout
