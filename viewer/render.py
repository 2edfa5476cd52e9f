"""HTML for the trajectory viewer: plain server-rendered pages, inline SVG, one small script (the index).

Every page links relatively (`episode/<id>.html`, `shots/<id>/<step>.png`, `report.html`), so the same
HTML works as a static folder (file://) and behind `flywheel view --serve`. Lake text (model output,
instructions, UI text) is untrusted: it is always escaped, never inserted as markup.
"""

from __future__ import annotations

import json
from html import escape
from typing import Any
from urllib.parse import urlencode

from viewer.charts import line_chart, success_chart

CSS = """
body{font:14px/1.4 system-ui,sans-serif;margin:0;color:#222;background:#fafafa}
header{background:#1f2937;color:#fff;padding:8px 16px}header a{color:#cbd5e1;margin-right:16px}
main{padding:12px 16px}table{border-collapse:collapse;margin:8px 0}td,th{border:1px solid #ddd;padding:3px 6px;
text-align:left;vertical-align:top}th{background:#eef}tr.ok td.s{color:#15803d}tr.fail td.s{color:#b91c1c}
.step{display:flex;gap:16px;background:#fff;border:1px solid #ddd;margin:10px 0;padding:8px}
.shot{position:relative;flex:none}.shot img{display:block;image-rendering:pixelated;border:1px solid #999}
.shot svg{position:absolute;left:1px;top:1px;pointer-events:none;overflow:visible}
pre{white-space:pre-wrap;word-break:break-word;background:#f3f4f6;padding:4px;margin:2px 0;max-width:70ch}
.err{color:#b91c1c}.muted{color:#666}.pair{display:grid;grid-template-columns:1fr 1fr;gap:12px}
.notice{background:#fff7ed;border:1px solid #fdba74;padding:6px 10px;margin:8px 0}
select{margin-right:8px}
"""


def page(title: str, body: str, depth: int = 0, extra_head: str = "") -> str:
    up = "../" * depth
    return (
        f"<!doctype html><html><head><meta charset='utf-8'><title>{escape(title)}</title>"
        f"<style>{CSS}</style>{extra_head}</head><body><header><a href='{up}index.html'>Episodes</a>"
        f"<a href='{up}report.html'>Iteration report</a><span>{escape(title)}</span></header>"
        f"<main>{body}</main></body></html>"
    )


def notices(lines: list[str]) -> str:
    return "".join(f"<div class='notice'>{escape(x)}</div>" for x in lines)


def short_version(v: str | None) -> str:
    """A readable label for a policy version: the checkpoint folder (and its round), not the whole path."""
    if not v:
        return "-"
    parts = [p for p in str(v).replace("\\", "/").split("/") if p]
    if len(parts) >= 2 and parts[-1].startswith("round-"):
        return "/".join(parts[-2:])
    return parts[-1] if parts else str(v)


# ---------------------------------------------------------------------- actions drawn on screenshots
def display_scale(w: int, h: int) -> float:
    """Small screens (MiniWoB's 160x210) are shown 2x; wide desktop screens shrink to 720 px."""
    if w <= 400:
        return 2.0
    return min(1.0, 720.0 / max(w, 1))


def _label(x: float, y: float, text: str, s: float) -> str:
    return (
        f"<text x='{x:.1f}' y='{y:.1f}' font-size='{12 / s:.2f}' fill='#b91c1c' stroke='#fff' "
        f"stroke-width='{3 / s:.2f}' paint-order='stroke'>{escape(text)}</text>"
    )


