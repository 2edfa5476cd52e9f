"""The RL update on lake step rows: GRPO / Dr.GRPO / GSPO / SDPO, pure torch/transformers (no Prefect).

    s = RLSettings.from_config(cfg)                        # cfg.rl + the student's prompt options and max_new_tokens
    trainer = RLTrainer(model, processor, s)               # optimizer, weights, SDPO teacher, KL reference:
                                                           # kept over rounds
    res = trainer.train_round(lake, ["<rollout run key>"], round_idx=0, iteration=0, run_key="rl-it0-...")
    metrics = rl_update(model, processor, rows, s)          # one update on rows you built (training.rl_data)

Rows (training/rl_data.py) are episode steps, each with its own prompt (the rollouts' prompt builder: instruction,
text history, K-screenshot window, UI text) and its response tokens. Encoding: the chat template of the prompt with
the generation prompt, run through the processor with the row's own images, then the response ids appended; each
row keeps its image tensors and the model computes its mRoPE positions from its own ids and image grid (right
padding, the SFT collator's `pad`). Log-probs come from the backbone's hidden states at the positions that predict
a response token, projected through the LM head there only.

One update (`RLTrainer.update`, `settings.epochs` passes over seeded minibatches, AdamW via training.core):
- old_logp: the response log-probs under the weights at the start of the update (no gradient): the PPO ratio's
  denominator (rl.old_logp "rollout": for the rows a round just sampled with these weights, the sampler's own).
  behaviour_logp: the sampler's log-probs from the lake; the token weight
  w = losses.truncated_is_weight(old, behaviour, is_cap) corrects rows sampled by an older policy (an earlier
  round, another engine). Forwards run in eval mode (no dropout), so the first minibatch starts at ratio 1.
  At rl.temperature T != 1 every log-prob is of logits / T (the sampler's policy); w then compares T = 1 ones.
- PG term: losses.clipped_pg_loss (token level, or sequence level for gspo; clip eps_low/eps_high) x w, with
  the episode's group advantage (rl_data.assign_advantages) on every token of the row.
- Replayed successes (rl_data: a stored success joined to an all-failed group with reward 1): a scripted
  teacher's steps have no sampled tokens, so their response is the SFT target text tokenised as SFT does, and no
  behaviour log-probs: behaviour = old = the current weights' (detached) log-probs, so w = 1 and the ratio starts
  at 1; the PPO clip bounds how far one update moves towards the demo. An earlier student success keeps its own
  tokens and behaviour log-probs (w corrects its staleness).
- SDPO (algorithm sdpo, or sdpo_weight > 0 with another algorithm): the teacher is the same network without
  gradient (an EMA of the student, updated after every optimizer step, or the frozen start), re-prompted with the
  row's own prompt (same images and history) plus a privileged block at the end of the user message -- "Correct
  solution:" with a successful sibling's action sequence (never the row's own episode; a stored success counts
  when no sibling succeeded) and/or the failed attempt's feedback -- then "Correctly solve the original task.".
  It scores the student's own response tokens teacher-forced (its own forward, its own prompt length and
  positions); loss = losses.sdpo_token_loss(student, teacher, old, ...) x w, blended per row with the PG term by
  losses.blend (rows without a context keep the full PG term). The context of each row is returned in the
  update's row records (rl_rows in the lake), so an update can be reproduced.
  sdpo_mode "topk" (logit-level SDPO): the term is instead losses.sdpo_topk_loss -- a generalized JSD (sdpo_alpha:
  0 forward KL, 1 reverse) between student and teacher over the student's top sdpo_topk vocabulary ids plus a tail
  bucket, at each response token -- x min(exp(sg(student - old)), sdpo_is_clip) x w, blended the same way. Both
  forwards return only those buckets (rl_encode.response_logprobs topk= / at=): no [tokens x vocab] tensor is kept.
- GiGPO (gigpo_omega > 0): a row's advantage is A^E + omega A^S, A^S from the rows of its group that saw the same
  screen (rl_data.assign_advantages).
- Optional k3 KL to a frozen copy of the start weights (kl_coef; none is built at 0).
- Aggregation: losses.aggregate, "constant" = student.max_new_tokens x rows (Dr.GRPO) by default; micro-batches
  inside a minibatch use the minibatch's normaliser, so micro_batch never changes the update.
"""

