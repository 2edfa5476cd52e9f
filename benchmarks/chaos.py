"""A chaos iteration (issue 32, part 1): one whole flywheel iteration while a seeded killer SIGKILLs its processes.

    .venv/bin/python benchmarks/chaos.py [--seeds 0,1,2 --kills 17 --min-total-kills 50 --out docs/bench_chaos.json]
    .venv/bin/python benchmarks/chaos.py --seeds 0 --kills 3 --targets sft --env-server none --no-reference \
        --work /tmp/chaos                                                                   # the slow test's run

The run is `flywheel run -c <tiny + RL> --lake <lake> --start 0` (configs/tiny.yaml with RL on, 2 rounds, and SFT
saving its resumable state every 5 of 30 steps), a real subprocess with its own ephemeral Prefect server, rollout
workers and Chromium. For each killer seed, every `U(--min-delay, --max-delay)` seconds the killer lists the live
descendants of the run's parent (walking /proc from this process, which is made a child subreaper so that the
children of a killed parent stay its descendants), picks a role at random (the parent, which runs the stages and the
SFT / RL trainers in local mode; the Prefect server; a rollout worker; chromedriver; a Chromium process; ...), then a
process of that role, and sends it SIGKILL. It never signals anything else. When the parent ends (killed, or failed
because a child was killed), the killer waits for its descendants to exit (an orphan is one still alive after
`--grace` seconds; it is then killed and counted) and reruns the same command. After `--kills` kills the last attempt
runs undisturbed to the end.

Mid-stage kills (`--targets sft,rl`, one each per seed, part of `--kills`): once SFT has saved a `state/step-N` in
the running attempt, or RL has finished a round (`round-<r>/rl_round.json`) and has one to go, the killer SIGKILLs
the trainer within 0.1-1 s: the parent, which runs the trainers in local mode (a separate trainer process if there
is one). The attempt that runs the stage again must start it from that step / round (its progress line), not 0.

Env server (`--env-server 1`: the seeds, 'all' or 'none'): the harness starts `flywheel env serve --slots 2 --port
0` in its own process group (a child subreaper, so the browsers a killed slot leaves stay in its tree), points the
config at it (env.name remote) and adds the server's slot processes (each slot's child, its chromedriver and
Chromium) to the victims; never the server itself (a lone server's clients do not outlive it). Errored episodes
run again within the run (env.error_retries). At the end the server must hold no browser re-parented to it (one its
slots lost track of); it is stopped by its process group. A seed on the server is compared with an undisturbed run
on a server of its own (the env's name is in the run keys).

Each seed's lake is then compared with an undisturbed run of the same command (`--no-reference`: with the counts
the config implies): the same multiset of episode instances (stage, task, seed, sample), every episode with all its
step rows (n_steps + 1), no duplicate episode_id or (episode_id, step_idx), `flywheel lake verify` clean, the same
dataset and checkpoint ids, and each SFT / RL resume starting at the step / round its resumable state held when the
attempt started. A kill is survived when its attempt left no orphan and no stuck run, and its seed passed every
check. Prints progress to stderr and the JSON to stdout (and --out).
"""

from __future__ import annotations

import argparse
import ctypes
import hashlib
import json
import os
import random
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

FLYWHEEL = [sys.executable, "-m", "flywheel"]
# SFT must save resumable state mid-run and RL must have more than one round, or there is nothing to resume
CONFIG_EDITS = {
    "sft": {"method": "lora", "max_steps": 30, "save_every": 5, "batch_size": 2, "epochs": 100},
    "rl": {"enabled": True, "rounds": 2, "group_size": 2, "seeds_per_task_per_round": 1},
}


