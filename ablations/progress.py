"""Progress lines a person can follow: one line per change, to the terminal and to runs/<study>/runner.log."""

from __future__ import annotations

import sys
import time
from pathlib import Path


def duration(seconds: float | None) -> str:
    """Compact h/m/s form: 42s, 3m05s, 1h02m."""
    if seconds is None or seconds != seconds or seconds < 0:
        return "?"
    seconds = int(round(seconds))
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


class Reporter:
    """Writes timestamped lines to a stream and appends them to a log file (opened per line: several runners may
    share it, and a killed runner loses nothing)."""

    def __init__(self, study: str, log_file: Path | None, stream=None):
        self.study = study
        self.log_file = log_file
        self.stream = stream if stream is not None else sys.stdout
        self.appended = False  # whether a line reached the log file yet
        self.log_problem: str | None = None  # set once appending failed: lines then go to the stream only

    def line(self, event: str, text: str) -> None:
        message = f"{time.strftime('%Y-%m-%d %H:%M:%S')} {self.study} {event:<8} {text}"
        print(message, file=self.stream, flush=True)
        if self.log_file is None or self.log_problem is not None:
            return
        try:
            self.log_file.parent.mkdir(parents=True, exist_ok=True)  # the study folder may have been deleted
            with open(self.log_file, "a", encoding="utf-8") as f:
                f.write(message + "\n")
            self.appended = True
        except OSError as e:
            if not self.appended:  # the study's folder cannot be written at all: refused before any run starts
                raise OSError(e.errno, e.strerror, e.filename or str(self.log_file)) from None
            # Runs already going are worth more than the log: say so once and carry on.
            self.log_problem = e.strerror or str(e)
            print(f"warning: cannot append to {self.log_file} ({self.log_problem}); progress lines go to the "
                  f"terminal only from here", file=sys.stderr, flush=True)


class StepClock:
    """Elapsed time and remaining-time estimate of one run from the steps it reports.

    The rate is measured from the first step line seen, so start-up (imports, compilation, warm-up) does not
    stretch the estimate."""

    def __init__(self, started: float):
        self.started = started
        self.first: tuple[float, int] | None = None

    def eta(self, now: float, step: int, total: int) -> float | None:
        if self.first is None:
            self.first = (now, step)
            return None
        first_time, first_step = self.first
        if step <= first_step or now <= first_time:
            return None
        return (total - step) * (now - first_time) / (step - first_step)
