"""The Triton kernels of training.kernels, in one module that imports Triton at the top: the other modules import it
lazily (`from training.kernels import triton_ops`) and fall back to torch / Liger when that raises ImportError.

    rope            the vision RoPE over q and k (vision.vision_rope)
    ln              the tower's no-grad LayerNorm, optionally with the residual add before it (vision)
    rms_fwd/rms_bwd RMSNorm, optionally with a residual add before it (norms)
    qk_fwd/qk_bwd   the text attention's q/k RMSNorm over the head dim with the RoPE after it (norms.qk_norm_rope)

`row_block` is the row-block setup the LayerNorm and RMSNorm forwards share: a program's BLOCK_M rows of an
[M, N] row-major input, its masks, and the block loaded in fp32 (with the residual added before the norm, stored).
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def row_block(X, M, N, sx, A, S, sa, ss, HAS_ADD: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """(rows, cols, row mask, col mask, 2-D mask, int64 row offsets [BLOCK_M, 1], the block in fp32). HAS_ADD: the
    block is X + A rounded to X's dtype (as a separate add would round it), also stored to S."""
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.arange(0, BLOCK_N)
    rm, cm = rows < M, cols < N
    mask = rm[:, None] & cm[None, :]
    r64 = rows.to(tl.int64)[:, None]
    x = tl.load(X + r64 * sx + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    if HAS_ADD:
        a = tl.load(A + r64 * sa + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        xs = (x + a).to(X.dtype.element_ty)
        tl.store(S + r64 * ss + cols[None, :], xs, mask=mask)
        x = xs.to(tl.float32)
    return rows, cols, rm, cm, mask, r64, x


@triton.jit
def rope(q, k, qo, ko, cos, sin, sq, sqh, sk, skh, sc, ss, n_heads, HEADS: tl.constexpr, HALF: tl.constexpr):
    # one program per token: every head's q and k, rotate-half RoPE in fp32, rounded once to the output dtype
    t = tl.program_id(0).to(tl.int64)
    h = tl.arange(0, HEADS)[:, None]
    d = tl.arange(0, HALF)[None, :]
    m = h < n_heads
    c1 = tl.load(cos + t * sc + d).to(tl.float32)
    c2 = tl.load(cos + t * sc + HALF + d).to(tl.float32)
    s1 = tl.load(sin + t * ss + d).to(tl.float32)
    s2 = tl.load(sin + t * ss + HALF + d).to(tl.float32)
    out = t * n_heads * 2 * HALF + h * 2 * HALF + d
    x1 = tl.load(q + t * sq + h * sqh + d, mask=m).to(tl.float32)
    x2 = tl.load(q + t * sq + h * sqh + HALF + d, mask=m).to(tl.float32)
    tl.store(qo + out, (x1 * c1 - x2 * s1).to(qo.dtype.element_ty), mask=m)
    tl.store(qo + out + HALF, (x2 * c2 + x1 * s2).to(qo.dtype.element_ty), mask=m)
    x1 = tl.load(k + t * sk + h * skh + d, mask=m).to(tl.float32)
    x2 = tl.load(k + t * sk + h * skh + HALF + d, mask=m).to(tl.float32)
    tl.store(ko + out, (x1 * c1 - x2 * s1).to(ko.dtype.element_ty), mask=m)
    tl.store(ko + out + HALF, (x2 * c2 + x1 * s2).to(ko.dtype.element_ty), mask=m)


@triton.jit
def ln(X, W, B, Y, A, S, M, N, eps, sx, sy, sa, ss, HAS_ADD: tl.constexpr, BLOCK_M: tl.constexpr,
       BLOCK_N: tl.constexpr):  # fmt: skip
    # HAS_ADD: the input is X + A (rounded to the input dtype, as a separate add), also stored to S
    rows, cols, rm, cm, mask, r64, x = row_block(X, M, N, sx, A, S, sa, ss, HAS_ADD, BLOCK_M, BLOCK_N)
    mean = tl.sum(x, axis=1) / N
    xc = tl.where(mask, x - mean[:, None], 0.0)
    rstd = tl.rsqrt(tl.sum(xc * xc, axis=1) / N + eps)
    w = tl.load(W + cols, mask=cm, other=0.0).to(tl.float32)
    b = tl.load(B + cols, mask=cm, other=0.0).to(tl.float32)
    y = xc * rstd[:, None] * w[None, :] + b[None, :]
    tl.store(Y + r64 * sy + cols[None, :], y.to(Y.dtype.element_ty), mask=mask)


@triton.jit
def rms_fwd(
    X, W, Y, RSTD, B, S, M, N, eps, sx, sy, sb, ss,
    HAS_ADD: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):  # fmt: skip
    # HAS_ADD: the input is X + B (rounded to the input dtype, as a separate add), also stored to S
    rows, cols, rm, cm, mask, r64, x = row_block(X, M, N, sx, B, S, sb, ss, HAS_ADD, BLOCK_M, BLOCK_N)
    rstd = tl.rsqrt(tl.sum(x * x, axis=1) / N + eps)
    w = tl.load(W + cols, mask=cm, other=0.0).to(tl.float32)
    n = (x * rstd[:, None]).to(X.dtype.element_ty).to(tl.float32)  # rounded to the input dtype, as stock
    tl.store(Y + r64 * sy + cols[None, :], (n * w[None, :]).to(Y.dtype.element_ty), mask=mask)
    tl.store(RSTD + rows, rstd, mask=rm)


@triton.jit
def rms_bwd(
    DY, X, W, RSTD, DX, DW, DS, M, N, sdy, sx, sdx, sds, per_prog,
    HAS_DW: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, ACC2D: tl.constexpr,
    HAS_DS: tl.constexpr,
):  # fmt: skip
    # HAS_DS: DS (the gradient reaching the input by another path: the residual) is added to dx
    # one program per `per_prog` rows, BLOCK_M rows at a time; dW partial sums per program in fp32, summed
    # over the rows every block (ACC2D False) or once at the end (True: wide blocks of narrow rows)
    pid = tl.program_id(0)
    cols = tl.arange(0, BLOCK_N)
    cm = cols < N
    w = tl.load(W + cols, mask=cm, other=0.0).to(tl.float32)
    if ACC2D:
        acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    else:
        acc = tl.zeros([BLOCK_N], dtype=tl.float32)
    start = pid * per_prog
    end = tl.minimum(start + per_prog, M)
    for i in range(0, per_prog, BLOCK_M):
        rows = start + i + tl.arange(0, BLOCK_M)
        rm = rows < end
        mask = rm[:, None] & cm[None, :]
        r64 = rows.to(tl.int64)[:, None]
        x = tl.load(X + r64 * sx + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        dy = tl.load(DY + r64 * sdy + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        rstd = tl.load(RSTD + rows, mask=rm, other=0.0)
        xh = x * rstd[:, None]
        if HAS_DW:
            if ACC2D:
                acc += dy * xh.to(X.dtype.element_ty).to(tl.float32)
            else:
                acc += tl.sum(dy * xh.to(X.dtype.element_ty).to(tl.float32), axis=0)
        dn = dy * w[None, :]
        c = tl.sum(dn * xh, axis=1) / N
        dx = (dn - xh * c[:, None]) * rstd[:, None]
        if HAS_DS:
            dx += tl.load(DS + r64 * sds + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        tl.store(DX + r64 * sdx + cols[None, :], dx.to(DX.dtype.element_ty), mask=mask)
    if HAS_DW:
        if ACC2D:
            tl.store(DW + pid.to(tl.int64) * N + cols, tl.sum(acc, axis=0), mask=cm)
        else:
            tl.store(DW + pid.to(tl.int64) * N + cols, acc, mask=cm)


# The q/k RMSNorm over the head dim and the rotate-half RoPE after it (session 21). Rows are (token, head) pairs of a
# contiguous [tokens * heads, 2 * HALF] input; a row's token (for cos/sin, [tokens, 2 * HALF]) is row // H. The
# norm's output is rounded as the stock module rounds it (x * rstd to the input dtype, times the weight, rounded),
# and the RoPE is fp32 math on that, rounded once.
@triton.jit
def qk_fwd(X, W, COS, SIN, Y, RSTD, M, H, eps, BLOCK_M: tl.constexpr, HALF: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    rm = rows < M
    m = rm[:, None]
    d = tl.arange(0, HALF)[None, :]
    r64 = rows.to(tl.int64)[:, None]
    t = (rows // H).to(tl.int64)[:, None]
    x1 = tl.load(X + r64 * (2 * HALF) + d, mask=m, other=0.0).to(tl.float32)
    x2 = tl.load(X + r64 * (2 * HALF) + HALF + d, mask=m, other=0.0).to(tl.float32)
    rstd = tl.rsqrt((tl.sum(x1 * x1, axis=1) + tl.sum(x2 * x2, axis=1)) / (2 * HALF) + eps)
    w1 = tl.load(W + d).to(tl.float32)
    w2 = tl.load(W + HALF + d).to(tl.float32)
    dt = X.dtype.element_ty
    y1 = ((x1 * rstd[:, None]).to(dt).to(tl.float32) * w1).to(dt).to(tl.float32)
    y2 = ((x2 * rstd[:, None]).to(dt).to(tl.float32) * w2).to(dt).to(tl.float32)
    c1 = tl.load(COS + t * (2 * HALF) + d, mask=m, other=0.0).to(tl.float32)
    c2 = tl.load(COS + t * (2 * HALF) + HALF + d, mask=m, other=0.0).to(tl.float32)
    s1 = tl.load(SIN + t * (2 * HALF) + d, mask=m, other=0.0).to(tl.float32)
    s2 = tl.load(SIN + t * (2 * HALF) + HALF + d, mask=m, other=0.0).to(tl.float32)
    tl.store(Y + r64 * (2 * HALF) + d, (y1 * c1 - y2 * s1).to(Y.dtype.element_ty), mask=m)
    tl.store(Y + r64 * (2 * HALF) + HALF + d, (y2 * c2 + y1 * s2).to(Y.dtype.element_ty), mask=m)
    tl.store(RSTD + rows, rstd, mask=rm)


@triton.jit
def qk_bwd(DZ, X, W, COS, SIN, RSTD, DX, DW, M, H, per_prog, HAS_DW: tl.constexpr, BLOCK_M: tl.constexpr,
           HALF: tl.constexpr):  # fmt: skip
    # the RoPE's transpose (dy1 = dz1 c1 + dz2 s2, dy2 = dz2 c2 - dz1 s1), then the RMSNorm backward as rms_bwd's;
    # dW partial sums per program (2-D, summed once at the end)
    pid = tl.program_id(0)
    d = tl.arange(0, HALF)[None, :]
    w1 = tl.load(W + d).to(tl.float32)
    w2 = tl.load(W + HALF + d).to(tl.float32)
    acc1 = tl.zeros([BLOCK_M, HALF], dtype=tl.float32)
    acc2 = tl.zeros([BLOCK_M, HALF], dtype=tl.float32)
    start = pid * per_prog
    end = tl.minimum(start + per_prog, M)
    dt = X.dtype.element_ty
    for i in range(0, per_prog, BLOCK_M):
        rows = start + i + tl.arange(0, BLOCK_M)
        rm = rows < end
        m = rm[:, None]
        r64 = rows.to(tl.int64)[:, None]
        t = (rows // H).to(tl.int64)[:, None]
        dz1 = tl.load(DZ + r64 * (2 * HALF) + d, mask=m, other=0.0).to(tl.float32)
        dz2 = tl.load(DZ + r64 * (2 * HALF) + HALF + d, mask=m, other=0.0).to(tl.float32)
        c1 = tl.load(COS + t * (2 * HALF) + d, mask=m, other=0.0).to(tl.float32)
        c2 = tl.load(COS + t * (2 * HALF) + HALF + d, mask=m, other=0.0).to(tl.float32)
        s1 = tl.load(SIN + t * (2 * HALF) + d, mask=m, other=0.0).to(tl.float32)
        s2 = tl.load(SIN + t * (2 * HALF) + HALF + d, mask=m, other=0.0).to(tl.float32)
        dy1 = dz1 * c1 + dz2 * s2
        dy2 = dz2 * c2 - dz1 * s1
        x1 = tl.load(X + r64 * (2 * HALF) + d, mask=m, other=0.0).to(tl.float32)
        x2 = tl.load(X + r64 * (2 * HALF) + HALF + d, mask=m, other=0.0).to(tl.float32)
        rstd = tl.load(RSTD + rows, mask=rm, other=0.0)[:, None]
        xh1, xh2 = x1 * rstd, x2 * rstd
        if HAS_DW:
            acc1 += dy1 * xh1.to(dt).to(tl.float32)
            acc2 += dy2 * xh2.to(dt).to(tl.float32)
        dn1, dn2 = dy1 * w1, dy2 * w2
        c = (tl.sum(dn1 * xh1, axis=1) + tl.sum(dn2 * xh2, axis=1))[:, None] / (2 * HALF)
        tl.store(DX + r64 * (2 * HALF) + d, ((dn1 - xh1 * c) * rstd).to(DX.dtype.element_ty), mask=m)
        tl.store(DX + r64 * (2 * HALF) + HALF + d, ((dn2 - xh2 * c) * rstd).to(DX.dtype.element_ty), mask=m)
    if HAS_DW:
        base = DW + pid.to(tl.int64) * (2 * HALF) + tl.arange(0, HALF)
        tl.store(base, tl.sum(acc1, axis=0))
        tl.store(base + HALF, tl.sum(acc2, axis=0))
