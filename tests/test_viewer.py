"""`flywheel view` in real headless Chromium, over a lake of real MiniWoB episodes.

The lake: the scripted teacher on click-test and click-button (seeds 0-1) twice, once as stage
`bootstrap` and once as `rollouts`, plus evaluation, checkpoint and RL-metric rows for the report.
"""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from flywheel.runtime.rollout import PolicySpec, RolloutSpec, make_jobs, run_rollouts
from storage.lake import Lake
from viewer.data import Side, ViewerData, ViewerError
from viewer.site import build_site, make_app

pytestmark = pytest.mark.browser

TASKS, SEEDS = ["click-test", "click-button"], [0, 1]
MARK_RGB = (225, 29, 72)  # #e11d48, the viewer's marker colour


@pytest.fixture(scope="module")
def lake(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("viewer") / "lake"
    for stage in ("bootstrap", "rollouts"):
        jobs = make_jobs(f"view-{stage}", TASKS, SEEDS, policy_tag="scripted:0")
        s = run_rollouts(
            RolloutSpec(
                run_key=f"view-{stage}",
                iteration=0,
                stage=stage,
                lake_root=str(root),
                jobs=jobs,
                policy=PolicySpec("scripted"),
                n_envs=1,
                max_steps=4,
                episode_timeout_s=60,
            ),
            progress=False,
        )
        assert s.ran == 4 and s.errors == 0
    lk = Lake(root)
    lk.write(
        "checkpoints",
        [
            dict(
                checkpoint_id="sft-it0-aaa",
                method="sft",
                parent_checkpoint="init",
                dataset_id="curate-it0",
                metrics=json.dumps({"steps": 540, "final_loss": 0.0061234}),
                run_key="sft",
            ),
            dict(
                checkpoint_id="rl-it0-bbb",
                method="grpo",
                parent_checkpoint=str(root / "_checkpoints" / "sft-it0-aaa"),
                metrics=json.dumps({"rounds": 8}),
                run_key="rl",
            ),
        ],
        iteration=0,
        stage="sft",
        run_key="sft",
    )
    lk.write(
        "evals",
        [
            dict(
                eval_id="e1",
                checkpoint_id=ck,
                task_id=t,
                split="eval-seed",
                n_episodes=25,
                successes=k,
                success_rate=k / 25,
                ci_low=max(0, k / 25 - 0.2),
                ci_high=min(1, k / 25 + 0.2),
                run_key=f"ev-{ck}",
            )
            for ck, k in (("sft-it0-aaa", 7), ("rl-it0-bbb", 15))
            for t in ("click-button", "__all__")
        ],
        iteration=0,
        stage="evaluate",
        run_key="ev",
    )
    lk.write(
        "rl_metrics",
        [
            dict(
                round=r,
                update_step=0,
                global_step=r,
                algo="grpo",
                loss=0.1 * r,
                entropy=0.2,
                approx_kl=0.01,
                grad_norm=1.0,
                round_success=0.3 + 0.05 * r,
                run_key="rl",
            )
            for r in range(4)
        ],
        iteration=0,
        stage="rl",
        run_key="rl",
    )
    return root


@pytest.fixture(scope="module")
def site(lake, tmp_path_factory) -> tuple[Path, dict]:
    out = tmp_path_factory.mktemp("site")
    res = build_site(lake, out, compares=[("stage=bootstrap", "stage=rollouts")])
    return out, res


@pytest.fixture(scope="module")
def browser():
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    from envs.miniwob import configure_browser

    chrome, driver = configure_browser()
    opts = webdriver.ChromeOptions()
    opts.binary_location = chrome
    for a in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--window-size=1200,900",
        "--force-device-scale-factor=1",
        "--hide-scrollbars",
    ):
        opts.add_argument(a)
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    d = webdriver.Chrome(service=Service(driver), options=opts)
    yield d
    d.quit()


def _open(browser, path: Path) -> None:
    browser.get(path.resolve().as_uri())
    errors = [e for e in browser.get_log("browser") if e["level"] in ("SEVERE", "ERROR")]
    assert errors == [], errors


def _rows(browser) -> list[list[str]]:
    from selenium.webdriver.common.by import By

    return [
        [td.text for td in tr.find_elements(By.TAG_NAME, "td")]
        for tr in browser.find_elements(By.CSS_SELECTOR, "#episodes tr.ep")
    ]


def test_pages_load_without_console_errors(site, browser):
    out, res = site
    assert res["episodes"] == 8 and res["pages"] == 8 and res["skipped_files"] == 0
    _open(browser, out / "index.html")
    assert len(_rows(browser)) == 8 and browser.find_element("id", "count").text == "8 episodes"
    eid = next((out / "episode").glob("*.html")).stem
    for page in (
        out / "episode" / f"{eid}.html",
        out / "compare-0.html",
        next((out / "pair").glob("*.html")),
        out / "report.html",
    ):
        _open(browser, page)
        assert all(
            img.get_attribute("naturalWidth") != "0"
            for img in browser.find_elements("tag name", "img")
            if img.is_displayed() and browser.execute_script("return arguments[0].complete", img)
        )


