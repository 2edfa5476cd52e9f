"""The RL trainer's GPU path: fused kernels bound onto a built model (training.kernels.fuse_model) give the stock
modules' log-probs and gradients within bf16 rounding and come off again (unfuse_model); an update's rows live on
the device with bf16 pixels, the SDPO teacher's rows sharing them. The CUDA tests skip without CUDA and
liger-kernel; `python tests/test_rl_kernels.py` runs them without pytest (the GPU box has no pytest). On CPU:
nothing is fused and rows stay on the host (the CPU update is unchanged)."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

try:
    import pytest  # noqa: E402

    gpu = pytest.mark.skipif(
        not torch.cuda.is_available() or importlib.util.find_spec("liger_kernel") is None,
        reason="needs CUDA and liger-kernel",
    )
except ImportError:  # run as a script on the GPU box
    pytest = None

    def gpu(f):
        return f


def _rows(proc, n: int = 4) -> list[dict]:
    """n one-step episodes in one group (half succeeded), each with its own random response."""
    from synthetic import png_pool

    from agents.actions import Click
    from agents.prompts import PromptOptions
    from training.rl_data import episode_rows

    g = torch.Generator().manual_seed(0)
    pngs, rows = png_pool(2, size=(320, 176)), []
    for i in range(n):
        ok = i < n // 2
        ids = torch.randint(100, proc.tokenizer.vocab_size, (12 + i,), generator=g).tolist()
        ep = dict(
            episode_id=f"e{i}",
            task_id="click-test",
            seed=0,
            split="train",
            instruction="Click OK.",
            policy="student",
            group_id="g",
            sample_idx=i,
            task_reward=float(ok),
            success=ok,
            status="ok",
            n_steps=1,
            run_key="k",
        )
        a = Click(x=10 + i, y=20)
        step = dict(
            episode_id=f"e{i}",
            step_idx=0,
            is_final=False,
            screenshot=pngs[i % 2],
            screen_w=320,
            screen_h=176,
            ui_text='button "OK" @ (80,120) [40x20]',
            thought="OK.",
            action_desc="Click OK",
            raw_action=json.dumps({"action": "click", "x": a.x, "y": a.y}),
            action=json.dumps({"action": "click", "x": a.x, "y": a.y}),
            parse_ok=True,
            parse_error=None,
            exec_error=None,
            token_ids=ids,
            logprobs=[-8.0] * len(ids),
            feedback=None if ok else "Missed.",
            run_key="k",
        )
        rows += episode_rows(ep, [step], arch="qwen3-vl", opts=PromptOptions())
    return rows


def _model(device: str, lora: bool = False):
    from training.models import apply_lora, build_model

    model, proc = build_model("qwen3-vl", "tiny", seed=0, dtype="auto", device=device)
    if lora:
        model = apply_lora(model, r=8, alpha=16, dropout=0.0, fp32_adapters=False)
    return model, proc


def _logp_and_grads(model, batch, pos, mask):
    from training.rl import response_logprobs

    model.zero_grad(set_to_none=True)
    lp, ent = response_logprobs(model, batch, pos, mask, entropy=True)
    (-(lp[mask]).sum()).backward()
    grads = {n: p.grad.float().clone() for n, p in model.named_parameters() if p.grad is not None}
    return lp.detach().float(), ent.float(), grads


@gpu
def test_fused_model_matches_the_stock_modules_and_comes_off_again():
    from transformers.models.qwen3_vl import modeling_qwen3_vl as m

    from training.kernels import fuse_model, unfuse_model
    from training.rl import RowEncoder

    for lora in (False, True):
        model, proc = _model("cuda", lora=lora)
        model.eval()
        stock_rope = m.apply_rotary_pos_emb
        enc = RowEncoder(proc)
        rows = _rows(proc)
        batch, pos, mask = enc.pad([enc.encode(r["messages"], r["images"], enc.response_ids(r)) for r in rows], "cuda")
        lp0, ent0, g0 = _logp_and_grads(model, batch, pos, mask)
        assert fuse_model(model) == ["rms_norm", "rope", "swiglu"]
        assert fuse_model(model) == ["rms_norm", "rope", "swiglu"]  # idempotent
        lp1, ent1, g1 = _logp_and_grads(model, batch, pos, mask)
        assert (lp1 - lp0).abs().max() < 0.05 * lp0.abs().max(), (lp0, lp1)  # bf16 rounding, not another function
        assert (ent1 - ent0).abs().max() < 0.05 * ent0.abs().max()
        assert g0.keys() == g1.keys() and g0
        for n in g0:
            cos = torch.nn.functional.cosine_similarity(g0[n].flatten(), g1[n].flatten(), dim=0)
            assert cos > 0.98 or g0[n].norm() < 1e-6, (n, float(cos))
        unfuse_model(model)
        assert m.apply_rotary_pos_emb is stock_rope
        assert not any("forward" in mod.__dict__ for mod in model.modules())
        lp2, _, _ = _logp_and_grads(model, batch, pos, mask)
        assert (lp2 - lp0).abs().max() <= 1e-3 * lp0.abs().max()  # the stock path again


@gpu
def test_trainer_on_cuda_fuses_keeps_rows_on_the_device_and_shares_teacher_pixels():
    from training.kernels import unfuse_model
    from training.rl import RLSettings, RLTrainer, teacher_messages
    from training.rl_data import attach_sdpo_context

    model, proc = _model("cuda", lora=True)
    for mode in ("sampled", "topk"):
        # random weights: no teacher check; the whole-episode block gives every row a context
        s = RLSettings(
            algorithm="sdpo",
            lr=1e-4,
            batch_size=4,
            epochs=2,
            sdpo_mode=mode,
            sdpo_hint="episode",
            sdpo_teacher_check=None,
        )
        tr = RLTrainer(model, proc, s)
        assert {"rms_norm", "rope", "swiglu", "lora"} <= set(tr.kernels) and tr.pixel_dtype == torch.bfloat16
        assert any("forward" in mod.__dict__ for mod in tr.teacher.modules())  # the teacher runs fused too
        rows = attach_sdpo_context(_rows(proc), "both")
        enc = [tr.encoder.encode(r["messages"], r["images"], tr.encoder.response_ids(r)) for r in rows]
        tenc = {
            i: tr.encoder.encode(
                teacher_messages(r["messages"], r.get("sdpo_solution"), r.get("sdpo_feedback")),
                r["images"],
                tr.encoder.response_ids(r),
            )
            for i, r in enumerate(rows)
            if r.get("sdpo")
        }
        res, tres = tr._resident(enc, dict(tenc))
        assert tres and all(v.is_cuda for e in res for v in e.values())
        assert all(e["pixel_values"].dtype == torch.bfloat16 for e in res)
        assert all(tres[i]["pixel_values"].data_ptr() == res[i]["pixel_values"].data_ptr() for i in tres)
        out = tr.update([dict(r) for r in rows])
        assert len(out["steps"]) == 2 and all(torch.isfinite(torch.tensor(st["loss"])) for st in out["steps"])
        assert out["steps"][0]["n_sdpo_rows"] == 4
        unfuse_model(model)


def test_on_cpu_nothing_is_fused_and_rows_stay_on_the_host():
    from training.kernels import fuse_model
    from training.rl import RLSettings, RLTrainer

    model, proc = _model("cpu")
    tr = RLTrainer(model, proc, RLSettings(algorithm="sdpo", batch_size=2))
    assert tr.kernels == [] and fuse_model(model) == [] and tr.pixel_dtype == torch.float32
    assert not any("forward" in mod.__dict__ for mod in model.modules())
    rows = _rows(proc, 2)
    enc = [tr.encoder.encode(r["messages"], r["images"], tr.encoder.response_ids(r)) for r in rows]
    res, _ = tr._resident(enc, {})
    assert all(a is b for a, b in zip(res, enc))  # the same host tensors the CPU update always used


def test_padding_mask_left_out_changes_no_response_logprob():
    """Right-padded rows without the padding mask (rl_encode.NO_PAD_MASK, what lets attention take the causal flash
    kernels on CUDA): the same response log-probs and gradients as with it, rows of different lengths."""
    import training.rl_encode as enc_mod
    from training.rl import RLSettings, RLTrainer

    model, proc = _model("cpu")
    tr = RLTrainer(model, proc, RLSettings(batch_size=4))
    rows = _rows(proc, 4)  # responses of 12..15 tokens: the batch is padded
    enc = [tr.encoder.encode(r["messages"], r["images"], tr.encoder.response_ids(r)) for r in rows]
    batch, pos, mask = tr.encoder.pad(enc, "cpu")
    assert not bool(batch["attention_mask"].all())
    got = {}
    for drop in (True, False):
        enc_mod.NO_PAD_MASK = drop
        try:
            got[drop] = _logp_and_grads(model, batch, pos, mask)
        finally:
            enc_mod.NO_PAD_MASK = True
    (lp1, ent1, g1), (lp0, ent0, g0) = got[True], got[False]
    assert torch.allclose(lp1[mask], lp0[mask], atol=1e-5, rtol=1e-5)
    assert torch.allclose(ent1[mask], ent0[mask], atol=1e-5, rtol=1e-5)
    for n in g0:
        assert torch.allclose(g1[n], g0[n], atol=1e-5, rtol=1e-4), n


def test_image_attention_groups_equal_images_and_matches_per_image_attention():
    """training.kernels.image_attention (one SDPA call per run of equally sized images) against one call per image;
    vision_rope off CUDA is the stock function."""
    import torch.nn.functional as F
    from transformers.models.qwen3_vl.modeling_qwen3_vl import apply_rotary_pos_emb_vision

    import training.kernels as K

    g = torch.Generator().manual_seed(0)
    lengths = [6, 6, 9, 6, 6]
    q, k, v = (torch.randn(sum(lengths), 4, 8, generator=g) for _ in range(3))
    before, K.vision.VISION_SDPA = K.vision.VISION_SDPA, ("math",)
    try:
        got = K.image_attention(q, k, v, lengths, 8**-0.5)
    finally:
        K.vision.VISION_SDPA = before
    ref, a = [], 0
    for n in lengths:
        qs, ks, vs = (x[a : a + n].transpose(0, 1)[None] for x in (q, k, v))
        ref.append(F.scaled_dot_product_attention(qs, ks, vs, scale=8**-0.5)[0].transpose(0, 1).reshape(n, 32))
        a += n
    assert got.shape == (sum(lengths), 32) and torch.allclose(got, torch.cat(ref), atol=1e-6)
    cos, sin = torch.randn(sum(lengths), 8, generator=g), torch.randn(sum(lengths), 8, generator=g)
    for x, y in zip(K.vision_rope(q, k, cos, sin), apply_rotary_pos_emb_vision(q, k, cos, sin)):
        assert torch.equal(x, y)


def test_fast_vision_only_on_cuda_and_unfuse_takes_it_off():
    from training.kernels import fast_vision, linear_patch_embed, unfuse_model

    model, _ = _model("cpu")
    assert fast_vision(model) == []  # CPU: the stock tower (the main job's numbers were measured on it)
    assert linear_patch_embed(model)
    unfuse_model(model)
    assert not any("forward" in mod.__dict__ for mod in model.modules())


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA") if pytest else (lambda f: f)
def test_fast_vision_tower_matches_the_stock_tower_on_cuda():
    """bf16 on the GPU: the tower's outputs with fast_vision's forwards (Triton RoPE, batched image attention, GELU in
    the GEMM epilogue) vs the stock forwards, relative L2 per output (bf16 rounding compounds over the layers)."""
    from training.data import cat_rows
    from training.kernels import fast_vision, unfuse_model
    from training.models import freeze_vision

    model, proc = _model("cuda")
    freeze_vision(model)
    tr_rows = _rows(proc, 3)
    from training.rl import RowEncoder

    enc = RowEncoder(proc)
    encs = [enc.encode(r["messages"], r["images"], enc.response_ids(r)) for r in tr_rows]
    pv = torch.cat([e["pixel_values"] for e in encs]).cuda().to(next(model.parameters()).dtype)
    grid = torch.cat([e["image_grid_thw"] for e in encs]).cuda()
    visual = model.model.visual
    with torch.no_grad():
        stock = visual(pv, grid_thw=grid)
        assert {"vision_gelu_epilogue", "vision_rope_attention"} <= set(fast_vision(model))
        fast = visual(pv, grid_thw=grid)
    unfuse_model(model)
    a, b = fast.last_hidden_state.float(), stock.last_hidden_state.float()
    assert float((a - b).norm() / b.norm()) < 3e-2
    parts = [e["pixel_values"].pin_memory() for e in encs]  # kept page-locked: copied per part, no host concat
    rows = cat_rows(parts, pin=True)
    assert type(rows).__name__ == "PinnedRows" and torch.equal(rows.to("cuda").cpu(), torch.cat(parts))


if __name__ == "__main__":
    for name, fn in list(globals().items()):
        if name.startswith("test_") and callable(fn):
            fn()
            print("passed", name, flush=True)
