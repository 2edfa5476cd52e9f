"""RL on lake step rows (training/rl.py, training/rl_data.py) with a tiny real Qwen3-VL: the sampler's log-probs
are reproduced, GRPO moves towards the rewarded response, SDPO moves the student towards what its privileged
teacher prefers, replay fills all-failed groups, advantages are per episode, zero-variance groups are dropped,
rows without a teacher context get no SDPO term, and the learner resumes exactly. No Chromium: rows are lake-shaped
dicts (or a small lake written with storage.lake.Lake) with synthetic screenshots."""

from __future__ import annotations

import json
import math
from datetime import datetime, timezone
from pathlib import Path

import pytest
import torch
from synthetic import png_pool

from agents.actions import Click
from agents.parsing import format_response
from agents.prompts import PromptOptions, transform_for
from training.rl import RLSettings, RLTrainer, RowEncoder, response_logprobs, rl_update, teacher_messages
from training.rl_data import (
    _pick,
    assign_advantages,
    attach_sdpo_context,
    episode_rows,
    load_rl_rows,
    stored_index,
    stored_successes,
)

T = transform_for("qwen3-vl", 160, 210)
PNG = png_pool(2)
UI = 'button "OK" @ (80,120) [40x20]'
ACTS = {"A": Click(x=80, y=120), "B": Click(x=20, y=180)}
TEXT = {k: format_response(None, "Click OK", a, T) for k, a in ACTS.items()}
TEXT["J"] = "I cannot find the button."  # an unparseable reply


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    from training.models import init_model

    return init_model("qwen3-vl", "tiny", tmp_path_factory.mktemp("rl") / "tiny", seed=0)


def _load(path):
    from training.models import load_model

    torch.manual_seed(0)
    return load_model(path)


def _ids(proc, which: str) -> list[int]:
    return proc.tokenizer(TEXT[which] + "<|im_end|>", add_special_tokens=False)["input_ids"]


def _episode(eid: str, group: str, success: bool, *, task="click-test", seed=0, run_key="rl-r0", policy="student"):
    return dict(
        episode_id=eid,
        task_id=task,
        seed=seed,
        split="train",
        instruction="Click the OK button.",
        policy=policy,
        group_id=group,
        sample_idx=0,
        task_reward=float(success),
        success=success,
        status="ok",
        n_steps=1,
        run_key=run_key,
        ended_at=datetime(2026, 1, 1, tzinfo=timezone.utc),
    )


def _step(eid: str, idx: int, which: str | None, ids=None, logprobs=None, *, run_key="rl-r0", parsed=True):
    a = ACTS.get(which or "A", ACTS["A"])
    return dict(
        episode_id=eid,
        step_idx=idx,
        is_final=False,
        screenshot=PNG[idx % 2],
        screen_w=160,
        screen_h=210,
        ui_text=UI,
        thought=f"The OK button is at ({a.x},{a.y}).",
        action_desc="Click OK",
        raw_action=json.dumps({"action": "click", "x": a.x, "y": a.y}),
        action=json.dumps({"action": "click", "x": a.x, "y": a.y}) if parsed else None,
        parse_ok=parsed,
        parse_error=None if parsed else "no tool call",
        token_ids=ids,
        logprobs=logprobs,
        run_key=run_key,
    )


def _rows(proc, specs, **kw) -> list[dict]:
    """specs: (episode id, group, success, response 'A'|'B', n_steps) -> training rows (each step answers it)."""
    out = []
    for eid, group, ok, which, n in specs:
        steps = [_step(eid, i, which, _ids(proc, which)) for i in range(n)]
        out += episode_rows(_episode(eid, group, ok), steps, arch="qwen3-vl", opts=PromptOptions(), **kw)
    return out


def _logp(model, proc, row, which: str, messages=None) -> float:
    """Teacher-forced summed log-prob of response `which` after the row's prompt (or `messages`)."""
    enc = RowEncoder(proc)
    batch, pos, mask = enc.pad([enc.encode(messages or row["messages"], row["images"], _ids(proc, which))], "cpu")
    with torch.no_grad():
        return float(response_logprobs(model.eval(), batch, pos, mask)[0].sum())


# ------------------------------------------------------------------------------------------------ encoding
def test_recomputed_logprobs_match_the_samplers(tiny):
    """Rows rebuilt from the lake score the sampled tokens exactly as the sampler did: IS weight 1, ratio 1."""
    from agents.backends.base import Sampling
    from agents.backends.hf import HFBackend

    model, proc = _load(tiny)
    row = _rows(proc, [("e", "g", True, "A", 1)])[0]
    be = HFBackend(model=model, processor=proc)
    from agents.prompts import Prompt

    gen = be.generate([Prompt(row["messages"], row["images"])], Sampling(temperature=1.0, max_new_tokens=12, seed=3))[0]
    enc = RowEncoder(proc)
    batch, pos, mask = enc.pad([enc.encode(row["messages"], row["images"], gen.token_ids)], "cpu")
    with torch.no_grad():
        lp = response_logprobs(model, batch, pos, mask)[0][0]
    assert torch.allclose(lp, torch.tensor(gen.logprobs), atol=1e-3)


def test_old_logp_rollout_reads_fresh_rows_log_probs_from_the_sampler(tiny):
    """rl.old_logp rollout: a freshly sampled row's stored log-probs are the ratio's denominator (no forward over
    it); a replayed row is still scored. With the weights' own log-probs stored, the update is the recomputing one;
    with other stored values it is not (the denominator really is read from the row)."""
    model, proc = _load(tiny)
    rows = _rows(proc, [("w", "g", True, "A", 1), ("l", "g", False, "B", 1)])
    enc = RowEncoder(proc)
    for r in rows:
        batch, pos, mask = enc.pad([enc.encode(r["messages"], r["images"], enc.response_ids(r))], "cpu")
        with torch.no_grad():
            r["behaviour_logp"] = response_logprobs(model.eval(), batch, pos, mask)[0][0].tolist()
    stale = [dict(r, behaviour_logp=[v - 1.0 for v in r["behaviour_logp"]]) for r in rows]
    replayed = [rows[0], dict(rows[1], replayed=True)]
    got = {}
    for name, mode, rs in (
        ("recompute", "recompute", rows),
        ("rollout", "rollout", rows),
        ("stale", "rollout", stale),
        ("replayed", "rollout", replayed),
    ):
        m, p = _load(tiny)
        trainer, scored = RLTrainer(m, p, RLSettings(lr=1e-3, batch_size=2, old_logp=mode)), []
        score = trainer._score
        trainer._score = lambda model, e, temperature=None: scored.append(len(e)) or score(model, e, temperature)
        trainer.update([dict(r) for r in rs])
        got[name] = (trainer.weights.params, scored)
    assert [got[k][1] for k in ("recompute", "rollout", "stale", "replayed")] == [[2], [0], [0], [1]]
    same = got["recompute"][0]
    assert all(torch.allclose(same[n], got["rollout"][0][n], atol=1e-5) for n in same)
    assert not all(torch.allclose(same[n], got["stale"][0][n], atol=1e-5) for n in same)
    with pytest.raises(ValueError, match="old_logp"):
        RLSettings(old_logp="cached")


def test_tempered_logprobs_are_the_samplers_distribution(tiny):
    """At rl.temperature T the update scores log softmax(logits / T): computed against the full logits here, and
    different from T = 1 (a scorer that ignored T would pass the first check only at T = 1)."""
    from training.losses import _backbone_and_head

    model, proc = _load(tiny)
    row = _rows(proc, [("e", "g", True, "A", 1)])[0]
    enc = RowEncoder(proc)
    batch, pos, mask = enc.pad([enc.encode(row["messages"], row["images"], _ids(proc, "A"))], "cpu")
    with torch.no_grad():
        lp_t, ent_t = response_logprobs(model.eval(), batch, pos, mask, temperature=0.5, entropy=True)
        lp_1, ent_1 = response_logprobs(model, batch, pos, mask, entropy=True)
        backbone, head = _backbone_and_head(model)
        logits = head(backbone(**batch).last_hidden_state[0, pos[0][mask[0]]]).float()
        tgt = batch["input_ids"][0, pos[0][mask[0]] + 1]
        want = torch.log_softmax(logits / 0.5, -1).gather(-1, tgt[:, None])[:, 0]
    assert torch.allclose(lp_t[0][mask[0]], want, atol=1e-5)
    assert not torch.allclose(lp_t, lp_1, atol=1e-3)
    assert float(ent_t[mask].mean()) < float(ent_1[mask].mean())  # a lower temperature is a sharper policy