def test_filters_change_the_list(site, browser):
    from selenium.webdriver.support.ui import Select

    out, _ = site
    _open(browser, out / "index.html")
    Select(browser.find_element("id", "f-stage")).select_by_value("bootstrap")
    rows = _rows(browser)
    assert len(rows) == 4 and {r[2] for r in rows} == {"bootstrap"}
    Select(browser.find_element("id", "f-task_id")).select_by_value("click-test")
    rows = _rows(browser)
    assert len(rows) == 2 and {(r[2], r[3]) for r in rows} == {("bootstrap", "click-test")}
    assert sorted(r[4] for r in rows) == ["0", "1"]
    Select(browser.find_element("id", "f-success")).select_by_value("false")  # the teacher never fails here
    assert _rows(browser) == [] and browser.find_element("id", "count").text == "No episodes match these filters."
    # the filter state lives in the URL: reloading it shows the same selection
    assert "stage=bootstrap" in browser.current_url and "success=false" in browser.current_url


def test_side_by_side_pairs_the_same_task_and_seed(lake, site, browser):
    v = ViewerData(lake)
    pairs = v.pairs(Side.parse("stage=bootstrap"), Side.parse("stage=rollouts"))
    assert len(pairs) == 4
    for p in pairs:
        a, b = v.episode(p["a_id"])["episode"], v.episode(p["b_id"])["episode"]
        assert (a["stage"], b["stage"]) == ("bootstrap", "rollouts")
        assert (a["task_id"], a["seed"]) == (b["task_id"], b["seed"]) == (p["task_id"], p["seed"])
        assert a["instruction"] == b["instruction"]
    out, _ = site
    _open(browser, out / "compare-0.html")
    links = browser.find_elements("css selector", "tr.cmp a")
    assert sorted(link.get_attribute("href").rsplit("/", 1)[1].split("?")[0] for link in links) == sorted(
        f"{p['a_id']}--{p['b_id']}.html" for p in pairs
    )
    links[0].click()
    halves = browser.find_elements("css selector", ".pair")[0].find_elements("css selector", ":scope > div")
    assert "A: stage=bootstrap" in halves[0].text and "B: stage=rollouts" in halves[1].text
    texts = [h.text for h in halves]
    assert texts[0].split("instruction", 1)[1].split("\n")[0] == texts[1].split("instruction", 1)[1].split("\n")[0]
    with pytest.raises(ViewerError, match="matches no policy version"):
        v.pairs(Side.parse("no-such-checkpoint"), Side.parse("stage=rollouts"))
    with pytest.raises(ViewerError, match="unknown comparison key 'colour'"):
        Side.parse("colour=red")


def _marker_centroid(png: bytes, box: tuple[int, int, int, int]) -> tuple[float, float] | None:
    img = np.asarray(Image.open(io.BytesIO(png)).convert("RGB")).astype(int)
    x0, y0, x1, y1 = box
    crop = img[y0:y1, x0:x1]
    hit = np.abs(crop - np.array(MARK_RGB)).sum(axis=2) < 60
    if hit.sum() < 5:
        return None
    ys, xs = np.nonzero(hit)
    return x0 + xs.mean(), y0 + ys.mean()


def test_click_marker_is_drawn_at_the_action_pixel(lake, site, browser):
    out, _ = site
    v = ViewerData(lake)
    eid = v.con.execute(
        "SELECT episode_id FROM ep WHERE task_id = 'click-button' AND stage = 'bootstrap' ORDER BY seed LIMIT 1"
    ).fetchone()[0]
    step = v.episode(eid)["steps"][0]
    act = json.loads(step["action"])
    assert act["action"] == "click"
    _open(browser, out / "episode" / f"{eid}.html")
    svg = browser.find_element("css selector", ".step[data-step='0'] svg")
    browser.execute_script("arguments[0].scrollIntoView()", svg)
    r = browser.execute_script("const b = arguments[0].getBoundingClientRect(); return [b.left, b.top, b.width];", svg)
    scale = r[2] / step["screen_w"]
    want = (r[0] + act["x"] * scale, r[1] + act["y"] * scale)
    shot = browser.get_screenshot_as_png()
    box = tuple(int(v) for v in (r[0], r[1], r[0] + r[2], r[1] + step["screen_h"] * scale))
    got = _marker_centroid(shot, box)
    assert got is not None, "no marker drawn"
    assert abs(got[0] - want[0]) <= 1.5 and abs(got[1] - want[1]) <= 1.5, (got, want)
    # and the marker is ours, not the page: the final screen (no action) has no marker colour there
    final = browser.find_element("css selector", ".step.final svg")
    browser.execute_script("arguments[0].scrollIntoView()", final)
    r2 = browser.execute_script(
        "const b = arguments[0].getBoundingClientRect(); return [b.left, b.top, b.width];", final
    )
    box2 = tuple(int(v) for v in (r2[0], r2[1], r2[0] + r2[2], r2[1] + step["screen_h"] * scale))
    assert _marker_centroid(browser.get_screenshot_as_png(), box2) is None


