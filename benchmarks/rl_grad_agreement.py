"""Do GRPO gradients from different RL rounds point the same way? A diagnostic of the RL signal on CPU.

    .venv/bin/python benchmarks/rl_grad_agreement.py --lake LAKE --checkpoint _checkpoints/sft-it0-... \
        --run-keys rl-it0-aaa rl-it0-bbb ... [--targets action]

For each rollout run key (one RL round's episodes), the round's rows are loaded as the RL stage loads them
(training.rl_data.load_rl_rows with replay, episode-weighted z-score advantages) and the gradient of the
round's policy-gradient loss at ratio 1 (-sum A x log p over every response token, the update's first-step
direction) is taken at the checkpoint's weights, vision tower frozen as in RL. Prints JSON: the rows per round,
the pairwise cosine matrix between rounds, its off-diagonal mean, and the same mean between 16-row minibatches
of the first round. Cosines near 0 mean the update direction is mostly instance noise at that batch size.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks._rl_common import add_model_args, load_for_rl  # noqa: E402


def _grad(model, params, enc, rows, response_logprobs, torch):
    model.zero_grad()
    for i in range(0, len(rows), 16):
        mb = rows[i : i + 16]
        ids = [enc.response_ids(r) for r in mb]
        batch, pos, mask = enc.pad([enc.encode(r["messages"], r["images"], x) for r, x in zip(mb, ids)], "cpu")
        lp, _ = response_logprobs(model, batch, pos, mask)
        adv = torch.tensor([r["advantage"] for r in mb])
        (-(adv[:, None] * lp * mask).sum() / 128).backward()
    return torch.cat([p.grad.flatten() for p in params]).clone()


def _cos(gs, torch):
    g = torch.stack(gs)
    n = g.norm(dim=1)
    cos = (g @ g.T) / (n[:, None] * n[None, :])
    return cos, float(cos[~torch.eye(len(gs), dtype=torch.bool)].mean())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_model_args(ap)
    ap.add_argument("--run-keys", nargs="+", required=True, help="rollout run keys of RL rounds (episodes.run_key)")
    a = ap.parse_args()

    import torch

    from agents.prompts import PromptOptions
    from storage.catalog import connect
    from training.models import model_arch
    from training.rl_data import assign_advantages, load_rl_rows
    from training.rl_encode import response_logprobs

    lake, model, proc, enc = load_for_rl(a)
    params = [p for p in model.parameters() if p.requires_grad]
    con = connect(lake)
    gs, n_rows, first = [], {}, None
    for key in a.run_keys:
        rows = load_rl_rows(con, [key], arch=model_arch(model), opts=PromptOptions(), targets=a.targets, replay=True)
        rows, _ = assign_advantages(rows, step_weight="episode")
        rows = [r for r in rows if enc.scorable(enc.response_ids(r))]
        first = first if first is not None else rows
        n_rows[key] = len(rows)
        gs.append(_grad(model, params, enc, rows, response_logprobs, torch))
    cos, mean = _cos(gs, torch)
    mbs = [
        _grad(model, params, enc, first[i : i + 16], response_logprobs, torch) for i in range(0, len(first) - 15, 16)
    ]
    print(
        json.dumps(
            {
                "rows": n_rows,
                "round_cosines": [[round(float(x), 3) for x in row] for row in cos],
                "round_pairwise_mean": round(mean, 3),
                "minibatch16_pairwise_mean_first_round": round(_cos(mbs, torch)[1], 3) if len(mbs) > 1 else None,
            },
            indent=1,
        )
    )


if __name__ == "__main__":
    main()
