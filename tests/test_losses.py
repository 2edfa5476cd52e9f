"""Loss functions on hand-built tensors and on a real tiny Qwen3-VL: the labelled-only head equals the full one."""

import torch

from training.losses import chunked_head_loss, labelled_token_loss, token_loss_sum


def test_token_loss_sum_by_hand():
    logits = torch.zeros(1, 3, 4)
    logits[0, 0, 2] = 10.0  # position 0 predicts token 2 confidently
    labels = torch.tensor([[-100, 2, -100]])
    loss, n = token_loss_sum(logits, labels)
    expected = -torch.log_softmax(torch.tensor([0.0, 0.0, 10.0, 0.0]), 0)[2]
    assert n == 1 and torch.allclose(loss, expected)


def test_chunked_head_equals_unchunked():
    torch.manual_seed(0)
    head = torch.nn.Linear(8, 11, bias=False)
    h, t = torch.randn(10, 8), torch.randint(0, 11, (10,))
    full = torch.nn.functional.cross_entropy(head(h), t, reduction="sum")
    assert torch.allclose(chunked_head_loss(h, head, t, chunk=3), full, atol=1e-5)


def test_labelled_loss_matches_full_logits_on_tiny_qwen3vl_with_lora():
    from training.models import apply_lora, build_model

    model, proc = build_model("qwen3-vl", "tiny", seed=0)
    model = apply_lora(model, r=4, alpha=8, dropout=0.0)
    torch.manual_seed(0)
    ids = torch.randint(10, 200, (2, 24))
    labels = torch.full_like(ids, -100)
    labels[:, 15:20] = ids[:, 15:20]  # a few "assistant" tokens per row
    batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    ref, n_ref = token_loss_sum(model(**batch).logits, labels)
    got, n = labelled_token_loss(model, batch, labels)
    assert n == n_ref == 10 and torch.allclose(got, ref, rtol=1e-5, atol=1e-5)
    got.backward()  # gradients reach the LoRA adapters through the backbone
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for n_, p in model.named_parameters() if "lora_" in n_)


# ------------------------------------------------------------------------------------------------
# RL losses and advantages: hand-built tensors against hand-computed values.
# ------------------------------------------------------------------------------------------------

import math  # noqa: E402

import pytest  # noqa: E402

from training.losses import (  # noqa: E402
    aggregate,
    blend,
    clipped_pg_loss,
    combine,
    discounted_returns,
    entropy_from_logits,
    gigpo_step_advantages,
    group_advantages,
    kl_k3,
    ratio,
    sdpo_token_loss,
    sdpo_topk_loss,
    shaped_advantages,
    truncated_is_weight,
)


def close(got, want, tol=1e-6):
    return torch.allclose(
        torch.as_tensor(got, dtype=torch.float64), torch.as_tensor(want, dtype=torch.float64), atol=tol, rtol=0
    )


def test_group_advantages_mean_and_zscore_with_degenerate_groups():
    # group a: rewards 1,0,0,0 (mean .25, population std sqrt(.1875)); b: 1,1 (zero variance); c: singleton
    gids = ["a", "b", "a", "c", "a", "b", "a"]
    rewards = [1, 1, 0, 1, 0, 1, 0]
    adv, keep = group_advantages(rewards, gids, mode="mean")
    assert close(adv, [0.75, 0, -0.25, 0, -0.25, 0, -0.25])
    assert keep.tolist() == [True, False, True, False, True, False, True]
    adv, keep = group_advantages(rewards, gids, mode="zscore", eps=0.0)
    s3 = math.sqrt(3.0)  # .75 / sqrt(.1875) = sqrt(3); .25 / sqrt(.1875) = 1/sqrt(3) (sample std would give 1.5)
    assert close(adv, [s3, 0, -1 / s3, 0, -1 / s3, 0, -1 / s3], 1e-6)
    assert keep.tolist() == [True, False, True, False, True, False, True]
    adv_eps, _ = group_advantages(torch.tensor(rewards), torch.tensor([0, 1, 0, 2, 0, 1, 0]), eps=1e-6)
    assert close(adv_eps[0], 0.75 / (math.sqrt(0.1875) + 1e-6), 1e-7)
    with pytest.raises(ValueError):
        group_advantages(rewards, gids, mode="median")