def test_rl_temperature_reaches_the_sampler_and_the_scorer(tmp_path):
    from configs.loading import load_config
    from flywheel.rl_stage import _policy

    cfg = load_config("configs/tiny.yaml", {"lake.root": str(tmp_path), "rl.temperature": 0.6})
    assert RLSettings.from_config(cfg).temperature == 0.6
    assert _policy(cfg, "m", "v").options["config"]["temperature"] == 0.6
    plain = load_config("configs/tiny.yaml", {"lake.root": str(tmp_path), "student.temperature": 0.0})
    assert RLSettings.from_config(plain).temperature == 1.0  # a greedy student config: RL scores the raw policy
    assert _policy(plain, "m", "v").options["config"]["temperature"] == 0.0
    with pytest.raises(ValueError, match="temperature"):
        RLSettings(temperature=0.0)


# ------------------------------------------------------------------------------------------------ GRPO
def test_grpo_raises_the_rewarded_response(tiny):
    model, proc = _load(tiny)
    rows = _rows(proc, [("win", "g", True, "A", 1), ("lose", "g", False, "J", 1)])
    a0, b0 = _logp(model, proc, rows[0], "A"), _logp(model, proc, rows[0], "J")
    trainer = RLTrainer(model, proc, RLSettings(lr=3e-3, batch_size=2, epochs=2))
    rows, stats = trainer.prepare(rows)
    assert stats["n_groups_kept"] == 1 and rows[0]["advantage"] > 0 > rows[1]["advantage"]
    first = None
    for r in range(3):  # three rounds: old log-probs recomputed each time
        res = trainer.update(rows, round_idx=r)
        first = first or res["steps"][0]
    assert first["approx_kl"] < 1e-6 and first["clip_frac"] == 0.0  # the first minibatch is exactly on-policy
    assert all(m["n_rows"] == 2 and m["n_sdpo_rows"] == 0 and m["grad_norm"] > 0 for m in res["steps"])
    a1, b1 = _logp(model, proc, rows[0], "A"), _logp(model, proc, rows[0], "J")
    assert a1 > a0 + 1.0 and b1 < b0 - 1.0, (a0, a1, b0, b1)


def test_demo_nll_clones_the_replayed_reply_at_its_own_token_mean(tiny):
    """rl.demo_nll (DAPG): the replayed rows' token-mean NLL joins the loss; the metric is that NLL before the
    step, and the replayed reply ends more likely than with the policy-gradient term alone."""
    after, nll = {}, {}
    for w in (0.0, 1.0):
        model, proc = _load(tiny)
        rows = _rows(proc, [("l1", "g", False, "B", 1), ("l2", "g", False, "B", 1)])
        rows += _rows(proc, [("demo", "g", True, "A", 1)], replayed=True)
        before = _logp(model, proc, rows[2], "A")
        n_tok = len(rows[2]["response_ids"])
        trainer = RLTrainer(model, proc, RLSettings(lr=1e-3, batch_size=3, warmup_steps=0, demo_nll=w))
        rows, _ = trainer.prepare(rows)
        step = trainer.update(rows, round_idx=0)["steps"][0]
        demo = next(r for r in rows if r["episode_id"] == "demo")
        after[w], nll[w] = _logp(model, proc, demo, "A") - before, step["demo_nll"]
    assert nll[0.0] is None and nll[1.0] == pytest.approx(-before / n_tok, rel=1e-4)
    assert after[1.0] > after[0.0] + 0.5 > 0.5, after
    # rl.pg_weight 0 (the ablation): the loss is the clone term alone; with no clone term nothing moves
    for w, expect_grad in ((1.0, True), (0.0, False)):
        model, proc = _load(tiny)
        rows, _ = RLTrainer(model, proc, RLSettings()).prepare(
            _rows(proc, [("l1", "g", False, "B", 1), ("l2", "g", False, "B", 1)])
            + _rows(proc, [("demo", "g", True, "A", 1)], replayed=True)
        )
        trainer = RLTrainer(model, proc, RLSettings(lr=1e-3, batch_size=3, warmup_steps=0, demo_nll=w, pg_weight=0.0))
        step = trainer.update(rows, round_idx=0)["steps"][0]
        assert (step["grad_norm"] > 0) == expect_grad
        if w:
            assert step["loss"] == pytest.approx(step["demo_nll"], rel=1e-5)


def test_replies_holding_vision_placeholders_are_left_out_not_crashed_on(tiny):
    """A sampled reply can contain <|image_pad|>: teacher-forcing it would make the model count one image token
    too many (transformers raises). Such rows are dropped from the update and counted."""
    model, proc = _load(tiny)
    bad = _ids(proc, "J")
    bad.insert(2, proc.tokenizer.convert_tokens_to_ids("<|image_pad|>"))
    rows = _rows(proc, [("win", "g", True, "A", 1), ("lose", "g", False, "J", 1), ("junk", "g", False, "J", 1)])
    rows[2]["response_ids"] = bad
    res = RLTrainer(model, proc, RLSettings(lr=1e-3, batch_size=4)).update(rows)
    assert res["summary"]["n_rows_unscorable"] == 1
    assert [r["episode_id"] for r in res["rows"]] == ["win", "lose"] and res["steps"][0]["n_rows"] == 2


# ------------------------------------------------------------------------------------------------ SDPO
@pytest.fixture(scope="module")
def hinted_teacher(tiny):
    """A 0.5M model cannot learn to copy a hint in seconds, so the SDPO checks are built to be meaningful at this size:
    the model is first trained to answer A when the privileged block ("Correct solution: <A>") is in its prompt and B
    without it. Returns its weights (a frozen copy is the SDPO teacher of the tests below)."""
    from training.core import TrainableWeights, make_optimizer, optimizer_step
    from training.data import SFTCollator
    from training.losses import labelled_token_loss
    from training.models import freeze_vision

    model, proc = _load(tiny)
    rows = _rows(proc, [("s1", "g", True, "A", 1), ("s2", "g", True, "A", 1), ("f1", "g", False, "B", 1)])
    attach_sdpo_context(rows, "sibling")
    hinted = teacher_messages(rows[0]["messages"], rows[0]["sdpo_solution"])
    reply = lambda w: [{"role": "assistant", "content": [{"type": "text", "text": TEXT[w]}]}]  # noqa: E731
    samples = [
        {"messages": hinted + reply("A"), "images": rows[0]["images"]},
        {"messages": rows[0]["messages"] + reply("B"), "images": rows[0]["images"]},
    ]
    batch = SFTCollator(proc)(samples)
    labels = batch.pop("labels")
    freeze_vision(model)
    w = TrainableWeights(model)
    opt = make_optimizer(w, 5e-3, 0.0)
    model.train()
    for _ in range(30):
        loss, n = labelled_token_loss(model, batch, labels)
        (loss / n).backward()
        optimizer_step(w, opt, 1.0)
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def _sdpo_setup(tiny, hinted_teacher):
    """(student, teacher, processor, rows with sibling context, hinted prompt): both start from the hinted weights."""
    model, proc = _load(tiny)
    model.load_state_dict(hinted_teacher)
    rows = _rows(proc, [("s1", "g", True, "A", 1), ("s2", "g", True, "A", 1), ("f1", "g", False, "B", 1)])
    attach_sdpo_context(rows, "sibling")
    return model, _frozen(model), proc, rows, teacher_messages(rows[0]["messages"], rows[0]["sdpo_solution"])


def test_hinted_sft_samples_show_the_prompt_the_sdpo_teacher_gets(tiny):
    """sft.hint_fraction: a hinted copy of a sample is the SDPO teacher's prompt for a row whose successful sibling
    did the same step (training.rl_encode.teacher_messages on rl_data.solution_text), with the target unchanged."""
    from training.data import episode_samples, hinted_samples, retarget_sample

    model, proc = _load(tiny)
    eps = [("s1", "g", True, "A", 1), ("s2", "g", True, "A", 1)]
    rows = attach_sdpo_context(_rows(proc, eps, targets="action"), "sibling")
    steps = [dict(_step("s2", 0, "A"), fit=True)]
    sample = retarget_sample(episode_samples("Click the OK button.", steps, "qwen3-vl", PromptOptions())[0], "action")
    extra = hinted_samples([sample] * 4, 0.5, seed=1)
    assert len(extra) == 2 and hinted_samples([sample], 0.0) == []
    got = extra[0]["messages"]
    want = teacher_messages(rows[0]["messages"], rows[0]["sdpo_solution"])
    assert got[:-1] == want  # the prompt SDPO's teacher sees
    assert got[-1] == sample["messages"][-1] and extra[0]["images"] == sample["images"]
    assert "Correct solution:" in got[-2]["content"][-1]["text"] and "Correct solution:" not in str(sample["messages"])
    second = hinted_samples([dict(sample, step_idx=2)], 1.0)[0]["messages"][-2]["content"][-1]["text"]
    assert "Step 3:\n" in second  # the step comes from the sample's step_idx
    with pytest.raises(ValueError, match="step_idx"):
        hinted_samples([{k: v for k, v in sample.items() if k != "step_idx"}], 1.0)
    # SFT hints the stored sample, then retargets: with any sft.targets the hint quotes what the teacher is shown
    raw = episode_samples("Click the OK button.", steps, "qwen3-vl", PromptOptions())[0]
    for targets in ("full", "action", "tool_call"):
        hinted = retarget_sample(hinted_samples([raw], 1.0)[0], targets)
        assert (
            hinted["messages"][:-1] == want and hinted["messages"][-1] == retarget_sample(raw, targets)["messages"][-1]
        )


