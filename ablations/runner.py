"""Runs a study's (arm, seed) runs: resumable, safe to kill at any moment, several runs side by side.

State lives only in files (see runstate.py), so the runner can be killed with any signal and started again:
- a complete log is never rerun or overwritten;
- an unfinished log is renamed aside (never deleted) and its run restarted, or resumed from its checkpoint;
- a run whose lock is held (by another runner, or by a training process that outlived its runner) is not started
  twice: it is watched until it ends, then counted, or taken over if it ended unfinished without an error.
Children run in their own process groups; on SIGINT/SIGTERM the runner stops them before it exits, and on Linux
each child also gets SIGTERM when the runner dies without warning (SIGKILL).
"""

from __future__ import annotations

import ctypes
import dataclasses
import json
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

from speedrun.compile_cache import remove_truncated_kernel, truncated_kernel
from speedrun.logformat import STUDY_VARIABLE

from .progress import Reporter, StepClock, duration
from .runstate import (LogFollower, RunLock, RunPaths, checkpoint_config, checkpoint_damage, end_processes, is_running,
                       keep_aside, launch_environment, log_config, log_is_complete, new_run_token, not_a_run, run_paths,
                       set_aside)
from .staleness import ConfigCheck
from .study import Run, Study, describe_run, runner_flags

PR_SET_PDEATHSIG = 1
try:
    _LIBC = ctypes.CDLL(None, use_errno=True) if sys.platform.startswith("linux") else None
except OSError:
    _LIBC = None


@dataclasses.dataclass
class Options:
    runs_dir: Path = Path("runs")
    launcher: str | None = None        # overrides the study's launcher
    gpu_ids: list[str] = dataclasses.field(default_factory=list)  # empty: CPU runs
    hide_gpus: bool = False            # CPU runs on a machine with GPUs (--gpus 0)
    parallel: int | None = None        # most runs at once (default: 1 on CPU, as many as GPUs allow)
    resume: bool = True                # resume from a checkpoint when one exists
    wait_for_others: bool = True       # watch runs locked by another process (False: leave them)
    nnodes: int = 1                    # >1: each run spans nodes (Slurm: srun + torchrun rendezvous)
    rdzv_endpoint: str | None = None
    grace_s: float = 15.0              # how long stopped children get between SIGTERM and SIGKILL
    poll_s: float = 0.25
    progress_every_s: float = 30.0     # training-step progress lines at most this often (validations always)
    config_check: ConfigCheck | None = None  # redoes complete runs and skips checkpoints made with other flags
    # the study the runs belong to and its claim rule (speedrun.logformat.study_value: a sequential design's digest,
    # or a fixed study's arms), handed to each run, which writes it into its log
    study_mark: str | None = None