def action_marks(action: dict[str, Any] | None, w: int, h: int, s: float) -> str:
    """SVG elements (in screen pixels) for one executed action."""
    if not action:
        return ""
    kind = action.get("action")
    r, red = 6 / s, "#e11d48"
    stroke = f"stroke='{red}' stroke-width='2' vector-effect='non-scaling-stroke'"
    if kind in ("click", "double_click", "right_click", "move") and "x" in action:
        x, y = float(action["x"]), float(action["y"])
        out = (
            f"<circle class='mark' cx='{x}' cy='{y}' r='{r:.2f}' fill='{red}' fill-opacity='0.85'/>"
            f"<line x1='{x - 2 * r}' y1='{y}' x2='{x + 2 * r}' y2='{y}' {stroke}/>"
            f"<line x1='{x}' y1='{y - 2 * r}' x2='{x}' y2='{y + 2 * r}' {stroke}/>"
        )
        if kind == "double_click":
            out += f"<circle cx='{x}' cy='{y}' r='{2.2 * r:.2f}' fill='none' {stroke}/>"
        if kind != "click" or action.get("button", "left") != "left":
            out += _label(x + 2 * r, y - r, kind if kind != "click" else f"{action['button']} click", s)
        return out
    if kind == "drag":
        x1, y1, x2, y2 = (float(action[k]) for k in ("x1", "y1", "x2", "y2"))
        return (
            f"<line class='mark' x1='{x1}' y1='{y1}' x2='{x2}' y2='{y2}' {stroke} marker-end='url(#arrow)'/>"
            f"<circle cx='{x1}' cy='{y1}' r='{r / 2:.2f}' fill='{red}'/>"
        )
    if kind == "scroll":
        x, y = float(action["x"]), float(action["y"])
        dx, dy = int(action.get("dx", 0)), int(action.get("dy", 0))
        n = max((dx * dx + dy * dy) ** 0.5, 1e-9)
        L = 30 / s
        return (
            f"<line class='mark' x1='{x}' y1='{y}' x2='{x + L * dx / n:.1f}' y2='{y + L * dy / n:.1f}' {stroke} "
            f"marker-end='url(#arrow)'/>" + _label(x + r, y - r, f"scroll {dx},{dy}", s)
        )
    if kind == "type":
        return _label(4 / s, h - 8 / s, f"type: {str(action.get('text', ''))[:60]}", s)
    if kind == "key":
        return _label(4 / s, h - 8 / s, "key: " + "+".join(action.get("keys", [])), s)
    return _label(4 / s, h - 8 / s, str(kind))


def screenshot(src: str, w: int, h: int, action: dict[str, Any] | None) -> str:
    s = display_scale(w, h)
    dw, dh = round(w * s), round(h * s)
    defs = (
        "<defs><marker id='arrow' viewBox='0 0 10 10' refX='8' refY='5' markerWidth='6' markerHeight='6' "
        "orient='auto-start-reverse'><path d='M0,0L10,5L0,10z' fill='#e11d48'/></marker></defs>"
    )
    return (
        f"<div class='shot'><img src='{escape(src)}' width='{dw}' height='{dh}' loading='lazy' alt='screenshot'>"
        f"<svg width='{dw}' height='{dh}' viewBox='0 0 {w} {h}'>{defs}{action_marks(action, w, h, s)}</svg></div>"
    )


# ---------------------------------------------------------------------- episode pages
def _json(v: Any) -> dict[str, Any] | None:
    if not v:
        return None
    try:
        out = json.loads(v)
    except (TypeError, ValueError):
        return None
    return out if isinstance(out, dict) else None


def _kv(rows: list[tuple[str, Any]]) -> str:
    cells = "".join(f"<tr><th>{escape(k)}</th><td>{v}</td></tr>" for k, v in rows if v not in (None, ""))
    return f"<table>{cells}</table>"


def _pre(v: Any) -> str:
    return f"<pre>{escape(str(v))}</pre>" if v not in (None, "") else ""