def test_sdpo_moves_the_student_towards_its_privileged_teacher(tiny, hinted_teacher):
    """Frozen, the hinted model is the SDPO teacher: with a successful sibling's solution in its prompt it scores A
    above what the student (no hint) gives A, and SDPO updates on the group's own responses raise the student's A."""
    model, teacher, proc, rows, hinted = _sdpo_setup(tiny, hinted_teacher)
    assert [r["sdpo_sibling_episode_id"] for r in rows] == ["s2", "s1", "s1"]  # never the row's own episode
    assert "Correct solution:" in hinted[-1]["content"][-1]["text"] and '500, "y": 571' in rows[0]["sdpo_solution"]
    t_a, s_a = _logp(teacher, proc, rows[0], "A", hinted), _logp(model, proc, rows[0], "A")
    assert t_a > s_a + 1.0, (t_a, s_a)  # the privileged context makes the sibling's action likelier

    s = RLSettings(algorithm="sdpo", lr=1e-3, batch_size=3, sdpo_teacher="frozen", sdpo_context="sibling")
    trainer = RLTrainer(model, proc, s, teacher=teacher)
    rows, _ = trainer.prepare(rows)
    for r in range(3):
        res = trainer.update(rows, round_idx=r)
        assert [m["n_sdpo_rows"] for m in res["steps"]] == [3] and res["steps"][0]["sdpo_div_mean"] is None
        if r == 0:  # rl.sdpo_teacher_check's numbers: the block raises the sibling's A on the failed row
            got = {k: v for k, v in res["summary"].items() if k.startswith("sdpo_teacher_")}
            assert got["sdpo_teacher_read_rows"] == 1 and got["sdpo_teacher_read_gain"] > 1.0, got
            assert got["sdpo_teacher_own_rows"] == 2 and got["sdpo_teacher_own_gap"] > -0.2, got
    assert {x["episode_id"]: x["sdpo_sibling_episode_id"] for x in res["rows"]} == {"s1": "s2", "s2": "s1", "f1": "s1"}
    after = _logp(model, proc, rows[0], "A")
    assert after > s_a + 0.5, (s_a, after)


def test_sdpo_topk_moves_the_student_towards_its_privileged_teacher(tiny, hinted_teacher):
    """The same check with logit-level SDPO (sdpo_mode topk: generalized JSD over the student's top-k + tail): the
    divergence to the hinted teacher shrinks and the student's log-prob of the sibling's action A goes up."""
    model, teacher, proc, rows, hinted = _sdpo_setup(tiny, hinted_teacher)
    s_a = _logp(model, proc, rows[0], "A")
    s = RLSettings(
        algorithm="sdpo",
        lr=1e-3,
        batch_size=3,
        sdpo_teacher="frozen",
        sdpo_context="sibling",
        sdpo_mode="topk",
        sdpo_topk=20,
        sdpo_alpha=0.5,
    )
    trainer = RLTrainer(model, proc, s, teacher=teacher)
    rows, _ = trainer.prepare(rows)
    divs = []
    for r in range(3):
        res = trainer.update(rows, round_idx=r)
        assert [m["n_sdpo_rows"] for m in res["steps"]] == [3]
        divs.append(res["steps"][0]["sdpo_div_mean"])
    assert divs[0] > 0 and divs[-1] < divs[0], divs
    after = _logp(model, proc, rows[0], "A")
    assert after > s_a + 2.0, (s_a, after)


def test_screen_hint_shows_the_step_a_success_took_on_the_rows_own_screen(tiny):
    """rl.sdpo_hint screen: a failed row's block is the last action a successful sibling took on the same screen,
    numbered as the row's step; episode: the sibling's whole sequence. A success has no other success here."""
    model, proc = _load(tiny)
    win = [
        _step("w", 0, "B", _ids(proc, "B")),
        _step("w", 1, "A", _ids(proc, "A")),
        _step("w", 2, "A", _ids(proc, "A")),
    ]
    lose = [_step("f", 0, "B", _ids(proc, "B")), _step("f", 1, "A", _ids(proc, "A"))]
    kw = dict(arch="qwen3-vl", opts=PromptOptions())
    rows = episode_rows(_episode("w", "g", True), win, **kw) + episode_rows(_episode("f", "g", False), lose, **kw)
    w, f = rows[:3], rows[3:]
    assert w[0]["screen_hash"] == w[2]["screen_hash"] == f[0]["screen_hash"] != f[1]["screen_hash"]
    assert all(r["step_action"] for r in w) and not any(r["step_action"] for r in f)
    attach_sdpo_context(rows, "sibling", "screen")
    assert w[0]["step_action"] != w[2]["step_action"]
    assert f[0]["sdpo_solution"] == "Step 1:\n" + w[2]["step_action"]  # the step that left the screen, not step 0
    assert f[1]["sdpo_solution"] == "Step 2:\n" + w[1]["step_action"] and f[1]["sdpo_sibling_episode_id"] == "w"
    assert not any(r["sdpo"] for r in w)
    attach_sdpo_context(rows, "sibling", "episode")
    assert f[0]["sdpo_solution"] == f[1]["sdpo_solution"] == w[0]["solution"] and "Step 3:" in w[0]["solution"]
    with pytest.raises(ValueError, match="unknown sdpo hint"):
        attach_sdpo_context(rows, "sibling", "page")


def test_a_teacher_that_does_not_read_its_block_stops_sdpo_before_any_step(tiny, hinted_teacher):
    """rl.sdpo_teacher_check: the hinted model answers A whenever the privileged block is in its prompt. On a group
    whose successes answer B its teacher scores the student's own right tokens far lower than the student does, so
    the update stops with SDPOTeacherError before any step (the student's weights unchanged); null runs anyway."""
    from training.rl import SDPOTeacherError

    model, proc = _load(tiny)
    model.load_state_dict(hinted_teacher)
    specs = [("s1", "g", True, "B", 1), ("s2", "g", True, "B", 1), ("f1", "g", False, "A", 1)]
    rows = attach_sdpo_context(_rows(proc, specs), "sibling")
    hinted = teacher_messages(rows[0]["messages"], rows[0]["sdpo_solution"])
    assert _logp(model, proc, rows[0], "B", hinted) < _logp(model, proc, rows[0], "B") - 1.0
    before = {k: v.clone() for k, v in model.state_dict().items()}
    s = RLSettings(algorithm="sdpo", lr=1e-3, batch_size=3, sdpo_teacher="frozen", sdpo_context="sibling")
    trainer = RLTrainer(model, proc, s, teacher=_frozen(model))
    with pytest.raises(SDPOTeacherError) as err:
        trainer.update(rows)
    assert "on 2 successful rows" in str(err.value) and "sft.hint_fraction" in str(err.value)
    assert "on 1 failed rows whose successful sibling acted otherwise on the same screen" in str(err.value)
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in before.items())
    s.sdpo_teacher_check = None
    assert len(RLTrainer(model, proc, s, teacher=_frozen(model)).update(rows)["steps"]) == 1