def test_discounted_returns_by_hand():
    assert close(discounted_returns([0, 0, 1], gamma=0.5), [0.25, 0.5, 1.0])
    assert close(discounted_returns([1, 0, 2], gamma=0.5), [1.5, 1.0, 2.0])
    assert close(discounted_returns([0, 0, 0, 1], gamma=0.95), [0.95**3, 0.95**2, 0.95, 1.0])


def test_gigpo_step_advantages_two_step_groups_and_singletons():
    returns = [0.81, 0.9, 1.0, 0.0, 0.0, 0.5, 0.3]
    gids = [1, 1, 1, 1, 2, 2, 2]
    anchors = ["s0", "s1", "s2", "s0", "s0", "s0", "s7"]
    # step groups: (1,s0) rows 0,3 mean .405; (2,s0) rows 4,5 mean .25 (s0 of group 2 is not group 1's s0);
    # (1,s1), (1,s2), (2,s7) singletons -> 0
    a_s = gigpo_step_advantages(returns, gids, anchors, mode="mean")
    assert close(a_s, [0.405, 0, 0, -0.405, -0.25, 0.25, 0])
    z = gigpo_step_advantages(returns, gids, anchors, mode="zscore", eps=0.0)
    assert close(z, [1, 0, 0, -1, -1, 1, 0])
    a_e = torch.tensor([1.0, 1.0, 1.0, -1.0, 0.5, 0.5, 0.5])
    assert close(combine(a_e, a_s, omega=0.5), [1.2025, 1.0, 1.0, -1.2025, 0.375, 0.625, 0.5])
    assert close(shaped_advantages(torch.tensor([1.0, -0.5]), [0, 2], penalty=0.1), [1.0, -0.7])


def test_ratio_token_and_sequence_levels():
    logp = torch.tensor([[-1.0, -2.0, -3.0], [-1.0, -1.0, -1.0]])
    old = torch.tensor([[-1.5, -2.0, -1.0], [-1.2, -0.9, -1.0]])
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]])
    assert close(ratio(logp, old, mask, "token"), [[math.exp(0.5), 1.0, 1.0], [math.exp(0.2), math.exp(-0.1), 1.0]])
    s0, s1 = math.exp(0.25), math.exp(0.1 / 3)  # mean log-ratio over each row's masked tokens
    assert close(ratio(logp, old, mask, "sequence"), [[s0, s0, s0], [s1, s1, s1]])
    with pytest.raises(ValueError):
        ratio(logp, old, mask, "episode")


def test_clipped_pg_loss_values_clip_fraction_and_zero_gradients():
    r = torch.tensor([[1.1, 1.5, 0.5, 3.0], [1.1, 1.5, 0.5, 3.0]])
    old = torch.tensor([[-1.0, -2.0, -0.5, -1.0], [-0.7, -1.3, -2.0, -1.0]])
    logp = (old + r.log()).requires_grad_(True)
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 0]])
    adv = torch.tensor([1.0, -1.0])
    per_tok, st = clipped_pg_loss(logp, old, adv, mask, eps_low=0.2, eps_high=0.28)
    # A>0: 1.1 inside; 1.5 clipped to 1.28 (no grad); 0.5 below range but min keeps r*A (grad flows)
    # A<0: 1.1 inside; 1.5 keeps r*A (grad flows); 0.5 clipped to 0.8 (no grad); column 3 masked out
    assert close(per_tok, [[-1.1, -1.28, -0.5, 0.0], [1.1, 1.5, 0.8, 0.0]], 1e-5)
    assert st["clip_frac"] == pytest.approx(2 / 6, abs=1e-7)
    assert st["ratio_mean"] == pytest.approx(3.1 / 3, abs=1e-6)
    k3 = sum((x - 1) - math.log(x) for x in (1.1, 1.5, 0.5)) / 3
    assert st["approx_kl"] == pytest.approx(k3, abs=1e-6)
    per_tok.sum().backward()
    # d(-r*A)/dlogp = -A*r where unclipped; exactly 0 where clipped or masked
    assert close(logp.grad, [[-1.1, 0.0, -0.5, 0.0], [1.1, 1.5, 0.0, 0.0]], 1e-5)
    # a detached truncated IS weight scales the loss per row and receives no gradient
    w = torch.tensor([2.0, 0.5], requires_grad=True)
    weighted, _ = clipped_pg_loss(logp, old, adv, mask, is_weight=w)
    assert close(weighted, [[-2.2, -2.56, -1.0, 0.0], [0.55, 0.75, 0.4, 0.0]], 1e-5)
    weighted.sum().backward()
    assert w.grad is None
    # per-token advantages [B, T] are accepted as well
    per_tok2, _ = clipped_pg_loss(logp, old, adv.unsqueeze(-1).expand(2, 4), mask)
    assert close(per_tok2, per_tok.detach(), 1e-6)


