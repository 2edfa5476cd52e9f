"""RMSNorm for the trained text model: Triton kernels (triton_ops) that take a block of rows per program, as autograd
functions, with the stock torch math (or Liger's kernel) as the fallback.

    y = rms_norm(x, weight, eps)              # RMSNormFn on CUDA with Triton, else Liger's / torch
    s, y = _add_rms_fn().apply(a, b, w, eps)  # the residual add and the norm after it, one pass each way
    r, y = _residual_rms_fn().apply(x, w, eps)  # y = norm(x), r = x: the gradients reaching r are added in the norm's
                                                # backward kernel (no separate add of the residual's gradient)
    z = qk_norm_rope(x, w, cos, sin, eps)     # the attention's q/k norm over the head dim, then the RoPE (one kernel)

Liger's RMSNorm backward walks one row at a time per SM, a latency-bound loop: on the H100 its backward took 46 ms of
a 1.25 s packed step, ~2.5x the memory-traffic bound (session 20).
"""

from __future__ import annotations

from training.kernels.common import _rms_blocks, _rows, _sm_count, triton_cdiv

# The backward's launch per row width (block_n): (rows a block, programs per SM, warps, dW summed once at the end).
# Measured on an H100 (session 20, benchmarks/sft_mfu.py rms_check --rms-sweep); other widths: _rms_blocks.
RMS_BWD_CONFIG: dict[int, tuple[int, int, int, bool]] = {2048: (1, 4, 4, False), 128: (64, 8, 8, True)}


def _rms_bwd_config(n: int) -> tuple[int, int, int, int, bool]:
    block_n, block_m, warps = _rms_blocks(n)
    bm, per_sm, w, acc2d = RMS_BWD_CONFIG.get(block_n, (block_m, 4, warps, block_m >= 16))
    return block_n, bm, per_sm, w, acc2d


def _rms_kernels():
    """(fwd, bwd): raises ImportError without Triton."""
    from training.kernels import triton_ops

    return triton_ops.rms_fwd, triton_ops.rms_bwd


def _rms_fwd(x2, weight, eps: float, add=None):
    """(y, rstd, s): the norm of x2 (+ add, stored to s) as [M, N] rows."""
    import torch

    fwd, _ = _rms_kernels()
    m, n = x2.shape
    y = torch.empty((m, n), dtype=torch.promote_types(x2.dtype, weight.dtype), device=x2.device)
    rstd = torch.empty(m, dtype=torch.float32, device=x2.device)
    s = torch.empty_like(x2) if add is not None else None
    b = add if add is not None else x2
    block_n, block_m, warps = _rms_blocks(n)
    if m:
        fwd[(triton_cdiv(m, block_m),)](
            x2, weight, y, rstd, b, s if s is not None else y, m, n, eps, x2.stride(0), y.stride(0), b.stride(0),
            (s if s is not None else y).stride(0), HAS_ADD=add is not None, BLOCK_M=block_m, BLOCK_N=block_n,
            num_warps=warps,
        )  # fmt: skip
    return y, rstd, s


def _persistent(m: int, block_m: int, per_sm: int, device) -> tuple[int, int]:
    """(programs, rows a program) of a backward that loops over blocks of rows."""
    progs = max(1, min(triton_cdiv(m, block_m), per_sm * _sm_count(device)))
    per_prog = triton_cdiv(triton_cdiv(m, progs), block_m) * block_m
    return max(1, triton_cdiv(m, per_prog)), per_prog


def _rms_bwd(dy2, x2, weight, rstd, has_dw: bool, ds2=None):
    """(dx, dw) for rows x2 (+ ds2 added to dx)."""
    import torch

    _, bwd = _rms_kernels()
    m, n = x2.shape
    dx = torch.empty_like(x2)
    block_n, block_m, per_sm, warps, acc2d = _rms_bwd_config(n)
    progs, per_prog = _persistent(m, block_m, per_sm, x2.device)
    part = torch.empty((progs, n) if has_dw else (1, n), dtype=torch.float32, device=x2.device)
    d = ds2 if ds2 is not None else dy2
    if m:
        bwd[(progs,)](
            dy2, x2, weight, rstd, dx, part, d, m, n, dy2.stride(0), x2.stride(0), dx.stride(0), d.stride(0), per_prog,
            HAS_DW=has_dw, BLOCK_M=block_m, BLOCK_N=block_n, ACC2D=acc2d, HAS_DS=ds2 is not None, num_warps=warps,
        )  # fmt: skip
    return dx, (part.sum(0).to(weight.dtype) if has_dw else None)


