"""Score a model on synth/search SFT rows two ways, offline (no browser).

    python benchmarks/search_probe_eval.py MODEL DATA.parquet NAME

- click: the greedy reply's click lands inside the target element's box (benchmarks/step_accuracy.judge);
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
    from step_accuracy import judge

    from agents.backends.base import Sampling
    from agents.backends.hf import HFBackend
    from agents.prompts import Prompt

    model, data, name = sys.argv[1:4]
    rows = pq.read_table(data).to_pylist()
    be = HFBackend(model)
    tally: dict[str, list[int]] = {}
    episodes: dict[str, bool] = {}
    for i in range(0, len(rows), 64):
        chunk = rows[i : i + 64]
        prompts = [Prompt(r["messages"][:-1], [im["bytes"] for im in r["images"]]) for r in chunk]
        for r, g in zip(chunk, be.generate(prompts, Sampling(temperature=0.0, max_new_tokens=128))):
            target = r["messages"][-1]["content"][0]["text"]
            text = "\n".join(c.get("text") or "" for m in r["messages"][:-1] for c in m["content"])
            _, _, right = judge(g.text, target, text)
            want, got = CITE.search(target), CITE.search(g.text)
            where = "link_here" if want and want.group(1) == "a" else "other_tab"
            decided = bool(want and got and want.group(2) == got.group(2))
            for key in (where, "all"):
                t = tally.setdefault(key, [0, 0, 0])
                t[0] += right
                t[1] += decided
                t[2] += 1
            episodes[r["episode_id"]] = episodes.get(r["episode_id"], True) and right
    be.close()
    out: dict = {"name": name}
    for key, (a, d, n) in tally.items():
        out[key] = {"click": round(a / n, 4), "decision": round(d / n, 4), "n": n}
    out["episode"] = round(sum(episodes.values()) / max(len(episodes), 1), 4)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
