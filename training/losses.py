"""SFT losses as pure functions: the LM head only where there are labels.

GUI-agent samples are mostly prompt and image tokens; only the assistant reply is trained on
(often 5-15% of the sequence). The stock forward computes the vocabulary projection for every
position (a [tokens x vocab] matrix: 1482 x 151936 floats per 2B-shape sample) and then masks
most of it away. `labelled_token_loss` runs the backbone, gathers the hidden states at the
labelled positions, and projects and scores only those, in chunks, so neither the compute nor
the memory of the full logits is spent.

    loss_sum, n = labelled_token_loss(model, batch, labels)      # same value as the full-logits loss
    loss_sum, n = token_loss_sum(model(**batch).logits, labels)  # reference / fallback

The RL section (below the SFT functions) holds the multi-turn RL math, also as pure functions on
tensors or plain sequences: group / GiGPO step advantages (one training row per episode step,
episodes grouped by `group_id`, binary episode reward), the clipped policy-gradient surrogate at
token (GRPO/DAPO) or sequence (GSPO) level with an optional truncated importance weight, loss
aggregation (Dr.GRPO constant, DAPO token-mean, GRPO seq-mean-token-mean), a k3 KL penalty, and the
SDPO self-distillation losses (sampled-token and top-k logit), plus `blend`. Which of them an algorithm uses, with
which clip range, is training.rl_settings.RLSettings' (clip, level) and the trainer's (training/rl.py `_micro`).
Tensor shapes: [B, T] per token with a response mask [B, T] (bool or 0/1), advantages [B] or [B, T].

    adv, keep = group_advantages(episode_rewards, group_ids, mode="mean")
    per_tok, stats = clipped_pg_loss(logp, old_logp, adv_rows, mask)
    loss = aggregate(per_tok, mask, "constant", constant=max_new_tokens * n_rows)
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Sequence

import torch
import torch.nn.functional as F


def token_loss_sum(logits: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, int]:
    """Summed next-token cross-entropy over labelled positions (labels -100 elsewhere) and their count."""
    shift_labels = labels[:, 1:]
    sel = shift_labels != -100
    picked = logits[:, :-1][sel.to(logits.device)].float()
    loss = F.cross_entropy(picked, shift_labels[sel].to(logits.device), reduction="sum")
    return loss, int(sel.sum())


def chunked_head_loss(
    hidden: torch.Tensor, head: torch.nn.Module, targets: torch.Tensor, chunk: int = 4096
) -> torch.Tensor:
    """Sum of CE(head(hidden[i]), targets[i]) over rows, projecting `chunk` rows at a time."""
    total = hidden.new_zeros((), dtype=torch.float32)
    for i in range(0, hidden.shape[0], chunk):
        logits = head(hidden[i : i + chunk]).float()
        total = total + F.cross_entropy(logits, targets[i : i + chunk], reduction="sum")
    return total


def _backbone_and_head(model):
    """(backbone returning hidden states, lm_head) of a plain or PEFT-wrapped Qwen-VL model."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return base.model, base.lm_head


HOST_INDEX = True  # labels on the host, hidden states on CUDA: pick the labelled rows without a GPU sync


