"""Bad input as a new user gives it (issue 32, part 4): each case is one line on stderr and exit 2, nothing written.
The table of what each prints: docs/ERRORS.md."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from synthetic import synthetic_episodes

from storage.lake import Lake

ROOT = Path(__file__).resolve().parents[1]
TINY = str(ROOT / "configs" / "tiny.yaml")


def _env() -> dict:
    env = {k: v for k, v in os.environ.items() if k != "FLYWHEEL_LAKE"}
    return {**env, "HF_HUB_OFFLINE": "1", "COLUMNS": "400"}


def run_fw(*args, cwd=None, prefix=(), timeout=180) -> subprocess.CompletedProcess:
    cmd = [*prefix, sys.executable, "-m", "flywheel", *args]
    return subprocess.run(cmd, capture_output=True, text=True, cwd=cwd or ROOT, env=_env(), timeout=timeout)


def one_line(r: subprocess.CompletedProcess) -> str:
    """The error of a failed command: exit 2, exactly one non-empty stderr line, no traceback anywhere."""
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert r.returncode == 2, (r.returncode, r.stderr[-2000:])
    assert "Traceback" not in r.stderr + r.stdout and len(lines) == 1, r.stderr[-2000:]
    return lines[0]


def _small_lake(root: Path) -> Lake:
    lk = Lake(root)
    eps, steps = synthetic_episodes(4, 2)
    lk.write("episodes", eps, iteration=0, stage="rollouts", run_key="r")
    lk.write("steps", steps, iteration=0, stage="rollouts", run_key="r")
    return lk


# ---------------------------------------------------------------------------- the lake
@pytest.mark.parametrize(
    "args",
    [["lake", "stats"], ["query", "SELECT 1"], ["stage", "curate", "-c", TINY]],
    ids=["lake-stats", "query", "stage-curate"],
)
def test_lake_folder_that_is_a_file(tmp_path, args):
    f = tmp_path / "lake"
    f.write_text("not a lake")
    line = one_line(run_fw(*args, "--lake", str(f)))
    assert f"lake root {f} is not a directory" in line
    assert f.read_text() == "not a lake"  # untouched


def test_lake_root_that_cannot_be_created(tmp_path):
    """A config whose lake.root sits under a path no one can create (/proc is read-only for root too)."""
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(Path(TINY).read_text().replace("root: lake", "root: /proc/no-such-dir/lake"))
    assert "/proc/no-such-dir/lake" in cfg.read_text()
    line = one_line(run_fw("stage", "curate", "-c", str(cfg)))
    assert line.startswith("error: cannot create or open the lake:") and "/proc/no-such-dir" in line


def _read_only_prefix(lake: Path) -> list[str]:
    """A command prefix under which `lake` really denies writes: chmod for a normal user; for root (whom chmod does
    not stop) a private mount namespace with a read-only bind mount of the lake. Skips where neither is possible."""
    if os.geteuid() != 0:
        for p in [lake, *lake.rglob("*")]:
            p.chmod(p.stat().st_mode & ~0o222)
        return []
    if not shutil.which("unshare"):
        pytest.skip("running as root (chmod does not deny root writes) and no `unshare` for a read-only mount")
    ro = f'mount --bind {lake} {lake} && mount -o remount,bind,ro {lake} && exec "$0" "$@"'
    probe = subprocess.run(["unshare", "-m", "sh", "-c", ro, "sh", "-c", f"! touch {lake}/probe"], capture_output=True)
    if probe.returncode != 0:
        pytest.skip(f"running as root and cannot make a read-only mount here: {probe.stderr.decode()[-200:]}")
    return ["unshare", "-m", "sh", "-c", ro]


@pytest.mark.parametrize("args", [["lake", "stats"], ["stage", "curate", "-c", TINY]], ids=["lake-stats", "curate"])
def test_read_only_lake(tmp_path, args):
    lake = _small_lake(tmp_path / "lake").root
    before = sorted(p.relative_to(lake) for p in lake.rglob("*"))
    line = one_line(run_fw(*args, "--lake", str(lake), prefix=_read_only_prefix(lake)))
    assert line.startswith("error:") and str(lake) in line
    assert sorted(p.relative_to(lake) for p in lake.rglob("*")) == before  # nothing written


# ---------------------------------------------------------------------------- model folders
@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("model") / "m"
    r = run_fw("model", "init", "--size", "tiny", "--out", str(out), "--device", "cpu")
    assert r.returncode == 0, r.stderr[-2000:]
    return out


def _rollout(model: Path, lake: Path) -> subprocess.CompletedProcess:
    args = ["--policy", "student", "--model", str(model), "--tasks", "click-test", "--seeds", "0"]
    return run_fw("rollout", *args, "--lake", str(lake), "-c", TINY)


def _broken(tiny_model: Path, tmp_path: Path, how: str) -> Path:
    bad = tmp_path / how
    shutil.copytree(tiny_model, bad)
    w = bad / "model.safetensors"
    if how == "no-weights":
        w.unlink()
    elif how == "cut-weights":
        with w.open("r+b") as f:
            f.truncate(w.stat().st_size // 2)
    elif how == "other-arch":
        cfg = json.loads((bad / "config.json").read_text())
        (bad / "config.json").write_text(
            json.dumps({**cfg, "model_type": "llama", "architectures": ["LlamaForCausalLM"]})
        )
    return bad


@pytest.mark.parametrize(
    "how, needle",
    [
        ("no-weights", "has no weights (model.safetensors): an incomplete checkpoint folder"),
        ("cut-weights", "model.safetensors is cut short"),
        ("other-arch", "model type 'llama' is not Qwen3-VL or Qwen2.5-VL (config.json)"),
    ],
)
def test_broken_model_folder_fails_before_any_worker(tiny_model, tmp_path, how, needle):
    bad, lake = _broken(tiny_model, tmp_path, how), tmp_path / "lake"
    assert needle in one_line(_rollout(bad, lake))
    assert not lake.exists()  # checked up front: no lake written, no worker started
    r = run_fw("stage", "evaluate", "--checkpoint", str(bad), "--lake", str(lake), "-c", TINY)
    assert needle in one_line(r) and not lake.exists()


def test_whole_model_folder_passes_the_check(tiny_model):
    """The up-front check must not refuse a good folder (else the broken-folder tests could pass vacuously)."""
    from flywheel.specs import check_model_folder

    check_model_folder(tiny_model)


# ---------------------------------------------------------------------------- flywheel up
def test_up_on_a_taken_port(tmp_path):
    """Another process holds the port (not a Prefect server): `flywheel up` says so at once, starts nothing."""
    shutil.copy(ROOT / "prefect.yaml", tmp_path / "prefect.yaml")  # a project folder of its own: own .prefect state
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        r = run_fw("up", "--port", str(port), cwd=tmp_path, timeout=150)
    line = one_line(r)
    assert f"port {port} on 127.0.0.1 is taken by another process" in line and "pick another --port" in line
    assert not (tmp_path / ".prefect" / "flywheel-up.json").exists()  # no server, pool or worker left behind


# ---------------------------------------------------------------------------- Ctrl-C during a stage
def _interrupted(args: list[str], ready, timeout: float = 300) -> None:
    """Run `flywheel *args` in a process group of its own and send the group SIGINT (what Ctrl-C sends) once
    `ready()` is true; checks it ends with the one line and exit 130. The command must still be running then."""
    import signal
    import threading
    import time

    # SIGINT back to its default in the child: a test run started in the background by a shell without job control
    # inherits SIGINT ignored, and an ignored signal stays ignored across exec (Python then installs no handler)
    p = subprocess.Popen(
        [sys.executable, "-m", "flywheel", *args],
        cwd=ROOT,
        env=_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    out_lines: list[str] = []
    reader = threading.Thread(target=lambda: out_lines.extend(p.stdout), daemon=True)
    reader.start()
    deadline = time.time() + timeout
    while time.time() < deadline and p.poll() is None:
        try:
            if ready():
                break
        except Exception:  # noqa: BLE001 - nothing written yet
            pass
        time.sleep(0.3)
    assert p.poll() is None, f"the command ended before it could be interrupted: {p.communicate()[1][-2000:]}"
    os.killpg(p.pid, signal.SIGINT)
    err = p.communicate(timeout=120)[1]
    reader.join(timeout=10)
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert p.returncode == 130, (p.returncode, err[-2000:])
    # the interrupt's one line ends stderr (progress bars from before it may precede it)
    assert lines[-1] == "interrupted (Ctrl-C); rerun the same command to continue", err[-2000:]
    assert sum("interrupted" in ln or "Error" in ln for ln in lines) == 1, err[-2000:]
    assert "Traceback" not in "".join(out_lines) + err


def test_ctrl_c_during_rollouts_leaves_whole_episodes_and_the_rerun_completes(tmp_path):
    """SIGINT to the command's process group (what Ctrl-C sends) mid-rollout: one line, exit 130, only whole
    episodes in the lake (every episode has its steps), and the same command run again fills in the rest."""
    lake = tmp_path / "lake"
    args = ["rollout", "--policy", "scripted", "--tasks", "click-test,focus-text", "--seeds", "0-49", "--envs", "1"]

    def counts():
        from storage.catalog import connect

        db = connect(Lake(lake, create=False))
        n_eps = db.execute("SELECT count(*) FROM episodes").fetchone()[0]
        orphans = db.execute(
            "SELECT count(*) FROM episodes e WHERE NOT EXISTS (SELECT 1 FROM steps s WHERE s.episode_id = e.episode_id)"
        ).fetchone()[0]
        return n_eps, orphans

    # interrupt once the first episodes are committed (a slow box only moves this later; 100 episodes take ~20 s
    # at the tiny config's ~5/s, so the interrupt lands mid-run)
    _interrupted([*args, "-c", TINY, "--lake", str(lake)], lambda: counts()[0] >= 2)

    n_eps, orphans = counts()
    assert 0 < n_eps < 100 and orphans == 0  # interrupted partway; nothing partial
    r = run_fw(*args, "-c", TINY, "--lake", str(lake))
    assert r.returncode == 0, r.stderr[-2000:]
    assert counts() == (100, 0)
    v = run_fw("lake", "verify", "--lake", str(lake))
    assert v.returncode == 0 and "0 bad" in v.stdout, v.stdout + v.stderr


@pytest.mark.slow
def test_ctrl_c_during_sft_keeps_its_last_state_and_the_rerun_resumes(tmp_path):
    """SIGINT mid-SFT: one line, exit 130, no checkpoint row (nothing partial), the last saved state kept; the same
    command run again resumes from that state (not from step 0) and records the one checkpoint."""
    lake = tmp_path / "lake"
    import yaml

    from training.models import init_model

    c = yaml.safe_load(Path(TINY).read_text())
    c["student"]["model"] = str(init_model("qwen3-vl", "tiny", tmp_path / "model"))
    c["sft"] = {"save_every": 2, "epochs": 60}  # a state every 2 steps; enough steps that the interrupt lands mid-run
    cfg = tmp_path / "tiny-sft.yaml"
    cfg.write_text(yaml.safe_dump(c))
    for stage in ("bootstrap", "curate"):
        r = run_fw("stage", stage, "-c", str(cfg), "--lake", str(lake))
        assert r.returncode == 0, r.stderr[-2000:]
    states = lambda: sorted(lake.glob("_checkpoints/*/state/step-*"))  # noqa: E731
    _interrupted(["stage", "sft", "-c", str(cfg), "--lake", str(lake)], lambda: len(states()) > 0)

    assert states(), "the interrupted run kept no state to resume from"
    n = lambda: len(Lake(lake, create=False).rows("checkpoints"))  # noqa: E731
    assert n() == 0  # no row for a checkpoint that never finished
    r = run_fw("stage", "sft", "-c", str(cfg), "--lake", str(lake), timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    (result,) = [json.loads(p.read_text()) for p in lake.glob("_checkpoints/*/sft_result.json")]
    assert 2 <= result["resumed_from_step"] < result["steps"], result
    assert n() == 1