_RMS_FN: dict = {}


def _norm_forward(ctx, x, weight, eps: float):
    """The norm of x's rows, saved for _norm_backward."""
    x2 = _rows(x, x.shape[-1])
    y, rstd, _ = _rms_fwd(x2, weight, eps)
    ctx.save_for_backward(x2, weight, rstd)
    ctx.shape = x.shape
    return y.view(x.shape)


def _norm_backward(ctx, dy, ds=None):
    """dx (+ ds, the gradient reaching x by another path) in x's shape; dw (or None) in ctx.dw."""
    x2, weight, rstd = ctx.saved_tensors
    n = x2.shape[1]
    dx, ctx.dw = _rms_bwd(_rows(dy, n), x2, weight, rstd, ctx.needs_input_grad[1], None if ds is None else _rows(ds, n))
    return dx.view(ctx.shape)


def _rms_fns() -> dict:
    if not _RMS_FN:
        import torch

        _rms_kernels()  # ImportError here, not inside a forward

        class RMSNormFn(torch.autograd.Function):
            @staticmethod
            def forward(ctx, x, weight, eps):
                return _norm_forward(ctx, x, weight, eps)

            @staticmethod
            def backward(ctx, dy):
                return _norm_backward(ctx, dy, None), ctx.dw, None

        class AddRMSNormFn(torch.autograd.Function):
            """(s, y) = (a + b, rms_norm(a + b)): the residual add and the norm after it in one pass each way."""

            @staticmethod
            def forward(ctx, a, b, weight, eps):
                n = a.shape[-1]
                y, rstd, s = _rms_fwd(_rows(a, n), weight, eps, add=_rows(b, n))
                ctx.save_for_backward(s, weight, rstd)
                ctx.shape = a.shape
                return s.view(a.shape), y.view(a.shape)

            @staticmethod
            def backward(ctx, ds, dy):
                s, weight, rstd = ctx.saved_tensors
                n = s.shape[1]
                ds2 = None if ds is None else _rows(ds, n)
                if dy is None:
                    dx, dw = ds2, None
                else:
                    dx, dw = _rms_bwd(_rows(dy, n), s, weight, rstd, ctx.needs_input_grad[2], ds2)
                dx = None if dx is None else dx.view(ctx.shape)
                return dx, dx, dw, None

        class ResidualRMSNormFn(torch.autograd.Function):
            """(r, y) = (x, rms_norm(x)) with r a view of x: the decoder layer's input kept as the residual and its
            input norm. In backward the residual's gradient is added inside the norm's backward kernel (HAS_DS),
            where autograd would add the two gradients of x with a separate pass."""

            @staticmethod
            def forward(ctx, x, weight, eps):
                return x.view_as(x), _norm_forward(ctx, x, weight, eps)

            @staticmethod
            def backward(ctx, dr, dy):
                if dy is None:
                    return dr, None, None
                return _norm_backward(ctx, dy, dr), ctx.dw, None

        class QKNormRopeFn(torch.autograd.Function):
            """z = rope(rms_norm(x over the head dim)): x [..., tokens, heads, head_dim] with cos/sin [tokens,
            head_dim] (the leading dims flattened into tokens)."""

            @staticmethod
            def forward(ctx, x, weight, cos, sin, eps):
                from training.kernels import triton_ops

                d, h = x.shape[-1], x.shape[-2]
                x2 = _rows(x, d)
                c2, s2 = _rows(cos, d), _rows(sin, d)
                m = x2.shape[0]
                y = torch.empty_like(x2)
                rstd = torch.empty(m, dtype=torch.float32, device=x.device)
                _, block_m, warps = _rms_blocks(d)
                if m:
                    triton_ops.qk_fwd[(triton_cdiv(m, block_m),)](
                        x2, weight, c2, s2, y, rstd, m, h, eps, BLOCK_M=block_m, HALF=d // 2, num_warps=warps
                    )
                ctx.save_for_backward(x2, weight, c2, s2, rstd)
                ctx.shape, ctx.h = x.shape, h
                return y.view(x.shape)

            @staticmethod
            def backward(ctx, dz):
                from training.kernels import triton_ops

                x2, weight, c2, s2, rstd = ctx.saved_tensors
                m, d = x2.shape
                dz2 = _rows(dz, d)
                dx = torch.empty_like(x2)
                has_dw = ctx.needs_input_grad[1]
                _, block_m, per_sm, warps, _ = _rms_bwd_config(d)
                progs, per_prog = _persistent(m, block_m, per_sm, x2.device)
                part = torch.empty((progs, d) if has_dw else (1, d), dtype=torch.float32, device=x2.device)
                if m:
                    triton_ops.qk_bwd[(progs,)](
                        dz2, x2, weight, c2, s2, rstd, dx, part, m, ctx.h, per_prog, HAS_DW=has_dw, BLOCK_M=block_m,
                        HALF=d // 2, num_warps=warps,
                    )  # fmt: skip
                dw = part.sum(0).to(weight.dtype) if has_dw else None
                return dx.view(ctx.shape), dw, None, None, None

        _RMS_FN.update(rms=RMSNormFn, add=AddRMSNormFn, residual=ResidualRMSNormFn, qk=QKNormRopeFn)
    return _RMS_FN


