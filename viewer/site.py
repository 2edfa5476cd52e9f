"""Build the viewer as a static folder, or serve it on localhost (`flywheel view`).

    summary = build_site("lake", "lake/_reports/view", compares=[("stage=bootstrap", "sft-it0")])
    app = make_app("lake")           # a Starlette app: the same pages, rendered on request

Static layout (the server answers the same paths, so every relative link works in both):
    index.html, index-data.js         the episode list (filters and paging run in the browser)
    report.html                       the iteration report
    episode/<id>.html                 one page per exported episode
    shots/<id>/<step>.png             screenshots, loaded lazily by the pages
    compare-<n>.html, pair/<a>--<b>.html   side by side: the same task + seed under two policies

A static build writes pages for at most `max_pages` episodes (the newest first, compared ones
before the rest); the index still lists every episode and marks the ones without a page.
"""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path
from typing import Any, Callable

from viewer import render
from viewer.data import SAFE_ID, Side, ViewerData, ViewerError, open_lake

DEFAULT_MAX_PAGES = 500


def _write(path: Path, text: str | bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_bytes(text if isinstance(text, bytes) else text.encode())
    os.replace(tmp, path)


def index_js(index: dict[str, Any], *, pages: set[str] | None) -> str:
    data = dict(index, all_pages=pages is None, pages={p: 1 for p in pages} if pages is not None else {})
    return "window.FLYWHEEL_INDEX = " + json.dumps(data, separators=(",", ":"), default=str) + ";\n"


def build_site(
    root: str | Path,
    out: str | Path,
    *,
    compares: list[tuple[str, str]] = (),
    max_pages: int = DEFAULT_MAX_PAGES,
    log: Callable[[str], None] = lambda s: None,
    progress: bool = False,
) -> dict[str, Any]:
    t0 = time.perf_counter()
    out = Path(out)
    v = open_lake(root)
    try:
        for line in v.skipped_lines():
            log(line)
        index = v.index()
        t_index = time.perf_counter() - t0
        labels: list[tuple[str, str, str]] = []
        pair_ids: list[tuple[str, str, str, str]] = []
        for n, (a, b) in enumerate(compares):
            pairs = v.pairs(Side.parse(a), Side.parse(b))
            href = f"compare-{n}.html"
            _write(out / href, render.compare_page(a, b, pairs))
            labels.append((a, b, href))
            pair_ids += [(p["a_id"], p["b_id"], a, b) for p in pairs]
            log(f"compare {a!r} vs {b!r}: {len(pairs)} pairs -> {out / href}")
        wanted = list(dict.fromkeys([i for p in pair_ids for i in p[:2]] + index["columns"]["episode_id"]))
        chosen = wanted[: max(0, int(max_pages))]
        pages = _episode_pages(v, out, chosen, progress)
        for ea, eb, a, b in pair_ids:
            if ea in pages and eb in pages:
                _write(out / "pair" / f"{ea}--{eb}.html", render.pair_page(pages[ea], pages[eb], a, b))
        _write(out / "index-data.js", index_js(index, pages=set(pages)))
        _write(out / "index.html", render.index_page(labels, False, v.skipped_lines()))
        _write(out / "report.html", render.report_page(v.report(), v.skipped_lines()))
    finally:
        v.close()
    return {
        "out": str(out),
        "episodes": index["n"],
        "pages": len(pages),
        "compares": len(labels),
        "skipped_files": len(v.skipped),
        "index_s": round(t_index, 3),
        "total_s": round(time.perf_counter() - t0, 3),
    }


def _episode_pages(v: ViewerData, out: Path, ids: list[str], progress: bool) -> dict[str, dict[str, Any]]:
    """Write episode pages and their screenshots in chunks; returns the written episodes' data."""
    done: dict[str, dict[str, Any]] = {}
    chunks = [ids[i : i + 200] for i in range(0, len(ids), 200)]
    bar = None
    if progress and chunks:
        from rich.progress import Progress

        bar = Progress(transient=True)
        bar.start()
        task = bar.add_task("episode pages", total=len(ids))
    try:
        for chunk in chunks:
            data = v.episodes(chunk)
            for eid, d in data.items():
                _write(out / "episode" / f"{eid}.html", render.episode_page(d))
            for eid, step, png in v.screenshots(chunk):
                _write(out / "shots" / eid / f"{int(step)}.png", bytes(png))
            done.update(data)
            if bar:
                bar.advance(task, len(chunk))
    finally:
        if bar:
            bar.stop()
    return done


# ---------------------------------------------------------------------- serve
class _Live:
    """The server's ViewerData, reopened when the lake has a new snapshot (a stage wrote more)."""

    CHECK_EVERY_S = 2.0

    def __init__(self, root: str | Path):
        self.root = root
        self.lock = threading.Lock()
        self.v = open_lake(root)
        self.sig, self.checked = self._sig(), time.monotonic()
        self.index_cache: str | None = None

    def _sig(self) -> int:
        return self.v.lake.snapshot()

    def get(self) -> ViewerData:
        if time.monotonic() - self.checked < self.CHECK_EVERY_S:
            return self.v
        sig, self.checked = self._sig(), time.monotonic()
        if sig != self.sig:
            self.v.close()
            self.v, self.sig, self.index_cache = open_lake(self.root), sig, None
        return self.v


def make_app(root: str | Path):
    from starlette.applications import Starlette
    from starlette.responses import HTMLResponse, Response
    from starlette.routing import Route

    live = _Live(root)

    def guarded(fn):
        def endpoint(request):
            with live.lock:
                try:
                    return fn(request, live.get())
                except ViewerError as e:
                    return HTMLResponse(render.page("not found", f"<p class='err'>{render.escape(str(e))}</p>"), 404)

        return endpoint

    def index(request, v):
        return HTMLResponse(render.index_page([], True, v.skipped_lines()))

    def index_data(request, v):
        if live.index_cache is None:
            live.index_cache = index_js(v.index(), pages=None)
        return Response(live.index_cache, media_type="text/javascript")

    def episode(request, v):
        return HTMLResponse(render.episode_page(v.episode(request.path_params["eid"])))

    def shot(request, v):
        return Response(
            v.screenshot(request.path_params["eid"], request.path_params["step"]),
            media_type="image/png",
            headers={"Cache-Control": "max-age=3600"},
        )

    def compare(request, v):
        a, b = request.query_params.get("a", ""), request.query_params.get("b", "")
        return HTMLResponse(render.compare_page(a, b, v.pairs(Side.parse(a), Side.parse(b))))

    def pair(request, v):
        ea, _, eb = request.path_params["pair"].partition("--")
        if not (SAFE_ID.match(ea) and SAFE_ID.match(eb)):
            raise ViewerError(f"not a pair of episode ids: {request.path_params['pair'][:80]!r}")
        q = request.query_params
        return HTMLResponse(render.pair_page(v.episode(ea), v.episode(eb), q.get("a", "A"), q.get("b", "B")))

    def report(request, v):
        return HTMLResponse(render.report_page(v.report(), v.skipped_lines()))

    routes = [
        Route("/", guarded(index)),
        Route("/index.html", guarded(index)),
        Route("/index-data.js", guarded(index_data)),
        Route("/report.html", guarded(report)),
        Route("/episode/{eid}.html", guarded(episode)),
        Route("/shots/{eid}/{step:int}.png", guarded(shot)),
        Route("/compare.html", guarded(compare)),
        Route("/pair/{pair}.html", guarded(pair)),
    ]
    return Starlette(routes=routes)


def serve(root: str | Path, host: str = "127.0.0.1", port: int = 8765) -> None:
    import uvicorn

    uvicorn.run(make_app(root), host=host, port=port, log_level="warning")
