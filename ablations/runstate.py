"""What the files of one run say about it, and the per-run lock.

Every fact the runner needs lives in files next to the log, so that a runner killed at any moment (or several runners,
on one machine or on the nodes of a cluster sharing the folder) can pick up where things are:

    <runs>/<study>/<arm>/seed<k>.txt                      the run log (docs/log-format.md; finished: analysis/logs.py log_problem)
    <runs>/<study>/<arm>/seed<k>.pt                       the checkpoint the training script keeps (resume source)
    <runs>/<study>/<arm>/seed<k>.unfinished-<time>.txt    an unfinished log kept aside before its run was redone
    <runs>/<study>/<arm>/seed<k>.stale-<time>.txt         a log (or .pt) made with flags the edited study no longer asks
    <runs>/<study>/<arm>/seed<k>.damaged-<time>.pt        a checkpoint that is empty, no zip, or fails its CRC: never resumed from
    <runs>/<study>/<arm>/seed<k>.out                      the process output of every attempt (for failures)
    <runs>/<study>/<arm>/seed<k>.failed                   written when an attempt exited with an error
    <runs>/<study>/<arm>/seed<k>.lock                     flock()ed while a process of the run is alive
"""

from __future__ import annotations

import dataclasses
import errno
import fcntl
import json
import os
import signal
import socket
import time
import zipfile
from pathlib import Path

from speedrun.logformat import SEPARATOR, parse_step_line, read_config


@dataclasses.dataclass(frozen=True)
class RunPaths:
    """File names of one (arm, seed) run of a study."""

    log_dir: Path
    run_name: str

    @property
    def log(self) -> Path:
        return self.log_dir / f"{self.run_name}.txt"

    @property
    def checkpoint(self) -> Path:
        return self.log_dir / f"{self.run_name}.pt"

    @property
    def output(self) -> Path:
        return self.log_dir / f"{self.run_name}.out"

    @property
    def failed_marker(self) -> Path:
        return self.log_dir / f"{self.run_name}.failed"

    @property
    def lock(self) -> Path:
        return self.log_dir / f"{self.run_name}.lock"

    def kept_aside(self) -> list[Path]:
        return sorted(self.log_dir.glob(f"{self.run_name}.unfinished-*.txt"))


def run_paths(runs_dir: Path, study: str, arm: str, seed: int) -> RunPaths:
    return RunPaths(Path(runs_dir) / study / arm, f"seed{seed}")


def log_is_complete(path: Path) -> bool:
    """Whether the log is a finished run, by the one definition analysis counts runs with (analysis/logs.py:
    log_problem): a cut last line, a damaged config line or steps going back after the final validation are
    unfinished, so the runner reruns them."""
    from analysis.logs import log_problem  # noqa: PLC0415 (the analysis package sits next to this one)

    return log_problem(path) is None


def not_a_run(path: Path) -> str | None:
    """Why a log that reads as finished is no run (its lines contradict each other: no config line, two, or steps
    counting to another number than its config plans; analysis/runs.py contradiction), or None. The runner reruns
    such a run like an unfinished one, and says why."""
    from analysis.logs import log_problem  # noqa: PLC0415 (the analysis package sits next to this one)

    problem = log_problem(path) if path.exists() else None
    return problem if problem is not None and problem.startswith("not a run") else None