def step_block(eid: str, st: dict[str, Any], rl: dict[str, Any] | None, up: str, result: str = "") -> str:
    w, h = int(st.get("screen_w") or 160), int(st.get("screen_h") or 210)
    act = _json(st.get("action"))
    img = screenshot(f"{up}shots/{eid}/{int(st['step_idx'])}.png", w, h, None if st.get("is_final") else act)
    if st.get("is_final"):
        info = _kv(
            [
                ("final screen", f"after step {int(st['step_idx']) - 1}"),
                ("episode", escape(result)),
                ("reward", st.get("reward")),
                ("feedback", _pre(st.get("feedback"))),
            ]
        )
        return f"<div class='step final' data-step='{int(st['step_idx'])}'>{img}<div>{info}</div></div>"
    errs = [
        f"<span class='err'>parse error: {escape(str(st['parse_error']))}</span>" if st.get("parse_error") else "",
        f"<span class='err'>exec error: {escape(str(st['exec_error']))}</span>" if st.get("exec_error") else "",
        "<span class='err'>lenient fallback parse</span>" if st.get("fallback_parse") else "",
    ]
    timing = " / ".join(f"{k} {float(st[k]):.0f} ms" for k in ("latency_ms", "env_ms") if st.get(k) is not None)
    rows = [
        ("step", int(st["step_idx"])),
        ("action", escape(st.get("action_desc") or "")),
        ("errors", " ".join(e for e in errs if e)),
        ("thought", _pre(st.get("thought"))),
        ("model output", _pre(st.get("response_text"))),
        ("raw_action (model space)", _pre(st.get("raw_action"))),
        ("action (screen px)", _pre(st.get("action"))),
        ("executed", _pre(st.get("executed"))),
        ("timing", escape(timing)),
        (
            "tokens",
            f"{st.get('prompt_tokens')} prompt / {st.get('completion_tokens')} reply"
            if st.get("prompt_tokens") is not None
            else None,
        ),
        ("reward after step", st.get("reward")),
        ("feedback", _pre(st.get("feedback"))),
    ]
    if rl:
        rows.append(
            (
                "RL row",
                escape(
                    f"round {rl.get('round')}, advantage {rl.get('advantage'):.3f}"
                    if rl.get("advantage") is not None
                    else f"round {rl.get('round')}"
                ),
            )
        )
        if rl.get("sdpo"):
            sib = rl.get("sdpo_sibling_episode_id")
            link = f"<a href='{up}episode/{escape(sib)}.html'>{escape(sib)}</a>" if sib else "-"
            rows.append(("SDPO teacher context", f"sibling success {link}{_pre(rl.get('sdpo_feedback'))}"))
    return f"<div class='step' data-step='{int(st['step_idx'])}'>{img}<div>{_kv(rows)}</div></div>"


def _result(e: dict[str, Any]) -> str:
    return (
        f"{'success' if e.get('success') else 'failure'} (task reward {e.get('task_reward')}), status {e.get('status')}"
    )


def episode_summary(e: dict[str, Any]) -> str:
    return _kv(
        [
            ("episode", escape(e["episode_id"])),
            ("task / seed", escape(f"{e.get('task_id')} / {e.get('seed')}")),
            ("instruction", escape(e.get("instruction") or "")),
            ("iteration / stage", escape(f"{e.get('iteration')} / {e.get('stage')}")),
            ("policy", escape(f"{e.get('policy')} · {e.get('policy_version')}")),
            ("result", escape(f"{_result(e)}, {e.get('n_steps')} steps, {e.get('n_parse_errors') or 0} parse errors")),
            ("error", escape(e.get("error") or "")),
            ("time", escape(f"{e.get('duration_s') or 0:.1f} s, started {e.get('started_at')}")),
            ("group", escape(f"{e.get('group_id')} #{e.get('sample_idx')}") if e.get("group_id") else None),
        ]
    )


def episode_page(data: dict[str, Any]) -> str:
    e = data["episode"]
    eid = e["episode_id"]
    steps = "".join(step_block(eid, st, data["rl"].get(st["step_idx"]), "../", _result(e)) for st in data["steps"])
    body = (
        f"<h2>{escape(str(e.get('task_id')))} seed {e.get('seed')}</h2>{episode_summary(e)}{steps or '<p>no steps</p>'}"
    )
    return page(f"episode {eid}", body, depth=1)


