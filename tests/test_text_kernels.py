"""The text model's levers in training.kernels (session 20): `rms_norm` (Triton kernels on CUDA, the stock math
elsewhere) and `fast_lora` (PEFT's LoRA linear as one autograd function). On CPU: the fallback is the stock
module's math, and the fused LoRA function gives PEFT's outputs and gradients (dropout on and off) and comes off
again. The CUDA tests skip without CUDA; `python tests/test_text_kernels.py` runs them without pytest (the GPU box
has no pytest)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

try:
    import pytest  # noqa: E402

    cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
except ImportError:  # run as a script on the GPU box
    pytest = None

    def cuda(f):
        return f


def _stock_rms(x, w, eps):
    from transformers.models.qwen3_vl.modeling_qwen3_vl import Qwen3VLTextRMSNorm

    m = Qwen3VLTextRMSNorm(x.shape[-1], eps=eps).to(device=x.device, dtype=w.dtype)
    with torch.no_grad():
        m.weight.copy_(w)
    return m(x)


def test_rms_norm_off_cuda_is_the_stock_math_and_the_module_keeps_the_names():
    from transformers.models.qwen3_vl.modeling_qwen3_vl import Qwen3VLTextRMSNorm

    from training.kernels import rms_norm, rms_norm_class

    g = torch.Generator().manual_seed(0)
    for dtype in (torch.float32, torch.bfloat16):
        x = (torch.randn(3, 5, 64, generator=g) * 3).to(dtype)
        w = (1 + 0.1 * torch.randn(64, generator=g)).to(dtype)
        assert torch.equal(rms_norm(x, w, 1e-6), _stock_rms(x, w, 1e-6))
    ours, stock = rms_norm_class()(64, eps=1e-5), Qwen3VLTextRMSNorm(64, eps=1e-5)
    assert ours.state_dict().keys() == stock.state_dict().keys() and ours.variance_epsilon == 1e-5
    ours.load_state_dict(stock.state_dict())


def _lora_model(dropout: float):
    from training.models import apply_lora, build_model

    model, _ = build_model("qwen3-vl", "tiny", seed=0, dtype="auto", device="cpu")
    model = apply_lora(model, r=8, alpha=16, dropout=dropout, fp32_adapters=False)
    for n, p in model.named_parameters():  # PEFT starts B at zero: give it values so the adapter path counts
        if "lora_B" in n:
            with torch.no_grad():
                p.normal_(0, 0.02, generator=torch.Generator().manual_seed(hash(n) % 1000))
    return model


def _out_and_grads(model, ids, seed: int = 0):
    model.zero_grad(set_to_none=True)
    torch.manual_seed(seed)
    logits = model(input_ids=ids).logits
    (logits.float().pow(2).mean()).backward()
    return logits.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def _off_and_on(model, ids, lever: str):
    """(logits, grads) with kernels.TEXT_LEVERS[lever] off, then on (it is left on)."""
    import training.kernels as K

    got = {}
    for on in (False, True):
        K.TEXT_LEVERS[lever] = on
        try:
            got[on] = _out_and_grads(model, ids)
        finally:
            K.TEXT_LEVERS[lever] = True
    return got[False], got[True]


def test_fast_lora_gives_peft_outputs_and_gradients_and_comes_off():
    import training.kernels as K

    ids = torch.randint(5, 200, (2, 17), generator=torch.Generator().manual_seed(1))
    for dropout, train in ((0.0, False), (0.0, True), (0.2, True), (0.2, False)):
        model = _lora_model(dropout)
        model.train(train)
        assert K.fast_lora(model) == []  # CPU: not bound unless forced
        assert K.fast_lora(model, force=True) == ["lora"]
        (y0, g0), (y1, g1) = _off_and_on(model, ids, "lora")
        assert torch.allclose(y1, y0, atol=1e-5, rtol=1e-4), (dropout, train, float((y1 - y0).abs().max()))
        assert g0.keys() == g1.keys() and any("lora_A" in n for n in g0)
        for n in g0:
            assert torch.allclose(g1[n], g0[n], atol=1e-6, rtol=1e-3), (dropout, train, n)
        K.unfuse_model(model)
        assert not any("forward" in mod.__dict__ for mod in model.modules())


def test_shared_input_linears_give_the_stock_outputs_and_gradients():
    """q/k/v and gate/up through one autograd function each (kernels.fast_text): the same logits, and the same
    gradients up to the order of the fp32 sums of the input gradient; off again with unfuse_model."""
    import training.kernels as K
    from training.models import build_model

    model, _ = build_model("qwen3-vl", "tiny", seed=0, dtype="auto", device="cpu")
    ids = torch.randint(5, 200, (2, 17), generator=torch.Generator().manual_seed(1))
    assert K.fast_text(model) == []  # CPU: not bound unless forced
    assert K.fast_text(model, force=True) == ["shared_input_linears"]
    (y0, g0), (y1, g1) = _off_and_on(model, ids, "shared_input")
    assert torch.equal(y1, y0)
    assert g0.keys() == g1.keys() and any("q_proj" in n for n in g0)
    for n in g0:
        assert torch.allclose(g1[n], g0[n], atol=1e-6, rtol=1e-4), n
    K.unfuse_model(model)
    assert not any("forward" in mod.__dict__ or "_flywheel_group" in mod.__dict__ for mod in model.modules())


def test_text_attention_forward_gives_the_stock_outputs_with_a_torch_kernel_stand_in():
    """The bound attention forward (kernels.fast_text on CUDA: q/k norm + RoPE in one kernel) around a torch stand-in
    for the kernel on CPU: the same logits and gradients as the stock forward, and off again with unfuse_model."""
    from types import MethodType

    from transformers.models.qwen3_vl import modeling_qwen3_vl as m

    import training.kernels as K
    import training.kernels.norms as N
    import training.kernels.text as T
    from training.models import build_model

    def stand_in(x, w, cos, sin, eps):
        h = x.float()
        y = w * (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)
        return m.apply_rotary_pos_emb(y.transpose(1, 2), y.transpose(1, 2), cos, sin)[0].transpose(1, 2).contiguous()

    saved = N.qk_norm_rope, N.qk_norm_rope_supported, T._ANY_DEVICE
    N.qk_norm_rope, N.qk_norm_rope_supported, T._ANY_DEVICE = stand_in, (lambda *a: True), True
    try:
        model, _ = build_model("qwen3-vl", "tiny", seed=0, dtype="auto", device="cpu")
        ids = torch.randint(5, 200, (2, 17), generator=torch.Generator().manual_seed(1))
        y0, g0 = _out_and_grads(model, ids)
        attn = [mod for mod in model.modules() if type(mod).__name__ in T._TEXT_ATTN_CLASSES]
        for mod in attn:
            mod.forward = MethodType(T._text_attn_forward, mod)
        (y1, g1), (y2, g2) = _off_and_on(model, ids, "qk_norm_rope")
    finally:
        N.qk_norm_rope, N.qk_norm_rope_supported, T._ANY_DEVICE = saved
    assert attn and torch.equal(y1, y0) and torch.equal(y2, y0)
    assert g0.keys() == g2.keys() and all(torch.equal(g2[n], g0[n]) and torch.equal(g1[n], g0[n]) for n in g0)
    K.unfuse_model(model)
    assert not any("forward" in mod.__dict__ for mod in model.modules())


@cuda
def test_rms_norm_kernels_match_the_stock_math_on_cuda():
    """bf16 and fp32, the text model's widths and odd ones, a strided input: the Triton forward against the stock
    module (one rounding apart at most), the backward against fp32 autograd of the stock math."""
    import training.kernels as K

    g = torch.Generator(device="cuda").manual_seed(0)
    for (m, n), dtype in [((300, 2048), torch.bfloat16), ((4096, 128), torch.bfloat16), ((77, 100), torch.float32)]:
        x = (torch.randn(m, n, device="cuda", generator=g) * 2).to(dtype)
        w = (1 + 0.1 * torch.randn(n, device="cuda", generator=g)).to(dtype)
        dy = torch.randn(m, n, device="cuda", generator=g).to(dtype)
        xi, wi = x.clone().requires_grad_(), w.clone().requires_grad_()
        y = K.rms_norm(xi, wi, 1e-6)
        y.backward(dy)
        ref = _stock_rms(x, w, 1e-6)
        tol = 1e-2 if dtype == torch.bfloat16 else 1e-5
        assert float((y.float() - ref.float()).abs().max() / ref.float().abs().max()) < tol
        xr, wr = x.float().requires_grad_(), w.float().requires_grad_()
        (wr * (xr * torch.rsqrt(xr.pow(2).mean(-1, keepdim=True) + 1e-6))).backward(dy.float())
        for a, b in ((xi.grad, xr.grad), (wi.grad, wr.grad)):
            assert float((a.float() - b).abs().max() / b.abs().max()) < 2 * tol, (m, n, dtype)
    base = torch.randn(64, 3, 256, device="cuda", dtype=torch.bfloat16)
    x = base[:, 1]  # strided rows
    w = torch.ones(256, device="cuda", dtype=torch.bfloat16)
    assert torch.allclose(K.rms_norm(x, w, 1e-6).float(), _stock_rms(x, w, 1e-6).float(), atol=2e-2)


@cuda
def test_fast_lora_matches_peft_on_cuda_bf16():
    import training.kernels as K

    ids = torch.randint(5, 200, (2, 33), generator=torch.Generator().manual_seed(1)).cuda()
    model = _lora_model(0.0).to("cuda", torch.bfloat16)
    model.eval()
    assert K.fast_lora(model) == ["lora"]
    (y0, g0), (y1, g1) = _off_and_on(model, ids, "lora")
    assert float((y1.float() - y0.float()).abs().max() / y0.float().abs().max()) < 3e-2
    for n in g0:
        cos = torch.nn.functional.cosine_similarity(g0[n].float().flatten(), g1[n].float().flatten(), dim=0)
        assert cos > 0.99 or g0[n].norm() < 1e-6, (n, float(cos))
    K.unfuse_model(model)


@cuda
def test_qk_norm_rope_and_residual_norm_match_the_stock_math_on_cuda():
    """Session 21's kernels against fp32 autograd of the stock math (bf16 inputs): the q/k RMSNorm + RoPE kernel
    (output, dx, dw), with the stock bf16 modules' error as the yardstick; ResidualRMSNormFn passes x through and
    its x gradient is the residual's plus the norm's."""
    from transformers.models.qwen3_vl.modeling_qwen3_vl import apply_rotary_pos_emb

    import training.kernels as K

    g = torch.Generator(device="cuda").manual_seed(0)
    for b, t, h, d in ((2, 300, 16, 128), (1, 77, 8, 64)):
        x = (torch.randn(b, t, h, d, device="cuda", generator=g) * 2).to(torch.bfloat16)
        w = (1 + 0.1 * torch.randn(d, device="cuda", generator=g)).to(torch.bfloat16)
        ang = torch.rand(b, t, d // 2, device="cuda", generator=g) * 20
        ang = torch.cat([ang, ang * 0.5], -1)  # halves unequal: the kernel must not assume cos[:h] == cos[h:]
        cos, sin = ang.cos().to(torch.bfloat16), ang.sin().to(torch.bfloat16)
        dz = torch.randn(b, t, h, d, device="cuda", generator=g).to(torch.bfloat16)
        assert K.qk_norm_rope_supported(x, w, cos, sin)
        xi, wi = x.clone().requires_grad_(), w.clone().requires_grad_()
        z = K.qk_norm_rope(xi, wi, cos, sin, 1e-6)
        z.backward(dz)
        xr, wr = x.float().requires_grad_(), w.float().requires_grad_()
        y = wr * (xr * torch.rsqrt(xr.pow(2).mean(-1, keepdim=True) + 1e-6))
        zr = apply_rotary_pos_emb(y.transpose(1, 2), y.transpose(1, 2), cos.float(), sin.float())[0].transpose(1, 2)
        zr.backward(dz.float())
        xs, ws = x.clone().requires_grad_(), w.clone().requires_grad_()  # the stock modules in bf16
        ys = ws * (xs.float() * torch.rsqrt(xs.float().pow(2).mean(-1, keepdim=True) + 1e-6)).to(torch.bfloat16)
        zs = apply_rotary_pos_emb(ys.transpose(1, 2), ys.transpose(1, 2), cos, sin)[0].transpose(1, 2)
        zs.backward(dz)

        def err(a, ref):
            return float((a.float() - ref).abs().max() / ref.abs().max())

        for ours, stock, ref in ((z, zs, zr), (xi.grad, xs.grad, xr.grad), (wi.grad, ws.grad, wr.grad)):
            assert err(ours, ref.detach()) <= max(2 * err(stock, ref.detach()), 1e-2), (b, t, h, d)
    x = (torch.randn(3, 50, 256, device="cuda", generator=g) * 2).to(torch.bfloat16)
    w = (1 + 0.1 * torch.randn(256, device="cuda", generator=g)).to(torch.bfloat16)
    dr, dy = (torch.randn(3, 50, 256, device="cuda", generator=g).to(torch.bfloat16) for _ in range(2))
    xi, wi = x.clone().requires_grad_(), w.clone().requires_grad_()
    r, y = K._residual_rms_fn().apply(xi, wi, 1e-6)
    assert torch.equal(r, x) and torch.equal(y, K.rms_norm(x, w, 1e-6))
    torch.autograd.backward([r, y], [dr, dy])
    xr, wr = x.float().requires_grad_(), w.float().requires_grad_()
    yr = wr * (xr * torch.rsqrt(xr.pow(2).mean(-1, keepdim=True) + 1e-6))
    torch.autograd.backward([xr * 1.0, yr], [dr.float(), dy.float()])
    for a, ref in ((xi.grad, xr.grad), (wi.grad, wr.grad)):
        assert float((a.float() - ref).abs().max() / ref.abs().max()) < 2e-2


@cuda
def test_cross_layer_norm_and_input_norm_residual_match_the_stock_path_on_cuda():
    """Text only, bf16 on the GPU: a layer's output add fused with the next layer's input norm (the hand-over that
    fast_text links after DeepStack's layers; linked here from layer 0) and the input norm keeping the residual give
    the stock logits and gradients within bf16 rounding."""
    import training.kernels as K
    from training.models import build_model

    model, _ = build_model("qwen3-vl", "tiny", seed=0, dtype="auto", device="cuda")
    model = model.to(torch.bfloat16)
    assert "add_rms_norm" in K.fast_text(model)
    layers = model.model.language_model.layers
    layers[0].__dict__["_flywheel_next"] = layers[1]
    ids = torch.randint(5, 200, (1, 40), generator=torch.Generator().manual_seed(1)).cuda()
    got = {}
    for on in (False, True):
        K.TEXT_LEVERS.update(cross_layer_norm=on, input_norm_residual=on)
        try:
            got[on] = _out_and_grads(model, ids)
        finally:
            K.TEXT_LEVERS.update(cross_layer_norm=True, input_norm_residual=True)
    (y0, g0), (y1, g1) = got[False], got[True]
    assert float((y1.float() - y0.float()).abs().max() / y0.float().abs().max()) < 2e-2
    for n in g0:
        cos = torch.nn.functional.cosine_similarity(g0[n].float().flatten(), g1[n].float().flatten(), dim=0)
        assert cos > 0.99 or g0[n].norm() < 1e-6, (n, float(cos))
    assert "_flywheel_pending" not in layers[1].__dict__
    K.unfuse_model(model)
    assert not any("_flywheel_next" in mod.__dict__ for mod in model.modules())


def _image_batch(device: str, n: int = 3):
    from training.models import build_model

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from test_rl_kernels import _rows

    model, proc = build_model("qwen3-vl", "tiny", seed=0, dtype="auto", device=device)
    rows = _rows(proc, n)
    from training.rl import RowEncoder

    enc = RowEncoder(proc)
    encs = [enc.encode(r["messages"], r["images"], enc.response_ids(r)) for r in rows]
    return model, encs


def test_vision_grid_inputs_give_the_same_tower_outputs():
    """The tower's forward with its grid inputs precomputed and cached (what fast_vision binds on CUDA) equals the
    stock forward bitwise (same helpers, same values), also on the cached second call."""
    from types import MethodType

    import training.kernels as K

    model, encs = _image_batch("cpu")
    visual = model.model.visual
    pv = torch.cat([e["pixel_values"] for e in encs]).to(next(visual.parameters()).dtype)
    grid = torch.cat([e["image_grid_thw"] for e in encs])
    with torch.no_grad():
        stock = visual(pv, grid_thw=grid)
        visual.forward = MethodType(K._vision_model_forward, visual)
        first, second = visual(pv, grid_thw=grid), visual(pv, grid_thw=grid)
    assert len(visual.__dict__["_flywheel_grid_inputs"]) == 1
    for out in (first, second):
        assert torch.equal(out.last_hidden_state, stock.last_hidden_state)
        assert torch.equal(out.pooler_output, stock.pooler_output)
        assert all(torch.equal(a, b) for a, b in zip(out.deepstack_features, stock.deepstack_features))
    K.unfuse_model(model)
    assert not any("forward" in mod.__dict__ for mod in model.modules())


@cuda
def test_deepstack_layer_norm_and_host_loss_index_match_the_stock_path_on_cuda():
    """On the tiny model with images, bf16 on the GPU: the labelled-token loss and gradients with DeepStack's
    index_add, the vision LayerNorm kernel, the fused add + RMSNorm, the shared-input linears and the host-side loss
    index stay within bf16 rounding of the stock path."""
    import training.kernels as K
    import training.losses as L

    model, encs = _image_batch("cuda")
    model = model.to(torch.bfloat16)
    e = encs[0]
    batch = {k: v.cuda() for k, v in e.items() if torch.is_tensor(v) and k not in ("labels", "response_mask")}
    batch["pixel_values"] = batch["pixel_values"].to(torch.bfloat16)
    labels = e["input_ids"].clone()
    labels[:, : labels.shape[1] // 2] = -100
    bound = K.fast_vision(model) + K.fast_text(model)
    assert {"deepstack_index", "vision_grid_cache", "vision_layer_norm", "add_rms_norm"} <= set(bound)
    assert {"shared_input_linears", "qk_norm_rope"} <= set(bound)
    levers = ("deepstack", "add_norm", "shared_input", "rms_norm") + K.SESSION21_LEVERS
    got = {}
    for on in (False, True):
        K.VISION_LEVERS["layer_norm"] = K.VISION_LEVERS["grid_cache"] = K.VISION_LEVERS["add_layer_norm"] = on
        K.TEXT_LEVERS.update({k: on for k in levers})
        L.HOST_INDEX = on
        try:
            model.zero_grad(set_to_none=True)
            loss, n = L.labelled_token_loss(model, batch, labels)
            loss.backward()
            grads = {k: p.grad.float().clone() for k, p in model.named_parameters() if p.grad is not None}
            got[on] = (float(loss), n, grads)
        finally:
            K.VISION_LEVERS.update(layer_norm=True, grid_cache=True, add_layer_norm=True)
            K.TEXT_LEVERS.update({k: True for k in levers})
            L.HOST_INDEX = True
    (l0, n0, g0), (l1, n1, g1) = got[False], got[True]
    assert n0 == n1 > 0 and abs(l1 - l0) <= 2e-2 * abs(l0), (l0, l1)
    for k in g0:
        cos = torch.nn.functional.cosine_similarity(g0[k].flatten(), g1[k].flatten(), dim=0)
        assert cos > 0.98 or g0[k].norm() < 1e-6, (k, float(cos))
    K.unfuse_model(model)


if __name__ == "__main__":
    for name, fn in list(globals().items()):
        if name.startswith("test_") and callable(fn):
            fn()
            print("passed", name, flush=True)
