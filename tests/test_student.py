"""The student: prompts, the hf backend (batched, seeded, logprobs), and student rollouts into the lake."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from synthetic import png_pool

from agents.actions import Click
from agents.backends.base import Sampling
from agents.backends.hf import HFBackend
from agents.base import StepRecord
from agents.prompts import PromptOptions, build_prompt, sft_messages, transform_for, ui_text_in_model_space
from agents.student import StudentOptions, StudentPolicy
from envs.base import Observation


@pytest.fixture(scope="module")
def tiny_path(tmp_path_factory) -> Path:
    from training.models import init_model

    return init_model("qwen3-vl", "tiny", tmp_path_factory.mktemp("models") / "tiny-qwen3vl", seed=0)


@pytest.fixture(scope="module")
def backend(tiny_path):
    return HFBackend(str(tiny_path))


def _obs(i=0) -> Observation:
    return Observation(
        png_pool(2, seed=i)[i % 2],
        160,
        210,
        "Click the button labelled OK.",
        'button "OK" @ (80,120) [40x20]\ninput_text "" @ (80,60) [120x18]',
    )


def test_prompt_window_history_and_model_space_ui_text():
    t = transform_for("qwen3-vl", 160, 210)
    shots = png_pool(3)
    hist = [StepRecord(i, "think", f"Click {i}", Click(x=80, y=105), "ok", shots[i]) for i in range(3)]
    p = build_prompt("Do it.", shots[0], 'button "OK" @ (80,105) [40x21]', hist, PromptOptions(history_images=2), t)
    user = p.messages[1]["content"]
    assert sum(c["type"] == "image" for c in user) == len(p.images) == 2  # K=2: one earlier + current
    assert p.images[0] == shots[2]  # the most recent earlier screen
    text = " ".join(c.get("text", "") for c in user)
    assert "Step 3: Click 2 -> click(500, 500) [ok]" in text  # history in the model's 0-1000 space
    assert "@ (500,500) [250x100]" in text  # UI boxes rewritten into the same space
    assert p.messages[0]["role"] == "system" and "0 to 1000" in p.messages[0]["content"][0]["text"]
    assert sft_messages(p, "target")[-1] == {"role": "assistant", "content": [{"type": "text", "text": "target"}]}
    # Qwen2.5-VL: absolute pixels of the resized image
    t25 = transform_for("qwen2.5-vl", 160, 210, image_size=(320, 420))
    assert ui_text_in_model_space("x @ (80,105) [40x21]", t25) == "x @ (160,210) [80x42]"


def test_hf_backend_batched_seeded_with_true_logprobs(backend):
    t = transform_for("qwen3-vl", 160, 210)
    prompts = [
        build_prompt(o.instruction, o.screenshot_png, o.ui_text, [], PromptOptions(), t) for o in (_obs(0), _obs(1))
    ]
    s = Sampling(temperature=1.0, max_new_tokens=12, seed=7)
    a = backend.generate(prompts, s)
    b = backend.generate(prompts, s)
    assert [g.text for g in a] == [g.text for g in b]  # deterministic under a seed
    assert all(g.completion_tokens == len(g.token_ids) == len(g.logprobs) > 0 for g in a)
    greedy = backend.generate(prompts[:1], Sampling(temperature=0.0, max_new_tokens=12))[0]
    # the returned logprobs are the model's: a teacher-forced forward pass over prompt+response agrees
    enc = backend.encode(prompts[:1])
    ids = torch.cat([enc["input_ids"], torch.tensor([greedy.token_ids])], dim=1)
    fwd = {k: v for k, v in enc.items() if k not in ("input_ids", "attention_mask")}
    if "mm_token_type_ids" in fwd:  # response tokens are text (type 0)
        fwd["mm_token_type_ids"] = torch.cat(
            [fwd["mm_token_type_ids"], torch.zeros(1, len(greedy.token_ids), dtype=fwd["mm_token_type_ids"].dtype)],
            dim=1,
        )
    with torch.no_grad():
        logits = backend.model(input_ids=ids, attention_mask=torch.ones_like(ids), **fwd).logits[0].float()
    n = len(greedy.token_ids)
    ref = torch.log_softmax(logits[-n - 1 : -1], -1).gather(-1, torch.tensor(greedy.token_ids)[:, None]).squeeze(-1)
    assert torch.allclose(ref, torch.tensor(greedy.logprobs), atol=1e-3)


def test_untrained_output_becomes_parse_errors_not_crashes(backend):
    pol = StudentPolicy(backend, StudentOptions(arch="qwen3-vl", sampling=Sampling(max_new_tokens=16, seed=1)))
    ds = pol.act_batch([_obs(0), _obs(1)], [[], []])
    for d in ds:
        assert d.response_text is not None and d.token_ids
        assert (d.action is None) == (d.parse_error is not None)
    assert all(d.action is None for d in ds)  # random weights do not write tool calls


@pytest.mark.browser
def test_student_rollouts_on_real_miniwob_into_the_lake(tiny_path, lake_root):
    from flywheel.runtime.rollout import PolicySpec, RolloutSpec, make_jobs, run_rollouts
    from storage.catalog import connect

    cfg = {"model": str(tiny_path), "max_new_tokens": 16}
    spec = RolloutSpec(
        run_key="student-a",
        iteration=0,
        stage="rollouts",
        lake_root=str(lake_root),
        jobs=make_jobs("student-a", ["click-test", "focus-text"], [0, 1], group_size=2, policy_tag="student"),
        policy=PolicySpec("student", {"model": str(tiny_path), "config": cfg}, version="tiny"),
        n_envs=2,
        max_steps=3,
        episode_timeout_s=120,
    )
    s = run_rollouts(spec, progress=False)
    assert s.ran == 8 and s.errors == 0, s
    con = connect(lake_root)
    n, parse_err, with_lp = con.execute(
        """SELECT count(*), count(*) FILTER (NOT parse_ok),
        count(*) FILTER (len(logprobs) = len(token_ids) AND len(token_ids) > 0) """
        "FROM steps WHERE NOT is_final"
    ).fetchone()
    assert n == 8 * 3 and parse_err == n and with_lp == n  # untrained: every step a recorded parse error
    ctx = json.loads(con.execute("SELECT prompt_context FROM steps WHERE NOT is_final LIMIT 1").fetchone()[0])
    assert ctx["coord_space"] == "relative1000" and ctx["history_images"] == 1
    assert con.execute("SELECT bool_and(status = 'truncated'), max(n_parse_errors) FROM episodes").fetchone() == (
        True,
        3,
    )


@pytest.mark.browser
def test_lockstep_batched_episodes_keep_their_own_rows(tiny_path, lake_root):
    """One worker steps 3 envs with one batched generate per tick; every row lands in its own episode."""
    from flywheel.runtime.rollout import PolicySpec, RolloutSpec, make_jobs, run_rollouts
    from storage.catalog import connect

    cfg = {"model": str(tiny_path), "max_new_tokens": 8}
    jobs = make_jobs("lock", ["click-test", "focus-text", "enter-text"], [0, 1], policy_tag="student")
    spec = RolloutSpec(
        run_key="lock",
        iteration=0,
        stage="rollouts",
        lake_root=str(lake_root),
        jobs=jobs,
        policy=PolicySpec("student", {"model": str(tiny_path), "config": cfg}),
        n_envs=1,
        envs_per_worker=3,
        max_steps=2,
        episode_timeout_s=120,
    )
    s = run_rollouts(spec, progress=False)
    assert s.ran == 6 and s.errors == 0
    con = connect(lake_root)
    # each episode's screens show its own task: focus-text/enter-text pages have a text input, click-test does not
    rows = con.execute("""SELECT e.task_id, bool_or(s.ui_text LIKE '%input_text%'), count(*)
                          FROM episodes e JOIN steps s USING (episode_id) GROUP BY e.task_id ORDER BY 1""").fetchall()
    assert rows == [("click-test", False, 6), ("enter-text", True, 6), ("focus-text", True, 6)]


def test_pool_keeps_workers_and_reloads_weights_between_runs(tiny_path, lake_root, tmp_path):
    """RL rounds: the same worker processes (and browsers) serve two runs; `reload` swaps the weights in place,
    and the second run's episodes record the new policy version and sample from the new weights."""
    from flywheel.runtime.rollout import PolicySpec, RolloutPool, RolloutSpec, make_jobs, run_rollouts
    from storage.catalog import connect
    from training.models import init_model

    other = init_model("qwen3-vl", "tiny", tmp_path / "round-1", seed=9)
    cfg = {"model": str(tiny_path), "temperature": 0.0, "max_new_tokens": 8}
    policy = PolicySpec("student", {"model": str(tiny_path), "config": cfg}, version="round-0")

    def spec(key):
        return RolloutSpec(
            run_key=key,
            iteration=0,
            stage="rl",
            lake_root=str(lake_root),
            policy=policy,
            jobs=make_jobs(key, ["click-test"], [0, 1], policy_tag="student"),
            n_envs=1,
            envs_per_worker=2,
            max_steps=1,
            episode_timeout_s=120,
        )

    with RolloutPool(spec("r0")) as pool:
        s0 = run_rollouts(spec("r0"), progress=False, pool=pool)
        pids = [w.proc.pid for w in pool.runner.workers]
        pool.reload(str(other), version="round-1")
        s1 = run_rollouts(spec("r1"), progress=False, pool=pool)
        assert [w.proc.pid for w in pool.runner.workers] == pids  # no restart: same process, same browsers
    assert (s0.ran, s1.ran, s0.errors, s1.errors) == (2, 2, 0, 0)
    con = connect(lake_root)
    versions = dict(con.execute("SELECT run_key, any_value(policy_version) FROM episodes GROUP BY 1").fetchall())
    assert versions == {"r0": "round-0", "r1": "round-1"}
    # the same greedy prompt under different weights gives different logprobs: the reload took effect
    lp = dict(
        con.execute("""SELECT e.run_key, s.logprobs FROM steps s JOIN episodes e USING (episode_id)
                             WHERE e.seed = (SELECT min(seed) FROM episodes) AND NOT s.is_final""").fetchall()
    )
    assert lp["r0"] != lp["r1"]