def pair_page(a: dict[str, Any], b: dict[str, Any], a_label: str, b_label: str) -> str:
    ea, eb = a["episode"], b["episode"]
    head = (
        f"<div class='pair'><div><h3>A: {escape(a_label)}</h3>{episode_summary(ea)}</div>"
        f"<div><h3>B: {escape(b_label)}</h3>{episode_summary(eb)}</div></div>"
    )
    n = max(len(a["steps"]), len(b["steps"]))
    rows = []
    for i in range(n):
        cells = []
        for d in (a, b):
            eid = d["episode"]["episode_id"]
            st = d["steps"][i] if i < len(d["steps"]) else None
            cells.append(
                step_block(eid, st, d["rl"].get(st["step_idx"]), "../", _result(d["episode"]))
                if st
                else "<div class='muted'>-</div>"
            )
        rows.append(f"<div class='pair' data-row='{i}'>{cells[0]}{cells[1]}</div>")
    title = f"{ea.get('task_id')} seed {ea.get('seed')}: A vs B"
    return page(title, f"<h2>{escape(title)}</h2>{head}{''.join(rows)}", depth=1)


def compare_page(a_label: str, b_label: str, pairs: list[dict[str, Any]], prefix: str = "") -> str:
    if not pairs:
        return page(
            "compare",
            f"<p>No task and seed was run under both <b>{escape(a_label)}</b> and <b>{escape(b_label)}</b>.</p>",
        )
    yes = sum(bool(p["a_success"]) for p in pairs), sum(bool(p["b_success"]) for p in pairs)
    q = urlencode({"a": a_label, "b": b_label})  # the served pair page names its sides from these
    rows = "".join(
        f"<tr class='cmp'><td>{escape(p['task_id'])}</td><td>{p['seed']}</td>"
        f"<td>{'✓' if p['a_success'] else '✗'} ({p['a_steps']})</td>"
        f"<td>{'✓' if p['b_success'] else '✗'} ({p['b_steps']})</td>"
        f"<td><a href='{prefix}pair/{escape(p['a_id'])}--{escape(p['b_id'])}.html?{escape(q)}'>"
        "side by side</a></td></tr>"
        for p in pairs
    )
    body = (
        f"<h2>A: {escape(a_label)} &nbsp; vs &nbsp; B: {escape(b_label)}</h2>"
        f"<p>{len(pairs)} task instances run under both; successes A {yes[0]}, B {yes[1]}.</p>"
        f"<table><tr><th>task</th><th>seed</th><th>A (steps)</th><th>B (steps)</th><th></th></tr>{rows}</table>"
    )
    return page("compare", body)


# ---------------------------------------------------------------------- the index
def index_page(compares: list[tuple[str, str, str]], serve: bool, skipped: list[str]) -> str:
    links = "".join(f"<li><a href='{escape(href)}'>{escape(a)} vs {escape(b)}</a></li>" for a, b, href in compares)
    form = (
        (
            "<form id='cmpform' action='compare.html'>Compare A <input name='a' placeholder='stage=bootstrap'> "
            "with B <input name='b' placeholder='sft-it0'> <button>side by side</button></form>"
        )
        if serve
        else ""
    )
    body = (
        notices(skipped) + "<div id='filters'></div><p id='count'></p><table id='episodes'></table>"
        "<p><button id='prev'>previous</button> <span id='page'></span> <button id='next'>next</button></p>"
        + (f"<h3>Comparisons</h3><ul>{links}</ul>" if links else "")
        + form
    )
    return page("episodes", body, extra_head="<script src='index-data.js'></script>").replace(
        "</body>", f"<script>{INDEX_JS}</script></body>"
    )


