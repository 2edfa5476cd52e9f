"""Synthetic lake rows for tests and benchmarks, never used by the flywheel itself (tests import it as
`synthetic`; benchmarks put tests/ on sys.path first).

eps, steps = synthetic_episodes(n_episodes=100, steps_per_episode=5, seed=0)
pngs = png_pool(16)          # realistic small PNG screenshots (noise + UI-like boxes)
"""

from __future__ import annotations

import io
import json
import random
from datetime import datetime, timedelta, timezone

import numpy as np
from PIL import Image, ImageDraw


def png_pool(n: int = 16, size: tuple[int, int] = (160, 210), seed: int = 0) -> list[bytes]:
    """PNGs that compress like MiniWoB screenshots: flat UI boxes, text-like strokes, some noise."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        img = Image.new("RGB", size, (255, 255, 255))
        d = ImageDraw.Draw(img)
        d.rectangle([0, 0, size[0], 50], fill=(255, 255, 0))  # the instruction banner
        for _ in range(6):
            x, y = int(rng.integers(0, size[0] - 40)), int(rng.integers(55, size[1] - 20))
            d.rectangle(
                [x, y, x + int(rng.integers(20, 60)), y + 18],
                fill=tuple(int(c) for c in rng.integers(0, 255, 3)),
                outline=(0, 0, 0),
            )
            d.text((x + 3, y + 3), f"b{i}{_}", fill=(0, 0, 0))
        arr = np.asarray(img).copy()
        # sparse antialiasing-like noise (~2% of pixels) so PNGs compress like real screenshots, not flat fills
        mask = rng.random(arr.shape[:2]) < 0.02
        arr[mask] = np.clip(arr[mask].astype(np.int16) - rng.integers(0, 60, (int(mask.sum()), 3)), 0, 255)
        buf = io.BytesIO()
        Image.fromarray(arr).save(buf, format="PNG")
        out.append(buf.getvalue())
    return out


def synthetic_episodes(
    n_episodes: int,
    steps_per_episode: int,
    *,
    seed: int = 0,
    run_key: str = "synth",
    pngs: list[bytes] | None = None,
    id_prefix: str = "ep",
    tasks: tuple[str, ...] = ("click-test", "click-button", "focus-text", "enter-text"),
):
    """(episode rows, step rows) shaped like real rollouts; about 60% successful."""
    rng = random.Random(seed)
    pngs = pngs or png_pool(4, seed=seed)
    t0 = datetime(2026, 1, 1, tzinfo=timezone.utc)
    episodes, steps = [], []
    for e in range(n_episodes):
        eid = f"{id_prefix}-{seed}-{e:07d}"
        ok = rng.random() < 0.6
        task = tasks[e % len(tasks)]
        episodes.append(
            dict(
                episode_id=eid,
                task_id=task,
                seed=e,
                split="train",
                instruction=f"Do {task}",
                env="miniwob",
                policy="scripted" if e % 2 else "student",
                policy_version="v0",
                group_id=f"g-{e // 4}",
                sample_idx=e % 4,
                task_reward=1.0 if ok else 0.0,
                success=ok,
                n_steps=steps_per_episode,
                n_parse_errors=0,
                status="ok",
                started_at=t0 + timedelta(seconds=e),
                ended_at=t0 + timedelta(seconds=e + 2),
                duration_s=2.0,
                cost=0.0,
                run_key=run_key,
            )
        )
        for s in range(steps_per_episode):
            x, y = rng.randint(0, 159), rng.randint(50, 209)
            steps.append(
                dict(
                    episode_id=eid,
                    step_idx=s,
                    is_final=False,
                    screenshot=pngs[(e + s) % len(pngs)],
                    screen_w=160,
                    screen_h=210,
                    ui_text=f'button "Ok" @ ({x},{y}) [40x20]',
                    response_text='<tool_call>{"name": "computer_use", "arguments": '
                    f'{{"action": "click", "x": {x}, "y": {y}}}}}</tool_call>',
                    thought="Click it.",
                    action_desc="Click the button",
                    action=json.dumps({"action": "click", "x": x, "y": y}),
                    parse_ok=rng.random() > 0.02,
                    fallback_parse=False,
                    latency_ms=30.0,
                    env_ms=60.0,
                    run_key=run_key,
                )
            )
    return episodes, steps