@pytest.mark.browser
def test_rollouts_stage_temperature_overrides_the_students(tiny_path, tmp_path):
    """`rollouts.temperature: 0` makes the rollouts stage greedy (both members of a group reply the same at every
    step); left unset, it samples at student.temperature (1.0) and the members differ."""
    from configs.loading import load_config
    from flywheel.stages import student_rollouts
    from storage.catalog import connect

    root = Path(__file__).resolve().parents[1]

    def replies(temperature, lake):
        cfg = load_config(
            root / "configs" / "tiny.yaml",
            {
                "lake.root": str(lake),
                "student.model": str(tiny_path),
                "student.max_new_tokens": 12,
                "rollouts.temperature": temperature,
                "rollout.group_size": 2,
                "env.max_steps": 2,
                "rollouts.selection.tasks": ["click-test"],
                "rollouts.selection.seeds_per_task": 1,
            },
        )
        assert student_rollouts(cfg, 0, str(tiny_path), progress=False)["ran"] == 2
        rows = (
            connect(lake)
            .execute("""SELECT e.sample_idx, list(s.response_text ORDER BY s.step_idx)
            FROM episodes e JOIN steps s USING (episode_id) WHERE NOT s.is_final GROUP BY 1 ORDER BY 1""")
            .fetchall()
        )
        return [r[1] for r in rows]

    greedy = replies(0.0, tmp_path / "greedy")
    assert len(greedy) == 2 and greedy[0] == greedy[1]
    sampled = replies(None, tmp_path / "sampled")
    assert len(sampled) == 2 and sampled[0] != sampled[1]


