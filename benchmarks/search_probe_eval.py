"""Score a model on synth/search SFT rows two ways, offline (no browser).

    python benchmarks/search_probe_eval.py MODEL DATA.parquet NAME

- click: the greedy reply's click lands inside the target element's box (benchmarks/step_accuracy.evaluate);
- decision: the reply's Action line cites the same element text as the target's (the link, or which tab to open).

Both are split by where the target is (`link_here`: the link is on the open tab; `other_tab`: a tab must be opened),
with the per-episode proxy (every step's click right). Prints one JSON line. Used by
benchmarks/tab_state_probe_gpu.sh (session 26, docs/LOG.md).
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

CITE = re.compile(r'^Action: Click (\S+) "(.*)"', re.M)


def main() -> None:
    import pyarrow.parquet as pq
    from step_accuracy import evaluate

    model, data, name = sys.argv[1:4]
    rows = pq.read_table(data).to_pylist()
    rights: list[bool] = []
    replies: list[str] = []
    evaluate(model, rows, 64, 128, rights=rights, replies=replies)
    tally: dict[str, list[int]] = {}
    episodes: dict[str, bool] = {}
    for r, right, reply in zip(rows, rights, replies):
        want, got = CITE.search(r["messages"][-1]["content"][0]["text"]), CITE.search(reply)
        where = "link_here" if want and want.group(1) == "a" else "other_tab"
        decided = bool(want and got and want.group(2) == got.group(2))
        for key in (where, "all"):
            t = tally.setdefault(key, [0, 0, 0])
            t[0] += right
            t[1] += decided
            t[2] += 1
        episodes[r["episode_id"]] = episodes.get(r["episode_id"], True) and right
    out: dict = {"name": name}
    for key, (a, d, n) in tally.items():
        out[key] = {"click": round(a / n, 4), "decision": round(d / n, 4), "n": n}
    out["episode"] = round(sum(episodes.values()) / max(len(episodes), 1), 4)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