def test_gspo_sequence_ratio_gradient_matches_hand_formula():
    old = torch.tensor([[-1.2, -1.9]])
    logp = torch.tensor([[-1.0, -2.0]], requires_grad=True)
    mask = torch.ones(1, 2)
    s = math.exp((0.2 - 0.1) / 2)
    per_tok, st = clipped_pg_loss(logp, old, torch.tensor([1.0]), mask, level="sequence")  # s inside 0.8..1.28
    assert close(per_tok, [[-s, -s]], 1e-6) and st["clip_frac"] == 0.0
    loss = aggregate(per_tok, mask, "seq_mean_token_mean")  # = -s * A
    loss.backward()
    assert close(logp.grad, [[-s / 2, -s / 2]], 1e-6)  # d(-s)/dlogp_t = -s/|y|
    # with the trainer's gspo range (the paper's 3e-4/4e-4) s = 1.051 is clipped for A > 0: no gradient at all
    from training.rl_settings import RLSettings

    gspo = RLSettings(algorithm="gspo")
    assert gspo.clip == (3e-4, 4e-4) and gspo.level == "sequence"
    logp.grad = None
    per_tok, st = clipped_pg_loss(logp, old, torch.tensor([1.0]), mask, *gspo.clip, level=gspo.level)
    per_tok.sum().backward()
    assert st["clip_frac"] == 1.0 and close(logp.grad, [[0.0, 0.0]])
    assert close(per_tok, [[-(1 + 4e-4), -(1 + 4e-4)]], 1e-6)


@pytest.mark.parametrize(
    "algo, clip, level",
    [("grpo", (0.2, 0.28), "token"), ("dr_grpo", (0.2, 0.28), "token"), ("sdpo", (0.2, 0.28), "token")]
    + [("gspo", (3e-4, 4e-4), "sequence")],
)
def test_trainer_clip_range_and_ratio_level_per_algorithm(algo, clip, level):
    """What the trainer passes clipped_pg_loss for each algorithm: DAPO clip-higher at token level, GSPO the paper's
    sequence-level range (arXiv 2507.18071 sec. 5.1); rl.eps_low / rl.eps_high override the range."""
    from training.rl_settings import RLSettings

    assert RLSettings(algorithm=algo).clip == clip and RLSettings(algorithm=algo).level == level
    assert RLSettings(algorithm=algo, eps_low=0.1, eps_high=0.5).clip == (0.1, 0.5)


def test_aggregation_modes_ignore_masked_positions():
    per_tok = torch.tensor([[1.0, 2.0, 3.0, 100.0], [4.0, 5.0, 100.0, float("nan")], [7.0, 7.0, 7.0, 7.0]])
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0], [0, 0, 0, 0]])
    assert aggregate(per_tok, mask, "constant", constant=10).item() == pytest.approx(1.5)  # 15 / 10
    assert aggregate(per_tok, mask, "token_mean").item() == pytest.approx(3.0)  # 15 / 5
    assert aggregate(per_tok, mask, "seq_mean_token_mean").item() == pytest.approx(3.25)  # (2 + 4.5) / 2
    with pytest.raises(ValueError):
        aggregate(per_tok, mask, "constant")
    with pytest.raises(ValueError):
        aggregate(per_tok, mask, "sum")


def test_truncated_is_weight_caps_and_detaches():
    old = torch.tensor([[-1.0, -1.0, -2.0]], requires_grad=True)
    behaviour = torch.tensor([[-1.5, -0.5, -3.0]])
    w = truncated_is_weight(old, behaviour, cap=2.0)
    assert close(w, [[math.exp(0.5), math.exp(-0.5), 2.0]])  # exp(1) = 2.718 capped at 2
    assert not w.requires_grad
    assert close(truncated_is_weight(old, old.detach()), [[1.0, 1.0, 1.0]])  # unknown behaviour: pass old