def detect_gpus() -> list[str]:
    """GPU ids usable here: CUDA_VISIBLE_DEVICES when set (Slurm sets it), else one per `nvidia-smi -L` line."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return [item.strip() for item in visible.split(",") if item.strip() and item.strip() != "-1"]
    try:
        listing = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return []
    if listing.returncode != 0:
        return []
    return [str(i) for i, line in enumerate(l for l in listing.stdout.splitlines() if l.startswith("GPU "))]


def launch_command(study: Study, run: Run, options: Options, resume_from: Path | None) -> list[str]:
    args = [str(study.script), *run.flags, *runner_flags(run, options.runs_dir)]
    if resume_from is not None:
        args += ["--resume", str(resume_from)]
    launcher = options.launcher or study.launcher
    if options.nnodes > 1:
        per_node, rest = divmod(study.nproc, options.nnodes)
        return ["srun", f"--nodes={options.nnodes}", "--ntasks-per-node=1", "--kill-on-bad-exit=1",
                sys.executable, "-m", "torch.distributed.run", f"--nnodes={options.nnodes}",
                f"--nproc_per_node={per_node + bool(rest)}", "--rdzv-backend=c10d",
                f"--rdzv-endpoint={options.rdzv_endpoint}", f"--rdzv-id={run.study}-{run.arm}-seed{run.seed}", *args]
    if launcher == "python" and study.nproc == 1:
        return [sys.executable, *args]
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={study.nproc}", *args]


def _die_with_runner(runner_pid: int):
    """preexec_fn for children: SIGTERM when the runner dies, even by SIGKILL (Linux)."""
    def setup():
        if _LIBC is not None:
            _LIBC.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
            if os.getppid() != runner_pid:  # the runner died before prctl took effect
                os._exit(1)
    return setup


@dataclasses.dataclass
class Active:
    run: Run
    paths: RunPaths
    lock: RunLock
    process: subprocess.Popen
    gpus: list[str]
    token: str  # in the environment of every process of the launch, torchrun's workers included
    resumed_from: Path | None
    follower: LogFollower
    clock: StepClock
    started: float
    last_line_at: float = 0.0


@dataclasses.dataclass
class Watched:
    run: Run
    paths: RunPaths
    since: float


class Stop(Exception):
    pass


class StudyRunner:
    def __init__(self, study: Study, runs: list[Run], options: Options, reporter: Reporter):
        self.study, self.runs, self.options, self.reporter = study, runs, options, reporter
        self.active: list[Active] = []
        self.watched: dict[str, Watched] = {}
        self.free_gpus = list(options.gpu_ids)
        self.outcome: dict[str, str] = {}  # run -> done-before, done, done-elsewhere, failed, failed-elsewhere, ...
        self.failures: dict[str, str] = {}
        self.requeued: list[Run] = []  # runs to start again (a truncated compiled kernel removed)
        self.kernel_retries: set[str] = set()  # runs already retried so: at most once each
        self.durations: list[float] = []
        self.stop_signal: int | None = None
        self.started = time.time()

    # ----- scheduling ---------------------------------------------------------------------------------------------
    def has_capacity(self) -> bool:
        limit = self.options.parallel
        if self.options.gpu_ids and self.options.nnodes == 1:
            if len(self.free_gpus) < self.study.nproc:
                return False
            return limit is None or len(self.active) < limit
        return len(self.active) < (limit or 1)

    def execute(self) -> int:
        pending = []
        for run in self.runs:
            if self._is_done(run, run_paths(self.options.runs_dir, run.study, run.arm, run.seed)):
                self.outcome[describe_run(run)] = "done-before"
            else:
                pending.append(run)
        total = len(self.runs)
        self.reporter.line("study", f"{total} runs ({len({r.arm for r in self.runs})} arms x seeds "
                                    f"{','.join(map(str, sorted({r.seed for r in self.runs})))}): "
                                    f"{total - len(pending)} already complete, {len(pending)} to run; "
                                    f"{self._slots_text()}")
        previous = {sig: signal.signal(sig, self._on_signal) for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
        try:
            while pending or self.active:
                if self.stop_signal is not None:
                    raise Stop
                self._start_what_fits(pending)
                self._follow_active()
                pending += self.requeued
                self.requeued.clear()
                self._follow_watched(pending)
                if pending or self.active:
                    time.sleep(self.options.poll_s)
        except Stop:
            self._stop_all()
            self._summary(pending, interrupted=True)
            return 128 + (self.stop_signal or signal.SIGTERM)
        except OSError as e:  # a folder gone read-only or deleted, a full disk: stop the runs before saying so
            self.stop_signal = signal.SIGTERM
            self._stop_all(f"cannot write {e.filename or 'a file of the study'} ({e.strerror or e})")
            raise
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
        return self._summary(pending, interrupted=False)

    def _slots_text(self) -> str:
        if self.options.nnodes > 1:
            return f"each run on {self.options.nnodes} nodes"
        if self.options.gpu_ids:
            return (f"{self.study.nproc} GPU(s) per run, GPUs {','.join(self.options.gpu_ids)}"
                    + (f", at most {self.options.parallel} at once" if self.options.parallel else ""))
        return f"CPU, {self.options.parallel or 1} run(s) at once, {self.study.nproc} process(es) each"

    def _on_signal(self, signum, _frame):
        if self.stop_signal is None:
            self.stop_signal = signum
        else:  # a second signal: no more patience with the children
            self.options.grace_s = 0.0

    def _start_what_fits(self, pending: list[Run]) -> None:
        for run in list(pending):
            key = describe_run(run)
            if key in self.watched:
                continue
            if not self.has_capacity():
                return
            paths = run_paths(self.options.runs_dir, run.study, run.arm, run.seed)
            if self._is_done(run, paths):
                pending.remove(run)
                self.outcome[key] = "done-elsewhere"
                continue
            lock = RunLock(paths)
            if not lock.acquire():
                if self.options.wait_for_others:
                    self.watched[key] = Watched(run, paths, time.time())
                    self.reporter.line("elsewhere", f"{key} is running in another process; watching it")
                else:
                    pending.remove(run)
                    self.outcome[key] = "running-elsewhere"
                    self.reporter.line("elsewhere", f"{key} is running in another process; leaving it")
                continue
            if self._is_done(run, paths):  # finished by another runner just before we locked it
                lock.release()
                pending.remove(run)
                self.outcome[key] = "done-elsewhere"
                continue
            pending.remove(run)
            self._launch(run, paths, lock)

    def _difference(self, run: Run, recorded: dict | None) -> str | None:
        check = self.options.config_check
        return check.difference(run, recorded) if check is not None else None

    def _is_done(self, run: Run, paths: RunPaths) -> bool:
        """A complete log made with the flags the study asks now (a stale one is redone: the command line refused
        to start unless asked to)."""
        return log_is_complete(paths.log) and self._difference(run, log_config(paths.log)) is None

    def _launch(self, run: Run, paths: RunPaths, lock: RunLock) -> None:
        key = describe_run(run)
        paths.failed_marker.unlink(missing_ok=True)
        notes = []
        for leftover in paths.log_dir.glob(f"{paths.checkpoint.name}.tmp*"):
            leftover.unlink()  # a save killed half-way; the lock is ours, so nothing of the run is writing it
        recorded = log_config(paths.log)
        if log_is_complete(paths.log):
            notes.append(f"log made with {self._difference(run, recorded)} set aside as "
                         f"{set_aside(paths, paths.log, 'stale').name}")
        else:
            contradiction = not_a_run(paths.log)
            kept = keep_aside(paths)
            if kept is not None:
                notes.append(f"log kept aside as {kept.name}, {contradiction}" if contradiction else
                             f"unfinished log kept aside as {kept.name}")
        resume_from = paths.checkpoint if self.options.resume and paths.checkpoint.exists() else None
        damage = checkpoint_damage(resume_from) if resume_from is not None else None
        if damage is not None:  # never trained from; kept for a look
            notes.append(f"checkpoint damaged ({damage}) set aside as "
                         f"{set_aside(paths, resume_from, 'damaged').name}; starting afresh")
            resume_from = None
        if resume_from is not None:
            stale = self._difference(run, checkpoint_config(resume_from) or recorded)
            if stale is not None:
                # Resuming would continue another schedule into this run's log (step lines of two lengths).
                notes.append(f"checkpoint made with {stale} set aside as "
                             f"{set_aside(paths, resume_from, 'stale').name}; starting afresh")
                resume_from = None
            else:
                notes.append(f"resuming from {resume_from}")
        command = launch_command(self.study, run, self.options, resume_from)
        gpus = []
        token = new_run_token()
        env = dict(os.environ, **launch_environment(paths, token))
        env.pop(STUDY_VARIABLE, None)  # only the runner says which study a run belongs to
        if self.options.study_mark:
            env[STUDY_VARIABLE] = self.options.study_mark
        if self.options.gpu_ids and self.options.nnodes == 1:
            gpus, self.free_gpus = self.free_gpus[:self.study.nproc], self.free_gpus[self.study.nproc:]
            env["CUDA_VISIBLE_DEVICES"] = ",".join(gpus)
            notes.append(f"GPUs {','.join(gpus)}")
        elif self.options.hide_gpus:
            env["CUDA_VISIBLE_DEVICES"] = ""
        if not self.options.gpu_ids and "OMP_NUM_THREADS" not in env and (self.options.parallel or 1) > 1:
            # Concurrent CPU runs share the cores instead of each taking all of them.
            per_run = max(1, (os.cpu_count() or 1) // ((self.options.parallel or 1) * self.study.nproc))
            env["OMP_NUM_THREADS"] = str(per_run)
        with open(paths.output, "ab") as out:
            out.write(f"==== {time.strftime('%Y-%m-%d %H:%M:%S')} {shlex.join(command)}\n".encode())
            out.flush()
            try:
                process = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                           env=env, start_new_session=True, pass_fds=(lock.fd,),
                                           preexec_fn=_die_with_runner(os.getpid()))
            except OSError as e:
                lock.release()
                self.free_gpus += gpus
                self._record_failure(run, paths, f"could not start: {e}", None)
                return
        lock.record(state="running", pid=process.pid, pgid=process.pid, command=command, token=token)
        now = time.time()
        self.active.append(Active(run, paths, lock, process, gpus, token, resume_from, LogFollower(paths.log),
                                  StepClock(now), now))
        position = self.runs.index(run) + 1
        self.reporter.line("start", f"{key} [{position}/{len(self.runs)}] pid {process.pid}"
                                    + (f" ({'; '.join(notes)})" if notes else ""))

    # ----- following ----------------------------------------------------------------------------------------------
    def _follow_active(self) -> None:
        for active in list(self.active):
            self._report_steps(active)
            code = active.process.poll()
            if code is not None:
                self._report_steps(active)
                self._finish(active, code)

    def _report_steps(self, active: Active) -> None:
        updates = active.follower.poll()
        if not updates:
            return
        now = time.time()
        latest = updates[-1]
        validations = [u for u in updates if u.is_val]
        eta = active.clock.eta(now, latest.step, latest.total)
        if validations:
            shown = validations[-1]
            extra = f" val_loss {shown.val_loss:.4f}"
        elif now - active.last_line_at >= self.options.progress_every_s:
            shown, extra = latest, ""
        else:
            return
        active.last_line_at = now
        self.reporter.line("step", f"{describe_run(active.run)} {shown.step}/{shown.total}{extra} "
                                   f"elapsed {duration(now - active.started)} eta {duration(eta)}")

    def _finish(self, active: Active, code: int) -> None:
        # Workers outliving their agent (torchrun killed with SIGKILL) die before the lock is let go, so the run can
        # never be started again while part of it still runs.
        leftovers = end_processes(active.token)
        self.active.remove(active)
        self.free_gpus += active.gpus
        key = describe_run(active.run)
        elapsed = time.time() - active.started
        complete = log_is_complete(active.paths.log)
        if complete:
            self.outcome[key] = "done"
            self.durations.append(elapsed)
            progress = active.follower.progress
            loss = f" val_loss {progress.val_loss:.4f}" if progress.val_loss is not None else ""
            warning = f" (exit status {code} after a complete log)" if code != 0 else ""
            self.reporter.line("done", f"{key} in {duration(elapsed)}{loss}{warning}; {self._tally()}")
        elif self.stop_signal is None and not self._retry_after_truncated_kernel(active):
            why = f"exit status {code}" if code != 0 else "exited without finishing its log"
            if leftovers:
                why += f"; killed {len(leftovers)} of its processes left running"
            if active.resumed_from is not None:
                why += (f" (it resumed from {active.resumed_from.name}: if that checkpoint is damaged, run again "
                        f"with --no-resume)")
            self._record_failure(active.run, active.paths, why, elapsed)
        active.lock.release()

    def _retry_after_truncated_kernel(self, active: Active) -> bool:
        """A run that failed loading a truncated kernel from inductor's shared compile cache (a compile killed
        while writing it, here or in another run) is started again once, with that file removed."""
        key = describe_run(active.run)
        kernel = truncated_kernel("\n".join(_last_attempt(active.paths.output)))
        if kernel is None or key in self.kernel_retries:
            return False
        self.kernel_retries.add(key)
        self.requeued.append(active.run)
        self.reporter.line("retry", f"{key}: {remove_truncated_kernel(kernel)}; starting it again (once)")
        return True

    def _record_failure(self, run: Run, paths: RunPaths, why: str, elapsed: float | None) -> None:
        key = describe_run(run)
        lines = _last_attempt(paths.output)
        reason = _likely_reason(lines)
        marker = {"time": time.time(), "why": why, "reason": reason, "output": str(paths.output),
                  "last_output": lines[-5:]}
        from analysis.atomic import write_text_atomically  # noqa: PLC0415 (as sequential_study: the package beside)

        # the study folder may have been deleted meanwhile (made again); a full disk names the marker, leaves no temp
        write_text_atomically(paths.failed_marker, json.dumps(marker) + "\n")
        self.outcome[key] = "failed"
        self.failures[key] = f"{why}" + (f": {reason}" if reason else "") + f" (see {paths.output})"
        last = f": {reason}" if reason else ""
        self.reporter.line("failed", f"{key} {why}" + (f" after {duration(elapsed)}" if elapsed else "")
                                     + f"{last}; {self._tally()}")

    def _follow_watched(self, pending: list[Run]) -> None:
        for key, watched in list(self.watched.items()):
            if is_running(watched.paths, count_leftovers=False):  # leftovers die when the lock is taken
                continue
            del self.watched[key]
            if log_is_complete(watched.paths.log):
                pending.remove(watched.run)
                self.outcome[key] = "done-elsewhere"
                self.reporter.line("done", f"{key} finished in another process; {self._tally()}")
            elif watched.paths.failed_marker.exists() and watched.paths.failed_marker.stat().st_mtime >= watched.since:
                pending.remove(watched.run)
                self.outcome[key] = "failed-elsewhere"
                self.failures[key] = f"failed in another process (see {watched.paths.failed_marker})"
                self.reporter.line("failed", f"{key} failed in another process; {self._tally()}")
            # else: its process died without finishing; it stays pending and is started here

    def _tally(self) -> str:
        values = list(self.outcome.values())
        done = sum(v.startswith("done") for v in values)
        failed = sum(v.startswith("failed") for v in values)
        left = len(self.runs) - len(values)
        text = f"{done}/{len(self.runs)} done, {failed} failed, {left} to go"
        if left and self.durations:
            at_once = max(1, len(self.active), self.options.parallel or 1)
            text += f", study eta ~{duration(sum(self.durations) / len(self.durations) * left / at_once)}"
        return text

    # ----- stopping -----------------------------------------------------------------------------------------------
    def _stop_all(self, why: str | None = None) -> None:
        if why is None:
            why = f"got {signal.Signals(self.stop_signal).name if self.stop_signal else 'a signal'}"
        self.reporter.line("stopping", f"{why}: stopping {len(self.active)} running run(s); "
                                       f"run the same command again to continue")
        for active in self.active:
            _signal_group(active.process.pid, signal.SIGTERM)
        asked = time.time()
        # grace_s is read on every pass: a second signal cuts it to zero.
        while any(a.process.poll() is None for a in self.active) and time.time() < asked + self.options.grace_s:
            time.sleep(0.1)
        for active in list(self.active):
            _signal_group(active.process.pid, signal.SIGKILL)  # _finish also ends workers outside the group
            active.process.wait()
            self._finish(active, active.process.returncode)

    def _summary(self, pending: list[Run], interrupted: bool) -> int:
        values = list(self.outcome.values())
        done = sum(v.startswith("done") for v in values)
        this_time = values.count("done")
        elsewhere = [k for k, v in self.outcome.items() if v == "running-elsewhere"]
        left = len(self.runs) - len(values)
        text = (f"{len(self.runs)} runs: {done} done ({this_time} by this runner), {len(self.failures)} failed, "
                f"{left} not run{' (interrupted)' if interrupted else ''}"
                + (f", {len(elsewhere)} running elsewhere" if elsewhere else "")
                + f"; {duration(time.time() - self.started)}")
        self.reporter.line("summary", text)
        for key, why in self.failures.items():
            self.reporter.line("failed", f"{key}: {why}")
        return 1 if self.failures or left or elsewhere else 0


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _last_attempt(output: Path) -> list[str]:
    """The non-empty output lines of the latest attempt (after its ==== header line)."""
    try:
        with open(output, "rb") as f:
            f.seek(max(0, os.fstat(f.fileno()).st_size - (1 << 18)))
            text = f.read().decode("utf-8", "replace")
    except OSError:
        return []
    return [line.rstrip() for line in text.split("\n==== ")[-1].splitlines()[1:] if line.strip()]


def _likely_reason(lines: list[str]) -> str | None:
    """The line that most likely says why an attempt failed: the training script's own one-line `error: ...`
    first, then a Python exception line, else the last line that is not part of torchrun's report."""
    for pick in (lambda l: l.startswith("error:"), lambda l: "Error: " in l and not l.startswith(" ")):
        found = [line for line in lines if pick(line)]
        if found:
            return found[0].strip()
    meaningful = [line for line in lines if line.strip("=-") and not line.startswith((" ", "["))]
    return meaningful[-1].strip() if meaningful else None


def run_study(study: Study, runs: list[Run], options: Options, reporter: Reporter) -> int:
    return StudyRunner(study, runs, options, reporter).execute()