def test_topk_buckets_give_sdpo_topk_loss_of_the_full_logits(tiny):
    """response_logprobs(topk=k) / (at=ids) keep only the student's top-k + tail buckets per response token, in
    chunks; sdpo_topk_loss on those buckets equals sdpo_topk_loss on the full [tokens x vocab] logits of both
    forwards (student and hinted teacher at their own positions), value and gradient, and the sampled log-probs
    are those of the plain call."""
    from training.losses import sdpo_topk_loss

    model, proc = _load(tiny)
    teacher = _frozen(model)
    with torch.no_grad():
        for p in teacher.parameters():
            p.add_(0.02 * torch.randn_like(p))
    rows = _rows(proc, [("a", "g", True, "A", 1), ("b", "g", False, "J", 1)])
    enc = RowEncoder(proc)
    resp = [enc.response_ids(r) for r in rows]
    batch, pos, mask = enc.pad([enc.encode(r["messages"], r["images"], ids) for r, ids in zip(rows, resp)], "cpu")
    hint = [teacher_messages(r["messages"], "Step 1: click the OK button") for r in rows]
    tb, tpos, tmask = enc.pad([enc.encode(m, r["images"], ids) for m, r, ids in zip(hint, rows, resp)], "cpu")
    assert torch.equal(tmask, mask) and bool((tpos[mask] > pos[mask]).all())  # the teacher's prompt is longer
    model.eval()
    logp, _, (s_bk, s_ids) = response_logprobs(model, batch, pos, mask, topk=5, chunk=7)
    with torch.no_grad():
        plain, _ = response_logprobs(model, batch, pos, mask)
        _, _, (t_bk, t_ids) = response_logprobs(teacher, tb, tpos, tmask, at=s_ids, chunk=7)
    assert torch.allclose(logp, plain, atol=1e-6) and torch.equal(t_ids[mask], s_ids[mask])
    assert s_bk.shape[-1] == 6 and torch.allclose(s_bk[mask].exp().sum(-1), torch.ones(int(mask.sum())), atol=1e-4)
    got, _ = sdpo_topk_loss(s_bk, t_bk, mask, k=6, alpha=0.3, tail=False)
    b = torch.arange(2)[:, None].expand_as(pos)
    with torch.no_grad():
        t_logits = teacher(**tb).logits[b, tpos]
    want, _ = sdpo_topk_loss(model(**batch).logits[b, pos], t_logits, mask, k=5, alpha=0.3, tail=True)
    assert float(want.detach()[mask].min()) > 0 and torch.allclose(got, want, atol=1e-5), (got, want)
    params = [p for p in model.parameters() if p.requires_grad][-4:]
    g_got = torch.autograd.grad(got.sum(), params, retain_graph=True)
    g_want = torch.autograd.grad(want.sum(), params)
    assert all(torch.allclose(x, y, atol=1e-5, rtol=1e-3) for x, y in zip(g_got, g_want))
    assert any(float(x.abs().max()) > 0 for x in g_got)


def _frozen(model):
    import copy

    twin = copy.deepcopy(model).eval()
    twin.requires_grad_(False)
    return twin


def test_rows_without_privileged_context_get_no_sdpo_term(tiny):
    model, proc = _load(tiny)
    # a success (no other success in its group: no sibling) and a failure (sibling: the success)
    rows = _rows(
        proc,
        [
            ("win", "g", True, "A", 1),
            ("lose", "g", False, "B", 1),
            ("x1", "h", False, "B", 1),
            ("x2", "h", False, "B", 1),
        ],
    )
    attach_sdpo_context(rows, "sibling")
    assert [r["sdpo"] for r in rows] == [False, True, False, False]
    attach_sdpo_context(rows, "feedback")
    assert [r["sdpo"] for r in rows] == [False, True, True, True]
    assert (
        "ended without success after 1 step" in rows[1]["sdpo_feedback"]
        and "click(125, 857)" in rows[1]["sdpo_feedback"]
    )
    # the random-init model does not read the block (rl.sdpo_teacher_check would stop it): these checks are of the rows
    s = RLSettings(algorithm="sdpo", lr=1e-3, batch_size=4, sdpo_context="sibling", sdpo_teacher_check=None)
    res = rl_update(model, proc, [dict(r) for r in rows], s)  # prepared inside: group h has no signal, no context
    assert [m["n_sdpo_rows"] for m in res["steps"]] == [1] and res["steps"][0]["n_rows"] == 2
    assert {x["episode_id"]: x["sdpo"] for x in res["rows"]} == {"win": False, "lose": True}
    # both: the failed rows of group h keep an SDPO term (feedback) although their group has no reward signal
    s = RLSettings(algorithm="sdpo", lr=1e-3, batch_size=4, sdpo_teacher_check=None)
    res = rl_update(model, proc, [dict(r) for r in rows], s)
    assert [m["n_sdpo_rows"] for m in res["steps"]] == [3] and res["steps"][0]["n_rows"] == 4


# ------------------------------------------------------------------------------------------------ advantages
def test_advantages_per_episode_broadcast_and_zero_variance_dropped(tiny):
    _, proc = _load(tiny)
    rows = _rows(
        proc,
        [
            ("long", "g", True, "A", 3),
            ("f1", "g", False, "B", 1),
            ("f2", "g", False, "B", 1),
            ("z1", "z", True, "A", 1),
            ("z2", "z", True, "A", 2),
        ],
    )
    assert [r["step_idx"] for r in rows if r["episode_id"] == "long"] == [0, 1, 2]
    assert len(rows[1]["messages"][1]["content"]) > len(rows[0]["messages"][1]["content"])  # history in later prompts
    kept, stats = assign_advantages([dict(r) for r in rows], mode="mean")
    adv = {(r["episode_id"], r["step_idx"]): r["advantage"] for r in kept}
    # per episode, not per row: mean over the 3 episodes (1/3), though "long" has 3 rows
    assert all(adv[("long", i)] == pytest.approx(2 / 3) for i in range(3))
    assert adv[("f1", 0)] == pytest.approx(-1 / 3) and adv[("f2", 0)] == pytest.approx(-1 / 3)
    assert not any(e in ("z1", "z2") for e, _ in adv)  # zero variance: dropped
    assert stats == {"n_groups": 2, "n_groups_kept": 1, "n_episodes": 5, "n_replayed": 0, "round_success": 0.6}
    z, _ = assign_advantages([dict(r) for r in rows], mode="zscore", drop_zero_variance=False)
    assert {r["episode_id"] for r in z} == {"long", "f1", "f2", "z1", "z2"}
    assert all(r["advantage"] == 0.0 for r in z if r["group_id"] == "z")
    std = (2 / 9) ** 0.5
    assert [r["advantage"] for r in z if r["episode_id"] == "long"] == pytest.approx([(2 / 3) / std] * 3, rel=1e-4)
    # shaping: a parse error lowers that row's advantage only
    bad = episode_rows(
        _episode("p", "g", False),
        [_step("p", 0, "B", _ids(proc, "B"), parsed=False)],
        arch="qwen3-vl",
        opts=PromptOptions(),
    )
    assert bad[0]["parse_error"]
    pen, _ = assign_advantages([dict(r) for r in rows] + bad, mode="mean", parse_error_penalty=0.1)
    by = {r["episode_id"]: r["advantage"] for r in pen}
    assert by["p"] == pytest.approx(by["f1"] - 0.1)
    # step_weight episode: the 3 rows of "long" share its advantage, one-row episodes keep theirs
    ew, _ = assign_advantages([dict(r) for r in rows], mode="mean", step_weight="episode")
    by_row = {(r["episode_id"], r["step_idx"]): r["advantage"] for r in ew}
    assert [by_row[("long", i)] for i in range(3)] == pytest.approx([2 / 9] * 3)
    assert by_row[("f1", 0)] == pytest.approx(-1 / 3)
    with pytest.raises(ValueError, match="step_weight"):
        assign_advantages([dict(r) for r in rows], step_weight="token")


def _screens_episode(eid: str, group: str, success: bool, screens: list[bytes], **kw) -> list[dict]:
    """Rows of an episode whose step i shows screens[i] (token ids [11, 12] unless replayed: then its SFT target)."""
    ids = None if kw.get("replayed") else [11, 12]
    steps = [dict(_step(eid, i, "A", ids), screenshot=png) for i, png in enumerate(screens)]
    ep = _episode(eid, group, success, policy="scripted" if kw.get("replayed") else "student")
    return episode_rows(ep, steps, arch="qwen3-vl", opts=PromptOptions(), **kw)


