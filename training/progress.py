"""Progress lines for where no bar draws: a redirected CLI (`flywheel run > log.txt`) and Prefect's run logs.

    plog = ProgressLog("sft", total=540, done=0, quiet=bar is not None)   # quiet: a rich bar shows it instead
    plog.update(120, loss=0.412)   # logs at most every FLYWHEEL_PROGRESS_EVERY_S (default 30) seconds
    plog.stop()                    # always one final line

    sft: step 120/540 (22%), 1.05 step/s, ETA 6m40s, loss 0.412
    rollouts: 64/128 episodes (50%), 2.1 ep/s, ETA 30s, success 0.41
    rl: round 3/8 (37%), 2m10s/round, ETA 10m50s, success 0.41

Long stages (SFT, RL rounds / updates / clone steps, every rollout run) draw a rich bar when `progress` is on and
stdout is a terminal (`draws_bar`), else log these lines on the `flywheel.progress` logger (level INFO). Where they
show:
- under Prefect, flows.common.run_stage forwards them (`forward_to`) to the stage flow run's logger: the run's log
  in the UI / API, and Prefect's console handler (stderr);
- the `flywheel` CLI calls `show_on_console()`: on stdout, never stderr (a failed command's stderr is its one
  error line); under Prefect, whose console handler prints them on stderr already, only a stdout redirected to
  another file gets a copy, so `flywheel run > log.txt` holds them as well as `flywheel run > log.txt 2>&1` (once).
Elsewhere they are plain `logging` records: a program that configures logging sees them (pytest's caplog does).
Not yet shown: a DDP run's (`distributed: ddp`); its rank 0 logs them inside torchrun's worker processes.
No Prefect import here: the trainers and the rollout runner use it without Prefect.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from contextlib import contextmanager
from typing import Any, Callable, Iterator, TextIO

LOGGER_NAME = "flywheel.progress"
EVERY_ENV = "FLYWHEEL_PROGRESS_EVERY_S"
log = logging.getLogger(LOGGER_NAME)
if log.level == logging.NOTSET:  # INFO passes even where the root logger stays at WARNING (Prefect's default)
    log.setLevel(logging.INFO)
_forwarding = 0  # > 0 while forward_to() sends the lines to a run logger (which prints them on stderr itself)


def every_s() -> float:
    """Seconds between progress lines: $FLYWHEEL_PROGRESS_EVERY_S, else 30."""
    return float(os.environ.get(EVERY_ENV) or 30.0)


def _isatty(stream: Any) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):  # no isatty, or a closed stream
        return False


def draws_bar(progress: bool, stream: TextIO | None = None) -> bool:
    """A rich bar draws when progress is asked for and stdout (or `stream`) is a terminal; else progress lines."""
    return bool(progress) and _isatty(stream if stream is not None else sys.stdout)


def duration(s: float) -> str:
    """45s, 6m40s, 1h02m."""
    s = max(0, int(round(s)))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


def _value(v: Any) -> str:
    return f"{v:.3g}" if isinstance(v, float) else str(v)


class ProgressLog:
    """Logs `label: step done/total (pct), rate, ETA, stats` at start, at most every `every` seconds on update, and
    once at stop. `quiet` (a bar draws, or a DDP rank other than 0) logs nothing. `unit_after` writes the count as
    `64/128 episodes` instead of `step 120/540`; `rate_unit` names the unit in the rate (default: `unit`).
    `clock` is injectable (tests)."""

    def __init__(
        self,
        label: str,
        total: int | None,
        done: int = 0,
        *,
        unit: str = "step",
        unit_after: bool = False,
        rate_unit: str | None = None,
        quiet: bool = False,
        every: float | None = None,
        clock: Callable[[], float] = time.monotonic,
        logger: logging.Logger | None = None,
    ):
        self.label, self.total, self.done, self.first = label, total, done, done
        self.unit, self.unit_after, self.rate_unit = unit, unit_after, rate_unit or unit
        self.quiet, self.every = quiet, every_s() if every is None else every
        self.clock, self.log = clock, logger or log
        self.stats: dict[str, Any] = {}
        self.t0 = self.last = clock()
        self.stopped = False
        if not quiet:
            self._emit(self.t0, "started")

    def update(self, done: int, **stats: Any) -> None:
        """`done` units so far and the latest stats (loss=, success=, ...; None leaves a stat out)."""
        self.done = done
        self.stats.update(stats)
        if self.quiet or self.stopped:
            return
        now = self.clock()
        if now - self.last >= self.every and not (self.total and done >= self.total):  # the end: stop()'s line
            self._emit(now)

    def stop(self) -> None:
        """The final line (once): where it ended, the mean rate, and how long it took."""
        if self.quiet or self.stopped:
            return
        self.stopped = True
        now = self.clock()
        self._emit(now, f"ended after {duration(now - self.t0)}")

    def __enter__(self) -> "ProgressLog":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def line(self, now: float, note: str | None = None) -> str:
        count = f"{self.done}/{self.total}" if self.total else f"{self.done}"
        parts = [f"{count} {self.unit}" if self.unit_after else f"{self.unit} {count}"]
        if self.total:
            parts[0] += f" ({min(100, 100 * self.done // self.total)}%)"
        rate = (self.done - self.first) / (now - self.t0) if now > self.t0 else 0.0
        if rate > 0:
            parts.append(f"{rate:.3g} {self.rate_unit}/s" if rate >= 0.1 else f"{duration(1 / rate)}/{self.rate_unit}")
            if self.total and note is None and self.done < self.total:
                parts.append(f"ETA {duration((self.total - self.done) / rate)}")
        if note:
            parts.append(note)
        parts += [f"{k} {_value(v)}" for k, v in self.stats.items() if v is not None]
        return f"{self.label}: " + ", ".join(parts)

    def _emit(self, now: float, note: str | None = None) -> None:
        self.last = now
        self.log.info(self.line(now, note))


# ------------------------------------------------------------------------------------------------ where lines go
@contextmanager
def forward_to(target: Any) -> Iterator[None]:
    """Send the progress lines to `target` (a logger or adapter, e.g. Prefect's run logger) while inside; they do
    not propagate to the root logger meanwhile, so a console handler there does not print them a second time."""
    global _forwarding
    h = _Forward(target)
    log.addHandler(h)
    propagate, log.propagate = log.propagate, False
    _forwarding += 1
    try:
        yield
    finally:
        _forwarding -= 1
        log.propagate = propagate
        log.removeHandler(h)


class _Forward(logging.Handler):
    def __init__(self, target: Any):
        super().__init__()
        self.target = target

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self.target.log(record.levelno, record.getMessage())
        except Exception:  # noqa: BLE001 - progress is informational; a failed send never stops training
            self.handleError(record)


def _same_file(a: TextIO, b: TextIO) -> bool:
    try:
        sa, sb = os.fstat(a.fileno()), os.fstat(b.fileno())
    except (AttributeError, OSError, ValueError):  # no file descriptor (a test's StringIO)
        return False
    return (sa.st_dev, sa.st_ino) == (sb.st_dev, sb.st_ino)


class _Console(logging.Handler):
    """stdout, never stderr: a CLI command's stderr holds only its one error line (exit 2). When a run logger
    (forward_to) or a root handler (Prefect's console) already prints the lines on stderr, the stdout copy is
    written only where stdout is redirected to another file (`> log.txt`), so a terminal shows each line once."""

    def __init__(self) -> None:
        super().__init__()
        self.setFormatter(logging.Formatter("%(asctime)s | %(message)s", "%H:%M:%S"))

    def emit(self, record: logging.LogRecord) -> None:
        try:
            text = self.format(record) + "\n"
            out, err = sys.stdout, sys.stderr
            elsewhere = _forwarding > 0 or (
                log.propagate and any(h.level <= record.levelno for h in logging.getLogger().handlers)
            )
            if not elsewhere or (not _isatty(out) and not _same_file(out, err)):  # same file: the line is there
                out.write(text)
                out.flush()
        except Exception:  # noqa: BLE001
            self.handleError(record)


def show_on_console() -> None:
    """The `flywheel` CLI calls this once, so progress lines print where no bar draws (see the module doc)."""
    if not any(isinstance(h, _Console) for h in log.handlers):
        log.addHandler(_Console())
