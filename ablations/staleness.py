"""Whether an existing run was made with what its study asks for now.

A study edited after some of its runs were made (`num-iterations` 12 -> 16, a flag removed from an arm, another
`script`) must not count their logs as done, nor resume their checkpoints into a log that mixes both schedules. Every
flag of the training script (named by the study or left at its default) and the seed are parsed with the script's
own parser, as the run would parse them, and compared with the `config` a log or checkpoint recorded (docs/log-format.md:
every flag value after parsing), and so is the track the script writes.
"""

from __future__ import annotations

import contextlib
import io
import json

from .study import Run, Study, runner_flags

# Flags that say where a run's files are, not what it computes (a runs folder named another way, a resumed run).
RUN_LOCATION = {"log_dir", "run_name", "resume", "help"}
# Flags a training script fills in at run time when left unset (the kernel warm-up follows compilation): compared
# only when the study sets them.
SET_AT_RUN_TIME = {"warmup_steps"}


def _comparable(value):
    """A value as the script's config JSON would hold it (tuples as lists, paths as strings)."""
    return json.loads(json.dumps(value, default=str))


class ConfigCheck:
    def __init__(self, module, study: Study, runs_dir):
        parser = module.make_arg_parser()
        self.parse = getattr(module, "resolve_args", None) or parser.parse_args
        self.runs_dir = runs_dir
        self.script, self.track = study.script.name, getattr(module, "TRACK", None)
        # dest -> the flag a person would recognise in the message
        self.compared = {action.dest: max(action.option_strings, key=len) for action in parser._actions
                         if action.option_strings and action.dest not in RUN_LOCATION}
        # A log may record what a flag resolved to (`--low-precision auto` as float32): a value outside the flag's
        # choices says so, and is not compared.
        self.choices = {action.dest: [_comparable(c) for c in action.choices] for action in parser._actions
                        if action.option_strings and action.choices}
        self._expected: dict[tuple, dict] = {}

    def expected(self, run: Run) -> dict:
        argv = tuple(run.flags + runner_flags(run, self.runs_dir))
        if argv not in self._expected:
            try:
                with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
                    namespace = self.parse(list(argv))
            except (SystemExit, Exception):  # noqa: BLE001 (flags `run` would refuse: `status` shows what it can)
                self._expected[argv] = {}
                return {}
            expected = {dest: _comparable(getattr(namespace, dest, None)) for dest in self.compared}
            self._expected[argv] = {dest: value for dest, value in expected.items()
                                    if value is not None or dest not in SET_AT_RUN_TIME}
        return self._expected[argv]

    def difference(self, run: Run, recorded: dict | None) -> str | None:
        """What differs first between the recorded config and what the study asks now (the script's track, then
        its flags), as one phrase; None when all agree or nothing was recorded."""
        if not recorded:
            return None
        if self.track is not None and "track" in recorded and recorded["track"] != self.track:
            return f"track {_shown(recorded['track'])}, the study's script {self.script} now writes {self.track}"
        for dest, value in self.expected(run).items():
            if dest not in recorded:
                continue
            seen = _comparable(recorded[dest])
            if dest in self.choices and (seen not in self.choices[dest] or value == "auto"):
                continue  # what the flag resolved to at run time (`--attention auto` logged as the kernel it ran)
            if seen != value:
                return f"{self.compared[dest]} {_shown(recorded[dest])}, the study now asks {_shown(value)}"
        return None


def _shown(value) -> str:
    return "(unset)" if value is None else json.dumps(value) if not isinstance(value, str) else value