def test_gigpo_step_groups_add_omega_times_the_step_advantage():
    """Group g: a success (screens S0 S1 S2) and a failure (S0 S3) share their first screen; group h: two successes
    from S4, one in 1 step, one in 2; group f: a failure that stays on S0 twice and a replayed demo (S0 S1).
    gamma 0.9: returns win .81 .9 1, lose 0 0, fast 1, slow .9 1, stuck 0 0, demo .9 1."""
    import hashlib

    S = png_pool(6, seed=1)
    rows = (
        _screens_episode("win", "g", True, [S[0], S[1], S[2]])
        + _screens_episode("lose", "g", False, [S[0], S[3]])
        + _screens_episode("fast", "h", True, [S[4]])
        + _screens_episode("slow", "h", True, [S[4], S[5]])
        + _screens_episode("stuck", "f", False, [S[0], S[0]])
        + _screens_episode("demo", "boot", True, [S[0], S[1]], replayed=True, group_id="f")
    )
    assert rows[0]["screen_hash"] == hashlib.sha1(S[0]).hexdigest() == rows[3]["screen_hash"] != rows[1]["screen_hash"]
    assert [r["episode_steps"] for r in rows] == [3, 3, 3, 2, 2, 1, 2, 2, 2, 2, 2, 2]
    kept, stats = assign_advantages([dict(r) for r in rows], mode="mean", gigpo_omega=0.5, gigpo_gamma=0.9)
    got = {(r["episode_id"], r["step_idx"]): (r["advantage"], r["step_advantage"]) for r in kept}
    # A^E (mean): g +-.5; h 0 (all succeeded); f +-.5 (the replayed demo is the group's success).
    # A^S: (g,S0) .81 vs 0 -> +-.405; (h,S4) 1 vs .9 -> +-.05; (f,S0) stuck 0, 0 and demo .9 -> -.3, -.3, +.6;
    # every other step group is a singleton -> 0.  A = A^E + .5 A^S
    want = {
        ("win", 0): (0.5 + 0.2025, 0.405),
        ("win", 1): (0.5, 0.0),
        ("win", 2): (0.5, 0.0),
        ("lose", 0): (-0.5 - 0.2025, -0.405),
        ("lose", 1): (-0.5, 0.0),
        ("fast", 0): (0.025, 0.05),
        ("slow", 0): (-0.025, -0.05),  # no episode signal, kept for the step signal
        ("stuck", 0): (-0.65, -0.3),
        ("stuck", 1): (-0.65, -0.3),
        ("demo", 0): (0.8, 0.6),
        ("demo", 1): (0.5, 0.0),
    }
    assert got.keys() == want.keys()  # ("slow", 1): no signal at either level -> dropped
    assert all(got[k] == pytest.approx(want[k], abs=1e-6) for k in want), got
    assert stats["n_groups_kept"] == 2 and stats["n_step_signal_rows"] == 7 and stats["n_replayed"] == 1
    # zscore normalises both levels: A^E +-1 in g and f, A^S +-1 in (g,S0) and (h,S4)
    z, _ = assign_advantages([dict(r) for r in rows], mode="zscore", gigpo_omega=1.0, gigpo_gamma=0.9)
    zb = {(r["episode_id"], r["step_idx"]): r["advantage"] for r in z}
    assert [zb[("win", 0)], zb[("win", 1)], zb[("fast", 0)], zb[("slow", 0)]] == pytest.approx([2, 1, 1, -1], rel=1e-4)
    # omega 0: exactly the episode advantages, the zero-variance group dropped, no step advantage
    off, off_stats = assign_advantages([dict(r) for r in rows], mode="mean", gigpo_omega=0.0, gigpo_gamma=0.5)
    ref, ref_stats = assign_advantages([dict(r) for r in rows], mode="mean")
    assert (
        [(r["episode_id"], r["step_idx"], r["advantage"]) for r in off]
        == [(r["episode_id"], r["step_idx"], r["advantage"]) for r in ref]
        == [
            (e, i, a)
            for e, a, n in (("win", 0.5, 3), ("lose", -0.5, 2), ("stuck", -0.5, 2), ("demo", 0.5, 2))
            for i in range(n)
        ]
    )
    assert off_stats == ref_stats and not any("step_advantage" in r for r in off)
    # the trainer passes the knobs through, and the row records carry the anchor and the step advantage
    s = RLSettings(gigpo_omega=0.5, gigpo_gamma=0.9, adv_mode="mean", step_weight="step")
    prepared, _ = RLTrainer.prepare(type("T", (), {"s": s})(), [dict(r) for r in rows])
    assert [r["advantage"] for r in prepared] == [r["advantage"] for r in kept]
    from training.rl_data import row_record

    assert row_record(prepared[0])["screen_hash"] == rows[0]["screen_hash"]
    assert row_record(prepared[0])["step_advantage"] == pytest.approx(0.405)


def test_new_rl_knobs_validate_and_reach_the_settings():
    from dataclasses import fields

    from configs.loading import parse_config
    from configs.models import ConfigError
    from configs.rl import RLConfig

    with pytest.raises(ValueError, match="rl sdpo_mode must be one of sampled, topk, got 'logits'"):
        RLSettings(sdpo_mode="logits")
    for bad in (dict(sdpo_topk=0), dict(sdpo_alpha=1.5), dict(gigpo_omega=-1.0), dict(gigpo_gamma=0.0)):
        with pytest.raises(ValueError, match=next(iter(bad))):
            RLSettings(**bad)
    with pytest.raises(ConfigError, match=r"rl\.sdpo_mode: Input should be 'sampled' or 'topk'"):
        parse_config({"rl": {"sdpo_mode": "logits"}})
    for key, value in (("sdpo_topk", 0), ("sdpo_alpha", -0.1), ("gigpo_omega", -1), ("gigpo_gamma", 1.5)):
        with pytest.raises(ConfigError, match=rf"rl\.{key}: "):
            parse_config({"rl": {key: value}})
    d = RLSettings.from_config(parse_config({}))
    assert (d.sdpo_mode, d.sdpo_topk, d.sdpo_alpha, d.gigpo_omega, d.gigpo_gamma) == ("sampled", 20, 0.5, 0.0, 0.95)
    cfg = parse_config(
        {"rl": {"sdpo_mode": "topk", "sdpo_topk": 7, "sdpo_alpha": 1.0, "gigpo_omega": 1.0, "gigpo_gamma": 0.9}}
    )
    s = RLSettings.from_config(cfg)
    assert (s.sdpo_mode, s.sdpo_topk, s.sdpo_alpha, s.gigpo_omega, s.gigpo_gamma) == ("topk", 7, 1.0, 1.0, 0.9)
    # RLSettings mirrors RLConfig by name (from_config copies matching names): every knob is a documented config key
    outside = {
        "max_new_tokens",
        "targets",
        "prompt",
        "config_hash",
        "focus_tasks",
    }
    assert {f.name for f in fields(RLSettings)} - outside <= set(RLConfig.model_fields)
    # the clone steps' task lists: rl.tasks is the focus; the rehearsed tasks default to the rollout tasks
    s = RLSettings.from_config(
        parse_config(
            {
                "rl": {"tasks": ["click-button"], "clone_steps": 3},
                "rollouts": {"selection": {"tasks": ["click-test", "click-button"]}},
            }
        )
    )
    assert (s.focus_tasks, s.clone_tasks, s.clone_steps) == (("click-button",), ("click-test", "click-button"), 3)
    s = RLSettings.from_config(parse_config({"rl": {"clone_tasks": ["focus-text"]}}))
    assert s.clone_tasks == ("focus-text",) and s.focus_tasks == tuple(parse_config({}).rollouts.selection.tasks)
    assert all(
        RLConfig.model_fields[k].description
        for k in ("sdpo_mode", "sdpo_topk", "sdpo_alpha", "gigpo_omega", "gigpo_gamma", "old_logp")
    )
    assert RLSettings.from_config(parse_config({"rl": {"old_logp": "rollout"}})).old_logp == "rollout"
    with pytest.raises(ConfigError, match="rl.old_logp 'rollout' needs rl.source 'sample'"):
        parse_config({"rl": {"old_logp": "rollout", "source": "lake"}})
    with pytest.raises(ConfigError, match="rl.distributed 'ddp' needs rl.source 'lake'"):
        parse_config({"rl": {"distributed": "ddp"}})
    assert parse_config({"rl": {"distributed": "ddp", "source": "lake", "nproc": 2}}).rl.nproc == 2


def test_balanced_share_splits_a_step_by_tokens():
    """Each DDP rank's part of a step: every sample on exactly one rank, step order kept, samples at their home rank
    (index mod world) when that is balanced, token loads evened out by moves and swaps when it is not, and one
    sample each when there are as many as ranks."""
    from training.distributed import Context, balanced_share

    def split(idx, lengths, world):
        parts = [balanced_share(idx, lengths, Context(r, world)) for r in range(world)]
        assert sorted(i for p in parts for i in p) == sorted(idx)  # every sample exactly once
        assert all(p == [i for i in idx if i in p] for p in parts)  # step order within a rank
        return parts, [sum(lengths[idx.index(i)] for i in p) for p in parts]

    idx, lengths = [10, 11, 12, 13, 14, 15], [900, 100, 800, 200, 300, 700]
    assert split(idx, lengths, 2)[1] == [1500, 1500]  # at home: 2000 / 1000
    parts, _ = split(list(range(8)), [100] * 8, 2)  # balanced at home: nobody moves, so caches keep serving
    assert parts == [[0, 2, 4, 6], [1, 3, 5, 7]]
    parts, load = split([7, 3, 5, 1, 8, 2, 6, 4], [120, 90, 100, 110, 95, 105, 100, 100], 2)
    assert max(load) - min(load) <= 20 and len(set(parts[0]) & {8, 2, 6, 4}) >= 3  # most of them still home
    parts, _ = split([0, 1, 4], [100, 30, 30], 3)  # rank 2 had no home sample: it gets one
    assert [len(p) for p in parts] == [1, 1, 1] and parts[0] == [0]
    assert split([5, 6], [3, 9], 2)[0] == [[6], [5]]
    assert sum(len(p) for p in split([5], [3], 2)[0]) == 1 and balanced_share(idx, lengths, Context()) == idx


# ------------------------------------------------------------------------------------------------ replay
def _write(lake, ep, steps, stage="rollouts"):
    lake.write("episodes", [ep], iteration=0, stage=stage, run_key=ep["run_key"], part=ep["episode_id"])
    lake.write("steps", steps, iteration=0, stage=stage, run_key=ep["run_key"], part=ep["episode_id"])


