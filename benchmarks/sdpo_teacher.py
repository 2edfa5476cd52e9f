"""Does the SDPO teacher read its privileged block? rl.sdpo_teacher_check's two numbers for checkpoints on a lake's
stored rollout groups, under each sibling block (rl.sdpo_hint), as JSON:

    .venv/bin/python benchmarks/sdpo_teacher.py --config CONFIG --iteration 2 --checkpoint CK [CK ...]
        [--hint screen episode] [--set key=value ...]

- own_gap: on up to 64 successful rows with a sibling's block, mean log pT - log pS over the student's own reply
  tokens (pT: the same weights with the block in the prompt). Far below 0, the teacher misleads.
- read_gain: on up to 64 failed rows whose successful sibling acted otherwise on the same screen (screen block
  only), the mean change in nats the block makes to log p(the sibling's reply). At or below 0, it does not read.

training.rl.RLTrainer.teacher_stats computes both, as the RL stage does before each SDPO update; docs/LOG.md
(session 47) has the numbers for a mini student with and without hint-aware SFT (sft.hint_fraction).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def teacher_numbers(cfg, lake, checkpoint: str, iteration: int, hints: list[str]) -> dict[str, dict]:
    """{hint: teacher_stats} for `checkpoint` (a folder) on the iteration's stored student rollout groups."""
    from flywheel.rl_stage import _stored_groups
    from storage.catalog import connect
    from training.models import load_model, model_arch
    from training.rl import RLSettings, RLTrainer
    from training.rl_data import attach_sdpo_context, load_rl_rows, stored_index

    model, proc = load_model(checkpoint)
    out = {}
    for hint in hints:
        s = RLSettings.from_config(cfg, "sdpo")
        s.sdpo_hint, s.sdpo_teacher_check = hint, None
        tr = RLTrainer(model, proc, s, teacher=model)  # the teacher of the first update: the same weights
        run_keys, _ = _stored_groups(lake, iteration)
        rows = load_rl_rows(
            connect(lake),
            run_keys,
            arch=model_arch(model),
            opts=s.prompt_options,
            targets=s.targets,
            replay=s.replay,
            stored_context=True,
            same_seed=s.stored_same_seed,
            lake=lake,
            index=stored_index(lake),
        )
        attach_sdpo_context(rows, s.sdpo_context, hint)
        resp = [tr.encoder.response_ids(r) for r in rows]
        tenc = {i: tr.teacher_encoding(r, ids) for i, (r, ids) in enumerate(zip(rows, resp)) if r["sdpo"]}
        own = [i for i in tenc if rows[i].get("success") and rows[i].get("sdpo_solution")][:64]
        old: list = [None] * len(rows)
        scored = tr._score(model, [tr.encoder.encode(rows[i]["messages"], rows[i]["images"], resp[i]) for i in own])
        for i, lp in zip(own, scored):
            old[i] = lp
        out[hint] = dict(tr.teacher_stats(rows, tenc, old, resp), rows=len(rows), rows_with_block=len(tenc))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--config", required=True)
    ap.add_argument("--iteration", type=int, required=True)
    ap.add_argument("--checkpoint", nargs="+", required=True, help="model folders (a checkpoint's, or round-N)")
    ap.add_argument("--hint", nargs="+", default=["screen", "episode"], choices=["screen", "episode"])
    ap.add_argument("--set", action="append", default=[], help="config override key=value")
    a = ap.parse_args()
    import yaml

    from configs.loading import load_config
    from storage.lake import open_lake

    cfg = load_config(a.config, {k: yaml.safe_load(v) for k, _, v in (kv.partition("=") for kv in a.set)})
    lake = open_lake(cfg.lake.root, create=False)
    report = {ck: teacher_numbers(cfg, lake, ck, a.iteration, a.hint) for ck in a.checkpoint}
    print(json.dumps({"iteration": a.iteration, "lake": str(cfg.lake.root), "checkpoints": report}, indent=2))


if __name__ == "__main__":
    main()
