"""Benchmark: how long `flywheel view` takes to index a lake of 100k episodes (500k steps with screenshots).

    .venv/bin/python benchmarks/viewer_index.py [--episodes 100000] [--lake bench-out/viewer-lake] [--reps 3]

Builds (once; reused while its row count matches) a synthetic lake with benchmarks/lake_query.py's
builder: 5 steps per episode, realistic PNG screenshots, 2 iterations x 2 stages x 10 files. Then
(median of --reps, alternating order):
  viewer_index: open the lake (views + the in-memory episode table and step locator) and write
                index-data.js + index.html + report.html (`build_site(max_pages=0)`);
  viewer_site:  the same plus the default 500 episode pages with their screenshots.
Also times one episode page and one screenshot from the live server's data layer. Prints JSON.
The cost grows with the number of files as well as rows: DuckDB reads every file's footer.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.lake_query import STEPS_PER_EPISODE, build_lake  # noqa: E402
from storage.inspect import lake_stats  # noqa: E402
from storage.lake import open_lake  # noqa: E402
from viewer.data import ViewerData  # noqa: E402
from viewer.site import build_site  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--episodes", type=int, default=100_000)
    ap.add_argument("--lake", type=Path, default=Path("bench-out/viewer-lake"))
    ap.add_argument("--reps", type=int, default=3)
    a = ap.parse_args()
    root = a.lake.resolve()
    build = build_lake(root, a.episodes * STEPS_PER_EPISODE, 2, ["bootstrap", "rollouts"], 10)
    stats = lake_stats(open_lake(root))
    out = Path(tempfile.mkdtemp(prefix="viewer-bench-"))

    def index():
        return build_site(root, out / "index", max_pages=0)

    def site():
        return build_site(root, out / "site")

    times: dict[str, list[float]] = {"viewer_index": [], "viewer_site": []}
    fns = {"viewer_index": index, "viewer_site": site}
    results = {}
    for r in range(a.reps):
        order = list(fns) if r % 2 == 0 else list(reversed(fns))
        for name in order:
            t0 = time.perf_counter()
            results[name] = fns[name]()
            times[name].append(time.perf_counter() - t0)
    v = ViewerData(root)
    eid = v.index()["columns"]["episode_id"][a.episodes // 2]
    t0 = time.perf_counter()
    ep = v.episode(eid)
    page_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    png = v.screenshot(eid, 0)
    shot_s = time.perf_counter() - t0
    med = {k: round(statistics.median(x), 3) for k, x in times.items()}
    shutil.rmtree(out, ignore_errors=True)
    print(
        json.dumps(
            {
                "benchmark": "viewer_index",
                "episodes": stats["episodes"].rows,
                "step_rows": stats["steps"].rows,
                "files": stats["steps"].files + stats["episodes"].files,
                "lake_gb": round((stats["steps"].bytes + stats["episodes"].bytes) / 2**30, 2),
                "viewer_index_s": med["viewer_index"],
                "viewer_site_500_pages_s": med["viewer_site"],
                "index_breakdown_s": {"open_and_index": results["viewer_index"]["index_s"]},
                "server_episode_page_s": round(page_s, 4),
                "server_screenshot_s": round(shot_s, 4),
                "spread_s": {k: [round(min(x), 3), round(max(x), 3)] for k, x in times.items()},
                "checks": {
                    "pages": results["viewer_site"]["pages"],
                    "steps_on_page": len(ep["steps"]),
                    "png_bytes": len(png),
                },
                "reps": a.reps,
                **build,
            },
            indent=1,
        )
    )


if __name__ == "__main__":
    main()
