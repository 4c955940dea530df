"""Writing the run log (docs/log-format.md; its line grammar is speedrun/logformat.py's): sources, environment,
config, step lines; rank 0 only, flushed per line."""

import os
import platform
import subprocess
import sys
from pathlib import Path

import torch

from speedrun.distributed import Dist
from speedrun.errors import UsageError
from speedrun.logformat import SEPARATOR, STUDY_VARIABLE, config_line, source_header, study_line

PROJECT_ROOT = Path(__file__).resolve().parent.parent
# The project packages whose modules a log embeds: the training package, and the data package's shard format.
EMBEDDED_PACKAGES = ("speedrun", "data")
# In a file exported with --export-script: the config fields of the studies it leaves out (off), at their values,
# so that its config line is the modular run's (speedrun/export.py writes them there). Empty in the modular code.
LEFT_OUT_FIELDS = {}


class LogWriter:
    """Rank 0 writes the run log line by line (flushed); other ranks write nothing."""

    def __init__(self, path, enabled):
        self.enabled, self.path, self.lines = enabled, path, []
        self.file = None
        if enabled:
            try:
                Path(path).parent.mkdir(parents=True, exist_ok=True)
                self.file = open(path, "w")
            except OSError as e:
                raise UsageError(f"{path}: cannot write the run log ({e.strerror or e})") from None

    def write(self, line, echo=True, keep=False):
        if not self.enabled:
            return
        try:
            self.file.write(line + "\n")
            self.file.flush()
        except OSError as e:  # a full disk: one line naming the log, not a traceback
            raise UsageError(f"{self.path}: cannot write the run log ({e.strerror or e})") from None
        if keep:
            self.lines.append(line)
        if echo:
            print(line, flush=True)

    def close(self):
        if self.file:
            self.file.close()


def environment_lines(proc: Dist):
    lines = [f"Running Python {sys.version}", f"Running PyTorch {torch.__version__}"
             + (f" compiled for CUDA {torch.version.cuda}" if torch.version.cuda else "")]
    if proc.device.type == "cuda":
        try:
            lines.append(subprocess.run(["nvidia-smi"], capture_output=True, text=True, timeout=30).stdout.rstrip())
        except (OSError, subprocess.SubprocessError):
            lines.append(f"GPU: {torch.cuda.get_device_name(proc.device)}")
    else:
        lines.append(f"Hardware: CPU {platform.processor() or platform.machine()}, {os.cpu_count()} cores")
    return lines


def package_sources():
    """(path relative to the repository, text) of every module of a project package (EMBEDDED_PACKAGES) or of its
    subpackages (speedrun/r18) that this process imported, in path order."""
    files = set()
    for name, module in list(sys.modules.items()):
        path = getattr(module, "__file__", None)
        if name.split(".")[0] in EMBEDDED_PACKAGES and path:
            files.add(Path(path).resolve())
    folders = {PROJECT_ROOT / package for package in EMBEDDED_PACKAGES}
    return [(f.relative_to(PROJECT_ROOT).as_posix(), f.read_text()) for f in sorted(files)
            if any(folder in f.parents for folder in folders)]


def write_sources(log: LogWriter, script_path):
    """The script's source (no header, as upstream), then each project module under `==> PACKAGE/NAME.py <==`."""
    log.write(Path(script_path).read_text().rstrip("\n"), echo=False)
    for name, text in package_sources():
        log.write(source_header(name), echo=False)
        log.write(text.rstrip("\n"), echo=False)


def write_preamble(log: LogWriter, script_path, proc: Dist, config, extra_lines=()):
    """Everything before the step lines: sources, a rule, environment and config lines, a rule."""
    write_sources(log, script_path)
    log.write(SEPARATOR, echo=False)
    for line in environment_lines(proc):
        log.write(line, echo=False)
    log.write(config_line({**LEFT_OUT_FIELDS, **config}))
    study = os.environ.get(STUDY_VARIABLE)
    if study:  # set by the study runner for the runs of its studies
        log.write(study_line(study), echo=False)
    for line in extra_lines:
        log.write(line)
    log.write(SEPARATOR, echo=False)