def log(msg: str) -> None:
    print(f"[chaos {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# ------------------------------------------------------------------------------------------------ processes
def become_subreaper() -> None:
    """Orphans of a killed parent are re-parented to this process instead of init, so they stay our descendants."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(36, 1, 0, 0, 0) != 0:  # PR_SET_CHILD_SUBREAPER
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_CHILD_SUBREAPER) failed")


def _procs() -> dict[int, tuple[int, str]]:
    """pid -> (ppid, state) for every process on the machine (read-only)."""
    out = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            stat = Path(f"/proc/{d}/stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        out[int(d)] = (int(fields[1]), fields[0])
    return out


def descendants(root: int | None = None) -> dict[int, str]:
    """Live descendants of `root` (default: this process) -> state; zombies included (state 'Z')."""
    root = root or os.getpid()
    procs = _procs()
    kids: dict[int, list[int]] = {}
    for pid, (ppid, _) in procs.items():
        kids.setdefault(ppid, []).append(pid)
    out, todo = {}, list(kids.get(root, []))
    while todo:
        pid = todo.pop()
        out[pid] = procs[pid][1]
        todo.extend(kids.get(pid, []))
    return out


def reap(keep: int | None) -> None:
    """Collect exited children re-parented to us (the subreaper), except `keep` (Popen waits for that one)."""
    me = os.getpid()
    for pid, (ppid, state) in _procs().items():
        if ppid == me and state == "Z" and pid != keep:
            try:
                os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                pass


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


def role(pid: int, parent: int) -> str:
    if pid == parent:
        return "parent"
    cmd = cmdline(pid)
    exe = Path(cmd.split(" ", 1)[0]).name if cmd else "?"
    if "prefect.server" in cmd or "uvicorn" in cmd:
        return "prefect-server"
    if "resource_tracker" in cmd:
        return "resource-tracker"
    if "chromedriver" in exe:
        return "chromedriver"
    if "chrom" in exe or "chrome" in cmd.split(" ", 1)[0] or " --type=" in cmd:  # helpers may show /proc/self/exe
        return "chromium"
    if "env_worker" in cmd or "multiprocessing" in cmd or "runtime" in cmd:
        return "rollout-worker"
    if "training" in cmd:
        return "trainer"
    return f"other:{exe}"


def live(parent: int, server: int | None = None) -> dict[int, str]:
    """The run's live processes (not zombies) -> role: our descendants but the env server and its tree."""
    skip = {server, *descendants(server)} if server else set()
    return {pid: role(pid, parent) for pid, st in descendants().items() if st != "Z" and pid not in skip}


def slot_procs(server: int) -> dict[int, str]:
    """The env server's slot processes -> role: each slot's child (its env), chromedriver and Chromium; never the
    server itself (its client, RemoteEnv, does not outlive a lone server) nor its resource tracker."""
    procs, out = _procs(), {}
    for pid, st in descendants(server).items():
        if st == "Z":
            continue
        cmd = cmdline(pid)
        exe = Path(cmd.split(" ", 1)[0]).name if cmd else "?"
        if procs.get(pid, (0,))[0] == server and "spawn_main" in cmd:
            out[pid] = "env-slot"
        elif "chromedriver" in exe:
            out[pid] = "env-slot-chromedriver"
        elif "chrom" in exe and "crashpad" not in exe:
            out[pid] = "env-slot-chromium"
    return out


def server_leaks(server: int) -> list[dict]:
    """Browsers the server lost track of: a chromedriver or Chromium re-parented to the server (a subreaper here)
    after its slot's child died, still running."""
    procs = _procs()
    return [
        {"pid": pid, "role": r, "cmd": cmdline(pid)[:160]}
        for pid, r in slot_procs(server).items()
        if r != "env-slot" and procs.get(pid, (0,))[0] == server
    ]


def kill_all(pids) -> None:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


# ------------------------------------------------------------------------------------------------ the run
def _env(home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "FLYWHEEL_LAKE"))}
    env.update(
        PREFECT_HOME=str(home / "prefect-home"),
        PREFECT_SERVER_ANALYTICS_ENABLED="false",
        HF_HUB_OFFLINE="1",
        PYTHONUNBUFFERED="1",
        TOKENIZERS_PARALLELISM="false",
        FLYWHEEL_PROGRESS_EVERY_S="1",
    )
    return env


def _default_sigint() -> None:  # a background (nohup) parent hands its children SIGINT ignored
    signal.signal(signal.SIGINT, signal.SIG_DFL)


TOKEN_ENV = "FLYWHEEL_ENV_TOKEN"
SERVER_SLOTS = 2


def _subreaper_exec() -> None:
    """preexec_fn of the env server: it becomes a child subreaper (kept across exec), so a killed slot's
    chromedriver and Chromium, and Chromium's crash handlers, stay in its tree (and apart from the run's)."""
    _default_sigint()
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(36, 1, 0, 0, 0)


def start_env_server(home: Path, token: str) -> tuple[subprocess.Popen, str]:
    """`flywheel env serve --slots 2 --port 0` in its own process group; returns once every slot is ready."""
    import httpx

    home.mkdir(parents=True, exist_ok=True)
    path = home / "env-server.log"
    with path.open("w") as fh:
        proc = subprocess.Popen(
            [*FLYWHEEL, "env", "serve", "--slots", str(SERVER_SLOTS), "--port", "0", "--health-interval", "5"],
            cwd=ROOT,
            env={**_env(home), TOKEN_ENV: token},
            stdout=fh,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=_subreaper_exec,
        )
    deadline, url = time.monotonic() + 180, None
    http = httpx.Client(headers={"Authorization": f"Bearer {token}"}, timeout=5)
    while time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.2)
        if url is None:
            found = re.search(r"on (http://[0-9.]+:\d+)", path.read_text(errors="replace"))
            url = found.group(1) if found else None
            continue
        try:
            if http.get(f"{url}/v1/health").json()["free"] == SERVER_SLOTS:
                return proc, url
        except (httpx.HTTPError, ValueError, KeyError):
            pass
    stop_env_server(proc)
    raise SystemExit(f"the env server did not become ready; see {path}")


