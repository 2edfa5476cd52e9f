"""Benchmark (GPU): RL update throughput of the project's loss path (training.rl.RLTrainer), GRPO vs SDPO, and
TRL's `GRPOTrainer` loss on the same batch.

    python benchmarks/rl_gpu.py [--size 2b] [--batch 8] [--modes lora full] [--algos grpo sdpo]
                                [--sdpo-modes sampled topk] [--steps 10] [--trl] [--ablate-kernels] [--breakdown]
                                [--ablate-levers] [--ablate-text]
    python benchmarks/rl_gpu.py --size tiny --batch 4 --steps 1 --warmup 1 --screen 320x176 --text-tokens 150  # CPU

Model: Qwen3-VL with the released 2B shape (random init, bf16, SDPA, no gradient checkpointing), as
benchmarks/sft_gpu.py builds it: LoRA r16 on the language model (bf16 adapters, the project default) or full
fine-tuning, vision frozen in both.
Rows: shaped as training/rl_data.py makes them, through its own `episode_rows` (the rollouts' prompt builder): one
step per episode, episodes in groups of --group (half of each group succeeded), one 1280x704 screenshot (880 image
tokens after the 2x2 merge), ~--text-tokens prompt text tokens (system prompt, task, UI-element text), a sampled
response of 64-96 random token ids with behaviour log-probs. SDPO rows carry the teacher context that
`attach_sdpo_context` gives them ("both": a successful sibling's solution, plus the failure feedback on failed rows).
  ours: RLTrainer(model, processor, RLSettings(algorithm=..., sdpo_mode=...)).update(rows) with epochs = warmup +
        steps, so one call encodes the rows (RowEncoder), puts them on the GPU (bf16 pixel_values; the SDPO teacher's
        rows share them), scores old log-probs once and runs warmup + steps optimizer steps (`_step`) over the same
        batch; each `_step` is timed (pad of the resident rows, forward + backward + AdamW, the SDPO teacher's
        no-grad forward on its re-prompted rows and its EMA update included). prep_s = the update's time outside
        `_step` (CPU encoding, the copy to the GPU, the old-log-prob forward), once per update. The trainer binds
        Liger's fused RMSNorm/SwiGLU/RoPE onto the model when liger-kernel is installed (rl.fused_kernels; `kernels`
        in the JSON says what was applied); --ablate-kernels also times GRPO with them off ("grpo_no_kernels");
        --ablate-levers times GRPO as before issue #33 ("grpo_before": no fast_vision / linear patch embedding /
        fused AdamW, the padding mask in the forward) before and after "grpo" ("_again"), `speedup_vs_before`;
        --ablate-text times it on the previous session's path around "grpo" ("grpo_prev", "grpo_prev_again";
        --prev s20: session 21's q/k norm + RoPE kernel and input-norm residual off; --prev s19: session 20's
        Liger RMSNorm, PEFT LoRA forward, stock DeepStack / linears / tower preamble too), `text_levers`.
        The kernels are taken off the model again before the next run (TRL gets the stock model).
        SDPO runs once per --sdpo-modes entry: "sdpo" (sampled-token) and "sdpo_topk" (logit-level, top-20 + tail).
  trl:  trl.GRPOTrainer (loss_type dr_grpo, the same clip range and max_completion_length as ours), constructed
        normally around the same model object, then `compute_loss(model, inputs)` + `accelerator.backward` + grad
        clip + AdamW (the trainer's own `create_optimizer`, adamw_torch) per step, on the inputs dict its generation
        step would hand it (prompt_ids/mask left-padded, completion_ids/mask right-padded, advantages,
        old_per_token_logps, pixel_values, image_grid_thw, num_images, mm_token_type_ids) built from the same
        encoded rows. Only GRPO: TRL's SDPO trainer is experimental and not compared here.
Prints JSON: per mode x algo x side the median step time, tokens/s (T = prompt + response tokens of the batch, image
tokens included, padding excluded; response tokens/s too), peak memory, MFU = 6*N*T / step / 989 TFLOP/s (N = all
parameters, as in sft_gpu.py; the SDPO teacher's forward is not in T, `mfu_with_teacher` adds 2*N*T_teacher),
SDPO's step time over GRPO's, and TRL's GRPO step over ours. --breakdown (default on) re-times the pieces of our
step on the same batch after the update (median of 5): placing the rows on the GPU (once per update), the per-step
pad of the resident rows, the old per-step pad from host fp32 rows (collate + copy, for reference), forward (with
entropy) and backward of a summed log-prob loss, the optimizer; for SDPO the teacher rows' pad, no-grad forward (and
with top-k, at the student's top-k ids) and EMA update; TRL's step split into forward (compute_loss), backward and
optimizer.
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # test data: synthetic

import torch  # noqa: E402

PEAK_BF16 = 989e12  # H100 SXM dense bf16
PREV = "s20"  # what the --ablate-text "prev" sides run (--prev)


def _cuda() -> bool:
    return torch.cuda.is_available()


def _sync() -> None:
    if _cuda():
        torch.cuda.synchronize()


def _peak_gib() -> float | None:
    return round(torch.cuda.max_memory_allocated() / 2**30, 2) if _cuda() else None


def _reset_peak() -> None:
    gc.collect()
    if _cuda():
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()


# ------------------------------------------------------------------------------------------------ rows
def _ui_text(n: int, rng, w: int, h: int) -> str:
    """n UI elements in the env's `role "label" @ (x,y) [wxh]` form (screen pixels)."""
    kinds = ("button", "link", "textbox", "checkbox", "tab", "label")
    out = []
    for i in range(n):
        x, y = int(rng.integers(10, w - 10)), int(rng.integers(10, h - 10))
        out.append(
            f'{kinds[i % len(kinds)]} "Item {int(rng.integers(0, 999))}" @ ({x},{y}) '
            f"[{int(rng.integers(20, 200))}x{int(rng.integers(12, 40))}]"
        )
    return "\n".join(out)


