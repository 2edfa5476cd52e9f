"""A flake hunt: tests/test_sft.py's DDP SIGKILL-then-resume scenario, many times and in parallel.

    .venv/bin/python benchmarks/ddp_resume_stress.py build [--dir .dev_data/ddp]     # tiny model + curated demos
    .venv/bin/python benchmarks/ddp_resume_stress.py run --parallel 8 --seconds 470 [--dir .dev_data/ddp] [--out D]

`build` makes what the test's fixture makes (a tiny Qwen3-VL, scripted demos of 3 MiniWoB tasks in real Chromium,
curated) and copies the model and the export into --dir, so `run` needs neither Chromium nor the lake (it runs on
the GPU box too, with CUDA_VISIBLE_DEVICES= for gloo on CPU). Each scenario: 2-process gloo SFT under torchrun
with a 0.4 s pause per step, SIGKILL to the launcher's process group once state/step-0000004 exists, then the same
command again, which must exit 0 having resumed from step 4-9 and finished 10 steps. A failure keeps its stderr
(the ranks' own last words: training.distributed.worker_failure) in --out. Prints JSON: runs and their outcomes.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def build(d: Path) -> None:
    sys.path[:0] = [str(ROOT), str(ROOT / "tests")]
    os.environ["PYTHONPATH"] = os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])
    import test_sft

    from configs.loading import load_config
    from flywheel.runtime.rollout import PolicySpec, RolloutSpec, make_jobs, run_rollouts
    from flywheel.stages import curate
    from training.models import init_model

    tmp = d / "build"
    shutil.rmtree(tmp, ignore_errors=True)
    tiny = init_model("qwen3-vl", "tiny", tmp / "tiny", seed=0)
    jobs = make_jobs("boot", ["click-test", "focus-text", "enter-text"], [0, 1, 2], policy_tag="scripted:0")
    spec = RolloutSpec(
        run_key="boot",
        iteration=0,
        stage="bootstrap",
        lake_root=str(tmp / "lake"),
        jobs=jobs,
        policy=PolicySpec("scripted"),
        max_steps=6,
        episode_timeout_s=60,
        n_envs=2,
    )
    run_rollouts(spec, progress=False)
    over = {f"sft.{k}": v for k, v in test_sft.FAST.items()}
    over.update({"lake.root": str(tmp / "lake"), "student.model": str(tiny), "sft.output_root": str(tmp / "ckpt")})
    res = curate(load_config(ROOT / "configs" / "tiny.yaml", over), 0)
    shutil.rmtree(d / "tiny", ignore_errors=True)
    shutil.copytree(tiny, d / "tiny")
    files = res["data_files"]
    shutil.copy(files if isinstance(files, str) else files[0], d / "train.parquet")
    (d / "fast.json").write_text(json.dumps(test_sft.FAST))
    shutil.rmtree(tmp)
    print(json.dumps({"built": str(d), "samples": res["n_steps"]}))


def _cmd(d: Path, out: Path, settings: dict) -> list[str]:
    return [sys.executable, "-m", "training.sft", "--base", str(d / "tiny"), "--data", str(d / "train.parquet")] + [
        "--out", str(out), "--settings", json.dumps(settings), "--no-progress", "--threads", "1"
    ]  # fmt: skip


def scenario(d: Path, work: Path) -> tuple[str, str]:
    """(outcome, detail) of one kill-and-resume."""
    settings = {**json.loads((d / "fast.json").read_text()), "epochs": 2.0, "lora_dropout": 0.1, "max_steps": 10}
    settings.update(keep_state=True, distributed="ddp", nproc=2)
    p = subprocess.Popen(
        _cmd(d, work, {**settings, "step_sleep_s": 0.4}),
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    deadline = time.monotonic() + 300
    while not (work / "state" / "step-0000004").exists():
        if p.poll() is not None or time.monotonic() > deadline:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
            return "first run failed", p.stderr.read().decode()[-6000:]
        time.sleep(0.05)
    os.killpg(p.pid, signal.SIGKILL)
    p.wait()
    r = subprocess.run(_cmd(d, work, settings), cwd=ROOT, capture_output=True, text=True, timeout=600)
    if r.returncode != 0:
        return "resume failed", r.stderr[-8000:]
    got = json.loads((work / "sft_result.json").read_text())
    if not (4 <= got["resumed_from_step"] < 10 and got["steps"] == 10):
        return "wrong resume", json.dumps({k: got.get(k) for k in ("resumed_from_step", "steps")})
    return "ok", ""


def run(d: Path, parallel: int, seconds: float, out: Path) -> dict:
    out.mkdir(parents=True, exist_ok=True)
    until, results, lock = time.monotonic() + seconds, [], threading.Lock()

    def loop(i: int) -> None:
        n = 0
        while time.monotonic() < until:
            work = Path(f"/tmp/ddp-stress-{os.getpid()}") / f"w{i}-{n}"
            try:
                outcome, detail = scenario(d, work)
            except Exception as e:  # noqa: BLE001 - the harness's own failure, kept like the others
                outcome, detail = "harness error", repr(e)
            with lock:
                results.append(outcome)
                if outcome != "ok":
                    (out / f"failure-w{i}-{n}.txt").write_text(f"{outcome}\n{detail}")
            shutil.rmtree(work, ignore_errors=True)
            n += 1

    threads = [threading.Thread(target=loop, args=(i,)) for i in range(parallel)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    summary = {"runs": len(results), "parallel": parallel, "outcomes": {k: results.count(k) for k in set(results)}}
    (out / "summary.json").write_text(json.dumps(summary))
    return summary


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("what", choices=["build", "run"])
    ap.add_argument("--dir", type=Path, default=ROOT / ".dev_data" / "ddp")
    ap.add_argument("--parallel", type=int, default=4, help="scenarios at once (each: 2 ranks + the agent)")
    ap.add_argument("--seconds", type=float, default=300, help="start new scenarios until then")
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "bench-out/ddp-stress")))
    a = ap.parse_args()
    a.dir.mkdir(parents=True, exist_ok=True)
    if a.what == "build":
        build(a.dir.resolve())
        return 0
    summary = run(a.dir.resolve(), a.parallel, a.seconds, a.out)
    print(json.dumps(summary))
    return 0 if set(summary["outcomes"]) <= {"ok"} else 1


if __name__ == "__main__":
    sys.exit(main())
