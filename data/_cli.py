"""Command-line plumbing shared by the data tools: one-line errors."""

from __future__ import annotations

import argparse
import sys


class ArgumentParser(argparse.ArgumentParser):
    """argparse, but a bad flag gives one line on stderr (naming the flag) and exit status 2, without the
    usage block."""

    def error(self, message: str):
        print(f"{self.prog}: error: {message} (see --help)", file=sys.stderr)
        sys.exit(2)


def file_problem(path, error: OSError) -> str:
    """One line saying why `path` could not be read."""
    if isinstance(error, FileNotFoundError):
        return f"{path}: no such file"
    if isinstance(error, IsADirectoryError):
        return f"{path}: is a directory, not a file"
    return f"{path}: cannot read ({error.strerror or error})"