def make_rows(
    proc, n: int, *, group: int, screen: tuple[int, int], ui_elems: int, resp: tuple[int, int], seed: int = 0
) -> list[dict]:
    """n step rows through training.rl_data.episode_rows (as tests/test_rl.py builds them): n one-step episodes
    in groups of `group`, the first half of each group successful, each with its own sampled response."""
    import numpy as np
    from synthetic import png_pool

    from agents.actions import Click
    from agents.prompts import PromptOptions
    from training.rl_data import episode_rows

    rng = np.random.default_rng(seed)
    w, h = screen
    pngs = png_pool(4, size=screen, seed=seed)
    tok = proc.tokenizer
    rows = []
    for i in range(n):
        eid, ok = f"ep{i:03d}", (i % group) < max(group // 2, 1)
        a = Click(x=int(rng.integers(0, w)), y=int(rng.integers(0, h)))
        k = int(rng.integers(resp[0], resp[1] + 1))
        ids = rng.integers(100, tok.vocab_size, k).tolist()
        episode = dict(
            episode_id=eid,
            task_id="click-button",
            seed=i // group,
            split="train",
            instruction=f"Click the button labelled Item {i}.",
            policy="student",
            group_id=f"g{i // group}",
            sample_idx=i % group,
            task_reward=float(ok),
            success=ok,
            status="ok",
            n_steps=1,
            run_key="bench",
        )
        step = dict(
            episode_id=eid,
            step_idx=0,
            is_final=False,
            screenshot=pngs[i % len(pngs)],
            screen_w=w,
            screen_h=h,
            ui_text=_ui_text(ui_elems, rng, w, h),
            thought=f"The button is at ({a.x},{a.y}).",
            action_desc="Click the button",
            raw_action=json.dumps({"action": "click", "x": a.x, "y": a.y}),
            action=json.dumps({"action": "click", "x": a.x, "y": a.y}),
            parse_ok=True,
            parse_error=None,
            exec_error=None,
            token_ids=ids,
            logprobs=(-12.0 + rng.normal(0, 0.5, k)).tolist(),
            feedback=None if ok else "The click landed on no button.",
            run_key="bench",
        )
        rows += episode_rows(episode, [step], arch="qwen3-vl", opts=PromptOptions())
    return rows


def _image_tokens(proc, enc: dict) -> int:
    merge = getattr(proc.image_processor, "merge_size", 2)
    return int(enc["image_grid_thw"].prod(-1).sum()) // merge**2


def calibrate_ui(proc, text_tokens: int, screen: tuple[int, int]) -> int:
    """How many UI elements give ~text_tokens prompt text tokens (a linear fit of two probe rows)."""
    from training.rl import RowEncoder

    enc = RowEncoder(proc)

    def text_len(k: int) -> int:
        r = make_rows(proc, 1, group=1, screen=screen, ui_elems=k, resp=(1, 1), seed=123)[0]
        e = enc.encode(r["messages"], r["images"], [1])
        return e["input_ids"].shape[1] - 1 - _image_tokens(proc, e)

    a, b = text_len(0), text_len(20)
    return max(0, round((text_tokens - a) * 20 / max(b - a, 1)))


def batch_shape(proc, rows: list[dict]) -> dict:
    """Token counts of the batch as the student and the SDPO teacher see it (unpadded)."""
    from training.rl import RowEncoder, teacher_messages
    from training.rl_data import attach_sdpo_context

    enc = RowEncoder(proc)
    rows = attach_sdpo_context([dict(r) for r in rows], "both")
    p, t, img, r_, extra = [], [], [], [], []
    for r in rows:
        ids = enc.response_ids(r)
        e = enc.encode(r["messages"], r["images"], ids)
        n = e["input_ids"].shape[1]
        p.append(n - len(ids))
        r_.append(len(ids))
        img.append(_image_tokens(proc, e))
        if r.get("sdpo"):
            te = enc.encode(
                teacher_messages(r["messages"], r.get("sdpo_solution"), r.get("sdpo_feedback")), r["images"], ids
            )
            t.append(te["input_ids"].shape[1])
            extra.append(t[-1] - n)
    return {
        "rows": len(rows),
        "tokens": sum(p) + sum(r_),
        "response_tokens": sum(r_),
        "prompt_tokens_mean": sum(p) / len(p),
        "image_tokens_mean": sum(img) / len(img),
        "text_prompt_tokens_mean": (sum(p) - sum(img)) / len(p),
        "response_tokens_mean": sum(r_) / len(r_),
        "teacher_rows": len(t),
        "teacher_tokens": sum(t),
        "teacher_extra_prompt_tokens_mean": sum(extra) / max(len(extra), 1),
    }


# ------------------------------------------------------------------------------------------------ models
def build(size: str, mode: str):
    from training.models import apply_lora, build_model, count_parameters, freeze_vision

    model, proc = build_model("qwen3-vl", size, seed=0, dtype="auto", device="auto")
    model.config.use_cache = False
    if mode == "lora":
        model = apply_lora(model, r=16, alpha=32, dropout=0.0, fp32_adapters=False)  # the project default (bf16)
    else:
        freeze_vision(model)
    return model, proc, count_parameters(model)


def _stats(times: list[float], shape: dict, n_params: int, batch: int, teacher: bool = False) -> dict:
    t = sorted(times)[len(times) // 2]
    out = {
        "batch": batch,
        "step_s": round(t, 4),
        "tokens_per_s": round(shape["tokens"] / t, 1),
        "response_tokens_per_s": round(shape["response_tokens"] / t, 1),
        "peak_mem_gib": _peak_gib(),
        "mfu": round(6 * n_params * shape["tokens"] / t / PEAK_BF16, 3) if _cuda() else None,
        "steps_timed": len(times),
    }
    if teacher and _cuda():
        flops = (6 * shape["tokens"] + 2 * shape["teacher_tokens"]) * n_params
        out["mfu_with_teacher"] = round(flops / t / PEAK_BF16, 3)
    return out


# ------------------------------------------------------------------------------------------------ ours
def run_ours(
    model,
    proc,
    rows,
    algo: str,
    steps: int,
    warmup: int,
    shape: dict,
    n_params: int,
    lr: float,
    breakdown: bool = False,
    sdpo_mode: str = "sampled",
    kernels: bool = True,
    levers: bool = True,
    text: bool = True,
) -> dict:
    """One RLTrainer.update over the batch with epochs = warmup + steps (one optimizer step per epoch). `levers`
    False: the step as before issue #33 (Liger only: no fast_vision, no linear patch embedding, foreach AdamW, the
    padding mask in the forward). `text` False: the previous session's path (PREV): "s20" (default) session 21's
    text levers off (training.kernels.SESSION21_LEVERS: the q/k norm + RoPE kernel, the input norm keeping the
    residual, Liger's MLP as a shared-input group); "s19" session 20's off too (TEXT_LEVERS and the vision grid
    cache / LayerNorm: Liger's RMSNorm, PEFT's LoRA forward, the stock DeepStack adds and tower preamble)."""
    import training.kernels as K
    import training.rl as rl_mod
    import training.rl_encode as enc_mod
    from training.kernels import unfuse_model
    from training.rl import RLSettings, RLTrainer

    saved = rl_mod.fast_vision, rl_mod.linear_patch_embed, rl_mod.make_optimizer
    if not levers:
        rl_mod.fast_vision, rl_mod.linear_patch_embed = (lambda m: []), (lambda m: False)
        rl_mod.make_optimizer = lambda w, lr, wd, fused=False: saved[2](w, lr, wd)
    enc_mod.NO_PAD_MASK = levers  # before: the padded rows' attention mask went into the forward
    K.TEXT_LEVERS.update({k: text for k in K.SESSION21_LEVERS})
    K.VISION_LEVERS.update({k: text for k in K.SESSION21_VISION_LEVERS})
    if PREV == "s19":  # the prev sides without session 20's levers either
        K.TEXT_LEVERS.update(rms_norm=text, lora=text, deepstack=text, shared_input=text, add_norm=text)
        K.VISION_LEVERS.update(grid_cache=text, layer_norm=text)

    s = RLSettings(
        algorithm=algo,
        lr=lr,
        batch_size=len(rows),
        epochs=warmup + steps,
        seed=0,
        sdpo_mode=sdpo_mode,
        sdpo_hint="episode",  # the rows' contexts come from attach_sdpo_context above, as before session 47
        sdpo_teacher_check=None,  # random weights read nothing: this is a speed benchmark
        fused_kernels=kernels,
    )
    try:
        trainer = RLTrainer(model, proc, s)
        rl_mod.fast_vision, rl_mod.linear_patch_embed, rl_mod.make_optimizer = saved
        return time_update(trainer, rows, s, steps, warmup, shape, n_params, breakdown)
    finally:
        rl_mod.fast_vision, rl_mod.linear_patch_embed, rl_mod.make_optimizer = saved
        enc_mod.NO_PAD_MASK = True
        K.TEXT_LEVERS.update({k: True for k in K.TEXT_LEVERS})
        K.VISION_LEVERS.update({k: True for k in K.VISION_LEVERS})
        unfuse_model(model)  # the next run (and TRL) gets the stock model


def time_update(trainer, rows, s, steps: int, warmup: int, shape: dict, n_params: int, breakdown: bool) -> dict:
    times: list[float] = []
    inner = trainer._step

    def timed_step(*a, **kw):
        _sync()
        t0 = time.perf_counter()
        m = inner(*a, **kw)
        _sync()
        times.append(time.perf_counter() - t0)
        return m

    trainer._step = timed_step
    urows = [dict(r) for r in rows]  # update prepares (advantages, SDPO context) these copies in place
    _reset_peak()
    t0 = time.perf_counter()
    res = trainer.update(urows)
    _sync()
    total = time.perf_counter() - t0
    out = _stats(times[warmup:], shape, n_params, len(rows), teacher=s.distill_weight > 0)
    last = res["steps"][-1]
    out.update(
        kernels=trainer.kernels,
        sdpo_mode=s.sdpo_mode if s.distill_weight > 0 else None,
        prep_s=round(total - sum(times), 3),
        first_step_s=round(times[0], 3),
        n_rows=last["n_rows"],
        n_sdpo_rows=last["n_sdpo_rows"],
        loss_finite=all(torch.isfinite(torch.tensor(m["loss"])).item() for m in res["steps"]),
    )
    if breakdown:
        out["breakdown"] = _breakdown(trainer, urows)
    del trainer, res
    return out


def _median_time(fn, reps: int) -> float:
    times = []
    for _ in range(reps):
        _sync()
        t0 = time.perf_counter()
        fn()
        _sync()
        times.append(time.perf_counter() - t0)
    return round(sorted(times)[len(times) // 2], 4)


def _breakdown(trainer, rows: list[dict], reps: int = 5) -> dict:
    """Where a `_step` goes, re-timed piece by piece on the same batch with the trainer's own encoder, model,
    optimizer and teacher: placing the encoded rows on the GPU (`RLTrainer._resident`, once per update), the pad
    of the resident rows a step does, the old per-step pad from host fp32 rows (collate + copy, for reference),
    the student's forward (response_logprobs with entropy) and backward of a summed log-prob loss, the optimizer
    step (training.core.optimizer_step), and for SDPO the teacher rows' pad, no-grad forward (at the student's
    top-k ids in topk mode) and EMA update."""
    from training.core import optimizer_step
    from training.rl import response_logprobs, teacher_messages

    enc, dev, model, dt = trainer.encoder, trainer.device, trainer.model, trainer.pixel_dtype
    encs = [enc.encode(r["messages"], r["images"], enc.response_ids(r)) for r in rows]
    sd = [i for i, r in enumerate(rows) if r.get("sdpo")] if trainer.teacher is not None else []
    tencs = {
        i: enc.encode(
            teacher_messages(rows[i]["messages"], rows[i].get("sdpo_solution"), rows[i].get("sdpo_feedback")),
            rows[i]["images"],
            enc.response_ids(rows[i]),
        )
        for i in sd
    }
    out = {
        "collate_cpu_s": _median_time(lambda: enc.collator.pad(encs), reps),
        "pad_from_host_fp32_s": _median_time(lambda: enc.pad(encs, dev), reps),
        "place_rows_once_s": _median_time(lambda: trainer._resident(encs, dict(tencs)), reps),
    }
    res, tres = trainer._resident(encs, dict(tencs))
    out["pad_resident_s"] = _median_time(lambda: enc.pad(res, dev, dt), reps)
    batch, pos, mask = enc.pad(res, dev, dt)
    n = float(mask.sum())
    fw, bw, opt = [], [], []
    topk = trainer.s.sdpo_mode == "topk" and bool(sd)
    for _ in range(reps):
        _sync()
        t0 = time.perf_counter()
        lp, _, *top = response_logprobs(model, batch, pos, mask, entropy=True, topk=trainer.s.sdpo_topk if topk else 0)
        _sync()
        t1 = time.perf_counter()
        (-(lp.sum()) / n).backward()
        _sync()
        t2 = time.perf_counter()
        optimizer_step(trainer.weights, trainer.opt, trainer.s.grad_clip)
        _sync()
        fw.append(t1 - t0)
        bw.append(t2 - t1)
        opt.append(time.perf_counter() - t2)
    med = lambda v: round(sorted(v)[len(v) // 2], 4)  # noqa: E731
    out.update(fwd_s=med(fw), bwd_s=med(bw), fwd_bwd_s=med([a + b for a, b in zip(fw, bw)]), optimizer_s=med(opt))
    if sd:
        tl = [tres[i] for i in sd]
        out["teacher_pad_resident_s"] = _median_time(lambda: enc.pad(tl, dev, dt), reps)
        tb, tpos, tmask = enc.pad(tl, dev, dt)
        at = top[0][1][:, : tpos.shape[1]] if topk else None

        def teacher_fwd():
            with torch.no_grad():
                response_logprobs(trainer.teacher, tb, tpos, tmask, at=at)

        out["teacher_fwd_s"] = _median_time(teacher_fwd, reps)
        if trainer.s.sdpo_teacher == "ema":
            out["ema_s"] = _median_time(trainer._ema, reps)
    return out


# ------------------------------------------------------------------------------------------------ TRL
def _no_reward(completions, **kw):
    return [0.0] * len(completions)


def trl_inputs(model, proc, rows: list[dict], device) -> dict:
    """The dict GRPOTrainer._compute_loss reads, built from the rows as our RowEncoder encodes them: prompts
    left-padded, completions right-padded (TRL's layout), old log-probs from one no-grad forward (ours)."""
    from training.rl import RowEncoder, response_logprobs
    from training.rl_data import assign_advantages

    rows, _ = assign_advantages([dict(r) for r in rows], mode="zscore")
    enc = RowEncoder(proc)
    encs = [enc.encode(r["messages"], r["images"], enc.response_ids(r)) for r in rows]
    pad_id = proc.tokenizer.pad_token_id if proc.tokenizer.pad_token_id is not None else 0
    n_p = [int((e["labels"][0] == -100).sum()) for e in encs]
    n_r = [e["input_ids"].shape[1] - p for e, p in zip(encs, n_p)]
    P, R, B = max(n_p), max(n_r), len(encs)
    prompt_ids = torch.full((B, P), pad_id, dtype=torch.long)
    prompt_mask = torch.zeros((B, P), dtype=torch.long)
    completion_ids = torch.full((B, R), pad_id, dtype=torch.long)
    completion_mask = torch.zeros((B, R), dtype=torch.long)
    mm = torch.zeros((B, P + R), dtype=torch.long) if "mm_token_type_ids" in encs[0] else None
    for i, (e, p, r) in enumerate(zip(encs, n_p, n_r)):
        ids = e["input_ids"][0]
        prompt_ids[i, P - p :], prompt_mask[i, P - p :] = ids[:p], 1
        completion_ids[i, :r], completion_mask[i, :r] = ids[p:], 1
        if mm is not None:
            mm[i, P - p : P] = e["mm_token_type_ids"][0][:p]
    with torch.no_grad():
        batch, pos, mask = enc.pad(encs, device)
        old, _ = response_logprobs(model.eval(), batch, pos, mask)
    old_t = torch.zeros((B, R), dtype=torch.float32)
    old_t[:, : old.shape[1]] = old.float().cpu()
    inputs = {
        "prompt_ids": prompt_ids,
        "prompt_mask": prompt_mask,
        "completion_ids": completion_ids,
        "completion_mask": completion_mask,
        "advantages": torch.tensor([r["advantage"] for r in rows], dtype=torch.float32),
        "old_per_token_logps": old_t,
        "num_items_in_batch": completion_mask.sum().float(),
        "pixel_values": torch.cat([e["pixel_values"] for e in encs]),
        "image_grid_thw": torch.cat([e["image_grid_thw"] for e in encs]),
    }
    if mm is not None:
        inputs["mm_token_type_ids"] = mm
    inputs = {k: v.to(device) for k, v in inputs.items()}
    inputs["pixel_values"] = inputs["pixel_values"].to(next(model.parameters()).dtype)
    inputs["num_images"] = [len(r["images"]) for r in rows]
    return inputs


def run_trl(
    model,
    proc,
    rows,
    steps: int,
    warmup: int,
    shape: dict,
    n_params: int,
    lr: float,
    group: int,
    max_completion: int,
    out_dir: str,
) -> dict:
    """GRPOTrainer built normally around `model`, then its compute_loss + backward + clip + AdamW per step."""
    import trl
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    from training.rl import RLSettings

    eps_low, eps_high = RLSettings().clip
    B = len(rows)
    args = GRPOConfig(
        output_dir=out_dir,
        per_device_train_batch_size=B,
        num_generations=min(group, B),
        gradient_checkpointing=False,
        bf16=_cuda(),
        loss_type="dr_grpo",
        epsilon=eps_low,
        epsilon_high=eps_high,
        beta=0.0,
        max_completion_length=max_completion,
        learning_rate=lr,
        optim="adamw_torch",
        adam_beta1=0.9,
        adam_beta2=0.98,
        weight_decay=0.0,
        max_grad_norm=1.0,
        report_to="none",
        save_strategy="no",
        logging_strategy="no",
        use_cpu=not _cuda(),
        dataloader_num_workers=0,
        seed=0,
    )
    ds = Dataset.from_dict({"prompt": [[{"role": "user", "content": "x"}]] * B})
    tr = GRPOTrainer(model=model, reward_funcs=_no_reward, args=args, train_dataset=ds, processing_class=proc)
    tr.current_gradient_accumulation_steps = 1  # set by Trainer's train loop, which is not run here
    inputs = trl_inputs(model, proc, rows, next(model.parameters()).device)
    opt = tr.create_optimizer()
    params = [p for g in opt.param_groups for p in g["params"]]
    model.train()  # as Trainer.training_step does (dropout is 0 in this model)
    times, losses, fb, fw = [], [], [], []
    _reset_peak()
    for _ in range(warmup + steps):
        _sync()
        t0 = time.perf_counter()
        with tr.compute_loss_context_manager():
            loss = tr.compute_loss(model, inputs)
        _sync()
        fw.append(time.perf_counter() - t0)
        tr.accelerator.backward(loss)
        _sync()
        t1 = time.perf_counter()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        _sync()
        times.append(time.perf_counter() - t0)
        fb.append(t1 - t0)
        losses.append(float(loss.detach()))
    out = _stats(times[warmup:], shape, n_params, B)
    med = lambda v: round(sorted(v)[len(v) // 2], 4)  # noqa: E731
    out["breakdown"] = {
        "fwd_s": med(fw[warmup:]),
        "bwd_s": med([b - f for b, f in zip(fb[warmup:], fw[warmup:])]),
        "fwd_bwd_s": round(sorted(fb[warmup:])[len(fb[warmup:]) // 2], 4),
        "optimizer_s": round(sorted(t - f for t, f in zip(times[warmup:], fb[warmup:]))[steps // 2], 4),
    }
    out.update(
        first_step_s=round(times[0], 3),
        loss_finite=all(torch.isfinite(torch.tensor(losses)).tolist()),
        trl_version=trl.__version__,
        padded_tokens=int(B * (inputs["prompt_ids"].shape[1] + inputs["completion_ids"].shape[1])),
    )
    model.eval()
    del tr, opt, inputs, params
    return out


def _guard(fn, batch: int) -> dict:
    """fn()'s result; an OOM or another error is recorded in its place, so the other runs still report."""
    try:
        return fn()
    except torch.cuda.OutOfMemoryError:
        _reset_peak()
        return {"batch": batch, "oom": True}
    except Exception as e:  # noqa: BLE001
        import traceback

        traceback.print_exc()
        _reset_peak()
        return {"batch": batch, "error": f"{type(e).__name__}: {e}"[:500]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", default="2b", help="2b (GPU) or tiny (CPU smoke)")
    ap.add_argument("--batch", type=int, default=8, help="rows per optimizer step (RLSettings.batch_size)")
    ap.add_argument("--group", type=int, default=4, help="episodes per group (half of each succeeded)")
    ap.add_argument("--modes", nargs="+", default=["lora", "full"])
    ap.add_argument("--algos", nargs="+", default=["grpo", "sdpo"])
    ap.add_argument(
        "--sdpo-modes",
        nargs="+",
        default=["sampled", "topk"],
        choices=["sampled", "topk"],
        help="rl.sdpo_mode values to time SDPO with (sampled -> 'sdpo', topk -> 'sdpo_topk')",
    )
    ap.add_argument(
        "--ablate-kernels",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="also time our GRPO step with rl.fused_kernels off ('grpo_no_kernels')",
    )
    ap.add_argument(
        "--ablate-levers",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="also time GRPO as before issue #33 ('grpo_before': Liger only, no fast_vision / linear patch "
        "embedding / fused AdamW, the padding mask in the forward), right before and after 'grpo'",
    )
    ap.add_argument(
        "--ablate-text",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="also time GRPO on the previous session's path ('grpo_prev', see --prev), right before and after "
        "'grpo'; `text_levers` compares the pairs",
    )
    ap.add_argument(
        "--prev",
        choices=("s20", "s19"),
        default="s20",
        help="what 'grpo_prev' runs: s20 = session 21's text levers off (the session-20 commit's step); s19 = "
        "session 20's text levers off too",
    )
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--text-tokens", type=int, default=600, help="prompt text tokens per row (approximate)")
    ap.add_argument("--resp-min", type=int, default=64)
    ap.add_argument("--resp-max", type=int, default=96, help="<= RLSettings.max_new_tokens (96)")
    ap.add_argument("--screen", default="1280x704", help="screenshot WxH")
    ap.add_argument("--lr", type=float, default=1e-5)
    ap.add_argument(
        "--trl",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="also time TRL's GRPOTrainer loss on the same batch",
    )
    ap.add_argument(
        "--breakdown",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="ours: also time the pieces of a step (collate, copy, fwd+bwd, optimizer, teacher)",
    )
    ap.add_argument("--out", default=None, help="also write the JSON here")
    a = ap.parse_args()
    global PREV
    PREV = a.prev
    screen = tuple(int(x) for x in a.screen.lower().split("x"))
    from training.rl import ALGORITHMS, RLSettings

    for algo in a.algos:
        if algo not in ALGORITHMS:
            ap.error(f"unknown algo {algo!r}: use {', '.join(ALGORITHMS)}")
    max_new = RLSettings().max_new_tokens
    out = {
        "benchmark": "rl_gpu_step",
        "size": a.size,
        "gpu": torch.cuda.get_device_name(0) if _cuda() else "cpu",
        "torch": torch.__version__,
        "batch": a.batch,
        "group": a.group,
        "screen": list(screen),
        "steps": a.steps,
        "warmup": a.warmup,
        "results": {},
    }
    import transformers

    out["transformers"] = transformers.__version__
    rows, shape = None, None
    for mode in a.modes:
        model, proc, counts = build(a.size, mode)
        if rows is None:
            ui = calibrate_ui(proc, a.text_tokens, screen)
            rows = make_rows(proc, a.batch, group=a.group, screen=screen, ui_elems=ui, resp=(a.resp_min, a.resp_max))
            shape = batch_shape(proc, rows)
            out["batch_shape"] = dict(shape, ui_elements=ui)
            print(json.dumps({"batch_shape": out["batch_shape"]}), file=sys.stderr)
        res = out["results"].setdefault(
            mode, {"params": counts["total"], "trainable_params": counts["trainable"], "ours": {}}
        )
        runs = []  # (result key, algo, sdpo_mode, fused kernels, issue-33 levers, session-20 text levers)
        for algo in a.algos:
            if algo == "sdpo":
                runs += [("sdpo" if m == "sampled" else f"sdpo_{m}", algo, m, True, True, True) for m in a.sdpo_modes]
            else:
                grpo = algo == "grpo" and _cuda()
                if grpo and a.ablate_levers:
                    runs.append(("grpo_before", algo, "sampled", True, False, False))
                if grpo and a.ablate_text:
                    runs.append(("grpo_prev", algo, "sampled", True, True, False))
                runs.append((algo, algo, "sampled", True, True, True))
                if grpo and a.ablate_levers:
                    runs.append(("grpo_before_again", algo, "sampled", True, False, False))
                if grpo and a.ablate_text:
                    runs.append(("grpo_prev_again", algo, "sampled", True, True, False))
                if grpo and (a.ablate_levers or a.ablate_text):
                    runs.append(("grpo_again", algo, "sampled", True, True, True))
                if grpo and a.ablate_kernels:
                    runs.append(("grpo_no_kernels", algo, "sampled", False, True, True))
        for key, algo, sdpo_mode, kern, lev, text in runs:
            res["ours"][key] = _guard(
                lambda: run_ours(
                    model,
                    proc,
                    rows,
                    algo,
                    a.steps,
                    a.warmup,
                    shape,
                    counts["total"],
                    a.lr,
                    a.breakdown,
                    sdpo_mode,
                    kern,
                    lev,
                    text,
                ),
                a.batch,
            )
            print(json.dumps({mode: {"ours": {key: res["ours"][key]}}}), file=sys.stderr)
            _reset_peak()
        if a.trl:
            try:
                res["trl"] = {
                    "grpo": _guard(
                        lambda: run_trl(
                            model,
                            proc,
                            rows,
                            a.steps,
                            a.warmup,
                            shape,
                            counts["total"],
                            a.lr,
                            a.group,
                            max_new,
                            f"/tmp/rl_bench_trl_{mode}",
                        ),
                        a.batch,
                    )
                }
            except Exception as e:  # report, keep the other numbers
                res["trl"] = {"grpo": {"error": f"{type(e).__name__}: {e}"[:500]}}
            print(json.dumps({mode: {"trl": res["trl"]}}), file=sys.stderr)
        ours = res["ours"]
        if "step_s" in ours.get("grpo", {}):
            for key in ours:
                if not key.startswith("grpo") and "step_s" in ours[key]:
                    res[f"{key}_over_grpo_step"] = round(ours[key]["step_s"] / ours["grpo"]["step_s"], 3)
            if "step_s" in ours.get("grpo_before", {}):
                res["speedup_vs_before"] = round(ours["grpo_before"]["step_s"] / ours["grpo"]["step_s"], 3)
            pairs = [k for k in ("grpo_prev", "grpo_prev_again") if "step_s" in ours.get(k, {})]
            nows = [k for k in ("grpo", "grpo_again") if "step_s" in ours.get(k, {})]
            if pairs and nows:  # session 20: the last commit (text levers off) vs now, each side's median averaged
                prev = sum(ours[k]["step_s"] for k in pairs) / len(pairs)
                now = sum(ours[k]["step_s"] for k in nows) / len(nows)
                res["text_levers"] = {
                    "step_s_prev": round(prev, 4),
                    "step_s_now": round(now, 4),
                    "speedup": round(prev / now, 3),
                    "mfu_prev": round(sum(ours[k]["mfu"] for k in pairs) / len(pairs), 3),
                    "mfu_now": round(sum(ours[k]["mfu"] for k in nows) / len(nows), 3),
                }
            trl_s = res.get("trl", {}).get("grpo", {}).get("step_s")
            if trl_s:
                res["speedup_vs_trl_grpo"] = round(trl_s / ours["grpo"]["step_s"], 3)
                if "step_s" in ours.get("grpo_no_kernels", {}):
                    res["speedup_vs_trl_grpo_no_kernels"] = round(trl_s / ours["grpo_no_kernels"]["step_s"], 3)
        model = None  # drop the reference before the next mode's build
        _reset_peak()
    text = json.dumps(out, indent=1)
    print(text)
    if a.out:
        Path(a.out).parent.mkdir(parents=True, exist_ok=True)
        Path(a.out).write_text(text + "\n")


if __name__ == "__main__":
    main()