def _teacher_step(png: bytes) -> dict:
    """A scripted teacher's fit step as the lake holds it: screen pixels in the action, its Action line and thought."""
    return {
        "episode_id": "e0",
        "step_idx": 0,
        "screen_w": 160,
        "screen_h": 210,
        "fit": True,
        "screenshot": png,
        "ui_text": 'div "intro" @ (80,60) [156x11]\nbutton "OK" @ (80,120) [40x20]',
        "action": Click(x=80, y=120).model_dump_json(),
        "raw_action": json.dumps({"action": "click", "x": 80, "y": 120}),
        "thought": 'The "OK" button is at (80,120).',
        "action_desc": 'Click button "OK" @ (80,120)',
    }


def test_screen_coord_space_writes_and_reads_the_screens_own_pixels():
    """student.coord_space = screen: the UI text, the teacher's target and the parsed reply all use the pixel
    numbers the UI text shows (a copy), where the native Qwen3-VL space rescales them to 0-1000."""
    from agents.parsing import parse_response
    from training.data import episode_samples

    step = _teacher_step(png_pool(1)[0])
    native = episode_samples("Click OK.", [step], "qwen3-vl", PromptOptions())[0]
    screen = episode_samples("Click OK.", [step], "qwen3-vl", PromptOptions(coord_space="screen"))[0]
    assert '"x": 500, "y": 571' in native["target"] and '"x": 80, "y": 120' in screen["target"]
    assert 'Click button "OK" @ (80,120)' in screen["target"] and "(80,120)." in screen["target"]
    ui = screen["messages"][1]["content"][-1]["text"]
    assert 'button "OK" @ (80,120) [40x20]' in ui  # unchanged: the reply's numbers are on this line
    assert "pixels of the screenshot" in screen["messages"][0]["content"][0]["text"]
    t = transform_for("qwen3-vl", 160, 210, space="screen")
    assert parse_response(screen["target"], t).action == Click(x=80, y=120)
    with pytest.raises(ValueError, match="unknown coordinate space 'pixels'"):
        transform_for("qwen3-vl", 160, 210, space="pixels")