INDEX_JS = r"""
(function(){
const D = window.FLYWHEEL_INDEX, C = D.columns, PAGE = 50;
const FILTERS = [["iteration","iteration"],["stage","stage"],["task_id","task"],["policy","policy"],
                 ["policy_version","checkpoint"],["success","success"]];
function val(col, i){ const c = C[col]; if (c && c.codes) { const k = c.codes[i]; return k < 0 ? null : c.values[k]; } return c[i]; }
const state = new URLSearchParams(location.hash.slice(1)); let pageNo = +(state.get("page") || 0);
const box = document.getElementById("filters");
for (const [col, label] of FILTERS) {
  const seen = new Set(col === "success" ? ["true", "false"] : []); for (let i = 0; i < D.n; i++) seen.add(String(val(col, i)));
  const sel = document.createElement("select"); sel.id = "f-" + col; sel.dataset.col = col;
  sel.add(new Option(label + ": all", ""));
  for (const v of [...seen].sort()) sel.add(new Option(label + ": " + v, v));
  sel.value = state.get(col) || ""; sel.onchange = () => { pageNo = 0; render(); }; box.appendChild(sel);
}
function esc(s){ return String(s).replace(/[&<>"']/g, c => ({"&":"&amp;","<":"&lt;",">":"&gt;",'"':"&quot;","'":"&#39;"}[c])); }
function render(){
  const want = FILTERS.map(([col]) => [col, document.getElementById("f-" + col).value]).filter(([, v]) => v !== "");
  const rows = []; for (let i = 0; i < D.n; i++) if (want.every(([c, v]) => String(val(c, i)) === v)) rows.push(i);
  const pages = Math.max(1, Math.ceil(rows.length / PAGE)); pageNo = Math.min(Math.max(pageNo, 0), pages - 1);
  const h = new URLSearchParams(want); if (pageNo) h.set("page", pageNo); history.replaceState(null, "", "#" + h);
  document.getElementById("count").textContent = rows.length ? rows.length + " episodes" : "No episodes match these filters.";
  document.getElementById("page").textContent = "page " + (pageNo + 1) + " / " + pages;
  const head = "<tr><th>episode</th><th>iter</th><th>stage</th><th>task</th><th>seed</th><th>policy</th><th>checkpoint</th><th>success</th><th>steps</th><th>status</th></tr>";
  const body = rows.slice(pageNo * PAGE, (pageNo + 1) * PAGE).map(i => {
    const id = val("episode_id", i), ok = val("success", i), linked = D.all_pages || (D.pages && D.pages[id]);
    const cell = linked ? "<a href='episode/" + esc(id) + ".html'>" + esc(id) + "</a>" : esc(id) + " <span class='muted'>(no page)</span>";
    const v = val("policy_version", i) || "-";
    return "<tr class='ep " + (ok ? "ok" : "fail") + "'><td>" + cell + "</td><td>" + val("iteration", i) + "</td><td>" + esc(val("stage", i)) +
      "</td><td>" + esc(val("task_id", i)) + "</td><td>" + val("seed", i) + "</td><td>" + esc(val("policy", i)) +
      "</td><td title='" + esc(v) + "'>" + esc(v.split("/").slice(-2).join("/")) + "</td><td class='s'>" + (ok ? "yes" : "no") +
      "</td><td>" + val("n_steps", i) + "</td><td>" + esc(val("status", i)) + "</td></tr>";
  }).join("");
  document.getElementById("episodes").innerHTML = head + body;
}
document.getElementById("prev").onclick = () => { pageNo--; render(); };
document.getElementById("next").onclick = () => { pageNo++; render(); };
render();
})();
"""  # noqa: E501 (JavaScript kept verbatim: its long lines are part of the string)


# ---------------------------------------------------------------------- the iteration report
def _table(rows: list[dict[str, Any]], cols: list[str]) -> str:
    if not rows:
        return "<p class='muted'>none in this lake</p>"
    head = "".join(f"<th>{escape(c)}</th>" for c in cols)
    body = "".join(
        "<tr>" + "".join(f"<td>{escape('' if r.get(c) is None else str(r.get(c)))}</td>" for c in cols) + "</tr>"
        for r in rows
    )
    return f"<table><tr>{head}</tr>{body}</table>"