def labelled_token_loss(model, batch: dict, labels: torch.Tensor, chunk: int = 4096) -> tuple[torch.Tensor, int]:
    """Like `token_loss_sum(model(**batch).logits, labels)`, without materialising unlabelled logits.

    LoRA layers live inside the backbone's modules, so a PEFT model's adapters are used as usual. With the labels on
    the host and the model on CUDA (the SFT step), the labelled positions and their targets are found on the host and
    copied from page-locked memory, so the GPU is not waited for (a pageable copy and a boolean index on the GPU
    each wait for the whole forward); the same rows, in the same order."""
    backbone, head = _backbone_and_head(model)
    hidden = backbone(**batch).last_hidden_state  # [B, T, H]
    if HOST_INDEX and labels.device.type == "cpu" and hidden.is_cuda:
        shift = labels[:, 1:]
        sel = shift != -100
        pos = sel.nonzero()  # [n, 2] (row, position), row-major as boolean indexing
        flat = pos[:, 0] * hidden.shape[1] + pos[:, 1]  # the predicting positions in hidden.view(-1, H)
        flat, targets = (x.pin_memory().to(hidden.device, non_blocking=True) for x in (flat, shift[sel]))
        picked = hidden.reshape(-1, hidden.shape[-1]).index_select(0, flat)
        return chunked_head_loss(picked, head, targets, chunk), int(pos.shape[0])
    shift_labels = labels[:, 1:].to(hidden.device)
    sel = shift_labels != -100
    picked = hidden[:, :-1][sel]  # [n_labelled, H]: the positions that predict a label
    return chunked_head_loss(picked, head, shift_labels[sel], chunk), int(sel.sum())


# =============================================================================================
# RL: advantages. One value per episode (group_advantages) or per step row (GiGPO); plain
# sequences or 1-D tensors in, float32 tensors out. Statistics are computed in float64.
# =============================================================================================


def _as_list(x) -> list:
    return x.tolist() if isinstance(x, torch.Tensor) else list(x)


def _group_index(keys: Sequence[Hashable]) -> list[list[int]]:
    """Indices of equal keys, one list per distinct key, in first-seen order."""
    out: dict = {}
    for i, k in enumerate(_as_list(keys)):
        out.setdefault(k, []).append(i)
    return list(out.values())