def set_aside(paths: RunPaths, path: Path, reason: str) -> Path:
    """Renames one file of a run out of the way (never deletes it) as <run>.<reason>-<time><suffix>; returns the
    new name. Analysis never reads logs named so (analysis/logs.py)."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    for attempt in range(1, 1000):
        suffix = stamp if attempt == 1 else f"{stamp}-{attempt}"
        target = paths.log_dir / f"{paths.run_name}.{reason}-{suffix}{path.suffix}"
        if not target.exists():
            os.replace(path, target)
            return target
    raise OSError(f"cannot find a free name to set {path} aside")


def keep_aside(paths: RunPaths) -> Path | None:
    """Renames an unfinished log out of the way; returns its new name."""
    return set_aside(paths, paths.log, "unfinished") if paths.log.exists() else None


def log_config(path: Path) -> dict | None:
    """The config line of a run log (see speedrun/logformat.py: read_config), or None when it has none yet."""
    try:
        return read_config(path.read_bytes())
    except OSError:
        return None


def checkpoint_config(path: Path) -> dict | None:
    """The config a checkpoint was saved with (the training script's `config` entry), or None when it has none or
    cannot be read (the training script then names the problem itself)."""
    try:
        with open(path, "rb") as f:
            is_json = f.read(1) == b"{"  # the stand-in script of the tests keeps JSON checkpoints
        if is_json:
            state = json.loads(path.read_text())
        else:
            import torch  # noqa: PLC0415 (only needed when a torch checkpoint is about to be resumed)

            state = torch.load(path, map_location="cpu", mmap=True, weights_only=False)
    except Exception:  # noqa: BLE001 (any unreadable checkpoint: no config to compare)
        return None
    config = state.get("config") if isinstance(state, dict) else None
    return config if isinstance(config, dict) else None


def checkpoint_damage(path: Path) -> str | None:
    """Why a checkpoint cannot be trusted: empty, not a zip (torch.save writes zips), a broken zip or a member whose
    bytes fail their CRC, a zip that torch.save did not write; None when it is intact (or the stand-in script's
    JSON, which that script judges)."""
    try:
        with open(path, "rb") as f:
            head = f.read(2)
        if not head:
            return "empty: 0 bytes"
        if head[:1] == b"{":
            return None
        if head != b"PK":
            return f"not a zip file: it starts with {head!r}, torch.save's start with b'PK'"
        # torch loads only when a zip is to be resumed
        from speedrun.checkpoint import damaged_member, holds_torch_pickle  # noqa: PLC0415

        member = damaged_member(path)
        if member is None and not holds_torch_pickle(path):
            return "a zip file but not torch.save's: no data.pkl in it"
    except (zipfile.BadZipFile, EOFError) as e:
        return f"not a whole zip file: {e}"
    except OSError as e:
        return f"cannot be read: {e.strerror or e}"
    return None if member is None else f"the bytes of {member} fail their CRC check"


@dataclasses.dataclass
class StepProgress:
    """Progress read from the step lines of a run log (only those after the two separator lines)."""

    step: int | None = None
    total: int | None = None
    val_loss: float | None = None
    val_step: int | None = None
    is_val: bool = False  # whether the line this entry came from was a validation line


class LogFollower:
    """Reads a growing log incrementally and keeps the latest step it reports."""

    def __init__(self, path: Path):
        self.path = path
        self.offset = 0
        self.separators = 0
        self.pending = b""
        self.progress = StepProgress()

    def poll(self) -> list[StepProgress]:
        """Reads what was appended since the last call; returns one entry per new step line."""
        try:
            with open(self.path, "rb") as f:
                if os.fstat(f.fileno()).st_size < self.offset:
                    # The log was replaced (kept aside, run restarted): read it from the start.
                    self.offset, self.separators, self.pending = 0, 0, b""
                f.seek(self.offset)
                data = f.read()
        except FileNotFoundError:
            return []
        self.offset += len(data)
        data = self.pending + data
        lines = data.split(b"\n")
        self.pending = lines.pop()
        updates = []
        for raw in lines:
            line = raw.decode("utf-8", "replace").rstrip("\r")
            if self.separators < 2:
                if line == SEPARATOR:
                    self.separators += 1
                continue
            parsed = parse_step_line(line)
            if parsed is None:
                continue
            self.progress.step, self.progress.total = parsed.step, parsed.total
            self.progress.is_val = parsed.val_loss is not None
            if self.progress.is_val:
                self.progress.val_loss = parsed.val_loss
                self.progress.val_step = self.progress.step
            updates.append(dataclasses.replace(self.progress))
        return updates


def read_progress(path: Path) -> StepProgress:
    follower = LogFollower(path)
    follower.poll()
    return follower.progress


# ----- the per-run lock -----------------------------------------------------------------------------------------

def _boot_id() -> str:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""


RUN_TOKEN_VARIABLE = "ABLATIONS_RUN_TOKEN"
# Every process of a launch also carries which run it is (its log's absolute path): a launch whose lock file was
# deleted while it ran is still found, so a second runner never starts the run beside it.
RUN_LOG_VARIABLE = "ABLATIONS_RUN_LOG"


def new_run_token() -> str:
    """A value unique to one launch; every process of the launch inherits it in its environment."""
    return f"{socket.gethostname()}-{os.getpid()}-{time.time_ns()}"


def run_log_id(paths: RunPaths) -> str:
    return str(paths.log.resolve())


def launch_environment(paths: RunPaths, token: str) -> dict[str, str]:
    """The variables every process of a launch of this run carries (see processes_with)."""
    return {RUN_TOKEN_VARIABLE: token, RUN_LOG_VARIABLE: run_log_id(paths)}


def processes_with(variable: str, value: str) -> dict[int, str | None]:
    """Live processes on this machine whose environment sets `variable` to `value` (Linux /proc; empty elsewhere),
    each with the launch token it carries.

    torchrun starts its workers in sessions of their own, so neither the launch's process group nor the lock
    reaches them; the environment they inherit does."""
    proc = Path("/proc")
    if not value or not proc.is_dir():
        return {}
    needle = f"{variable}={value}".encode()
    token_prefix = f"{RUN_TOKEN_VARIABLE}=".encode()
    found = {}
    for entry in proc.iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            environment = (entry / "environ").read_bytes().split(b"\0")
            if needle not in environment:
                continue
            stat = (entry / "stat").read_text()
        except OSError:  # gone, or another user's process
            continue
        if stat[stat.rindex(")") + 2:].split()[0] != "Z":
            token = next((item[len(token_prefix):].decode() for item in environment if item.startswith(token_prefix)),
                         None)
            found[int(entry.name)] = token
    return found


def processes_with_token(token: str) -> list[int]:
    """Live processes of the launch `token` on this machine."""
    return list(processes_with(RUN_TOKEN_VARIABLE, token))


def unknown_launch_alive(paths: RunPaths) -> bool:
    """Whether processes of this run live here that its lock file does not know of (their launch's lock file was
    deleted, and maybe made anew by someone else): the run is running, whoever holds the file now."""
    known = read_lock_info(paths).get("token")
    return any(token != known for token in processes_with(RUN_LOG_VARIABLE, run_log_id(paths)).values())


def end_processes(token: str, timeout_s: float = 10.0) -> list[int]:
    """SIGKILLs every live process of a launch (e.g. workers whose torchrun agent died) and waits until they are
    gone; returns the pids it killed."""
    killed = processes_with_token(token)
    for pid in killed:
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    deadline = time.time() + timeout_s
    while processes_with_token(token) and time.time() < deadline:
        time.sleep(0.05)
    return killed


class RunLock:
    """An exclusive flock() on <run>.lock, held by the runner and inherited by the run's process.

    The kernel releases it when every holder has died, so a runner killed with SIGKILL leaves no stale lock, while a
    training process that outlives its runner keeps the run marked as running. torchrun's workers do not inherit
    it, so the file also records the launch's token (see processes_with_token): workers left behind by a killed
    agent are found by it, counted as running by `status`, and killed before the run starts again.
    """

    def __init__(self, paths: RunPaths):
        self.paths = paths
        self.fd: int | None = None

    def acquire(self) -> bool:
        """Takes the lock without waiting; False when a live process of this run holds it, or runs without it."""
        fd = _try_flock(self.paths, leftovers="end")
        if fd is None:
            return False
        if unknown_launch_alive(self.paths):
            fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)
            return False
        self.fd = fd
        self.record(state="starting")
        return True

    def record(self, **info) -> None:
        """Replaces the lock file's description of who holds it."""
        assert self.fd is not None
        content = {"host": socket.gethostname(), "boot_id": _boot_id(), "runner_pid": os.getpid(),
                   "since": time.time(), **info}
        data = (json.dumps(content) + "\n").encode()
        os.ftruncate(self.fd, 0)
        os.pwrite(self.fd, data, 0)

    def release(self) -> None:
        if self.fd is not None:
            fcntl.flock(self.fd, fcntl.LOCK_UN)
            os.close(self.fd)
            self.fd = None


def read_lock_info(paths: RunPaths) -> dict:
    try:
        return json.loads(paths.lock.read_text() or "{}")
    except (OSError, ValueError):
        return {}


def _leftover_token(info: dict) -> str | None:
    """The token of the launch that last held the lock, when its processes could be on this machine."""
    if info.get("host") != socket.gethostname() or info.get("boot_id") != _boot_id():
        return None
    return info.get("token")


def _try_flock(paths: RunPaths, leftovers: str) -> int | None:
    """An fd holding the run's lock, or None when a live process of the run holds it or still runs.

    With the lock free, processes of the last launch that are still alive are workers whose agent died. leftovers:
    "end" kills them (the lock is ours, so no one else will), "count" counts them as the run still running,
    "ignore" leaves them to whoever takes the lock."""
    paths.log_dir.mkdir(parents=True, exist_ok=True)
    fd = os.open(paths.lock, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as e:
        os.close(fd)
        if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            return None
        raise
    token = _leftover_token(read_lock_info(paths))
    if leftovers != "ignore" and token and processes_with_token(token):
        if leftovers == "end":
            end_processes(token)
        else:
            fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)
            return None
    return fd


def is_running(paths: RunPaths, count_leftovers: bool = True) -> bool:
    """True while some process of this run (on any host sharing the folder) holds its lock, or, with
    `count_leftovers`, while workers of its last launch outlive their agent (see _try_flock)."""
    if not paths.lock.exists():
        return unknown_launch_alive(paths)
    fd = _try_flock(paths, leftovers="count" if count_leftovers else "ignore")
    if fd is None:
        return True
    fcntl.flock(fd, fcntl.LOCK_UN)
    os.close(fd)
    return unknown_launch_alive(paths)


def run_state(paths: RunPaths) -> str:
    """One of: done, running, failed, todo."""
    if log_is_complete(paths.log):
        return "done"
    if is_running(paths):
        return "running"
    if paths.failed_marker.exists():
        return "failed"
    return "todo"
