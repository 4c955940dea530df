"""Command-line plumbing shared by the data tools: the project's one-line-error parser, under the data tools'
names for it."""

from __future__ import annotations

from speedrun.errors import OneLineErrorParser as ArgumentParser  # noqa: F401
from speedrun.errors import file_problem  # noqa: F401
