"""Whether an existing run was made with the flags its study asks for now.

A study edited after some of its runs were made (`num-iterations` 12 -> 16) must not count their logs as done, nor
resume their checkpoints into a log that mixes both schedules. The flags a study names (in any arm, or shared) and
the seed are parsed with the training script's own parser, as the run would parse them, and compared with the
`config` a log or checkpoint recorded (contract section 3: every flag value after parsing).
"""

from __future__ import annotations

import contextlib
import io
import json

from .study import Run, Study, runner_flags


def _comparable(value):
    """A value as the script's config JSON would hold it (tuples as lists, paths as strings)."""
    return json.loads(json.dumps(value, default=str))


class ConfigCheck:
    def __init__(self, module, study: Study, runs_dir):
        parser = module.make_arg_parser()
        self.parse = getattr(module, "resolve_args", None) or parser.parse_args
        self.runs_dir = runs_dir
        named = {key for table in study.arms.values() for key in table}
        # dest -> the flag a person would recognise in the message
        self.compared = {parser._option_string_actions[f"--{key}"].dest: f"--{key}" for key in sorted(named)
                         if f"--{key}" in parser._option_string_actions}
        self.compared.setdefault("seed", "--seed")
        self._expected: dict[tuple, dict] = {}

    def expected(self, run: Run) -> dict:
        argv = tuple(run.flags + runner_flags(run, self.runs_dir))
        if argv not in self._expected:
            with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
                namespace = self.parse(list(argv))
            self._expected[argv] = {dest: _comparable(getattr(namespace, dest, None)) for dest in self.compared}
        return self._expected[argv]

    def difference(self, run: Run, recorded: dict | None) -> str | None:
        """The first flag whose recorded value differs from what the study asks now, as one phrase; None when all
        agree or nothing was recorded."""
        if not recorded:
            return None
        for dest, value in self.expected(run).items():
            if dest in recorded and _comparable(recorded[dest]) != value:
                return f"{self.compared[dest]} {_shown(recorded[dest])}, the study now asks {_shown(value)}"
        return None


def _shown(value) -> str:
    return "(unset)" if value is None else json.dumps(value) if not isinstance(value, str) else value