def test_screen_coord_space_from_the_config_reaches_the_policy_and_the_dataset_ids(tiny_path):
    from agents.student import build_student_policy
    from configs.loading import load_config
    from configs.models import ConfigError
    from flywheel import midtrain
    from training.curation import dataset_id_for, prompt_key

    root = Path(__file__).resolve().parents[1]
    native = load_config(str(root / "configs" / "local.yaml"))
    screen = load_config(str(root / "configs" / "local.yaml"), {"student.coord_space": "screen"})
    # a lake made before the knob keeps its dataset ids; the other space gets its own (its prompts differ)
    assert dataset_id_for(native, 0) != dataset_id_for(screen, 0)
    assert midtrain.dataset_id_for(native, "midtrain-it0-x") != midtrain.dataset_id_for(screen, "midtrain-it0-x")
    assert "coord_space" not in prompt_key(native.student) and prompt_key(screen.student)["coord_space"] == "screen"
    with pytest.raises(ConfigError, match="coord_space"):
        load_config(str(root / "configs" / "local.yaml"), {"student.coord_space": "pixels"})
    pol = build_student_policy(str(tiny_path), {"model": str(tiny_path), "max_new_tokens": 8, "coord_space": "screen"})
    d = pol.act_batch([_obs(0)], [[]])[0]
    assert d.extra["prompt_context"]["coord_space"] == "screen"
    assert native.student.coord_space == "native"


def test_lean_prompt_options_drop_the_system_line_and_sizes_and_mark_the_cited_line():
    """student.system_prompt none / ui_sizes false / ui_marks true: no system message, UI lines without their box
    size and numbered "[k] ", and the teacher's Action line cites the number of the line it clicks, also when
    another line differs from it only by case (the copy keys on the number)."""
    from agents.parsing import parse_response
    from agents.prompts import cite_marks
    from training.data import episode_samples

    step = _teacher_step(png_pool(1)[0])
    step["ui_text"] = 'button "ok" @ (30,120) [40x20]\nbutton "OK" @ (80,120) [40x20]\ninput_text "" @ (80,60) [120x18]'
    lean = PromptOptions(system="none", ui_sizes=False)
    marks = PromptOptions(system="none", ui_sizes=False, ui_marks=True)
    plain, short, marked = (
        episode_samples("Click OK.", [step], "qwen3-vl", o)[0] for o in (PromptOptions(), lean, marks)
    )
    assert [m["role"] for m in plain["messages"]] == ["system", "user", "assistant"]
    assert [m["role"] for m in short["messages"]] == ["user", "assistant"]
    assert 'button "OK" @ (500,571) [250x95]' in plain["messages"][1]["content"][-1]["text"]
    assert short["messages"][0]["content"][-1]["text"] == (
        '\nUI elements:\nbutton "ok" @ (188,571)\nbutton "OK" @ (500,571)\ninput_text "" @ (500,286)'
    )
    assert marked["messages"][0]["content"][-1]["text"] == (
        '\nUI elements:\n[1] button "ok" @ (188,571)\n[2] button "OK" @ (500,571)\n[3] input_text "" @ (500,286)'
    )
    assert 'Action: Click button "OK" @ (500,571)' in short["target"]
    assert 'Action: Click [2] button "OK" @ (500,571)' in marked["target"]
    t = transform_for("qwen3-vl", 160, 210)
    act = parse_response(marked["target"], t).action  # the mark is text; the call is the action
    assert act.action == "click" and abs(act.x - 80) < 1 and abs(act.y - 120) < 1
    # a reply that cites no line, or a prompt without marks, is left as it is
    assert cite_marks('Action: Type "x"\n', step["ui_text"], marks, t) == 'Action: Type "x"\n'
    assert cite_marks(short["target"], step["ui_text"], lean, t) == short["target"]
    assert cite_marks(marked["target"], step["ui_text"], marks, t) == marked["target"]  # marked once


