"""Progress lines where no bar draws (training/progress.py): the cadence on a fake clock, the fields, no lines
where a bar draws, where the console handler writes (a redirected stdout, stderr), the forwarding to a run logger
(what flows.common.run_stage does with Prefect's), and a short real SFT run logging them when not on a terminal."""

from __future__ import annotations

import io
import logging
import re
import sys

import pytest
from test_sft import FAST, env  # noqa: F401 - `env`: test_sft's module fixture (a tiny model and a curated dataset)

from training import progress
from training.progress import LOGGER_NAME, ProgressLog, draws_bar, duration, forward_to


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


class Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


class Stream(io.StringIO):
    def __init__(self, tty: bool) -> None:
        super().__init__()
        self.tty = tty

    def isatty(self) -> bool:
        return self.tty


@pytest.fixture
def lines():
    h = Records()
    log = logging.getLogger(LOGGER_NAME)
    log.addHandler(h)
    yield h.lines
    log.removeHandler(h)


def test_cadence_start_every_30s_and_always_a_final_line(lines):
    clock = Clock()
    p = ProgressLog("sft", 540, clock=clock, every=30)
    assert lines == ["sft: step 0/540 (0%), started"]
    for t, step in ((1, 1), (15, 20), (29.9, 35)):
        clock.t = 1000 + t
        p.update(step, loss=0.5)
    assert len(lines) == 1  # nothing before 30 s
    clock.t = 1030
    p.update(36, loss=0.45)
    assert len(lines) == 2
    clock.t = 1059  # 29 s after the last line
    p.update(70, loss=0.44)
    assert len(lines) == 2
    clock.t = 1061
    p.update(72, loss=0.43)
    assert len(lines) == 3
    clock.t = 1062
    p.stop()
    p.stop()  # once
    assert len(lines) == 4 and "ended after 1m02s" in lines[-1]
    p.update(80)  # after stop: nothing
    assert len(lines) == 4
    q = ProgressLog("sft", 2, clock=clock, every=30)
    clock.t += 60
    q.update(2, loss=0.1)  # the last step: no periodic line right before the final one
    q.stop()
    assert lines[-2:] == ["sft: step 0/2 (0%), started", "sft: step 2/2 (100%), 30s/step, ended after 1m00s, loss 0.1"]


def test_a_short_run_still_logs_its_final_line(lines):
    clock = Clock()
    with ProgressLog("evaluate", 4, unit="episodes", unit_after=True, rate_unit="ep", clock=clock) as p:
        clock.t += 2
        p.update(4, success=0.5)
    assert lines == [
        "evaluate: 0/4 episodes (0%), started",
        "evaluate: 4/4 episodes (100%), 2 ep/s, ended after 2s, success 0.5",
    ]


def test_fields_step_total_rate_eta_and_the_latest_stats(lines):
    clock = Clock()
    p = ProgressLog("sft", 540, clock=clock, every=30)
    clock.t += 120 / 1.05
    p.update(120, loss=0.4123)
    assert lines[-1] == "sft: step 120/540 (22%), 1.05 step/s, ETA 6m40s, loss 0.412"
    r = ProgressLog("rollouts", 128, unit="episodes", unit_after=True, rate_unit="ep", clock=clock, every=30)
    clock.t += 64 / 2.1
    r.update(64, success=0.41, errors=None)  # None: left out
    assert lines[-1] == "rollouts: 64/128 episodes (50%), 2.1 ep/s, ETA 30s, success 0.41"
    rl = ProgressLog("rl", 8, 2, unit="round", clock=clock, every=30)  # resumed at round 2: the rate counts from there
    clock.t += 130
    rl.update(3, success=0.25)
    assert lines[-1] == "rl: round 3/8 (37%), 2m10s/round, ETA 10m50s, success 0.25"
    u = ProgressLog("rl round 3 clone", None, clock=clock, every=30)  # no known total: no percent, no ETA
    clock.t += 40
    u.update(80, loss=1.5)
    assert lines[-1] == "rl round 3 clone: step 80, 2 step/s, loss 1.5"
    assert [duration(s) for s in (0.4, 45, 400, 3725)] == ["0s", "45s", "6m40s", "1h02m"]


def test_every_defaults_to_30s_and_follows_the_environment(monkeypatch):
    monkeypatch.delenv(progress.EVERY_ENV, raising=False)
    assert ProgressLog("x", 1, quiet=True).every == 30.0
    monkeypatch.setenv(progress.EVERY_ENV, "5")
    assert ProgressLog("x", 1, quiet=True).every == 5.0