def test_report_shows_success_lineage_and_rl_curves(site):
    out, _ = site
    html = (out / "report.html").read_text()
    assert "28% " in html and "60% " in html  # 7/25 and 15/25 click-button, from the evals rows
    lineage = html.split("Checkpoint lineage", 1)[1].split("RL curves", 1)[0]
    assert lineage.index("<b>sft-it0-aaa</b>") < lineage.index("<ul><li><b>rl-it0-bbb</b>")  # nested under its parent
    assert "final_loss 0.006123" in lineage
    rl = html.split("RL curves", 1)[1]
    assert rl.count("<svg class='chart'") == 5 and "round success" in rl
    assert "Data volumes" in html and "<td>bootstrap</td><td>teacher</td><td>4</td><td>4</td>" in html


def test_report_shows_per_task_rows_and_where_the_teacher_budget_went(site):
    """flywheel.reports' rows on the report page: per iteration and task (attempts, SFT mix, held-out success), and
    the teacher's spend by stage. The fixture's scripted episodes are teacher spend in both stages."""
    out, _ = site
    html = (out / "report.html").read_text()
    per_task = html.split("<table id='per-task'>", 1)[1].split("</table>", 1)[0]
    assert per_task.count("<tr class='pt'>") == 3  # click-button, click-test, all
    assert (
        "<tr class='pt'><td>0</td><td>click-test</td><td>0</td><td>0</td><td>4</td><td>0</td><td>0</td><td>0</td>"
        "<td>-</td><td>-</td></tr>"
    ) in per_task
    assert "<tr class='pt'><td>0</td><td>all</td><td>0</td><td>0</td><td>8</td>" in per_task
    teacher = html.split("Teacher budget: where it went", 1)[1]
    assert "8 teacher episodes" in teacher and "(bootstrap: 4 episodes, $0; rollouts: 4 episodes, $0)" in teacher


def test_bad_input_gets_one_clear_message(lake, tmp_path, browser):
    cli = [sys.executable, "-m", "flywheel"]
    r = subprocess.run(cli + ["view", "--lake", str(tmp_path / "nowhere")], capture_output=True, text=True)
    assert r.returncode == 2 and "no lake at" in r.stderr and "Traceback" not in r.stderr
    r = subprocess.run(
        cli + ["view", "--lake", str(lake), "--compare", "stage=bootstrap"], capture_output=True, text=True
    )
    assert r.returncode == 2 and "--compare comes in pairs" in r.stderr
    # a corrupt data file is named in one line, with the command that lists every bad file
    import shutil

    broken = tmp_path / "lake"
    shutil.copytree(lake, broken)
    Lake(broken).compact()
    victim = sorted((broken / "data" / "main" / "episodes").glob("*.parquet"))[0]
    victim.write_bytes(victim.read_bytes()[:100])
    r = subprocess.run(
        cli + ["view", "--lake", str(broken), "--out", str(tmp_path / "site")], capture_output=True, text=True
    )
    assert r.returncode == 2 and victim.name in r.stderr and "flywheel lake verify" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr
    # an empty lake: the page says there is nothing, rather than failing
    empty = tmp_path / "empty"
    empty.mkdir()
    res = build_site(empty, tmp_path / "site2")
    assert res["episodes"] == 0
    _open(browser, tmp_path / "site2" / "index.html")
    assert browser.find_element("id", "count").text == "No episodes match these filters."
    assert "no evaluations in this lake yet" in (tmp_path / "site2" / "report.html").read_text()


def test_serve_answers_the_same_pages(lake):
    from starlette.testclient import TestClient

    v = ViewerData(lake)
    eid = v.index()["columns"]["episode_id"][0]
    with TestClient(make_app(lake)) as c:
        assert "FLYWHEEL_INDEX" in c.get("/index-data.js").text and '"all_pages":true' in c.get("/index-data.js").text
        page = c.get(f"/episode/{eid}.html")
        assert page.status_code == 200 and f"shots/{eid}/0.png" in page.text
        png = c.get(f"/shots/{eid}/0.png")
        assert png.headers["content-type"] == "image/png" and png.content[:4] == b"\x89PNG"
        cmp_ = c.get("/compare.html", params={"a": "stage=bootstrap", "b": "stage=rollouts"})
        assert cmp_.text.count("class='cmp'") == 4
        missing = c.get("/episode/not-an-episode.html")
        assert missing.status_code == 404 and "no episode" in missing.text
        assert c.get("/shots/..%2F..%2Fetc/0.png").status_code == 404
        assert c.get("/report.html").status_code == 200
