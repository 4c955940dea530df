"""What each test costs and what it starts, for the suite's cost table (benchmarks/suite_costs.py).

With SPEEDRUN_TEST_COSTS=PATH set, every test appends one JSON line to PATH: its node id, wall seconds, the CPU
seconds of the test process and of the children it waited for (a torchrun's ranks included), and the kind of work
it started. CPU seconds, unlike wall seconds, hardly change when the machine is shared, so a table read from a
loaded machine still says where the suite's time goes. Off (no file written) when the variable is not set."""
import json
import os
import resource
import subprocess
import sys
import time

import pytest

COSTS_ENV = "SPEEDRUN_TEST_COSTS"

# The kinds, most expensive start first: a test is filed under the first kind it started.
KINDS = ("own process", "torchrun", "study", "process", "compile", "in process")


def kind_of(commands, own_process, compiled_frames):
    """The kind of work a test started, from the commands it ran, its own_process mark and the frames dynamo
    compiled in the test process."""
    if own_process:
        return "own process"
    if any("torch.distributed.run" in c or "torchrun" in c for c in commands):
        return "torchrun"
    if any("-m ablations" in c or "run.sh" in c for c in commands):
        return "study"
    if commands:
        return "process"
    if compiled_frames:
        return "compile"
    return "in process"


def _cpu_seconds():
    me, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime, children.ru_utime + children.ru_stime


def _compiled_frames():
    """Frames dynamo has compiled in this process so far (0 when torch._dynamo was never imported)."""
    utils = sys.modules.get("torch._dynamo.utils")
    return utils.counters["stats"]["unique_graphs"] if utils is not None else 0


def command_text(args):
    """A spawned command as one line: Popen's args are a list or a string."""
    return " ".join(map(str, args)) if isinstance(args, (list, tuple)) else str(args)


class CostMeter:
    """Measures one test; records the commands of the processes it starts while it runs."""

    def __init__(self, path):
        self.path = path
        self.commands = []
        self._spawn = None

    def start(self):
        self.commands = []
        self._wall, (self._cpu, self._child_cpu) = time.time(), _cpu_seconds()
        self._frames = _compiled_frames()
        spawn = self._spawn = subprocess.Popen._execute_child
        commands = self.commands

        def recording_spawn(popen, args, *rest, **kwargs):
            commands.append(command_text(args))
            return spawn(popen, args, *rest, **kwargs)

        subprocess.Popen._execute_child = recording_spawn

    def stop(self, nodeid, own_process, outcome):
        subprocess.Popen._execute_child = self._spawn
        cpu, child_cpu = _cpu_seconds()
        line = {"test": nodeid, "outcome": outcome, "wall_s": round(time.time() - self._wall, 3),
                "cpu_s": round(cpu - self._cpu, 3), "child_cpu_s": round(child_cpu - self._child_cpu, 3),
                "kind": kind_of(self.commands, own_process, _compiled_frames() - self._frames),
                "worker": os.environ.get("PYTEST_XDIST_WORKER", "main")}
        # One write per line, in append mode: lines of the xdist workers do not interleave. A measurement never fails
        # the suite: when the line cannot be written (a full disk), it says so once and measures no more.
        if self.path is None:
            return
        try:
            with open(self.path, "a") as f:
                f.write(json.dumps(line) + "\n")
        except OSError as e:
            print(f"\ncost_meter: cannot write {self.path} ({e.strerror or e}); no more cost lines", file=sys.stderr)
            self.path = None


class CostPlugin:
    """The pytest side: a CostMeter around each test's whole protocol (set-up and teardown included, as a shared
    fixture's cost is paid by the test that first needs it)."""

    def __init__(self, path):
        self.meter = CostMeter(path)
        self.failed = {}

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_protocol(self, item, nextitem):
        self.meter.start()
        try:
            return (yield)
        finally:
            outcome = self.failed.pop(item.nodeid, "passed")
            self.meter.stop(item.nodeid, item.get_closest_marker("own_process") is not None, outcome)

    def pytest_runtest_logreport(self, report):
        if report.outcome != "passed" and self.failed.get(report.nodeid) != "failed":
            self.failed[report.nodeid] = report.outcome