def test_replay_joins_a_stored_success_to_an_all_failed_group(tiny, tmp_path):
    from storage.catalog import connect
    from storage.lake import Lake

    model, proc = _load(tiny)
    lake = Lake(tmp_path / "lake")
    ids = _ids(proc, "B")
    for eid, task, seed in (
        ("c1", "click-test", 5000),
        ("c2", "click-test", 5000),
        ("f1", "focus-text", 5000),
        ("f2", "focus-text", 5000),
    ):
        _write(
            lake, _episode(eid, f"g-{task}", False, task=task, seed=seed), [_step(eid, 0, "B", ids, [-20.0] * len(ids))]
        )
    # a scripted teacher demo of click-test (no token ids) in an earlier bootstrap: two steps
    demo = _episode("demo", "boot-g", True, seed=3, run_key="boot", policy="scripted")
    _write(lake, demo, [_step("demo", i, "A", run_key="boot") for i in range(2)], stage="bootstrap")
    con = connect(lake)
    rows = load_rl_rows(con, ["rl-r0"], arch="qwen3-vl", opts=PromptOptions(), targets="action")
    # with the lake, only the round's and the candidates' run files are read: the same rows
    assert load_rl_rows(con, ["rl-r0"], arch="qwen3-vl", opts=PromptOptions(), targets="action", lake=lake) == rows
    replayed = [r for r in rows if r["replayed"]]
    assert [(r["episode_id"], r["group_id"], r["reward"]) for r in replayed] == [("demo", "g-click-test", 1.0)] * 2
    assert replayed[0]["response_ids"] is None and replayed[0]["behaviour_logp"] is None
    assert replayed[0]["target_text"] == TEXT["A"]  # the SFT target in the configured format (action: no thought)
    kept, stats = assign_advantages(rows)
    assert {r["group_id"] for r in kept} == {"g-click-test"}  # focus-text has no stored success: dropped
    assert all(r["advantage"] > 0 for r in kept if r["replayed"]) and all(
        r["advantage"] < 0 for r in kept if not r["replayed"]
    )
    assert stats["n_replayed"] == 1 and stats["n_groups_kept"] == 1 and stats["round_success"] == 0.0
    no_replay, _ = assign_advantages(load_rl_rows(con, ["rl-r0"], arch="qwen3-vl", opts=PromptOptions(), replay=False))
    assert no_replay == []  # without replay every group has zero variance
    # rl.stored_same_seed: the demo is of seed 3, the group of seed 5000: neither replay nor stored context
    same = load_rl_rows(con, ["rl-r0"], arch="qwen3-vl", opts=PromptOptions(), targets="action", same_seed=True)
    assert not any(r["replayed"] or r.get("stored_solution") for r in same) and len(same) == 4
    # the index of stored successes gives the same rows, and a success written later is found
    index = stored_index(lake)
    assert load_rl_rows(
        con, ["rl-r0"], arch="qwen3-vl", opts=PromptOptions(), targets="action", lake=lake, index=index
    ) == load_rl_rows(con, ["rl-r0"], arch="qwen3-vl", opts=PromptOptions(), targets="action", lake=lake)
    late = _episode("late", "boot-g2", True, seed=5000, run_key="boot2", policy="scripted")
    _write(lake, late, [_step("late", 0, "A", run_key="boot2")], stage="bootstrap")
    con = connect(lake)
    for idx in (None, index):  # the group's own instance now has a stored success: it comes first
        again = load_rl_rows(
            con, ["rl-r0"], arch="qwen3-vl", opts=PromptOptions(), targets="action", lake=lake, index=idx
        )
        assert {r["episode_id"] for r in again if r["replayed"]} == {"late"}
    assert stored_successes(con, ["click-test"], ["rl-r0"], index) == stored_successes(con, ["click-test"], ["rl-r0"])

    lake.replace_run("episodes", [], iteration=0, stage="bootstrap", run_key="boot2")  # forget the run
    assert [e["episode_id"] for e in stored_successes(con, ["click-test"], [], index)["click-test"]] == ["demo"]

    # a round over the lake: replayed rows train at IS weight 1 and the round's numbers land in rl_metrics / rl_rows
    trainer = RLTrainer(model, proc, RLSettings(lr=1e-3, batch_size=2, targets="action"))
    res = trainer.train_round(lake, ["rl-r0"], round_idx=0, iteration=0, run_key="rl-test")
    assert res["n_rows"] == 4 and res["round_success"] == 0.0
    con = connect(lake)
    got = con.sql(
        "SELECT episode_id, step_idx, replayed, advantage, is_weight_mean FROM rl_rows ORDER BY 1, 2"
    ).fetchall()
    assert [g[:3] for g in got] == [("c1", 0, False), ("c2", 0, False), ("demo", 0, True), ("demo", 1, True)]
    assert all(g[4] == pytest.approx(1.0) for g in got if g[2])  # replayed: behaviour = old
    assert all(g[4] == pytest.approx(2.0) for g in got if not g[2])  # exp(old - (-20)) capped at is_cap 2
    anchors = con.sql("SELECT count(DISTINCT screen_hash), count(screen_hash), count(step_advantage) FROM rl_rows")
    assert anchors.fetchall() == [(2, 4, 0)]  # c1, c2 and the demo's first step share the first screen; GiGPO off
    m = con.sql(
        "SELECT round, update_step, algo, n_rows, n_replayed, rollout_run_keys, run_key FROM rl_metrics"
    ).fetchall()
    assert m == [(0, 0, "grpo", 2, 1, ["rl-r0"], "rl-test"), (0, 1, "grpo", 2, 1, ["rl-r0"], "rl-test")]


# ------------------------------------------------------------------------------------------------ resume
def test_guide_joins_the_teachers_success_to_its_instances_group(tiny, tmp_path):
    """rl.guide: the teacher's episode of a group's own (task, seed) joins it as a replayed member: "all" for
    every group with a failure, "failed" only for all-failed ones; a guided group takes no stored success."""
    from storage.catalog import connect
    from storage.lake import Lake

    model, proc = _load(tiny)
    lake = Lake(tmp_path / "lake")
    ids = _ids(proc, "B")
    # group a (seed 5000): one success, one failure; group b (seed 5001): both failed; group c (5002): both won
    for eid, g, seed, ok in (
        ("a1", "ga", 5000, True),
        ("a2", "ga", 5000, False),
        ("b1", "gb", 5001, False),
        ("b2", "gb", 5001, False),
        ("c1", "gc", 5002, True),
        ("c2", "gc", 5002, True),
    ):
        _write(lake, _episode(eid, g, ok, seed=seed), [_step(eid, 0, "B", ids, [-1.0] * len(ids))])
    for seed in (5000, 5001, 5002):  # the teacher solved every instance (run key "guide")
        _write(
            lake,
            _episode(f"t{seed}", f"tg{seed}", True, seed=seed, run_key="guide", policy="scripted"),
            [_step(f"t{seed}", 0, "A", run_key="guide")],
            stage="rl",
        )
    demo = _episode("demo", "boot-g", True, seed=3, run_key="boot", policy="scripted")
    _write(lake, demo, [_step("demo", 0, "A", run_key="boot")], stage="bootstrap")
    con = connect(lake)

    def joined(**kw):
        rows = load_rl_rows(con, ["rl-r0"], arch="qwen3-vl", opts=PromptOptions(), targets="action", lake=lake, **kw)
        return sorted((r["group_id"], r["episode_id"]) for r in rows if r["replayed"])

    assert joined(guide_keys=["guide"]) == [("ga", "t5000"), ("gb", "t5001")]  # gc has no failure
    assert joined(guide_keys=["guide"], guide="failed") == [("gb", "t5001")]
    # without guide keys the teacher's episodes are stored successes like any other: its own instance first
    assert joined() == [("gb", "t5001")]
    assert joined(same_seed=True) == [("gb", "t5001")]
    rows = load_rl_rows(con, ["rl-r0"], arch="qwen3-vl", opts=PromptOptions(), targets="action", guide_keys=["guide"])
    kept, stats = assign_advantages(rows)
    guide_rows = [r for r in kept if r["replayed"]]
    assert {r["seed"] for r in guide_rows} == {5000, 5001} and all(r["advantage"] > 0 for r in guide_rows)
    assert guide_rows[0]["target_text"] == TEXT["A"] and stats["n_replayed"] == 2


def test_replay_spreads_all_failed_groups_over_stored_successes():
    """Without a success of the group's own instance, each all-failed group of a round takes the next stored
    success in turn (not every group the newest one); one of its own instance always comes first."""
    cands = [{"seed": s, "episode_id": f"e{s}"} for s in (7, 8, 9)]
    firsts = [_pick(cands, 5000, False, turn)[0]["seed"] for turn in range(4)]
    assert firsts == [7, 8, 9, 7]
    assert _pick(cands, 9, False, 1)[0]["seed"] == 9 and [c["seed"] for c in _pick(cands, 9, True, 1)] == [9]