def test_kl_k3_by_hand():
    x = torch.tensor([-1.0, -2.0, -0.3])
    assert close(kl_k3(x, x), [0.0, 0.0, 0.0])
    assert close(
        kl_k3(torch.tensor([-1.0, -2.0]), torch.tensor([-2.0, -1.0])), [math.exp(-1) + 1 - 1, math.exp(1) - 1 - 1]
    )


def test_entropy_from_logits_by_hand():
    assert close(entropy_from_logits(torch.zeros(2, 3, 5)), torch.full((2, 3), math.log(5)), 1e-6)
    logits = torch.tensor([math.log(1), math.log(2), math.log(1)])  # p = .25, .5, .25
    want = -(0.25 * math.log(0.25) * 2 + 0.5 * math.log(0.5))
    assert close(entropy_from_logits(logits), want, 1e-6)
    assert close(entropy_from_logits(logits + 1000.0), want, 1e-5)  # shift-invariant, no overflow
    assert close(entropy_from_logits(torch.tensor([0.0, 0.0, float("-inf")])), math.log(2), 1e-6)


def test_sdpo_token_loss_value_gradient_direction_and_is_clip():
    student = torch.tensor([[-1.0, -2.0, -0.5]], requires_grad=True)
    teacher = torch.tensor([[-0.5, -3.0, -0.5]])
    old = torch.tensor([[-1.0, -3.0, -0.5]])  # w = exp(0) = 1; exp(1) capped at 2; masked
    mask = torch.tensor([[1, 1, 0]])
    per_tok, st = sdpo_token_loss(student, teacher, old, mask, is_clip=2.0)
    # A = (0.5, -1.0); loss = -A * logp * w = (-0.5 * -1 * 1, 1 * -2 * 2)
    assert close(per_tok, [[0.5, -4.0, 0.0]], 1e-6)
    assert st["adv_mean"] == pytest.approx(-0.25) and st["teacher_higher_frac"] == pytest.approx(0.5)
    assert st["is_clip_frac"] == pytest.approx(0.5)
    per_tok.sum().backward()
    assert close(student.grad, [[-0.5, 2.0, 0.0]], 1e-6)  # -A * w
    stepped = student.detach() - 0.1 * student.grad
    assert stepped[0, 0] > student[0, 0] and stepped[0, 1] < student[0, 1]  # towards the teacher
    no_old, _ = sdpo_token_loss(student, teacher, None, mask)
    assert close(no_old, [[0.5, -2.0, 0.0]], 1e-6)


def test_sdpo_token_loss_gradient_is_reverse_kl_gradient_in_expectation():
    # E_{y~pS}[grad loss(y)] = grad KL(pS || pT): weight each vocabulary entry y by sg(pS(y))
    z = torch.tensor([0.3, -1.0, 1.2, 0.1], requires_grad=True)
    t_lp = torch.log_softmax(torch.tensor([1.0, 0.0, -0.5, 0.4]), -1)
    s_lp = torch.log_softmax(z, -1)
    per_tok, _ = sdpo_token_loss(s_lp[None], t_lp[None], None, torch.ones(1, 4))
    (per_tok[0] * s_lp.exp().detach()).sum().backward()
    z2 = z.detach().clone().requires_grad_(True)
    lp2 = torch.log_softmax(z2, -1)
    (lp2.exp() * (lp2 - t_lp)).sum().backward()
    assert close(z.grad, z2.grad, 1e-6) and z.grad.abs().sum() > 0.1


def _probs(logits):
    e = [math.exp(x) for x in logits]
    return [x / sum(e) for x in e]


def _kl_list(p, q):
    return sum(a * math.log(a / b) for a, b in zip(p, q))


S_LOGITS = [2.0, 1.0, 0.0, -1.0]
T_LOGITS = [0.5, -1.0, 2.0, 0.0]  # teacher's mass sits mostly outside the student's top-2