def test_lean_prompt_options_from_the_config_reach_the_policy_rl_and_the_dataset_ids(tiny_path):
    from agents.student import build_student_policy
    from configs.loading import load_config
    from configs.models import ConfigError
    from training.curation import PROMPT_KEYED_IF_SET, dataset_id_for, prompt_key
    from training.rl_settings import RLSettings

    root = Path(__file__).resolve().parents[1]
    plain = load_config(str(root / "configs" / "local.yaml"), {"student.system_prompt": "compact"})  # all at default
    over = {"student.system_prompt": "none", "student.ui_sizes": False, "student.ui_marks": True}
    lean = load_config(str(root / "configs" / "local.yaml"), over)
    assert not set(PROMPT_KEYED_IF_SET) & set(prompt_key(plain.student))  # earlier lakes keep their ids
    assert {k: prompt_key(lean.student)[k] for k in ("system_prompt", "ui_sizes", "ui_marks")} == {
        "system_prompt": "none",
        "ui_sizes": False,
        "ui_marks": True,
    }
    assert dataset_id_for(plain, 0) != dataset_id_for(lean, 0)
    opts = PromptOptions.from_student(lean.student)
    assert (opts.system, opts.ui_sizes, opts.ui_marks) == ("none", False, True)
    assert RLSettings.from_config(lean).prompt_options == opts
    with pytest.raises(ConfigError, match="system_prompt"):
        load_config(str(root / "configs" / "local.yaml"), {"student.system_prompt": "short"})
    policy_cfg = {"model": str(tiny_path), "max_new_tokens": 8, "system_prompt": "none", "ui_marks": True}
    d = build_student_policy(str(tiny_path), policy_cfg).act_batch([_obs(0)], [[]])[0]
    assert d.extra["prompt_context"]["system"] == "none" and d.extra["prompt_context"]["ui_marks"] is True


# A click-button page from the lake (eval seed 100002, screen pixels): "Next" second on its row, "next" below it.
_BUTTONS = """div "pharetra, eget lacinia" @ (80,58) [156x11]
button "Okay" @ (26,74) [47x21]
button "Next" @ (71,74) [43x21]
div "habitasse aliquam commodo" @ (80,90) [156x11]
button "next" @ (23,106) [41x21]
button "Okay" @ (120,106) [47x21]"""


def _reply(desc: str, x: int, y: int):
    from agents.base import Decision
    from agents.parsing import parse_response

    t = transform_for("qwen3-vl", 160, 210)
    call = json.dumps({"name": "computer_use", "arguments": {"action": "click", "x": x, "y": y}})
    text = f"Action: {desc}\n<tool_call>\n{call}\n</tool_call>"
    pr = parse_response(text, t)
    assert pr.ok, pr.error
    return Decision(text, pr.action, pr.thought, pr.action_desc, pr.raw_args, extra={"prompt_context": {"k": 1}})