def test_learner_state_save_and_load_is_exact(tiny, tmp_path):
    s = RLSettings(algorithm="sdpo", sdpo_weight=0.5, lr=1e-3, batch_size=2, sdpo_context="feedback", kl_coef=0.05)
    model, proc = _load(tiny)
    rows = _rows(proc, [("win", "g", True, "A", 1), ("lose", "g", False, "B", 1)])
    a = RLTrainer(model, proc, s)
    a.update([dict(r) for r in rows], round_idx=0)
    folder = a.save_state(tmp_path / "out")
    torch.save(a.state_dict(), tmp_path / "state.pt")
    for src in (folder, tmp_path / "state.pt"):
        model_b, _ = _load(tiny)
        b = RLTrainer(model_b, proc, s)
        b.load_state(src)
        assert all(torch.equal(b.weights.params[n], p) for n, p in a.weights.params.items())
        assert b.state.step == a.state.step == 1
        ta, tb = dict(a.teacher.named_parameters()), dict(b.teacher.named_parameters())
        assert all(torch.equal(ta[n], tb[n]) for n in a.weights.params)  # the EMA teacher too
        sa, sb = a.opt.state_dict()["state"], b.opt.state_dict()["state"]
        assert sa.keys() == sb.keys() and all(torch.equal(sa[k]["exp_avg_sq"], sb[k]["exp_avg_sq"]) for k in sa)
    # the next round from the restored learner equals the uninterrupted one
    a.update([dict(r) for r in rows], round_idx=1)
    b.update([dict(r) for r in rows], round_idx=1)
    assert all(torch.equal(b.weights.params[n], p) for n, p in a.weights.params.items())


def test_ema_teacher_follows_the_student_at_sdpo_ema_rate(tiny):
    """rl.sdpo_teacher ema (the default): after each optimizer step with an SDPO term, every trainable weight of the
    teacher is exactly (1 - rate) x its value before the step + rate x the student's new value, rate being
    rl.sdpo_ema_rate; the weights nobody trains stay where they were. With sdpo_teacher frozen it never moves."""
    from configs.loading import parse_config

    assert RLSettings.from_config(parse_config({"rl": {"sdpo_ema_rate": 0.25}})).sdpo_ema_rate == 0.25
    rows = _rows(_load(tiny)[1], [("win", "g", True, "A", 1), ("lose", "g", False, "B", 1)])
    kw = dict(algorithm="sdpo", lr=1e-2, warmup_steps=0, batch_size=2, sdpo_context="feedback")
    for rate in (0.25, 0.7):  # below and above 1/2: a lerp taken from the wrong end, or at 1 - rate, is caught
        model, proc = _load(tiny)
        trainer = RLTrainer(model, proc, RLSettings(**kw, sdpo_ema_rate=rate))
        assert trainer.s.sdpo_teacher == "ema" and trainer.teacher is not None
        names = list(trainer.weights.params)
        teacher = dict(trainer.teacher.named_parameters())
        untrained = {n: p.detach().clone() for n, p in teacher.items() if n not in trainer.weights.params}
        prev = {n: teacher[n].detach().clone() for n in names}
        for r in range(2):
            res = trainer.update([dict(x) for x in rows], round_idx=r)
            assert [m["n_sdpo_rows"] for m in res["steps"]] == [1]  # one step, with an SDPO term
            student = {n: trainer.weights.params[n].detach() for n in names}
            assert sum(not torch.equal(student[n], prev[n]) for n in names) > len(names) // 2  # the step moved it
            for n in names:
                want = prev[n] + rate * (student[n].to(prev[n].dtype) - prev[n])
                assert torch.allclose(teacher[n], want, rtol=0, atol=1e-6), (rate, r, n)
            assert any(not torch.equal(teacher[n], student[n]) for n in names)  # it lags: not a copy of the student
            prev = {n: teacher[n].detach().clone() for n in names}
        assert all(torch.equal(teacher[n], p) for n, p in untrained.items())
    model, proc = _load(tiny)
    trainer = RLTrainer(model, proc, RLSettings(**kw, sdpo_teacher="frozen"))
    start = {n: p.detach().clone() for n, p in trainer.teacher.named_parameters()}
    assert [m["n_sdpo_rows"] for m in trainer.update([dict(x) for x in rows])["steps"]] == [1]
    assert all(torch.equal(p, start[n]) for n, p in trainer.teacher.named_parameters())


# ------------------------------------------------------------------------------------------------ knobs
@pytest.mark.parametrize(
    "algo,aggregation", [("grpo", "constant"), ("dr_grpo", "token_mean"), ("gspo", "seq_mean_token_mean")]
)
def test_micro_batches_give_the_same_update(tiny, algo, aggregation):
    """Splitting a minibatch into micro-batches keeps the minibatch's normaliser: the same weights after."""
    got, curves = [], []
    for micro in (None, 1, 2):  # 2: micro-batches taken in length order, not minibatch order
        model, proc = _load(tiny)
        rows = _rows(proc, [("w", "g", True, "A", 2), ("l", "g", False, "J", 1)])
        s = RLSettings(algorithm=algo, aggregation=aggregation, lr=1e-3, batch_size=3, epochs=2, micro_batch=micro)
        trainer = RLTrainer(model, proc, s)
        res = trainer.update(rows)
        assert len(res["steps"]) == 2 and res["steps"][0]["n_rows"] == 3
        curves.append([v for m in res["steps"] for v in (m["loss"], m["grad_norm"])])
        got.append(trainer.weights.params)
    for k in (1, 2):
        assert curves[0] == pytest.approx(curves[k], rel=1e-5, abs=1e-6)  # same loss and gradient norm at every step
        # Adam's first steps are ~lr * sign(grad): float noise on near-zero gradients moves a weight by a few % of lr
        assert all(torch.allclose(got[0][n], got[k][n], atol=1e-4) for n in got[0])


def test_kl_penalty_uses_a_frozen_reference_only_when_asked(tiny):
    model, proc = _load(tiny)
    rows = _rows(proc, [("w", "g", True, "A", 1), ("l", "g", False, "J", 1)])
    assert RLTrainer(model, proc, RLSettings()).ref is None  # kl_coef 0: no reference copy
    trainer = RLTrainer(model, proc, RLSettings(lr=3e-3, batch_size=2, epochs=3, kl_coef=0.1))
    res = trainer.update(rows)
    kls = [m["kl_ref"] for m in res["steps"]]
    assert kls[0] == pytest.approx(0.0, abs=1e-7) and kls[-1] > kls[1] > 0  # drifts from the frozen start


# ------------------------------------------------------------------------------------------------ clone steps
def test_clone_draw_splits_each_batch_between_focus_and_rehearsal():
    """rl.clone_focus: round(n x focus) draws from the RL tasks, the rest from the others; the same seed draws the
    same episodes, and an empty side leaves every draw to the other."""
    import numpy as np

    from training.rl_clone import draw

    pool = {
        "click-button": [{"episode_id": f"b{i}"} for i in range(5)],
        "click-test": [{"episode_id": f"t{i}"} for i in range(3)],
        "focus-text": [{"episode_id": "f0"}],
    }
    got = draw(pool, ["click-button"], 40, 0.75, np.random.default_rng(3))
    assert sum(e["episode_id"][0] == "b" for e in got) == 30 and len(got) == 40
    assert {e["episode_id"][0] for e in got[30:]} == {"t", "f"}
    assert got == draw(pool, ["click-button"], 40, 0.75, np.random.default_rng(3))
    assert got != draw(pool, ["click-button"], 40, 0.75, np.random.default_rng(4))
    assert all(
        e["episode_id"][0] == "b"
        for e in draw({"click-button": pool["click-button"]}, ["click-button"], 8, 0.5, np.random.default_rng(0))
    )
    assert all(
        e["episode_id"][0] != "b"
        for e in draw({"click-test": pool["click-test"]}, ["click-button"], 8, 0.5, np.random.default_rng(0))
    )
    assert draw({}, ["click-button"], 8, 0.5, np.random.default_rng(0)) == []


