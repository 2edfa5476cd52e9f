"""Small inline SVG charts for the iteration report (no plotting library, no script)."""

from __future__ import annotations

from html import escape
from typing import Any

PALETTE = ("#2563eb", "#dc2626", "#16a34a", "#9333ea", "#ea580c", "#0891b2", "#ca8a04", "#db2777", "#475569")


def _frame(w: int, h: int, title: str, inner: str) -> str:
    return (
        f"<svg class='chart' width='{w}' height='{h}' viewBox='0 0 {w} {h}' style='background:#fff;"
        f"border:1px solid #ddd;margin:4px'><text x='8' y='16' font-size='12' font-weight='bold'>"
        f"{escape(title)}</text>{inner}</svg>"
    )


def line_chart(
    series: dict[str, list[tuple[float, float]]], title: str, xlabel: str, w: int = 300, h: int = 170
) -> str:
    pts = [p for s in series.values() for p in s]
    if not pts:
        return _frame(w, h, title, "<text x='8' y='40' font-size='11' fill='#666'>no data</text>")
    x0, x1 = min(p[0] for p in pts), max(p[0] for p in pts)
    y0, y1 = min(p[1] for p in pts), max(p[1] for p in pts)
    if x1 == x0:
        x1 = x0 + 1
    if y1 == y0:
        y0, y1 = y0 - 0.5, y1 + 0.5
    L, R, T, B = 46, 10, 24, 28

    def sx(x: float) -> float:
        return L + (x - x0) / (x1 - x0) * (w - L - R)

    def sy(y: float) -> float:
        return h - B - (y - y0) / (y1 - y0) * (h - T - B)

    inner = (
        f"<line x1='{L}' y1='{h - B}' x2='{w - R}' y2='{h - B}' stroke='#999'/>"
        f"<line x1='{L}' y1='{T}' x2='{L}' y2='{h - B}' stroke='#999'/>"
        f"<text x='{L - 4}' y='{T + 4}' font-size='10' text-anchor='end'>{y1:.3g}</text>"
        f"<text x='{L - 4}' y='{h - B}' font-size='10' text-anchor='end'>{y0:.3g}</text>"
        f"<text x='{L}' y='{h - 8}' font-size='10'>{x0:g}</text>"
        f"<text x='{w - R}' y='{h - 8}' font-size='10' text-anchor='end'>{x1:g} {escape(xlabel)}</text>"
    )
    for i, (_name, s) in enumerate(series.items()):
        path = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in sorted(s))
        inner += f"<polyline fill='none' stroke='{PALETTE[i % len(PALETTE)]}' stroke-width='1.5' points='{path}'/>"
        if len(s) <= 30:
            inner += "".join(
                f"<circle cx='{sx(x):.1f}' cy='{sy(y):.1f}' r='2' fill='{PALETTE[i % len(PALETTE)]}'/>" for x, y in s
            )
    return _frame(w, h, title, inner)


def success_chart(evals: list[dict[str, Any]], h: int = 300) -> str:
    """Success per task over the lake's evaluations (in order), with 95% Wilson intervals."""
    if not evals:
        return ""
    runs = list(dict.fromkeys((e["iteration"], e["checkpoint_id"], e["split"]) for e in evals))
    tasks = sorted({e["task_id"] for e in evals})
    n = len(runs)
    L, R, T, B = 40, 190, 24, 90
    w = L + R + max(480, 56 * n)

    def sx(i: int) -> float:
        return L + (i + 0.5) / n * (w - L - R)

    def sy(v: float) -> float:
        return h - B - v * (h - T - B)

    inner = "".join(
        f"<line x1='{L}' y1='{sy(v):.1f}' x2='{w - R}' y2='{sy(v):.1f}' stroke='#eee'/>"
        f"<text x='{L - 4}' y='{sy(v) + 3:.1f}' font-size='10' text-anchor='end'>{v * 100:.0f}%</text>"
        for v in (0, 0.25, 0.5, 0.75, 1.0)
    )
    for i, (it, ck, split) in enumerate(runs):
        parts = [p for p in str(ck).rstrip("/").split("/") if p]
        name = "/".join(parts[-2:]) if parts and parts[-1].startswith("round-") else (parts[-1] if parts else "-")
        label = f"it{it} {name[:28]} ({split})"
        inner += (
            f"<text x='{sx(i):.1f}' y='{h - B + 10}' font-size='9' text-anchor='start' "
            f"transform='rotate(30 {sx(i):.1f} {h - B + 10})'>{escape(label)}</text>"
        )
    by = {(e["iteration"], e["checkpoint_id"], e["split"], e["task_id"]): e for e in evals}
    for k, t in enumerate(tasks):
        color = "#111" if t == "__all__" else PALETTE[k % len(PALETTE)]
        pts = []
        for i, run in enumerate(runs):
            e = by.get((*run, t))
            if e is None or e.get("success_rate") is None:
                continue
            x, off = sx(i), (k - len(tasks) / 2) * 2.0  # a small offset so whiskers do not overlap
            pts.append(f"{x + off:.1f},{sy(e['success_rate']):.1f}")
            if e.get("ci_low") is not None:
                inner += (
                    f"<line x1='{x + off:.1f}' y1='{sy(e['ci_low']):.1f}' x2='{x + off:.1f}' "
                    f"y2='{sy(e['ci_high']):.1f}' stroke='{color}' stroke-opacity='0.5'/>"
                )
            inner += f"<circle cx='{x + off:.1f}' cy='{sy(e['success_rate']):.1f}' r='3' fill='{color}'/>"
        if len(pts) > 1:
            inner += f"<polyline fill='none' stroke='{color}' points='{' '.join(pts)}'/>"
        inner += (
            f"<rect x='{w - R + 10}' y='{T + 14 * k - 8}' width='10' height='10' fill='{color}'/>"
            f"<text x='{w - R + 24}' y='{T + 14 * k + 1}' font-size='11'>"
            f"{'overall' if t == '__all__' else escape(t)}</text>"
        )
    return _frame(w, h, "held-out success per task (95% CI)", inner)
