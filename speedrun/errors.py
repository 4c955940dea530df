"""Bad input: one line naming the problem on stderr, exit status 2, before any log is written."""

import argparse
import os
import time

# A rank that ends quietly on bad input another rank reports waits this long first: under torchrun the first worker
# to exit makes the agent stop the others, and under load that could stop the reporting rank before its line.
QUIET_RANK_GRACE_S = 5.0


class UsageError(Exception):
    """Bad input: reported as one line on stderr and exit status 2, before any log is written."""


class ReportedByAnotherRank(UsageError):
    """Bad input another rank of the run reports: this rank ends with exit status 2 and prints nothing."""


def is_reporting_rank():
    """Whether this process prints the one line of bad input that every rank finds alike (torchrun's rank 0)."""
    return os.environ.get("RANK", "0") == "0"


def end_quietly(status=2):
    """status, after QUIET_RANK_GRACE_S where other ranks run (the reporting rank's exit then ends this one first)."""
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        time.sleep(QUIET_RANK_GRACE_S)
    return status


class HelpWithDefaults(argparse.HelpFormatter):
    """Shows a flag's default only when it has a real one (None means "preset's value" or "off")."""

    def _get_help_string(self, action):
        text = action.help or ""
        if action.default not in (None, False, argparse.SUPPRESS) and "default" not in text:
            text += " (default: %(default)s)"
        return text


class OneLineErrorParser(argparse.ArgumentParser):
    """Bad flags end the process with one line and exit 2 (not the whole usage text)."""

    def error(self, message):  # under torchrun every rank parses the same flags: rank 0 alone says what is wrong
        if is_reporting_rank():
            self.exit(2, f"error: {message} (see --help)\n")
        self.exit(end_quietly())


def parse_int_flag(value, flag):
    try:
        return int(value)
    except ValueError:
        raise UsageError(f"{flag}: expected an integer, got {value!r}")



def file_problem(path, error: OSError) -> str:
    """One line saying why `path` could not be read."""
    if isinstance(error, FileNotFoundError):
        return f"{path}: no such file"
    if isinstance(error, IsADirectoryError):
        return f"{path}: is a directory, not a file"
    return f"{path}: cannot read ({error.strerror or error})"