def test_clone_hard_draws_a_share_of_the_focus_batch_from_the_instances_the_student_failed(tiny, tmp_path):
    """rl.clone_hard: hard_instances finds the RL-stage instances whose student episodes all failed (not one with a
    success, not the teacher's, not another stage's); draw takes round(k x hard) of the k focus draws from the
    episodes of those instances, the rest as before, and ignores the share when none of them is in the pool; in
    clone_round, clone_hard 1 draws only the teacher's answer to the failed instance."""
    import numpy as np

    from storage.catalog import connect
    from storage.lake import Lake
    from training.rl_clone import attempts_index, clone_round, draw, hard_instances

    lake = Lake(tmp_path / "lake")
    for eid, seed, ok, policy, stage in (
        ("a0", 5001, False, "student", "rl"),
        ("a1", 5001, False, "student", "rl"),
        ("b0", 5002, True, "student", "rl"),
        ("b1", 5002, False, "student", "rl"),
        ("t1", 5001, True, "scripted", "rl"),
        ("t3", 5003, False, "scripted", "rl"),
        ("e0", 5004, False, "student", "eval"),
    ):
        _write(
            lake,
            _episode(eid, f"g{seed}", ok, task="click-button", seed=seed, policy=policy, run_key=stage),
            [_step(eid, 0, "B" if eid == "t1" else "A", run_key=stage)],
            stage=stage,
        )
    _write(
        lake,
        _episode("o0", "go", False, task="click-test", seed=5001, run_key="rl"),
        [_step("o0", 0, "A", run_key="rl")],
        stage="rl",
    )
    index = attempts_index(lake)
    assert hard_instances(index.rows(connect(lake)), ["click-button"]) == {("click-button", 5001)}
    pool = {
        "click-button": [{"episode_id": f"b{i}", "task_id": "click-button", "seed": 5000 + i} for i in range(5)],
        "click-test": [{"episode_id": f"t{i}", "task_id": "click-test", "seed": i} for i in range(3)],
    }
    hard = {("click-button", 5001), ("click-button", 5003), ("click-test", 1)}
    got = draw(pool, ["click-button"], 40, 0.75, np.random.default_rng(3), hard, 0.5)
    assert [e["episode_id"] for e in got[:15]] and {e["episode_id"] for e in got[:15]} <= {"b1", "b3"}
    assert sum(e["episode_id"][0] == "b" for e in got) == 30 and {e["episode_id"][0] for e in got[30:]} == {"t"}
    plain = draw(pool, ["click-button"], 40, 0.75, np.random.default_rng(3))
    hard_share = sum(e["episode_id"] in ("b1", "b3") for e in got[:30])
    assert hard_share >= 15 > sum(e["episode_id"] in ("b1", "b3") for e in plain[:15])
    assert draw(pool, ["click-button"], 40, 0.75, np.random.default_rng(3), {("click-button", 7)}, 0.5) == plain
    # clone_round: the bootstrap demo answers "A", the teacher's answer to the failed instance 5001 (t1) "B"; with
    # clone_hard 1 (focus 1) every drawn row is t1's, so the first step's loss is B's token-mean NLL
    _write(
        lake,
        _episode("demo", "boot-g", True, task="click-button", seed=3, run_key="boot", policy="scripted"),
        [_step("demo", 0, "A", run_key="boot")],
        stage="bootstrap",
    )
    model, proc = _load(tiny)
    want = -_logp(model, proc, _rows(proc, [("x", "g", True, "B", 1)])[0], "B") / len(_ids(proc, "B"))
    s = RLSettings(
        lr=1e-12,
        clone_steps=1,
        clone_batch=4,
        clone_lr=1e-12,
        clone_focus=1.0,
        clone_hard=1.0,
        focus_tasks=("click-button",),
        targets="action",
        clone_warmup=0,
    )
    trainer = RLTrainer(model, proc, s)
    got = clone_round(trainer, connect(lake), lake, round_idx=0)  # as train_round's
    assert len(got) == 1 and got[0]["loss"] == pytest.approx(want, rel=1e-4)


def test_clone_lr_warms_up_then_follows_its_schedule_to_the_runs_last_step():
    from training.rl_clone import clone_lr

    s = RLSettings(clone_steps=10, clone_lr=1e-3, clone_warmup=4, rounds=3)
    lrs = [clone_lr(s, n) for n in range(30)]
    # warmup (n + 1) / 4 times the cosine 0.5 (1 + cos(pi n / 30))
    assert lrs[:4] == pytest.approx([2.5e-4, 4.98630e-4, 7.41805e-4, 9.75528e-4], rel=1e-5)
    assert lrs[15] == pytest.approx(0.5e-3) and lrs[29] == pytest.approx(1e-3 * 0.5 * (1 + math.cos(math.pi * 29 / 30)))
    assert all(a > b for a, b in zip(lrs[4:], lrs[5:]))  # strictly decaying after warmup
    const = RLSettings(clone_steps=10, clone_lr=1e-3, clone_warmup=0, rounds=3, clone_schedule="constant")
    assert {clone_lr(const, n) for n in range(30)} == {1e-3}


def test_clone_round_learns_the_lakes_stored_successes(tiny, tmp_path):
    """rl.clone_steps after a round's update: NLL steps on the lake's stored successes (a teacher demo of the RL
    task, a student success of a rehearsed task; failures never), logged as 'clone' rl_metrics rows whose loss is
    the token-mean NLL before the step; both replies end more likely."""
    from storage.catalog import connect
    from storage.lake import Lake

    model, proc = _load(tiny)
    lake = Lake(tmp_path / "lake")
    ids_b = _ids(proc, "B")
    _write(
        lake,
        _episode("demo", "boot-g", True, task="click-button", seed=3, run_key="boot", policy="scripted"),
        [_step("demo", 0, "A", run_key="boot")],
        stage="bootstrap",
    )
    _write(
        lake,
        _episode("own", "g1", True, task="click-test", seed=5000),
        [_step("own", 0, "B", ids_b, [-1.0] * len(ids_b))],
    )
    _write(
        lake,
        _episode("lost", "g1", False, task="click-test", seed=5000),
        [_step("lost", 0, "B", ids_b, [-1.0] * len(ids_b))],
    )
    for eid, which in (("p", "A"), ("q", "B")):  # the rounds' rows: one group, a success and a failure
        _write(
            lake,
            _episode(eid, "g9", eid == "p", task="click-button", seed=5001, run_key="rl-r1"),
            [_step(eid, 0, which, _ids(proc, which), [-1.0] * len(_ids(proc, which)), run_key="rl-r1")],
        )
    demo_row = _rows(proc, [("x", "g", True, "A", 1)])[0]
    before = {w: _logp(model, proc, demo_row, w) for w in "AB"}
    s = RLSettings(
        lr=1e-4,
        batch_size=4,
        warmup_steps=0,
        clone_steps=3,
        clone_batch=4,
        clone_lr=1e-3,
        clone_focus=0.5,
        focus_tasks=("click-button",),
        clone_tasks=("click-test",),
        targets="action",
        clone_source="all",
        clone_warmup=2,
        clone_schedule="constant",
    )
    trainer = RLTrainer(model, proc, s)
    res = trainer.train_round(lake, ["rl-r1"], round_idx=0, iteration=0, run_key="rl-x")
    clone = (
        connect(lake)
        .execute("SELECT update_step, loss, n_rows, lr FROM rl_metrics WHERE algo = 'clone' ORDER BY update_step")
        .fetchall()
    )
    n_pg = res["summary"]["n_steps"]
    assert [c[0] for c in clone] == [n_pg, n_pg + 1, n_pg + 2] and all(c[2] == 4 for c in clone)
    assert [c[3] for c in clone] == [5e-4, 1e-3, 1e-3]  # rl.clone_warmup 2
    assert res["summary"]["clone_steps"] == 3 and clone[-1][1] < clone[0][1]
    after = {w: _logp(model, proc, demo_row, w) for w in "AB"}
    assert after["A"] > before["A"] + 1.0 and after["B"] > before["B"] + 1.0, (before, after)
    # rl.clone_source teacher (the default): the student's own success is not drawn, so every row of the first step
    # is the bootstrap demo's and its loss is that reply's token-mean NLL before the step
    model, proc = _load(tiny)
    first = -_logp(model, proc, demo_row, "A") / len(_ids(proc, "A"))
    trainer = RLTrainer(model, proc, RLSettings(**{**s.__dict__, "clone_source": "teacher", "lr": 1e-12}))
    step = trainer.train_round(lake, ["rl-r1"], round_idx=1, iteration=0, run_key="rl-t")
    got = (
        connect(lake)
        .execute("SELECT loss FROM rl_metrics WHERE run_key = 'rl-t' AND algo = 'clone' ORDER BY update_step")
        .fetchall()
    )
    assert step["summary"]["clone_steps"] == 3 and got[0][0] == pytest.approx(first, rel=1e-3)
    # the drawn rows are the successes only: with no stored success the round takes no clone step
    empty = Lake(tmp_path / "empty")
    _write(
        empty,
        _episode("lost", "g1", False, task="click-test", seed=5000),
        [_step("lost", 0, "B", ids_b, [-1.0] * len(ids_b))],
    )
    res = RLTrainer(model, proc, s).train_round(empty, ["rl-r0"], round_idx=0, iteration=0, run_key="rl-y")
    assert res["summary"]["clone_steps"] == 0