def test_a_terminal_draws_the_bar_and_no_lines(lines):
    tty, redirected = Stream(tty=True), Stream(tty=False)
    assert draws_bar(True, tty) and not draws_bar(True, redirected) and not draws_bar(False, tty)
    clock = Clock()
    p = ProgressLog("sft", 10, clock=clock, every=30, quiet=draws_bar(True, tty))
    for step in range(1, 11):
        clock.t += 60
        p.update(step, loss=1.0)
    p.stop()
    assert lines == []


def test_forward_to_a_run_logger_without_a_second_console_line(lines):
    class RunLogger:  # what Prefect's get_run_logger() returns is used the same way: .log(level, message)
        def __init__(self) -> None:
            self.got: list[tuple[int, str]] = []

        def log(self, level: int, msg: str) -> None:
            self.got.append((level, msg))

    run_log = RunLogger()
    log = logging.getLogger(LOGGER_NAME)
    before = list(log.handlers)
    with forward_to(run_log):
        assert log.propagate is False  # the root's console handler would print it a second time
        ProgressLog("sft", 3, clock=Clock()).stop()
    assert log.propagate is True and log.handlers == before
    assert [m for _, m in run_log.got] == lines and run_log.got[0][0] == logging.INFO and len(lines) == 2


def test_console_handler_writes_stdout_only(monkeypatch, tmp_path):
    """The CLI's copy goes to stdout, never stderr (a command's stderr is its one error line): `flywheel stage sft
    > log.txt` puts it in the file; `> log.txt 2>&1` once; with a run logger (Prefect's console prints on stderr
    itself) only a redirected stdout gets a copy, a terminal none (it shows Prefect's line already)."""
    log = logging.getLogger(LOGGER_NAME)
    monkeypatch.setattr(log, "propagate", False)  # as with no root handler (pytest's would count as one)
    monkeypatch.setattr(log, "handlers", [])
    progress.show_on_console()
    progress.show_on_console()  # once
    assert len(log.handlers) == 1

    def run(out, err, forwarding=False):
        monkeypatch.setattr(sys, "stdout", out)
        monkeypatch.setattr(sys, "stderr", err)
        monkeypatch.setattr(progress, "_forwarding", int(forwarding))
        log.info("sft: step 1/2 (50%)")  # monkeypatch puts the real streams back at the end

    with open(tmp_path / "out.txt", "w") as out, open(tmp_path / "err.txt", "w") as err:
        run(out, err)
    assert "sft: step 1/2" in (tmp_path / "out.txt").read_text() and (tmp_path / "err.txt").read_text() == ""
    with open(tmp_path / "both.txt", "w") as both:
        run(both, both)
    assert (tmp_path / "both.txt").read_text().count("sft: step 1/2") == 1
    with open(tmp_path / "out2.txt", "w") as out, open(tmp_path / "err2.txt", "w") as err:
        run(out, err, forwarding=True)
    assert "sft: step" in (tmp_path / "out2.txt").read_text() and (tmp_path / "err2.txt").read_text() == ""
    tty_out, err = Stream(tty=True), Stream(tty=False)
    run(tty_out, err)
    assert "sft: step" in tty_out.getvalue() and err.getvalue() == ""  # no run logger: the terminal's stdout
    tty_out, err = Stream(tty=True), Stream(tty=False)
    run(tty_out, err, forwarding=True)
    assert tty_out.getvalue() == "" and err.getvalue() == ""  # Prefect's console shows it: no second copy


@pytest.mark.browser
def test_sft_run_logs_progress_lines_when_not_on_a_terminal(env, tmp_path, monkeypatch, caplog):  # noqa: F811
    from training.sft import TrainSettings, train

    monkeypatch.setattr(sys, "stdout", Stream(tty=False))
    monkeypatch.setenv(progress.EVERY_ENV, "0.001")
    s = TrainSettings(**{**FAST, "epochs": 2.0})  # 15 steps
    with caplog.at_level(logging.INFO, logger=LOGGER_NAME):
        m = train(env["tiny"], env["data"], tmp_path / "out", s, progress=True)
    got = [r.getMessage() for r in caplog.records if r.name == LOGGER_NAME]
    assert got[0] == f"sft: step 0/{m['planned_steps']} (0%), started"
    assert len(got) >= 3 and got[-1].startswith(f"sft: step {m['steps']}/{m['planned_steps']} (100%), ")
    assert "ended after" in got[-1]
    mid = [g for g in got[1:-1] if "ETA" in g]
    assert mid and re.fullmatch(r"sft: step \d+/\d+ \(\d+%\), [\d.]+ step/s, ETA \w+, loss [\d.e+-]+", mid[0]), mid