def _eval_table(evals: list[dict[str, Any]]) -> str:
    if not evals:
        return "<p class='muted'>no evaluations in this lake yet</p>"
    tasks = sorted({e["task_id"] for e in evals if e["task_id"] != "__all__"}) + ["__all__"]
    runs: dict[tuple, dict[str, dict]] = {}
    for e in evals:
        runs.setdefault((e["iteration"], e["checkpoint_id"], e["split"], e.get("method")), {})[e["task_id"]] = e
    head = (
        "<tr><th>iteration</th><th>checkpoint</th><th>split</th>"
        + "".join(f"<th>{'overall' if t == '__all__' else escape(t)}</th>" for t in tasks)
        + "</tr>"
    )
    body = ""
    for (it, ck, split, method), cells in runs.items():
        tds = "".join(
            f"<td>{c['success_rate'] * 100:.0f}% "
            f"<span class='muted'>[{c['ci_low'] * 100:.0f}-{c['ci_high'] * 100:.0f}] n={c['n_episodes']}</span></td>"
            if (c := cells.get(t)) and c.get("success_rate") is not None
            else "<td>-</td>"
            for t in tasks
        )
        body += (
            f"<tr><td>{it}</td><td title='{escape(str(ck))}'>{escape(short_version(ck))}"
            f"{' (' + escape(method) + ')' if method else ''}</td><td>{escape(str(split))}</td>{tds}</tr>"
        )
    return f"<table id='evals'>{head}{body}</table>"


def _lineage(lineage: list[dict[str, Any]]) -> str:
    if not lineage:
        return "<p class='muted'>no checkpoints in this lake yet</p>"
    kids: dict[str | None, list[dict]] = {}
    ids = {short_version(c["checkpoint_id"]) for c in lineage}  # parents may be stored as paths, ids as names
    for c in lineage:
        parent = short_version(c["parent_checkpoint"]) if c["parent_checkpoint"] else None
        kids.setdefault(parent if parent in ids else None, []).append(c)

    def tree(parent: str | None, seen: set[str]) -> str:
        items = ""
        for c in kids.get(parent, []):
            me = short_version(c["checkpoint_id"])
            if me in seen:
                continue
            seen.add(me)
            m = c["metrics"] or {}
            facts = ", ".join(
                f"{k} {m[k]:.4g}" if isinstance(m[k], float) else f"{k} {m[k]}"
                for k in ("steps", "final_loss", "stopped", "rounds")
                if k in m
            )
            base = (
                f" from {escape(short_version(c['parent_checkpoint']))}"
                if parent is None and c["parent_checkpoint"]
                else ""
            )
            items += (
                f"<li><b>{escape(short_version(c['checkpoint_id']))}</b> ({escape(str(c['method']))}, iteration "
                f"{c['iteration']}{', data ' + escape(str(c['dataset_id'])) if c['dataset_id'] else ''}){base}"
                f" <span class='muted'>{escape(facts)}</span>{tree(me, seen)}</li>"
            )
        return f"<ul>{items}</ul>" if items else ""

    return tree(None, set())


def _rl_section(rl: list[dict[str, Any]]) -> str:
    if not rl:
        return "<p class='muted'>no RL runs in this lake</p>"
    out = ""
    for run in dict.fromkeys(r["run_key"] for r in rl):
        rows = [r for r in rl if r["run_key"] == run]
        algo = rows[0]["algo"]
        per_round: dict[int, float] = {}
        for r in rows:
            if r["round_success"] is not None:
                per_round[r["round"]] = r["round_success"]
        charts = "".join(
            line_chart({m: [(r["global_step"], r[m]) for r in rows if r[m] is not None]}, m, "step")
            for m in ("loss", "entropy", "approx_kl", "grad_norm")
        )
        charts += line_chart({"round success": sorted(per_round.items())}, "round success", "round")
        out += f"<h4>{escape(run)} ({escape(str(algo))}, iteration {rows[0]['iteration']})</h4><div>{charts}</div>"
    return out