def server_health(url: str, token: str) -> dict | None:
    import httpx

    try:
        return httpx.get(f"{url}/v1/health", headers={"Authorization": f"Bearer {token}"}, timeout=5).json()
    except (httpx.HTTPError, ValueError):
        return None


def stop_env_server(proc: subprocess.Popen, grace: float = 20.0) -> list[dict]:
    """SIGTERM to the server's process group (SIGKILL after 15 s); returns what of it is still alive `grace` s
    later (then killed): processes that left the group (Chromium's crash handlers) and outlived it."""
    tree = set(descendants(proc.pid))
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=15)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    except ProcessLookupError:
        proc.wait()
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # what of the group is left (the server is gone)
    except ProcessLookupError:
        pass
    deadline = time.monotonic() + grace
    while True:
        reap(None)
        mine = descendants()
        left = {p for p in tree if p in mine and mine[p] != "Z"}
        if not left or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    out = [{"pid": p, "cmd": cmdline(p)[:160]} for p in sorted(left)]
    kill_all(left)
    time.sleep(0.3)
    reap(None)
    return out


def remote_config(cfg: Path, home: Path, url: str) -> Path:
    """`cfg` with its episodes on the env server at `url` (env.name remote; error_retries as configured)."""
    import yaml

    from configs.loading import read_config_data

    c = read_config_data(cfg)  # `extends:` resolved: the copy below lies in another folder
    c["env"].update(name="remote", servers=[url], token_env=TOKEN_ENV)
    path = home / "chaos-remote.yaml"
    path.write_text(yaml.safe_dump(c, sort_keys=False))
    return path


def make_config(work: Path) -> Path:
    """configs/tiny.yaml with RL on and SFT saving resumable state, and a tiny student initialised in `work`."""
    import yaml

    from training.models import init_model

    student = work / "student"
    if not (student / "model.safetensors").exists():
        init_model("qwen3-vl", "tiny", student, seed=0)
    cfg = yaml.safe_load((ROOT / "configs" / "tiny.yaml").read_text())
    cfg["student"]["model"] = str(student)
    cfg["evaluate"]["held_out_tasks"] = False
    cfg.update(CONFIG_EDITS)
    path = work / "chaos.yaml"
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    return path


def command(cfg: Path, lake: Path) -> list[str]:
    return [*FLYWHEEL, "run", "-c", str(cfg), "--lake", str(lake), "--start", "0"]


STAGES = ["startup", "flow", "bootstrap", "rollouts", "curate", "sft", "rl", "evaluate"]


def _stage(text: str) -> str:
    found = re.findall(r"Beginning subflow run '([a-z_]+)-it\d+'", text)
    if found:
        return found[-1]
    return "flow" if "Beginning flow run" in text else "startup"


def _saved(lake: Path) -> dict[str, int]:
    """What a resume should start from: the newest SFT state step and the RL rounds finished (consecutive
    `round-<r>/rl_round.json`, what flywheel.rl_stage resumes after)."""
    sft = [int(p.parent.name.split("-")[1]) for p in lake.glob("_checkpoints/sft-*/state/step-*/trainer_state.json")]
    rl = 0
    for run in lake.glob("_checkpoints/rl-*"):
        done = 0
        while (run / f"round-{done}" / "rl_round.json").exists():
            done += 1
        rl = max(rl, done)
    return {"sft_step": max(sft, default=0), "rl_round": rl}


def _sft_done(lake: Path) -> bool:
    return any(lake.glob("_checkpoints/sft-*/sft_result.json"))


def _resumes(text: str) -> dict[str, int | None]:
    """Where this attempt's SFT / RL began (their first progress line), None if it did not run them."""
    sft = re.search(r"sft: step (\d+)/\d+ .*started", text)
    rl = re.search(r"rl: round (\d+)/\d+ .*started", text)
    return {"sft_step": int(sft.group(1)) if sft else None, "rl_round": int(rl.group(1)) if rl else None}


# targeted kills: once per seed, the trainer (in local mode: the parent, which runs it) killed mid-stage, after
# SFT saved a state step / RL finished a round, so that the rerun must resume from it
TARGETS = {"sft": "sft_step", "rl": "rl_round"}


def _mid_stage(target: str, stage: str, text: str, lake: Path) -> bool:
    """The attempt is inside `target`'s stage, its trainer started, with something saved to resume from and the
    stage not finished."""
    if stage != target:
        return False
    saved = _saved(lake)
    if target == "sft":
        return _resumes(text)["sft_step"] is not None and saved["sft_step"] > 0 and not _sft_done(lake)
    return _resumes(text)["rl_round"] is not None and 0 < saved["rl_round"] < CONFIG_EDITS["rl"]["rounds"]