from __future__ import annotations

import math
import time
from contextlib import nullcontext
from functools import partial
from typing import Any, Sequence

from training.core import Bar, TrainableWeights, TrainState, make_optimizer, optimizer_step
from training.distributed import Context, balanced_share, ddp_wrap, gather, global_float, global_floats
from training.kernels import fast_lora, fast_text, fast_vision, fuse_model, linear_patch_embed
from training.progress import ProgressLog, draws_bar
from training.rl_data import (
    assign_advantages,
    attach_sdpo_context,
    load_rl_rows,  # noqa: F401
    row_record,
    update_summary,
)
from training.rl_encode import (
    RowEncoder,
    frozen_copy,
    length_batches,  # noqa: F401
    pixel_dtype,
    response_logprobs,
    rows_tensor,
    teacher_messages,  # noqa: F401  (re-exported)
)
from training.rl_settings import ALGORITHMS, RLSettings, SDPOTeacherError  # noqa: F401  (re-exported)
from training.rl_state import ResumableTrainer
from training.rl_teacher import TeacherCheck


# ------------------------------------------------------------------------------------------------ trainer
class RLTrainer(ResumableTrainer, TeacherCheck):
    """The learner of an RL run: optimizer and trainable weights (training.core), the SDPO teacher and KL
    reference, and the step counter, kept across rounds; `state_dict`/`load_state` or `save_state` resume it
    exactly. The vision tower is frozen (as in SFT); LoRA adapters get fp32 master copies. On CUDA (with
    liger-kernel, rl.fused_kernels) the fused RMSNorm/SwiGLU/RoPE forwards are bound onto the model, its teacher
    and reference (training.kernels.fuse_model), with rl.fused_kernels the frozen tower's forward takes
    kernels.fast_vision and the linear patch embedding (no liger needed), PEFT's LoRA linears kernels.fast_lora and
    DeepStack kernels.fast_text, AdamW is fused, and an update keeps its encoded rows on the device."""

    device_rows_bytes = 4 << 30  # an update's encoded rows kept on a GPU (bf16 pixels); the rest is placed per use

    def __init__(
        self,
        model,
        processor,
        settings: RLSettings,
        *,
        ref=None,
        teacher=None,
        base_model: str | None = None,
        ctx: Context | None = None,
    ):
        from training.models import freeze_vision, is_lora_param

        self.model, self.processor, self.s, self.base_model = model, processor, settings, base_model
        freeze_vision(model)
        lora = any(is_lora_param(n) for n, p in model.named_parameters() if p.requires_grad)
        self.weights = TrainableWeights(model, master=lora)
        cuda = bool(self.weights.opt_params) and all(p.is_cuda for p in self.weights.opt_params)
        self.opt = make_optimizer(self.weights, settings.lr, settings.weight_decay, fused=cuda)  # as SFT's
        self.state = TrainState()
        self.device = next(model.parameters()).device
        self.encoder = RowEncoder(processor)
        self.ref = ref if ref is not None else (frozen_copy(model) if settings.kl_coef > 0 else None)
        self.teacher = teacher if teacher is not None else (frozen_copy(model) if settings.distill_weight > 0 else None)
        self.kernels = fuse_model(model) if settings.fused_kernels else []  # [] on CPU or without liger-kernel
        for twin in (self.ref, self.teacher):
            if self.kernels and twin is not None:
                fuse_model(twin)
        if settings.fused_kernels and self.device.type == "cuda":  # the frozen vision tower (no liger needed)
            vision = fast_vision(model) + (["patch_linear"] if linear_patch_embed(model) else [])
            vision += fast_lora(model) + fast_text(model)
            for twin in (self.ref, self.teacher):
                if twin is not None:
                    fast_vision(twin), linear_patch_embed(twin), fast_lora(twin), fast_text(twin)
            self.kernels = sorted(set(self.kernels) | set(vision))
        self.pixel_dtype = pixel_dtype(model)  # bf16 on GPU: what the vision tower casts pixel_values to anyway
        self._ema_pairs = None
        self.teacher_check: dict[str, Any] = {}  # the last update's teacher_stats (rl.sdpo_teacher_check)
        # rl.distributed ddp (a torchrun worker): each rank takes its share of every minibatch, DDP averages grads
        self.ctx = ctx or Context()
        self.ddp = ddp_wrap(response_logprobs, model, self.device) if self.ctx.active else None
        self._stored = None  # train_round's stored_index of the lake it reads
        self._attempts = None  # rl.clone_hard: training.rl_clone.attempts_index of that lake

    # ---------------------------------------------------------------- rows
    def prepare(self, rows: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], dict[str, Any]]:
        """SDPO contexts (when distilling), then advantages and the zero-variance filter (rl_data)."""
        s = self.s
        if s.distill_weight > 0:
            attach_sdpo_context(rows, s.sdpo_context, s.sdpo_hint)
        return assign_advantages(
            rows,
            mode=s.advantage_mode,
            drop_zero_variance=s.drop_zero_variance,
            parse_error_penalty=s.parse_error_penalty,
            keep_sdpo_rows=s.distill_weight > 0,
            gigpo_omega=s.gigpo_omega,
            gigpo_gamma=s.gigpo_gamma,
            step_weight=s.step_weight,
        )

    def _score(self, model, encoded: list[dict[str, Any]], temperature: float | None = None) -> list[Any]:
        """Per-row response log-probs (cpu, detached) under `model` at `temperature` (default: the sampler's)."""
        import torch

        out: list[Any] = [None] * len(encoded)
        t = self.s.temperature if temperature is None else temperature
        mine = range(self.ctx.rank, len(encoded), self.ctx.world)  # under DDP each rank scores its part
        with torch.no_grad():
            for idx in length_batches(mine, encoded, self.s.micro_batch or self.s.batch_size):
                batch, pos, mask = self.encoder.pad([encoded[i] for i in idx], self.device, self.pixel_dtype)
                lp, _ = response_logprobs(model, batch, pos, mask, temperature=t)
                for j, i in enumerate(idx):
                    out[i] = lp[j][mask[j]].cpu()
        if self.ctx.active:
            for part in gather(self.ctx, {i: out[i] for i in mine}):
                for i, v in part.items():
                    out[i] = v
        return out

    def _old_logp(self, rows, enc, resp) -> list[Any]:
        """The PPO ratio's denominator per row: recomputed, or with rl.old_logp "rollout" the sampler's stored
        log-probs for the rows these weights sampled at temperature 1 (every row of a freshly sampled round but the
        replayed ones), so only the others take the no-grad forward."""
        import torch

        s = self.s
        own = {
            i
            for i, r in enumerate(rows)
            if s.old_logp == "rollout"
            and s.temperature == 1.0
            and not r.get("replayed")
            and r.get("behaviour_logp")
            and len(r["behaviour_logp"]) == len(resp[i])
        }
        rest = [i for i in range(len(rows)) if i not in own]
        out = dict(zip(rest, self._score(self.model, [enc[i] for i in rest])))
        out.update({i: torch.tensor(rows[i]["behaviour_logp"], dtype=torch.float32) for i in own})
        return [out[i] for i in range(len(rows))]

    # ---------------------------------------------------------------- update
    def update(
        self, rows: list[dict[str, Any]], *, round_idx: int = 0, progress: bool = False, lines: bool = True
    ) -> dict[str, Any]:
        """`settings.epochs` passes of minibatch updates over `rows` (prepared with `prepare` first when they carry
        no advantages). `progress` draws a bar on a terminal; else `lines` logs progress lines (training.progress).
        Returns {"steps": per optimizer step metrics, "rows": per row records, "summary",
        "stopped"}."""
        import numpy as np

        s = self.s
        rows, resp, enc, tenc, old, ref, isw, n_unscorable = self._inputs(rows)
        steps: list[dict[str, Any]] = []
        per_epoch = math.ceil(len(rows) / s.batch_size)
        bar = Bar(per_epoch * s.epochs, 0, "rl") if draws_bar(progress) and rows else None
        plog = ProgressLog(
            f"rl round {round_idx + 1} update",
            per_epoch * s.epochs,
            quiet=bar is not None or not lines or not rows or not self.ctx.main,
        )
        stopped = "done" if rows else "empty"
        try:
            for epoch in range(s.epochs if rows else 0):
                order = np.random.default_rng([s.seed, round_idx, epoch]).permutation(len(rows)).tolist()
                for k in range(0, len(rows), s.batch_size):
                    if s.max_minutes and self.state.elapsed_s >= s.max_minutes * 60:
                        stopped = "budget"
                        break
                    t0 = time.monotonic()
                    m = self._step(order[k : k + s.batch_size], rows, enc, tenc, old, ref, isw)
                    self.count_time(t0)
                    m.update(
                        round=round_idx,
                        update_step=len(steps),
                        global_step=self.state.step - 1,
                        epoch=epoch,
                        algo=s.algorithm,
                        lr=m.pop("lr"),
                    )
                    steps.append(m)
                    if bar:
                        bar.show(len(steps), f"loss {m['loss']:.4f} | clip {m['clip_frac']:.2f} | H {m['entropy']:.2f}")
                    plog.update(len(steps), loss=m["loss"], clip=m["clip_frac"])
                if stopped == "budget":
                    break
        finally:
            if bar:
                bar.stop()
            plog.stop()
        self.state.stopped = stopped
        records = [
            dict(
                row_record(r),
                n_tokens=len(resp[i]),
                old_logp_mean=float(old[i].mean()) if len(old[i]) else None,
                is_weight_mean=float(isw[i].mean()) if len(isw[i]) else None,
                sdpo=bool(r.get("sdpo")),
            )
            for i, r in enumerate(rows)
        ]
        return {
            "steps": steps,
            "rows": records,
            "summary": {
                **update_summary(steps),
                "n_rows_unscorable": n_unscorable,
                **{f"sdpo_teacher_{k}": v for k, v in self.teacher_check.items()},
            },
            "stopped": stopped,
        }

    def apply_step(self, lr: float, n_rows: int, n_tok: int) -> float:
        """After a step's backward: the step's lr, clip + step + zero (training.core.optimizer_step), and the step
        counted in `state`. Returns the pre-clip gradient norm. Policy-update and clone steps (training.rl_clone)."""
        for g in self.opt.param_groups:
            g["lr"] = lr
        grad_norm = optimizer_step(self.weights, self.opt, self.s.grad_clip)
        st = self.state
        st.step, st.samples_seen, st.target_tokens = st.step + 1, st.samples_seen + n_rows, st.target_tokens + n_tok
        return grad_norm

    def count_time(self, t0: float) -> None:
        """Add the time since `t0` to the rl.max_minutes budget; under DDP the ranks' mean, so every rank stops at
        the same step."""
        self.state.elapsed_s += global_float(self.ctx, time.monotonic() - t0) / self.ctx.world

    def _inputs(self, rows: list[dict[str, Any]]):
        """What an update reads per row: the rows it can score (prepared if they carry no advantages), their
        response ids, encodings (+ the SDPO teacher's), old log-probs, the KL reference's, truncated IS weights,
        and how many rows were left out (a reply holding a vision placeholder cannot be teacher-forced)."""
        import torch

        from training.losses import truncated_is_weight

        s = self.s
        if rows and any("advantage" not in r for r in rows):
            rows, _ = self.prepare(rows)
        self.model.eval()  # no dropout: the first minibatch starts at ratio 1
        resp = [self.encoder.response_ids(r) for r in rows]
        ok = [self.encoder.scorable(ids) for ids in resp]
        n_unscorable = len(ok) - sum(ok)
        if n_unscorable:  # rare garbage replies; their episodes still count in their groups' baselines
            rows, resp = [r for r, k in zip(rows, ok) if k], [ids for ids, k in zip(resp, ok) if k]
        enc = [self.encoder.encode(r["messages"], r["images"], ids) for r, ids in zip(rows, resp)]
        tenc = {
            i: self.teacher_encoding(r, resp[i]) for i, r in enumerate(rows) if s.distill_weight > 0 and r.get("sdpo")
        }
        enc, tenc = self._resident(enc, tenc)
        old = self._old_logp(rows, enc, resp)
        self.teacher_check = (
            self.teacher_stats(rows, tenc, old, resp) if tenc and s.sdpo_teacher_check is not None else {}
        )
        if self.teacher_check:
            self._check_teacher(self.teacher_check)
        ref = self._score(self.ref, enc) if self.ref is not None and s.kl_coef > 0 else None
        # the sampler stores temperature-1 log-probs: at another temperature, staleness is measured at 1
        raw = old if s.temperature == 1.0 else self._score(self.model, enc, 1.0)
        isw = [
            truncated_is_weight(o, torch.tensor(r["behaviour_logp"]) if r.get("behaviour_logp") else o, s.is_cap)
            for o, r in zip(raw, rows)
        ]
        return rows, resp, enc, tenc, old, ref, isw, n_unscorable

    def _resident(self, enc: list[dict[str, Any]], tenc: dict[int, dict[str, Any]]):
        """RowEncoder.resident on this trainer's device, up to device_rows_bytes (none on CPU: rows stay put)."""
        budget = self.device_rows_bytes if self.device.type != "cpu" else 0
        return self.encoder.resident(enc, tenc, self.device, self.pixel_dtype, budget)

    def _step(self, mb: list[int], rows, enc, tenc, old, ref, isw) -> dict[str, Any]:
        """One optimizer step on minibatch `mb` (micro-batches in length order); returns the step's metrics."""
        import torch

        s, w = self.s, self.s.distill_weight
        lens = [len(old[i]) for i in mb]
        demo_tok = sum(len(old[i]) for i in mb if rows[i].get("replayed"))
        norm = (len(mb), sum(lens), sum(n > 0 for n in lens), demo_tok)  # rows, tokens, non-empty rows, replayed tokens
        acc = dict.fromkeys(
            (
                "loss",
                "ent",
                "clip",
                "akl",
                "ratio",
                "isw",
                "klref",
                "sd_tok",
                "sd_high",
                "sd_adv",
                "sd_div",
                "n_sdpo",
                "demo_nll",
            ),
            0.0,
        )
        # under DDP this rank runs its token-balanced share of the minibatch, its loss x world (DDP averages the
        # gradients); a rank left without a row (a minibatch smaller than the world) runs one at weight 0, so every
        # rank takes part in the one synced backward
        share = balanced_share(mb, [enc[i]["input_ids"].shape[-1] for i in mb], self.ctx)
        mine, scale = (share, float(self.ctx.world)) if share else (mb[:1], 0.0)
        parts = length_batches(mine, enc, s.micro_batch or len(mb))
        for k, idx in enumerate(parts):
            with self.ddp.no_sync() if self.ddp is not None and k < len(parts) - 1 else nullcontext():
                self._micro(idx, rows, enc, tenc, old, ref, isw, norm, scale, acc)
        if self.ctx.active:
            acc = dict(zip(acc, global_floats(self.ctx, list(acc.values()))))
        lr = s.lr * min(1.0, (self.state.step + 1) / s.warmup_steps) if s.warmup_steps else s.lr
        n_rows, n_tok = norm[0], norm[1]
        grad_norm = self.apply_step(lr, n_rows, n_tok)
        if self.teacher is not None and w > 0 and s.sdpo_teacher == "ema":
            self._ema()
        self.state.losses.append(round(acc["loss"], 6))
        a = torch.tensor([rows[i]["advantage"] for i in mb], dtype=torch.float64)
        T, sd = max(n_tok, 1), acc["sd_tok"]
        return dict(
            lr=lr,
            loss=acc["loss"],
            entropy=acc["ent"] / T,
            clip_frac=acc["clip"] / T,
            approx_kl=acc["akl"] / T,
            kl_ref=acc["klref"] / T,
            ratio_mean=acc["ratio"] / T,
            is_weight_mean=acc["isw"] / T,
            adv_mean=float(a.mean()),
            adv_std=float(a.std(unbiased=False)),
            adv_abs=float(a.abs().mean()),
            grad_norm=grad_norm,
            n_rows=n_rows,
            n_tokens=n_tok,
            n_sdpo_rows=int(acc["n_sdpo"]),
            sdpo_teacher_higher_frac=acc["sd_high"] / sd if sd else None,
            sdpo_adv_mean=acc["sd_adv"] / sd if sd else None,
            sdpo_div_mean=acc["sd_div"] / sd if sd and s.sdpo_mode == "topk" else None,
            demo_nll=acc["demo_nll"] if norm[3] and s.demo_nll else None,
        )

    def _micro(self, idx, rows, enc, tenc, old, ref, isw, norm, scale, acc) -> None:
        """Forward + backward of one micro-batch; its loss over the minibatch's normaliser `norm`, x `scale`."""
        import torch

        from training.losses import aggregate, blend, clipped_pg_loss, kl_k3

        s, dev, w = self.s, self.device, self.s.distill_weight
        n_rows, n_tok, n_nonempty, demo_tok = norm
        batch, pos, mask = self.encoder.pad([enc[i] for i in idx], dev, self.pixel_dtype)
        width = pos.shape[1]
        sd_rows = [j for j, i in enumerate(idx) if i in tenc]
        topk = s.sdpo_mode == "topk" and bool(sd_rows)
        kw = dict(entropy=True, topk=s.sdpo_topk if topk else 0, temperature=s.temperature)
        logp, ent, *top = (self.ddp or partial(response_logprobs, self.model))(batch, pos, mask, **kw)
        old_t = rows_tensor([old[i] for i in idx], width, dev)
        isw_t = rows_tensor([isw[i] for i in idx], width, dev, fill=1.0)
        adv = torch.tensor([rows[i]["advantage"] for i in idx], dtype=torch.float32, device=dev)
        per_tok, st = clipped_pg_loss(logp, old_t, adv, mask, s.clip[0], s.clip[1], s.level, is_weight=isw_t)
        per_tok = per_tok * s.pg_weight if s.pg_weight != 1.0 else per_tok
        part = dict.fromkeys(acc, 0.0)
        if sd_rows:
            part["n_sdpo"] = len(sd_rows)
            sd, sd_mask = self._sdpo_term(idx, sd_rows, tenc, logp, old_t, mask, top[0] if topk else None, part)
            per_tok = blend(per_tok, sd * isw_t, sd_mask, w)
        if ref is not None:
            kl = kl_k3(logp, rows_tensor([ref[i] for i in idx], width, dev))
            per_tok = per_tok + s.kl_coef * kl
            part["klref"] = float(torch.where(mask, kl.detach(), torch.zeros_like(kl)).sum())
        if s.aggregation == "constant":
            loss = aggregate(per_tok, mask, "constant", constant=s.max_new_tokens * n_rows)
        elif s.aggregation == "token_mean":
            loss = aggregate(per_tok, mask, "constant", constant=max(n_tok, 1))
        else:
            loss = aggregate(per_tok, mask, "seq_mean_token_mean") * (
                int((mask.sum(-1) > 0).sum()) / max(n_nonempty, 1)
            )
        demo = [j for j, i in enumerate(idx) if rows[i].get("replayed")]
        if s.demo_nll and demo:  # DAPG: behaviour cloning on the minibatch's replayed tokens, their own token mean
            dm = torch.zeros_like(mask)
            dm[demo] = mask[demo]
            nll = -torch.where(dm, logp, torch.zeros_like(logp)).sum() / max(demo_tok, 1)
            loss = loss + s.demo_nll * nll
            part["demo_nll"] = float(nll.detach())
        (loss * scale).backward()
        if not scale:  # a weight-0 stand-in: no metrics
            return
        t = float(mask.sum())
        part.update(
            loss=float(loss.detach()),
            ent=float(torch.where(mask, ent, torch.zeros_like(ent)).sum()),
            clip=st["clip_frac"] * t,
            akl=st["approx_kl"] * t,
            ratio=st["ratio_mean"] * t,
            isw=float(torch.where(mask, isw_t, torch.zeros_like(isw_t)).sum()),
        )
        for key, v in part.items():
            acc[key] += v

    def _sdpo_term(self, idx, sd_rows, tenc, logp, old_t, mask, student_top, acc) -> tuple[Any, Any]:
        """The SDPO per-token term of a micro-batch (rows `sd_rows` of `idx` have a teacher context) and its row mask.
        The teacher's own forward (its re-prompt, images and positions) scores the student's tokens: sampled mode
        uses the log-ratio (losses.sdpo_token_loss), topk mode the divergence over the student's top-k + tail buckets
        (`student_top`: their log-probs and ids), both times min(exp(sg(S - old)), sdpo_is_clip). Adds to `acc`."""
        import torch

        from training.losses import sdpo_token_loss, sdpo_topk_loss

        s, dev = self.s, self.device
        s_bk, s_ids = student_top if student_top is not None else (None, None)
        teacher_lp = logp.detach().clone()
        sel = torch.tensor(sd_rows, device=dev)
        with torch.no_grad():
            tb, tpos, tmask = self.encoder.pad([tenc[idx[j]] for j in sd_rows], dev, self.pixel_dtype)
            r_t = tpos.shape[1]  # the same response lengths as the student's rows, at the teacher's positions
            tlp, _, *t_top = response_logprobs(
                self.teacher,
                tb,
                tpos,
                tmask,
                temperature=s.temperature,
                at=s_ids[sel, :r_t] if s_ids is not None else None,
            )
        cur = teacher_lp[sel, :r_t]
        teacher_lp[sel, :r_t] = torch.where(tmask, tlp, cur)
        sd_mask = torch.zeros(len(idx), dtype=torch.bool, device=dev)
        sd_mask[sel] = True
        sd_tok_mask = mask & sd_mask[:, None]
        sd, sst = sdpo_token_loss(logp, teacher_lp, old_t, sd_tok_mask, s.sdpo_is_clip)
        if s_bk is not None:  # D over the student's top-k + tail buckets x the same IS clip min(exp(sg(S - old)), cap)
            t_bk = t_top[0][0]
            div, dst = sdpo_topk_loss(s_bk[sel, :r_t], t_bk, tmask, k=t_bk.shape[-1], alpha=s.sdpo_alpha, tail=False)
            clip_w = torch.exp((logp[sel, :r_t] - old_t[sel, :r_t]).detach()).clamp(max=s.sdpo_is_clip)
            sd = torch.zeros_like(logp)
            sd[sel, :r_t] = div * clip_w
            acc["sd_div"] += dst["div_mean"] * float(tmask.sum())
        k = float(sd_tok_mask.sum())
        acc["sd_tok"] += k
        acc["sd_high"] += sst["teacher_higher_frac"] * k
        acc["sd_adv"] += sst["adv_mean"] * k
        return sd, sd_mask

    def _ema(self) -> None:
        """theta_T <- (1 - rate) theta_T + rate theta_S over the trainable weights (the rest is shared and frozen):
        one foreach lerp over the (teacher, student) tensor lists, built once."""
        import torch

        if self._ema_pairs is None:
            tp = dict(self.teacher.named_parameters())
            self._ema_pairs = ([tp[n] for n in self.weights.params], list(self.weights.params.values()))
        t, st = self._ema_pairs
        with torch.no_grad():
            torch._foreach_lerp_(t, [p.to(q.dtype) for p, q in zip(st, t)], self.s.sdpo_ema_rate)

    # ---------------------------------------------------------------- a round over the lake
    def train_round(
        self,
        lake: Any,
        run_keys: list[str],
        *,
        round_idx: int,
        iteration: int,
        run_key: str,
        git_sha: str | None = None,
        progress: bool = False,
        lines: bool = True,
        guide_keys: Sequence[str] = (),
    ) -> dict[str, Any]:
        """training.rl_round.train_round with this trainer: load, prepare, update (+ clone steps), write the lake."""
        from training.rl_round import train_round

        return train_round(
            self,
            lake,
            run_keys,
            round_idx=round_idx,
            iteration=iteration,
            run_key=run_key,
            git_sha=git_sha,
            progress=progress,
            lines=lines,
            guide_keys=guide_keys,
        )


def rl_update(
    model, processor, rows: list[dict[str, Any]], settings: RLSettings, *, ref=None, teacher=None
) -> dict[str, Any]:
    """One update of `model` on `rows` (advantages assigned here if the rows carry none); see RLTrainer.update."""
    return RLTrainer(model, processor, settings, ref=ref, teacher=teacher).update(rows)