def test_sdpo_topk_full_vocab_forward_and_reverse_kl():
    s = torch.tensor([[S_LOGITS, [float("nan")] * 4]], requires_grad=True)  # position 1 masked out
    t = torch.tensor([[T_LOGITS, [0.0] * 4]], requires_grad=True)
    mask = torch.tensor([[1, 0]])
    ps, pt = _probs(S_LOGITS), _probs(T_LOGITS)
    fwd, _ = sdpo_topk_loss(s, t, mask, k=4, alpha=0.0)
    rev, st = sdpo_topk_loss(s, t, mask, k=4, alpha=1.0)
    assert close(fwd, [[_kl_list(pt, ps), 0.0]], 1e-5)
    assert close(rev, [[_kl_list(ps, pt), 0.0]], 1e-5) and st["div_mean"] == pytest.approx(_kl_list(ps, pt), abs=1e-5)
    (fwd.sum() + rev.sum()).backward()
    assert t.grad is None and s.grad[0, 0].abs().sum() > 0 and torch.isfinite(s.grad).all()
    # generalized JSD: hand formula, symmetric at alpha .5, zero on identical distributions
    m = [0.5 * a + 0.5 * b for a, b in zip(ps, pt)]
    jsd, _ = sdpo_topk_loss(s.detach(), t.detach(), mask, k=4, alpha=0.5)
    assert close(jsd, [[0.5 * _kl_list(ps, m) + 0.5 * _kl_list(pt, m), 0.0]], 1e-5)
    jsd_swapped, _ = sdpo_topk_loss(t.detach(), s.detach(), mask, k=4, alpha=0.5)
    assert close(jsd_swapped[0, 0], jsd[0, 0], 1e-6)
    same, _ = sdpo_topk_loss(s.detach(), s.detach(), mask, k=4, alpha=0.5)
    assert close(same, [[0.0, 0.0]], 1e-6)
    m3 = [0.7 * a + 0.3 * b for a, b in zip(ps, pt)]
    j3, _ = sdpo_topk_loss(s.detach(), t.detach(), mask, k=4, alpha=0.3)
    assert close(j3[0, 0], 0.7 * _kl_list(ps, m3) + 0.3 * _kl_list(pt, m3), 1e-5)


def test_sdpo_topk_tail_bucket_and_is_weight():
    s, t = torch.tensor([[S_LOGITS]]), torch.tensor([[T_LOGITS]])
    mask = torch.ones(1, 1)
    ps, pt = _probs(S_LOGITS), _probs(T_LOGITS)
    # student's top-2 = indices 0, 1; buckets (p0, p1, p2 + p3) for both distributions
    bs, bt = [ps[0], ps[1], ps[2] + ps[3]], [pt[0], pt[1], pt[2] + pt[3]]
    fwd, _ = sdpo_topk_loss(s, t, mask, k=2, alpha=0.0, tail=True)
    rev, _ = sdpo_topk_loss(s, t, mask, k=2, alpha=1.0, tail=True)
    assert close(fwd, [[_kl_list(bt, bs)]], 1e-5) and close(rev, [[_kl_list(bs, bt)]], 1e-5)
    # tail=False renormalises over the k entries
    rs, rt = [ps[0] / (ps[0] + ps[1]), ps[1] / (ps[0] + ps[1])], [pt[0] / (pt[0] + pt[1]), pt[1] / (pt[0] + pt[1])]
    rev_nt, _ = sdpo_topk_loss(s, t, mask, k=2, alpha=1.0, tail=False)
    assert close(rev_nt, [[_kl_list(rs, rt)]], 1e-5)
    # IS weight min(exp(log pS(y) - old), 2) with y = 0: old 1 nat lower -> e capped at 2; 0.1 nat -> exp(.1)
    sampled = torch.tensor([[0]])
    old_lo = torch.tensor([[math.log(ps[0]) - 1.0]])
    w_rev, _ = sdpo_topk_loss(s, t, mask, k=2, alpha=1.0, old_logp=old_lo, sampled_ids=sampled)
    assert close(w_rev, 2.0 * rev, 1e-5)
    old_near = torch.tensor([[math.log(ps[0]) - 0.1]])
    w_rev, _ = sdpo_topk_loss(s, t, mask, k=2, alpha=1.0, old_logp=old_near, sampled_ids=sampled)
    assert close(w_rev, math.exp(0.1) * rev, 1e-5)


def test_blend_uses_plain_grpo_on_rows_without_sdpo_context():
    grpo = torch.tensor([[1.0, 1.0], [2.0, 2.0]])
    sdpo = torch.tensor([[10.0, 10.0], [float("nan"), float("nan")]])
    out = blend(grpo, sdpo, torch.tensor([True, False]), weight=0.25)
    assert close(out, [[0.75 + 2.5, 0.75 + 2.5], [2.0, 2.0]])
    assert close(blend(grpo, torch.zeros(2, 2), torch.tensor([1.0, 1.0]), weight=1.0), torch.zeros(2, 2))