def _rms_fn():
    return _rms_fns()["rms"]


def _add_rms_fn():
    return _rms_fns()["add"]


def _residual_rms_fn():
    return _rms_fns()["residual"]


def qk_norm_rope_supported(x, weight, cos, sin) -> bool:
    """Whether qk_norm_rope's kernel takes these: CUDA, one dtype, a power-of-two head dim, cos/sin one row per
    token of x (x [B, T, H, D], cos/sin [B, T, D])."""
    d = x.shape[-1]
    return (
        x.is_cuda
        and x.dim() == 4
        and x.dtype == weight.dtype == cos.dtype == sin.dtype
        and d >= 16
        and d & (d - 1) == 0
        and weight.shape == (d,)
        and tuple(cos.shape) == tuple(sin.shape) == (x.shape[0], x.shape[1], d)
    )


def qk_norm_rope(x, weight, cos, sin, eps: float):
    """The Qwen3 attention's q (or k) path: RMSNorm over the head dim (llama-style rounding) then rotate-half RoPE,
    as one Triton kernel each way. x [B, T, H, D] (a view of the projection), cos/sin [B, T, D]; returns
    [B, T, H, D] contiguous. Callers check `qk_norm_rope_supported` first."""
    return _rms_fns()["qk"].apply(x, weight, cos, sin, eps)


def rms_norm(x, weight, eps: float):
    """Llama-style RMSNorm, `weight * (x * rsqrt(mean(x^2) + eps)).to(x.dtype)` with the statistics in fp32 (the
    Qwen/Llama RMSNorm modules' math). CUDA with Triton and TEXT_LEVERS["rms_norm"]: this package's kernels (one
    rounding per output; the backward in fp32, dW summed in fp32 per block of rows); else Liger's kernel on CUDA when
    installed, else the torch ops."""
    import torch

    from training.kernels.common import TEXT_LEVERS

    if x.is_cuda and x.shape[-1] <= 65536:
        if TEXT_LEVERS["rms_norm"]:
            try:
                return _rms_fn().apply(x, weight, eps)
            except ImportError:
                pass
        try:
            from liger_kernel.ops import LigerRMSNormFunction

            # (X, W, eps, offset, casting_mode, in_place, row_mode): LigerRMSNorm's defaults
            return LigerRMSNormFunction.apply(x, weight, eps, 0.0, "llama", True, None)
        except ImportError:
            pass
    dtype = x.dtype
    h = x.to(torch.float32)
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(dtype)


_RMS_CLASS: list = []


def rms_norm_class():
    """An RMSNorm module (parameter `weight`, attribute `variance_epsilon`, as the Qwen classes) whose forward is
    `rms_norm`: what apply_fused_kernels puts in place of the stock class for SFT."""
    if not _RMS_CLASS:
        import torch

        class FlywheelRMSNorm(torch.nn.Module):
            def __init__(self, hidden_size, eps: float = 1e-6, **_):
                super().__init__()
                self.weight = torch.nn.Parameter(torch.ones(hidden_size))
                self.variance_epsilon = eps

            def forward(self, hidden_states):
                return rms_norm(hidden_states, self.weight, self.variance_epsilon)

            def extra_repr(self):
                return f"{tuple(self.weight.shape)}, eps={self.variance_epsilon}"

        _RMS_CLASS.append(FlywheelRMSNorm)
    return _RMS_CLASS[0]