def run_seed(
    cfg: Path,
    home: Path,
    seed: int | None,
    kills: int,
    min_delay: float,
    max_delay: float,
    grace: float,
    stall: float,
    targets: tuple[str, ...] = (),
    server: bool = False,
    max_attempts: int = 200,
) -> dict:
    """One chaos run (seed None: undisturbed). `targets`: stages ('sft', 'rl') that get one kill each mid-stage
    (part of `kills`); `server`: the episodes run on an env server started here, whose slots are victims too.
    Returns its attempts, kills, orphans and wall time."""
    home.mkdir(parents=True, exist_ok=True)
    lake = home / "lake"
    rng = random.Random(seed)
    targets = tuple(targets) if seed is not None else ()
    n_random = max(0, kills - len(targets))
    # random kill i aims at stage plan[i]: the kills spread over the iteration in order (finished stages are cached)
    plan = [STAGES[min(len(STAGES) - 1, i * len(STAGES) // max(n_random, 1))] for i in range(n_random)]
    attempts: list[dict] = []
    kill_log: list[dict] = []
    t0 = time.monotonic()
    tag = "reference" if seed is None else f"seed {seed}"
    srv = url = None
    env = _env(home)
    if server:
        token = hashlib.sha256(f"chaos-{seed}-{time.time()}".encode()).hexdigest()[:32]
        srv, url = start_env_server(home, token)
        cfg = remote_config(cfg, home, url)
        env[TOKEN_ENV] = token
        log(f"{tag}: env server {url} (pid {srv.pid}, {SERVER_SLOTS} slots)")
    cmd = command(cfg, lake)
    pending = list(targets)  # targets not yet hit
    done = False
    try:
        while not done and len(attempts) < max_attempts:
            n = len(attempts)
            saved = _saved(lake)
            path = home / f"attempt-{n:03d}.log"
            with path.open("w") as fh:
                proc = subprocess.Popen(
                    cmd,
                    cwd=ROOT,
                    env=env,
                    stdout=fh,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                    preexec_fn=_default_sigint,
                )
            att = {"attempt": n, "kills": [], "saved_at_start": saved, "stuck": False}
            started = last_growth = time.monotonic()
            size = 0
            next_kill = aimed = None  # when the next kill goes, and at what ('random' or a target)
            while proc.poll() is None:
                time.sleep(0.1)
                reap(proc.pid)
                now = time.monotonic()
                grown = path.stat().st_size
                if grown != size:
                    size, last_growth = grown, now
                if now - last_growth > stall:
                    att["stuck"] = True
                    log(f"{tag}: attempt {n} printed nothing for {stall:.0f} s: stuck, killing it")
                    kill_all(live(proc.pid, srv and srv.pid))
                    break
                if seed is None:
                    continue
                randoms = sum(1 for k in kill_log if k["target"] is None)
                if next_kill is None or aimed == "random":
                    # a target whose stage is running (and has saved something) goes first, soon
                    text = path.read_text(errors="replace")
                    stage = _stage(text)
                    hit = next((t for t in pending if _mid_stage(t, stage, text, lake)), None)
                    if hit is not None:
                        next_kill, aimed = now + rng.uniform(0.1, 1.0), hit
                        continue
                if next_kill is None:  # wait for the stage the next random kill aims at, then a delay in it
                    if randoms >= n_random:
                        continue
                    target = plan[randoms]
                    current = _stage(path.read_text(errors="replace"))
                    if target == "startup" or STAGES.index(current) >= STAGES.index(target):
                        hi = max_delay * 3 if target == "startup" else max_delay
                        next_kill, aimed = now + rng.uniform(min_delay, hi), "random"
                    continue
                if now < next_kill:
                    continue
                text = path.read_text(errors="replace")
                stage = _stage(text)
                procs = live(proc.pid, srv and srv.pid)
                if proc.pid not in procs:
                    continue
                if aimed != "random":
                    if not _mid_stage(aimed, stage, text, lake):  # it finished meanwhile: wait for another chance
                        next_kill = aimed = None
                        continue
                    # the trainer: its own process if it has one (DDP), else the parent, which runs it
                    trainers = [p for p, r in procs.items() if r == "trainer"]
                    r, pid = ("trainer", min(trainers)) if trainers else ("parent", proc.pid)
                else:
                    if srv is not None:
                        procs.update(slot_procs(srv.pid))
                    by_role: dict[str, list[int]] = {}
                    for p, rr in sorted(procs.items()):
                        by_role.setdefault(rr, []).append(p)
                    r = rng.choice(sorted(by_role))
                    pid = rng.choice(by_role[r])
                k = {
                    "kill": len(kill_log),
                    "attempt": n,
                    "t_s": round(now - started, 1),
                    "role": r,
                    "stage": stage,
                    "target": None if aimed == "random" else aimed,
                    "cmd": cmdline(pid)[:160],
                    "live": len(procs),
                    "saved": _saved(lake),
                }
                kill_all([pid])
                kill_log.append(k)
                att["kills"].append(k["kill"])
                if aimed != "random":
                    pending.remove(aimed)
                what = f"mid-{aimed} kill ({k['saved']})" if aimed != "random" else "kill"
                log(f"{tag}: {what} {k['kill'] + 1}/{kills} at {k['t_s']} s of attempt {n}: {r} during {stage}")
                next_kill = aimed = None
            rc = proc.wait()
            text = path.read_text(errors="replace")
            # the parent is gone: what it started must go too (the rollout workers and Chromium, the Prefect server)
            deadline = time.monotonic() + grace
            while True:
                reap(None)
                left = live(proc.pid, srv and srv.pid)
                if not left or time.monotonic() > deadline:
                    break
                time.sleep(0.2)
            orphans = [{"pid": p, "role": r, "cmd": cmdline(p)[:160]} for p, r in sorted(left.items())]
            if orphans:
                log(
                    f"{tag}: attempt {n} left {len(orphans)} orphan(s) after {grace:.0f} s: "
                    f"{[o['role'] for o in orphans]}"
                )
                kill_all(left)
                time.sleep(0.5)
                reap(None)
            att.update(
                rc=rc,
                wall_s=round(time.monotonic() - started, 1),
                stage_at_end=_stage(text),
                orphans=orphans,
                resumed=_resumes(text),
                error=next((ln[:300] for ln in reversed(text.splitlines()) if ln.startswith(("error", "Error"))), None),
            )
            attempts.append(att)
            log(f"{tag}: attempt {n} ended rc={rc} after {att['wall_s']} s in {att['stage_at_end']}")
            done = rc == 0
            if not done and not att["kills"] and not att["stuck"]:
                # failed with no kill of its own: a kill of the previous attempt broke the resume
                log(f"{tag}: attempt {n} failed without a kill: {att['error']}")
                att["failed_unkilled"] = True
                if sum(a.get("failed_unkilled", False) for a in attempts) >= 3:
                    break
    finally:
        server_info = None
        if srv is not None:
            health = server_health(url, env[TOKEN_ENV]) if srv.poll() is None else None
            leaks = server_leaks(srv.pid)
            server_info = {
                "url": url,
                "alive_at_end": srv.poll() is None,
                "slot_restarts": sum(sl.get("restarts", 0) for sl in health["slots"]) if health else None,
                "leaked": leaks,
                "left_after_stop": stop_env_server(srv, grace),
            }
            log(f"{tag}: env server stopped: {server_info['slot_restarts']} slot restarts, {len(leaks)} leaked")
    return {
        "seed": seed,
        "lake": str(lake),
        "env": "remote" if server else "miniwob",
        "wall_s": round(time.monotonic() - t0, 1),
        "completed": done,
        "targets": list(targets),
        "missed_targets": pending,
        "attempts": attempts,
        "kills": kill_log,
        "env_server": server_info,
    }


# ------------------------------------------------------------------------------------------------ the checks
def lake_facts(lake: Path) -> dict:
    """What the comparison needs from one lake, read after its run ended."""
    from storage.catalog import connect

    con = connect(lake)
    q = lambda sql: con.execute(sql).fetchall()  # noqa: E731
    facts = {
        "instances": sorted(
            list(r) for r in q("SELECT iteration, stage, task_id, seed, coalesce(sample_idx, -1) FROM episodes")
        ),
        "episodes": q("SELECT count(*) FROM episodes")[0][0],
        "steps": q("SELECT count(*) FROM steps")[0][0],
        "dup_episodes": q("SELECT count(*) - count(DISTINCT episode_id) FROM episodes")[0][0],
        "dup_steps": q("SELECT count(*) - count(DISTINCT (episode_id, step_idx)) FROM steps")[0][0],
        # an episode must have every step row: one per action plus the final screen
        "partial_episodes": q(
            "SELECT count(*) FROM episodes e LEFT JOIN (SELECT episode_id, count(*) AS n FROM steps GROUP BY 1) s "
            "USING (episode_id) WHERE coalesce(s.n, 0) <> e.n_steps + 1"
        )[0][0],
        "orphan_steps": q("SELECT count(*) FROM steps WHERE episode_id NOT IN (SELECT episode_id FROM episodes)")[0][0],
        "datasets": sorted(r[0] for r in q("SELECT dataset_id FROM datasets")),
        "checkpoints": sorted(r[0] for r in q("SELECT checkpoint_id FROM checkpoints")),
        "evals": sorted(
            [r[0], round(r[1], 6)] for r in q("SELECT task_id, success_rate FROM evals WHERE task_id = '__all__'")
        ),
    }
    con.close()
    weights = {}
    for p in sorted(lake.glob("_checkpoints/*/**/model.safetensors")):
        weights[str(p.relative_to(lake))] = hashlib.sha256(p.read_bytes()).hexdigest()[:16]
    facts["weights"] = weights
    verify = subprocess.run([*FLYWHEEL, "lake", "verify", "--lake", str(lake)], capture_output=True, text=True)
    facts["verify_rc"] = verify.returncode
    facts["verify_tail"] = (verify.stdout + verify.stderr).strip().splitlines()[-3:]
    return facts


def expected_counts(cfg: Path) -> dict[str, int]:
    """Episodes per stage that the config implies (for --no-reference)."""
    from configs.loading import read_config_data

    c = read_config_data(cfg)
    g = c["rollout"]["group_size"]
    sel = lambda s: len(c[s]["selection"]["tasks"]) * c[s]["selection"]["seeds_per_task"]  # noqa: E731
    rl = c["rl"]
    return {
        "bootstrap": sel("bootstrap"),
        "rollouts": sel("rollouts") * g,
        "rl": rl["rounds"]
        * len(c["rollouts"]["selection"]["tasks"])
        * rl["seeds_per_task_per_round"]
        * rl["group_size"],
        "evaluate": sel("evaluate"),
    }


def check(run: dict, facts: dict, ref: dict | None, expected: dict[str, int] | None) -> dict:
    """Every check of one chaos seed; rows_lost counts reference instances missing here plus partial episodes."""
    from collections import Counter

    have = Counter(tuple(i) for i in facts["instances"])
    problems = []
    if ref is not None:
        want = Counter(tuple(i) for i in ref["instances"])
        missing, extra = want - have, have - want
        rows_lost = sum(missing.values()) + facts["partial_episodes"]
        if missing or extra:
            problems.append(f"episode instances differ: {sum(missing.values())} missing, {sum(extra.values())} extra")
        for key in ("datasets", "checkpoints"):
            if facts[key] != ref[key]:
                problems.append(f"{key} differ: {facts[key]} vs {ref[key]}")
        # per weight file: SFT resumes exactly (same bytes); RL re-samples a killed round's episodes, so may differ
        weights_match = {k: v == ref["weights"].get(k) for k, v in facts["weights"].items()}
    else:
        per_stage = Counter(i[1] for i in facts["instances"])
        rows_lost = sum(max(0, n - per_stage.get(s, 0)) for s, n in expected.items()) + facts["partial_episodes"]
        if dict(per_stage) != expected:
            problems.append(f"episodes per stage {dict(per_stage)}, expected {expected}")
        weights_match = None
    for key in ("dup_episodes", "dup_steps", "partial_episodes", "orphan_steps"):
        if facts[key]:
            problems.append(f"{key}: {facts[key]}")
    if facts["verify_rc"] != 0:
        problems.append(f"lake verify failed: {facts['verify_tail']}")
    if not run["completed"]:
        problems.append("the run never completed")
    bad_resumes = []
    for a in run["attempts"]:
        got, saved = a["resumed"], a["saved_at_start"]
        for key in ("sft_step", "rl_round"):
            if got[key] is not None and got[key] != saved[key]:
                bad_resumes.append({"attempt": a["attempt"], key: got[key], "saved": saved[key]})
    if bad_resumes:
        problems.append(f"resumes not from the last saved step/round: {bad_resumes}")
    # each mid-stage kill: the next attempt that ran the stage resumed it from what was saved (not from scratch)
    for k in run["kills"]:
        if k.get("target") is None:
            continue
        key = TARGETS[k["target"]]
        later = [a for a in run["attempts"] if a["attempt"] > k["attempt"] and a["resumed"][key] is not None]
        if not later:
            problems.append(f"after the mid-{k['target']} kill {k['kill']}, no attempt ran {k['target']} again")
        elif not 0 < k["saved"][key] <= later[0]["resumed"][key]:
            got = later[0]["resumed"][key]
            problems.append(
                f"after the mid-{k['target']} kill {k['kill']} ({key} {k['saved'][key]} saved), attempt "
                f"{later[0]['attempt']} started {k['target']} at {got}"
            )
    if run.get("missed_targets"):
        problems.append(f"no kill landed mid-stage in {run['missed_targets']}")
    srv = run.get("env_server") or {}
    if srv.get("leaked") or srv.get("left_after_stop"):
        problems.append(f"the env server leaked {srv.get('leaked')}; left after its stop: {srv.get('left_after_stop')}")
    orphan_attempts = [a["attempt"] for a in run["attempts"] if a["orphans"]]
    stuck = [a["attempt"] for a in run["attempts"] if a["stuck"] or a.get("failed_unkilled")]
    # a kill is survived when its attempt left no orphan, nothing got stuck after it, and its seed passed every check
    survived = 0
    if not problems:
        bad = set(orphan_attempts) | set(stuck) | {s - 1 for s in stuck}
        survived = sum(1 for k in run["kills"] if k["attempt"] not in bad)
    if orphan_attempts:
        problems.append(f"orphans after attempts {orphan_attempts}")
    if stuck:
        problems.append(f"stuck or failed resumes in attempts {stuck}")
    return {
        "ok": not problems,
        "problems": problems,
        "rows_lost": rows_lost,
        "kills_survived": survived,
        "weights_match_reference": weights_match,
        "resumes_checked": sum(1 for a in run["attempts"] for v in a["resumed"].values() if v is not None),
        "resumes_mid_stage": {t: sum(1 for a in run["attempts"] if a["resumed"][key]) for t, key in TARGETS.items()},
        "server_leaks": len((run.get("env_server") or {}).get("leaked", [])),
    }


def recheck(path: Path, out: str | None) -> int:
    """Recompute every seed's checks (and the totals) of a finished run from its lakes, which are kept."""
    rep = json.loads(path.read_text())
    refs: dict[str, dict] = {}
    for s in rep["seeds"]:
        ref_lake = s.get("reference_lake")
        if ref_lake and ref_lake not in refs:
            refs[ref_lake] = lake_facts(Path(ref_lake))
        cfg = Path(s["lake"]).parents[1] / "chaos.yaml"
        s.update(check(s, lake_facts(Path(s["lake"])), refs.get(ref_lake), expected_counts(cfg)))
    rep["kills_survived"] = sum(s["kills_survived"] for s in rep["seeds"])
    rep["rows_lost"] = sum(s["rows_lost"] for s in rep["seeds"])
    rep["all_ok"] = all(s["ok"] for s in rep["seeds"])
    text = json.dumps(rep, indent=1, default=str)
    Path(out or path).write_text(text + "\n")
    print(text)
    return 0 if rep["all_ok"] and rep["kills_survived"] == rep["kills_sent"] else 1


def _seed_list(text: str) -> list[int]:
    return [int(s) for s in text.split(",") if s.strip()]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", default="0,1,2", help="Killer seeds, comma-separated")
    ap.add_argument("--kills", type=int, default=17, help="Kills per seed (the mid-stage ones included)")
    ap.add_argument("--min-total-kills", type=int, default=0, help="Add seeds until this many kills were sent")
    ap.add_argument("--min-delay", type=float, default=0.5, help="Shortest delay of a kill into its stage (s)")
    ap.add_argument(
        "--max-delay", type=float, default=8.0, help="Longest delay of a kill into its stage (s; x3 for startup)"
    )
    ap.add_argument("--grace", type=float, default=20.0, help="Time a dead parent's processes get to exit (s)")
    ap.add_argument("--stall", type=float, default=180.0, help="An attempt silent this long is stuck (s)")
    ap.add_argument(
        "--targets", default="sft,rl", help="Stages that get one kill each mid-stage, after a saved step / round"
    )
    ap.add_argument(
        "--env-server",
        default="1",
        help="Seeds whose episodes run on an env server started here (its slots are victims too): a list, "
        "'all' or 'none'",
    )
    ap.add_argument("--work", default="bench-out/chaos", help="Scratch folder (wiped)")
    ap.add_argument("--no-reference", action="store_true", help="Check counts the config implies, no undisturbed run")
    ap.add_argument("--out", default=None, help="Also write the JSON here (e.g. docs/bench_chaos.json)")
    ap.add_argument("--recheck", default=None, help="Redo the checks of a finished run's JSON from its lakes")
    a = ap.parse_args(argv)
    if a.recheck:
        return recheck(Path(a.recheck), a.out)
    targets = tuple(t for t in a.targets.split(",") if t.strip())
    if set(targets) - set(TARGETS):
        ap.error(f"--targets: choose from {sorted(TARGETS)}")
    become_subreaper()
    work = Path(a.work).resolve()
    if work.exists():
        subprocess.run(["rm", "-rf", str(work)], check=True)
    work.mkdir(parents=True)
    cfg = make_config(work)
    t_start = time.monotonic()
    refs: dict[str, tuple[dict, dict]] = {}  # env -> (the undisturbed run, its lake's facts)

    def reference(remote: bool) -> tuple[dict, dict] | None:
        if a.no_reference:
            return None
        env = "remote" if remote else "miniwob"
        if env not in refs:
            home = work / ("reference-remote" if remote else "reference")
            log(f"reference ({env}): an undisturbed run")
            run = run_seed(cfg, home, None, 0, 0, 0, a.grace, a.stall, server=remote)
            if not run["completed"]:
                raise SystemExit(f"error: the undisturbed reference run failed; see {home}")
            facts = lake_facts(home / "lake")
            log(f"reference ({env}): {run['wall_s']} s, {facts['episodes']} episodes, {facts['steps']} steps")
            refs[env] = (run, facts)
        return refs[env]

    expected = expected_counts(cfg)
    seeds = _seed_list(a.seeds)
    per_seed, i = [], 0
    while i < len(seeds) or sum(len(s["kills"]) for s in per_seed) < a.min_total_kills:
        seed = seeds[i] if i < len(seeds) else max(seeds) + 1 + i - len(seeds)
        i += 1
        remote = a.env_server == "all" or (a.env_server != "none" and seed in _seed_list(a.env_server))
        ref = reference(remote)
        log(f"seed {seed}: {a.kills} kills ({'env server' if remote else 'local MiniWoB'}, mid-stage {targets})")
        run = run_seed(
            cfg, work / f"seed-{seed}", seed, a.kills, a.min_delay, a.max_delay, a.grace, a.stall, targets, remote
        )
        facts = lake_facts(Path(run["lake"]))
        res = check(run, facts, ref[1] if ref else None, expected)
        n = len(run["kills"])
        log(f"seed {seed}: {n} kills, {res['kills_survived']} survived, ok={res['ok']} {res['problems']}")
        per_seed.append(
            {
                **run,
                **res,
                "reference_lake": ref[0]["lake"] if ref else None,
                "extra_wall_s": round(run["wall_s"] - ref[0]["wall_s"], 1) if ref else None,
                "episodes": facts["episodes"],
                "steps": facts["steps"],
                "datasets": facts["datasets"],
                "checkpoints": facts["checkpoints"],
                "evals": facts["evals"],
                "verify_rc": facts["verify_rc"],
            }
        )
    from collections import Counter

    kills = [k for s in per_seed for k in s["kills"]]
    out = {
        "benchmark": "chaos iteration (issue 32, part 1)",
        "date": time.strftime("%Y-%m-%d"),
        "machine": f"{os.cpu_count()} CPU cores",
        "config": {"base": "configs/tiny.yaml", "edits": CONFIG_EDITS, "evaluate.held_out_tasks": False},
        "commands": {
            "benchmark": "benchmarks/chaos.py " + " ".join(sys.argv[1:] if argv is None else argv),
            "run": " ".join(
                ["flywheel", "run", "-c", "<work>/chaos.yaml", "--lake", "<work>/seed-N/lake", "--start", "0"]
            ),
            "env_server": f"flywheel env serve --slots {SERVER_SLOTS} --port 0 --health-interval 5 "
            "(env.name remote; <work>/seed-N/chaos-remote.yaml)",
            "verify": "flywheel lake verify --lake <work>/seed-N/lake",
        },
        "killer": {
            "min_delay_s": a.min_delay,
            "max_delay_s": a.max_delay,
            "grace_s": a.grace,
            "stall_s": a.stall,
            "targets": list(targets),
            "env_server_seeds": a.env_server,
        },
        "kills_sent": len(kills),
        "kills_survived": sum(s["kills_survived"] for s in per_seed),
        "rows_lost": sum(s["rows_lost"] for s in per_seed),
        "orphans": sum(len(at["orphans"]) for s in per_seed for at in s["attempts"]),
        "server_leaks": sum(s["server_leaks"] for s in per_seed),
        "resumes_mid_stage": {t: sum(s["resumes_mid_stage"][t] for s in per_seed) for t in TARGETS},
        "all_ok": all(s["ok"] for s in per_seed),
        "kills_by_role": dict(Counter(k["role"] for k in kills)),
        "kills_by_stage": dict(Counter(k["stage"] for k in kills)),
        "kills_mid_stage": dict(Counter(k["target"] for k in kills if k.get("target"))),
        "references": {
            env: {
                "wall_s": run["wall_s"],
                "lake": run["lake"],
                "episodes": facts["episodes"],
                "steps": facts["steps"],
                "datasets": facts["datasets"],
                "checkpoints": facts["checkpoints"],
                "evals": facts["evals"],
                "env_server": run["env_server"],
            }
            for env, (run, facts) in refs.items()
        },
        "expected_episodes_per_stage": expected,
        "mean_extra_wall_s": round(sum(s["extra_wall_s"] for s in per_seed) / len(per_seed), 1) if refs else None,
        "total_wall_s": round(time.monotonic() - t_start, 1),
        "seeds": per_seed,
    }
    text = json.dumps(out, indent=1, default=str)
    if a.out:
        Path(a.out).write_text(text + "\n")
    print(text)
    return 0 if out["all_ok"] and out["kills_survived"] == out["kills_sent"] else 1


if __name__ == "__main__":
    sys.exit(main())
