"""Command-line plumbing shared by the data tools: one-line errors."""

from __future__ import annotations

import argparse
import sys

from speedrun.errors import file_problem  # noqa: F401  (the data tools' name for it)


class ArgumentParser(argparse.ArgumentParser):
    """argparse, but a bad flag gives one line on stderr (naming the flag) and exit status 2, without the
    usage block."""

    def error(self, message: str):
        print(f"{self.prog}: error: {message} (see --help)", file=sys.stderr)
        sys.exit(2)