def _per_task_table(rows: list[dict[str, Any]]) -> str:
    """flywheel.reports.iteration_table's rows: per iteration and task, what the student tried and learnt from."""
    if not rows:
        return "<p class='muted'>no episodes, datasets or evaluations in this lake yet</p>"

    def pct(v: Any) -> str:
        return "-" if v is None else f"{v * 100:.0f}%"

    head = (
        "<tr><th>iteration</th><th>task</th><th>attempts</th><th>successes</th><th>teacher episodes</th>"
        "<th>teacher $</th><th>SFT samples</th><th>student samples</th><th>student share</th>"
        "<th>held-out success</th></tr>"
    )
    body = ""
    for r in rows:
        task = "all" if r["task_id"] == "__all__" else str(r["task_id"])
        n = f" <span class='muted'>n={r['heldout_n']}</span>" if r["heldout_n"] is not None else ""
        if r.get("heldout_snapped"):  # episodes whose click student.snap_to_cited moved onto the cited line
            n += f" <span class='muted snapped'>{r['heldout_snapped']} snapped</span>"
        body += (
            f"<tr class='pt'><td>{r['iteration']}</td><td>{escape(task)}</td><td>{r['attempts']}</td>"
            f"<td>{r['successes']}</td><td>{r['teacher_episodes']}</td><td>{r['teacher_usd']:.4g}</td>"
            f"<td>{r['sft_samples']}</td><td>{r['student_samples']}</td><td>{pct(r['student_share'])}</td>"
            f"<td>{pct(r['heldout_success'])}{n}</td></tr>"
        )
    return f"<table id='per-task'>{head}{body}</table>"


def _teacher_section(rows: list[dict[str, Any]]) -> str:
    """flywheel.reports.teacher_spend_rows: teacher episodes and dollars per iteration, stage and task."""
    if not rows:
        return "<p class='muted'>no teacher episodes in this lake</p>"
    by_stage: dict[str, list[float]] = {}
    for r in rows:
        t = by_stage.setdefault(r["stage"], [0, 0, 0.0])
        t[0], t[1], t[2] = t[0] + r["episodes"], t[1] + r["successes"], t[2] + r["usd"]
    total = [sum(v[i] for v in by_stage.values()) for i in range(3)]
    summary = "; ".join(f"{escape(k)}: {v[0]} episodes, ${v[2]:.4g}" for k, v in by_stage.items())
    return (
        f"<p id='teacher-total'>{total[0]} teacher episodes, {total[1]} successes, ${total[2]:.4g} "
        f"({summary})</p>" + _table(rows, ["iteration", "stage", "task_id", "episodes", "successes", "usd"])
    )


def report_page(rep: dict[str, Any], skipped: list[str]) -> str:
    vol_cols = ["iteration", "stage", "source", "episodes", "successes", "steps"]
    body = (
        notices(skipped)
        + "<h2>Success per task and iteration</h2>"
        + success_chart(rep["evals"])
        + _eval_table(rep["evals"])
        + "<h2>Per task and iteration</h2><p class='muted'>attempts: the student's rollout and RL episodes; SFT "
        "samples: the iteration's dataset rows, and the student's share of them; held-out success: the "
        "iteration's newest evaluation</p>"
        + _per_task_table(rep.get("per_task") or [])
        + "<h2>Teacher budget: where it went</h2>"
        + _teacher_section(rep.get("teacher") or [])
        + "<h2>Data volumes</h2>"
        + _table(rep["volumes"], vol_cols)
        + "<h3>SFT datasets</h3>"
        + _table(rep["datasets"], ["iteration", "dataset_id", "n_episodes", "n_steps", "source_counts"])
        + "<h2>Checkpoint lineage</h2>"
        + _lineage(rep["lineage"])
        + "<h2>RL curves</h2>"
        + _rl_section(rep["rl"])
        + "<h2>Curriculum decisions</h2>"
        + (
            _table(rep["curriculum"], list(rep["curriculum"][0]))
            if rep["curriculum"]
            else "<p class='muted'>no curriculum decisions in this lake</p>"
        )
    )
    return page("iteration report", body)