def test_snap_to_cited_moves_a_missed_click_to_the_line_it_names_and_only_then():
    """The reply names "Next" but copies the x of "next" (what failing models wrote on this page): the click goes
    to "Next"'s centre, the reply and raw call stay as written, and prompt_context records the line and the model's
    point. A label two lines share goes to the nearer of them. A point already inside a cited box, an exact-case
    twin, a reply that cites nothing and a non-click are left alone."""
    from agents.student import snap_to_cited
    from training.data import target_text

    t = transform_for("qwen3-vl", 160, 210)
    missed = _reply('Click button "Next" @ (144,352)', 144, 352)  # 144 = "next"'s x in 0-1000
    d = snap_to_cited(missed, _BUTTONS, t)
    assert (d.action.x, d.action.y) == (71.0, 74.0) and d.action.action == "click"
    # the record names what was clicked, and an SFT target built from the step agrees with itself
    assert d.action_desc == 'Click button "Next" @ (444,352)' and missed.action_desc.endswith("(144,352)")
    step = {"action": d.action.model_dump_json(), "raw_action": json.dumps(d.raw_action), "action_desc": d.action_desc}
    assert target_text(step, t).endswith(
        'Action: Click button "Next" @ (444,352)\n<tool_call>\n'
        '{"name": "computer_use", "arguments": {"action": "click", "x": 444, "y": 352}}\n</tool_call>'
    )
    assert d.response_text == missed.response_text and d.raw_action == missed.raw_action == {
        "action": "click",
        "x": 144,
        "y": 352,
    }
    assert d.extra["prompt_context"] == {
        "k": 1,
        "snapped": {
            "line": 'button "Next" @ (71,74) [43x21]',
            "from": [23.04, 73.92],
            "action_desc": 'Click button "Next" @ (144,352)',
        },
    }
    assert "snapped" not in missed.extra["prompt_context"]  # the model's decision is not edited in place

    inside = _reply('Click button "Next" @ (450,350)', 450, 350)  # (72, 73.5) px: inside the 43x21 box
    assert snap_to_cited(inside, _BUTTONS) is inside
    twin = snap_to_cited(_reply('Click button "next" @ (444,352)', 444, 352), _BUTTONS)
    assert (twin.action.x, twin.action.y) == (23.0, 106.0)  # the case the reply wrote, not the look-alike
    # a label two lines share (click-button takes either): the model's point (80,105) px chooses the nearer centre
    shared = snap_to_cited(_reply('Click button "Okay" @ (500,500)', 500, 500), _BUTTONS, t)
    assert (shared.action.x, shared.action.y) == (120.0, 106.0) and shared.action_desc.endswith("(750,505)")
    assert shared.extra["prompt_context"]["snapped"]["of"] == 2
    assert "of" not in d.extra["prompt_context"]["snapped"]  # one line named: no choice was made
    near_first = snap_to_cited(_reply('Click button "Okay" @ (100,250)', 100, 250), _BUTTONS)  # (16, 52.5) px
    assert (near_first.action.x, near_first.action.y) == (26.0, 74.0)
    in_second = _reply('Click button "Okay" @ (740,500)', 740, 500)  # (118.4, 105) px: inside the second box
    assert snap_to_cited(in_second, _BUTTONS) is in_second
    pair = 'button "Okay" @ (40,105) [20x10]\nbutton "Okay" @ (120,105) [20x10]'
    tie = _reply('Click button "Okay" @ (500,500)', 500, 500)  # (80, 105) px: as near one centre as the other
    assert (tie.action.x, tie.action.y) == (80.0, 105.0)
    assert snap_to_cited(tie, pair) is tie
    for desc in ('Click button "Submit" @ (144,352)', "Click somewhere"):
        d = _reply(desc, 144, 352)
        assert snap_to_cited(d, _BUTTONS) is d
    assert snap_to_cited(missed, None) is missed
    marked = snap_to_cited(_reply('Click [3] button "Next" @ (144,352)', 144, 352), "[3] " + _BUTTONS.splitlines()[2])
    assert (marked.action.x, marked.action.y) == (71.0, 74.0)


def test_snap_to_cited_from_the_config_reaches_the_policy_and_its_run_keys(tiny_path):
    from agents.student import build_student_policy
    from configs.loading import load_config
    from configs.models import ConfigError

    root = Path(__file__).resolve().parents[1]
    off = load_config(str(root / "configs" / "local.yaml"), {"student.snap_to_cited": False})
    on = load_config(str(root / "configs" / "local.yaml"), {"student.snap_to_cited": True})
    assert "snap_to_cited" not in off.student.policy_config()  # rollout run keys made before the knob still hold
    assert on.student.policy_config()["snap_to_cited"] is True
    with pytest.raises(ConfigError, match="snap_to_cited"):
        load_config(str(root / "configs" / "local.yaml"), {"student.snap_to_cited": "sometimes"})
    cfg = {"model": str(tiny_path), "max_new_tokens": 8, "snap_to_cited": True}
    assert build_student_policy(str(tiny_path), cfg).opts.snap_to_cited
    assert not build_student_policy(str(tiny_path), {"model": str(tiny_path)}).opts.snap_to_cited