def _centre_by_group(values, keys, mode: str, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(v - mean_g) for mode "mean", (v - mean_g) / (std_g + eps) for "zscore"; population std
    (divide by n, not n-1). Groups of one member or with all-equal values give 0 and keep=False."""
    if mode not in ("mean", "zscore"):
        raise ValueError(f"unknown advantage mode {mode!r}")
    v = torch.as_tensor(values, dtype=torch.float64).flatten()
    adv = torch.zeros_like(v)
    keep = torch.zeros(v.shape[0], dtype=torch.bool)
    for idx in _group_index(keys):
        g = v[idx]
        if len(idx) < 2 or not bool(g.max() > g.min()):
            continue  # singleton or zero-variance group: no learning signal
        centred = g - g.mean()
        adv[idx] = centred / (g.std(unbiased=False) + eps) if mode == "zscore" else centred
        keep[idx] = True
    return adv.float(), keep


def group_advantages(rewards, group_ids, mode: str = "zscore", eps: float = 1e-6) -> tuple[torch.Tensor, torch.Tensor]:
    """Episode-level group-relative advantages: one entry per *episode* (not per step row).

    For episode i in group g (same task instance, G samples):
        mode "mean"   (Dr.GRPO):  A_i = r_i - mean_g(r)
        mode "zscore" (GRPO):     A_i = (r_i - mean_g(r)) / (std_g(r) + eps),  std = population std
    Returns (adv [N] float32, keep [N] bool). keep is False for every episode of a zero-variance
    group (all rewards equal: DAPO dynamic sampling drops them) or of a singleton group; their
    advantage is 0. Computing the stats over episodes, not step rows, avoids weighting long episodes
    more (verl-agent's per-row default does). The caller broadcasts A_i to the episode's step rows."""
    return _centre_by_group(rewards, group_ids, mode, eps)


def discounted_returns(step_rewards, gamma: float = 0.95) -> torch.Tensor:
    """Per-step discounted return of one episode: R_t = sum_{k>=t} gamma^(k-t) r_k  ([T] float32).

    With a binary episode reward on the last step only, R_t = gamma^(T-1-t) * r."""
    r = torch.as_tensor(step_rewards, dtype=torch.float64).flatten()
    out = torch.zeros_like(r)
    running = 0.0
    for t in range(r.shape[0] - 1, -1, -1):
        running = float(r[t]) + gamma * running
        out[t] = running
    return out.float()


def gigpo_step_advantages(returns, group_ids, anchor_keys, mode: str = "mean", eps: float = 1e-6) -> torch.Tensor:
    """GiGPO step-level advantages (arXiv 2505.10978), one entry per step row.

    Rows with the same (group_id, anchor_key) -- the same environment state reached by different
    episodes of a group -- form a step group G_S:
        mode "mean"   (GiGPO mean_norm, default):  A^S_t = R_t - mean_{G_S}(R)
        mode "zscore" (mean_std_norm):             A^S_t = (R_t - mean_{G_S}(R)) / (std_{G_S}(R) + eps)
    with population std. Singleton step groups and all-equal groups give 0. Returns [N] float32."""
    keys = list(zip(_as_list(group_ids), _as_list(anchor_keys)))
    return _centre_by_group(returns, keys, mode, eps)[0]


def combine(episode_adv: torch.Tensor, step_adv: torch.Tensor, omega: float = 1.0) -> torch.Tensor:
    """GiGPO combined advantage per step row: A = A^E + omega * A^S (verl-agent default omega = 1)."""
    return episode_adv + omega * step_adv


def shaped_advantages(adv: torch.Tensor, n_penalised, penalty: float = 0.1) -> torch.Tensor:
    """Shaping added to the advantages only (the reward and its group statistics stay binary):
    A' = A - penalty * n, with n e.g. the number of parse errors / invalid actions of the row."""
    return adv - penalty * torch.as_tensor(n_penalised, dtype=adv.dtype)


# =============================================================================================
# RL: policy-gradient losses. logp / old_logp: [B, T] log-probs of the sampled response tokens;
# mask: [B, T] response tokens (bool or 0/1); advantages [B] (per row) or [B, T] (per token).
# Per-token losses are 0 at masked-out positions; reduce them with `aggregate`.
# =============================================================================================


def _masked_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    m = mask.to(x.dtype)
    return (torch.where(m > 0, x, torch.zeros_like(x)) * m).sum() / m.sum().clamp_min(1.0)


def _per_token(x: torch.Tensor) -> torch.Tensor:
    """[B] -> [B, 1] so a per-row value broadcasts over tokens; [B, T] unchanged."""
    return x.unsqueeze(-1) if x.dim() == 1 else x


def ratio(logp: torch.Tensor, old_logp: torch.Tensor, mask: torch.Tensor, level: str = "token") -> torch.Tensor:
    """Importance ratio to the old policy, [B, T].

        token    (PPO/GRPO): r_t = exp(logp_t - old_t)
        sequence (GSPO):     s_i = exp( (1/|y_i|) sum_{t in y_i} (logp_t - old_t) ), broadcast to the
                             row's tokens; ds_i/dlogp_t = s_i / |y_i| (sequence-level GSPO, not GSPO-token).
    Masked-out positions get log-ratio 0 (ratio 1, no gradient), so padding never yields inf/nan."""
    m = mask.bool()
    log_r = torch.where(m, logp - old_logp, torch.zeros_like(logp))
    if level == "token":
        return torch.exp(log_r)
    if level == "sequence":
        n = m.sum(-1, keepdim=True).clamp_min(1).to(log_r.dtype)
        return torch.exp(log_r.sum(-1, keepdim=True) / n).expand_as(log_r)
    raise ValueError(f"unknown ratio level {level!r}")


def clipped_pg_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    adv: torch.Tensor,
    mask: torch.Tensor,
    eps_low: float = 0.2,
    eps_high: float = 0.28,
    level: str = "token",
    is_weight: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict]:
    """PPO clipped surrogate per token (to minimise), DAPO clip-higher by default:

        loss_t = -min(r_t * A, clip(r_t, 1 - eps_low, 1 + eps_high) * A) * w_t
    r_t from `ratio(level=...)`; A = adv [B] broadcast over the row or [B, T] per token (detached);
    w_t = is_weight ([B, T] or [B], detached; e.g. `truncated_is_weight`), 1 when None.
    Returns (per-token loss [B, T], 0 where mask is 0, and stats):
        clip_frac:  fraction of masked tokens where the clipped branch is active, i.e. the gradient is
                    zero: (A > 0 and r > 1 + eps_high) or (A < 0 and r < 1 - eps_low);
        ratio_mean: mean r over masked tokens;
        approx_kl:  k3 estimate of KL(old || new) from the *token* log-ratios (whatever the level),
                    mean over masked tokens of (r_t - 1) - log r_t."""
    m = mask.bool()
    r = ratio(logp, old_logp, m, level)
    a = _per_token(adv).to(r.dtype).detach()
    per_tok = -torch.minimum(r * a, r.clamp(1.0 - eps_low, 1.0 + eps_high) * a)
    if is_weight is not None:
        per_tok = per_tok * _per_token(is_weight).to(r.dtype).detach()
    per_tok = torch.where(m, per_tok, torch.zeros_like(per_tok))
    with torch.no_grad():
        rd = r.detach()
        clipped = ((a > 0) & (rd > 1.0 + eps_high)) | ((a < 0) & (rd < 1.0 - eps_low))
        log_r = torch.where(m, logp - old_logp, torch.zeros_like(logp)).detach()
        stats = {
            "clip_frac": float(_masked_mean(clipped.to(rd.dtype), m)),
            "ratio_mean": float(_masked_mean(rd, m)),
            "approx_kl": float(_masked_mean(torch.expm1(log_r) - log_r, m)),
        }
    return per_tok, stats


def truncated_is_weight(old_logp: torch.Tensor, behaviour_logp: torch.Tensor, cap: float = 2.0) -> torch.Tensor:
    """Truncated importance weight for rows sampled by an older (behaviour) policy (TIS as in
    verl / AReaL / DART-GUI): w_t = min(exp(old_t - behaviour_t), cap), detached (no gradient).

    old = the policy the PPO ratio is taken against (recomputed at the start of the update);
    behaviour = the logprobs recorded at sampling time (stale policy version / inference engine).
    When behaviour logprobs are unknown (e.g. replayed teacher demos) pass behaviour = old: w = 1."""
    with torch.no_grad():
        return torch.exp(old_logp - behaviour_logp).clamp(max=cap)


def aggregate(
    per_token: torch.Tensor, mask: torch.Tensor, mode: str = "token_mean", constant: float | None = None
) -> torch.Tensor:
    """Reduce a per-token loss [B, T] to a scalar over the mask (masked-out positions never count):

        constant (Dr.GRPO):          sum_{masked} loss / constant, constant fixed across batches,
                                     e.g. max_new_tokens * number of rows (required for this mode);
        token_mean (DAPO):           sum_{masked} loss / number of masked tokens;
        seq_mean_token_mean (GRPO):  mean over rows of (row's masked sum / row's masked count);
                                     rows with no masked token are left out of the mean.
    A fractional mask acts as a per-token weight (sums and counts are weighted)."""
    m = mask.to(per_token.dtype)
    x = torch.where(m > 0, per_token, torch.zeros_like(per_token)) * m
    if mode == "constant":
        if constant is None or constant <= 0:
            raise ValueError("aggregate(mode='constant') needs a positive constant")
        return x.sum() / constant
    if mode == "token_mean":
        return x.sum() / m.sum().clamp_min(1.0)
    if mode == "seq_mean_token_mean":
        n = m.sum(-1)
        rows = n > 0
        return (x.sum(-1)[rows] / n[rows]).mean() if bool(rows.any()) else x.sum() * 0.0
    raise ValueError(f"unknown aggregation mode {mode!r}")


def kl_k3(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """Per-token k3 estimator of KL(pi || pi_ref) on tokens sampled from pi (Schulman):
    k3 = exp(ref - logp) - (ref - logp) - 1 >= 0, 0 iff ref == logp. For the optional KL penalty."""
    d = ref_logp - logp
    return torch.expm1(d) - d


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """Entropy per position, H = -sum_v p_v log p_v with log p = log_softmax(logits) (float32, stable;
    -inf logits contribute 0). [..., V] -> [...]. Uniform over V gives log V."""
    return entropy_from_logprobs(F.log_softmax(logits.float(), dim=-1))


def entropy_from_logprobs(lp: torch.Tensor) -> torch.Tensor:
    """`entropy_from_logits` from log-probs already computed (log_softmax of the float32 logits): the same value
    without a second log-softmax over the vocabulary."""
    p = lp.exp()
    return -torch.where(p > 0, p * lp, torch.zeros_like(lp)).sum(-1)


# =============================================================================================
# RL: SDPO self-distillation (arXiv 2601.20802; lasgroup/SDPO core_algos.compute_self_distillation_loss).
# The teacher is the (EMA) model re-prompted with privileged context (a successful sibling and/or
# env feedback), teacher-forcing the student's own response; its logprobs/logits carry no gradient.
# =============================================================================================


def _sdpo_is_weight(student_logp: torch.Tensor, old_logp: torch.Tensor | None, is_clip: float | None) -> torch.Tensor:
    """w_t = min(exp(sg(student_t - old_t)), is_clip), detached; 1 when old_logp is None."""
    if old_logp is None:
        return torch.ones_like(student_logp).detach()
    w = torch.exp((student_logp - old_logp).detach())
    return w if is_clip is None else w.clamp(max=is_clip)


def sdpo_token_loss(
    student_logp: torch.Tensor,
    teacher_logp: torch.Tensor,
    old_logp: torch.Tensor | None,
    mask: torch.Tensor,
    is_clip: float | None = 2.0,
) -> tuple[torch.Tensor, dict]:
    """Sampled-token SDPO (alpha = 1, reverse KL), as a policy gradient with a per-token advantage:

        A_t    = sg(teacher_logp_t - student_logp_t)
        loss_t = -A_t * student_logp_t * w_t,   w_t = min(exp(sg(student_t - old_t)), is_clip)
    The gradient -A_t * w_t * grad log pS(y_t) is the gradient of the sampled reverse-KL estimator
    KL(pS||pT) ~ log pS(y_t) - log pT(y_t) with y_t ~ pS (score function; the E[grad log pS] = 0 term
    dropped). The loss *value* is not a KL. All inputs [B, T]; old_logp None means w = 1.
    Returns (per-token loss [B, T], 0 where mask is 0, and stats: adv_mean, teacher_higher_frac
    (fraction of masked tokens with teacher > student), is_clip_frac (w capped))."""
    m = mask.bool()
    a = (teacher_logp - student_logp).detach()
    w = _sdpo_is_weight(student_logp, old_logp, is_clip)
    per_tok = torch.where(m, -a * student_logp * w, torch.zeros_like(student_logp))
    with torch.no_grad():
        capped = (w >= is_clip) if (is_clip is not None and old_logp is not None) else torch.zeros_like(m)
        stats = {
            "adv_mean": float(_masked_mean(a, m)),
            "teacher_higher_frac": float(_masked_mean((a > 0).to(a.dtype), m)),
            "is_clip_frac": float(_masked_mean(capped.to(a.dtype), m)),
        }
    return per_tok, stats


def _topk_buckets(lp: torch.Tensor, idx: torch.Tensor, tail: bool) -> torch.Tensor:
    """Log-probs over the buckets: the k gathered entries plus log(1 - sum p_topk) when `tail`,
    else the k entries renormalised to sum to 1."""
    lk = lp.gather(-1, idx)
    log_mass = lk.logsumexp(-1, keepdim=True)
    if not tail:
        return lk - log_mass
    return torch.cat([lk, torch.log(-torch.expm1(log_mass.clamp(max=-1e-7)))], -1)


def _kl(lp: torch.Tensor, lq: torch.Tensor) -> torch.Tensor:
    """KL(p || q) over the last dim, from log-probs."""
    return (lp.exp() * (lp - lq)).sum(-1)


def generalized_jsd(lp_s: torch.Tensor, lp_t: torch.Tensor, alpha: float) -> torch.Tensor:
    """alpha = 0: KL(pT||pS) (forward); alpha = 1: KL(pS||pT) (reverse); otherwise, with
    M = (1-alpha) pS + alpha pT:  D = (1-alpha) KL(pS||M) + alpha KL(pT||M). Last dim = buckets."""
    if alpha == 0.0:
        return _kl(lp_t, lp_s)
    if alpha == 1.0:
        return _kl(lp_s, lp_t)
    log_m = torch.logsumexp(torch.stack([lp_s + math.log(1.0 - alpha), lp_t + math.log(alpha)]), 0)
    return (1.0 - alpha) * _kl(lp_s, log_m) + alpha * _kl(lp_t, log_m)


def sdpo_topk_loss(
    student_logits: torch.Tensor,
    teacher_logits: torch.Tensor,
    mask: torch.Tensor,
    k: int = 20,
    alpha: float = 0.5,
    tail: bool = True,
    old_logp: torch.Tensor | None = None,
    sampled_ids: torch.Tensor | None = None,
    is_clip: float | None = 2.0,
) -> tuple[torch.Tensor, dict]:
    """Top-k logit SDPO: a divergence per response position between student and (detached) teacher.

    At each masked position take the STUDENT's top-k vocabulary indices, gather both log-softmaxes
    there, and add a tail bucket log(1 - sum_{topk} p) (tail=True; both become distributions over
    k+1 buckets) or renormalise over the k entries (tail=False). k >= V uses the full vocabulary, no
    tail. D = generalized_jsd(student, teacher, alpha) (alpha 0 forward KL, 1 reverse KL, else JSD).
    With old_logp and sampled_ids [B, T] given, D is multiplied by
    w_t = min(exp(sg(log pS(y_t) - old_t)), is_clip). Logits [B, T, V]; only masked positions are
    projected through the softmax. Returns (per-token D [B, T], 0 where mask is 0, and stats: div_mean)."""
    m = mask.bool()
    s_lp = F.log_softmax(student_logits[m].float(), dim=-1)  # [N, V]
    t_lp = F.log_softmax(teacher_logits[m].detach().float(), dim=-1)
    vocab = s_lp.shape[-1]
    idx = s_lp.detach().topk(min(k, vocab), dim=-1).indices
    use_tail = tail and k < vocab
    div = generalized_jsd(_topk_buckets(s_lp, idx, use_tail), _topk_buckets(t_lp, idx, use_tail), alpha)
    if old_logp is not None and sampled_ids is not None:
        sampled = s_lp.gather(-1, sampled_ids[m].unsqueeze(-1)).squeeze(-1)
        div = div * _sdpo_is_weight(sampled, old_logp[m].float(), is_clip)
    out = torch.zeros(m.shape, dtype=div.dtype, device=div.device)
    out = out.masked_scatter(m, div)
    return out, {"div_mean": float(div.detach().mean()) if div.numel() else 0.0}


def blend(
    grpo_per_token: torch.Tensor, sdpo_per_token: torch.Tensor, sdpo_mask: torch.Tensor, weight: float
) -> torch.Tensor:
    """Per-token blend of the policy-gradient and SDPO losses (TRL SDPOTrainer distillation_weight):

        rows with SDPO context (sdpo_mask[b] true):  (1 - weight) * grpo + weight * sdpo
        rows without (no successful sibling, no feedback): grpo with weight 1, not (1 - weight),
    so rows that cannot be distilled keep their full RL signal. sdpo_mask: [B] per row."""
    w = weight * _per_token(sdpo_mask.to(grpo_per_token.dtype))
    sdpo = torch.where(w > 0, sdpo_per_token, torch.zeros_like(sdpo_per_token))  # no NaN leaks from unused rows
    return (1.0 - w) * grpo_per_token + w * sdpo
